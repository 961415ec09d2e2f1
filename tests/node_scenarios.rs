//! End to end on the real node, the run's own life: a run that keeps dying, thread admission,
//! stop, askUser, a worker frozen past its lease, the controller gone for a while, the API
//! server unreachable. The controller runs as the chart's pods; faults are real signals from
//! the host, real deletions and real scaling.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRunStatus, LedgerEvent, Phase, Role, ScriptTurn, ToolKind};
use baton_testkit::e2e::{Effects, Script, effect_command, run_with, shell_tool, tool_call};
use baton_testkit::node::*;

fn effects(env: &NodeEnv) -> Effects {
    Effects::read(&env.effects.file)
}

/// Every attempt dies (its worker is killed from the host each time it starts a step): after
/// maxAttempts the run ends Interrupted (MaxAttemptsExceeded) with its partial output and
/// transcript salvaged, ending in the controller's `claimed` seal and `closed` record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_run_that_always_dies_ends_interrupted() {
    let env = NodeEnv::start("always-dies").await;
    let name = "doomed";
    let sink = env.effects.addr.as_str();
    let turns: Vec<ScriptTurn> = (1..=6)
        .map(|t| ScriptTurn {
            text: Some(format!("attempting step {t}")),
            tool_calls: vec![tool_call(
                "sh",
                "command",
                &effect_command(sink, name, t, 20_000),
            )],
            delay_milliseconds: Some(200),
            usage: None,
        })
        .chain([ScriptTurn {
            text: Some("never reached".into()),
            ..ScriptTurn::default()
        }])
        .collect();
    let mut run = run_with(name, turns, vec![shell_tool("sh")]);
    run.spec.max_attempts = 2;
    env.create(&run).await;
    for attempt in 1..=2 {
        let (pod, _) = env.wait_worker(name, attempt).await;
        // Its step has started (the effect landed): the step is in flight when it dies.
        let deadline = Instant::now() + RUN_TIMEOUT;
        while effects(&env).lines.iter().filter(|l| l.0 == name).count() < attempt as usize {
            assert!(
                Instant::now() < deadline,
                "attempt {attempt} never started a step"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        env.signal_worker(&pod, libc::SIGKILL).await;
    }

    let st = env
        .wait_run(name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    assert_eq!(st.phase, Phase::Interrupted, "{st:#?}");
    assert_eq!(st.reason.as_deref(), Some("MaxAttemptsExceeded"), "{st:#?}");
    assert_eq!(st.failed_attempts, 2, "{st:#?}");
    assert!(st.output_partial, "the output is a salvage: {st:#?}");
    assert!(!st.output.clone().unwrap_or_default().is_empty(), "{st:#?}");
    assert!(st.unknown_effects.len() >= 2, "{:#?}", st.unknown_effects);
    // The terminal claim's `closed` record follows its status.
    let deadline = Instant::now() + Duration::from_secs(20);
    let ledger = loop {
        let ledger = env.ledger(name).await;
        let last = ledger.last().and_then(|s| s.spec.events.last());
        if matches!(last, Some(LedgerEvent::Closed { .. })) || Instant::now() > deadline {
            break ledger;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let events: Vec<&LedgerEvent> = ledger.iter().flat_map(|s| &s.spec.events).collect();
    let assistant = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                LedgerEvent::Message {
                    role: Role::Assistant,
                    ..
                }
            )
        })
        .count();
    assert!(assistant >= 2, "the transcript survives: {events:?}");
    assert!(matches!(events.last(), Some(LedgerEvent::Closed { .. })));
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// Two runs on one thread key run strictly one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_two_runs_on_one_thread_run_one_after_the_other() {
    let env = NodeEnv::start("thread").await;
    let names: Vec<String> = vec!["first".into(), "second".into()];
    for name in &names {
        let mut run = env.scripted(name, &Script::new(3, 2000));
        run.spec.thread_key = Some("thread-a".into());
        env.create(&run).await;
    }
    // The status alone: the kubelet may report the worker container running only after a
    // short run ended (seen on a loaded machine), and the wait would then never end.
    let running = |s: &AgentRunStatus| s.phase == Phase::Running || s.phase.is_terminal();
    let first = env.wait_run("first", RUN_TIMEOUT, "running", running).await;
    assert_eq!(
        first.phase,
        Phase::Running,
        "the first run ended before it was seen live"
    );
    assert_eq!(
        env.status("second").await.phase,
        Phase::Pending,
        "the second run waits while the first is live"
    );
    for name in &names {
        env.wait_succeeded(name).await;
    }
    env.check_invariants(&names).await;
    let lines = effects(&env).lines;
    let last_first = lines.iter().rposition(|(r, ..)| r == "first").unwrap();
    let first_second = lines.iter().position(|(r, ..)| r == "second").unwrap();
    assert!(last_first < first_second, "interleaved: {lines:?}");
    env.finish().await;
}

/// spec.stop: the worker cancels the step in flight and the run ends Stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stop_cancels_the_step_and_ends_the_run_stopped() {
    let env = NodeEnv::start("stop").await;
    let name = "stopme";
    env.create(&env.scripted(name, &Script::new(3, 30_000)))
        .await;
    env.wait_worker(name, 1).await;
    env.wait_effect(name, 1).await;
    let asked = Instant::now();
    env.stop(name).await;
    let st = env
        .wait_run(name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    assert_eq!(st.phase, Phase::Stopped, "{st:#?}");
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "stopped before the 30 s tool ended (the step was cancelled)"
    );
    assert_eq!(
        effects(&env).count(name, 2),
        0,
        "nothing ran after the stop"
    );
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// askUser: WaitingInput (the worker exits and frees its pod), an input, resumed in a new pod,
/// Succeeded; no attempt consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ask_user_waits_for_input_then_resumes_in_a_new_pod() {
    let env = NodeEnv::start("ask").await;
    let name = "ask";
    let sink = env.effects.addr.as_str();
    let turns = vec![
        ScriptTurn {
            text: Some("Which environment?".into()),
            tool_calls: vec![tool_call("ask", "question", "staging or production?")],
            delay_milliseconds: Some(200),
            usage: None,
        },
        ScriptTurn {
            text: Some("deploying".into()),
            tool_calls: vec![tool_call(
                "sh",
                "command",
                &effect_command(sink, name, 2, 0),
            )],
            delay_milliseconds: Some(200),
            usage: None,
        },
        ScriptTurn {
            text: Some("deployed".into()),
            ..ScriptTurn::default()
        },
    ];
    let mut ask = shell_tool("ask");
    ask.kind = ToolKind::AskUser;
    env.create(&run_with(name, turns, vec![ask, shell_tool("sh")]))
        .await;
    let st = env
        .wait_run(name, RUN_TIMEOUT, "WaitingInput", |s| {
            s.phase == Phase::WaitingInput
        })
        .await;
    let waiting_fence = st.fence;
    let pod = baton::fence::worker_pod_name(name, waiting_fence);
    env.wait_container_gone(&pod, RUN_TIMEOUT).await;
    assert_eq!(effects(&env).count(name, 2), 0);

    env.answer(name, "staging").await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some("deployed"));
    assert!(st.fence > waiting_fence, "resumed in a new pod");
    assert_eq!(st.failed_attempts, 0, "an input wait consumes no attempt");
    assert_eq!(effects(&env).count(name, 2), 1);
    let answered = env
        .ledger(name)
        .await
        .iter()
        .flat_map(|s| s.spec.events.clone())
        .any(|e| matches!(e, LedgerEvent::Input { content, .. } if content == "staging"));
    assert!(answered, "the answer is in the ledger");
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// The worker's process is frozen (SIGSTOP from the host) past its lease: the run is taken
/// over; thawed, the old worker writes nothing (no segment of its fence after the seal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_frozen_worker_is_taken_over_and_writes_nothing_when_thawed() {
    let env = NodeEnv::start("pause").await;
    let name = "pause";
    env.create(&env.scripted(name, &Script::new(4, 1500))).await;
    let (pod, fence) = env.wait_worker(name, 1).await;
    env.wait_effect(name, 1).await;
    let pid = env
        .container_pid(&pod)
        .await
        .expect("the worker's host PID");
    signal_pid(pid, libc::SIGSTOP);

    env.wait_run(name, RUN_TIMEOUT, "taken over", |s| s.fence.get() > fence)
        .await;
    env.recorder
        .wait_attempt_started(name, fence, RUN_TIMEOUT)
        .await;
    let thawed_at = Instant::now();
    signal_pid(pid, libc::SIGCONT);

    let st = env.wait_succeeded(name).await;
    assert_eq!(st.failed_attempts, 1, "the expiry consumed one attempt");
    let recorded = env.recorder.snapshot();
    let late: Vec<_> = recorded
        .segments
        .iter()
        .filter(|(_, s)| s.run == name && s.fence == fence && s.at > thawed_at)
        .map(|(n, _)| n.clone())
        .collect();
    assert!(late.is_empty(), "the zombie wrote {late:?}");
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// No controller at all for a while (the Deployment scaled to 0), and meanwhile a worker dies:
/// scaled back, the controllers pick up where they stopped and both runs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_controllers_gone_for_a_while_pick_up_where_they_stopped() {
    let env = NodeEnv::start("ctl-gone").await;
    let names: Vec<String> = vec!["cg-1".into(), "cg-2".into()];
    env.create_scripted(&names, &Script::new(5, 1000)).await;
    let (pod, _) = env.wait_worker(&names[0], 1).await;
    env.wait_worker(&names[1], 1).await;
    env.wait_effect(&names[0], 1).await;
    tokio::task::spawn_blocking(|| scale_controllers(0))
        .await
        .unwrap();
    env.signal_worker(&pod, libc::SIGKILL).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // no controller for a while
    tokio::task::spawn_blocking(|| scale_controllers(2))
        .await
        .unwrap();

    for name in &names {
        env.wait_succeeded(name).await;
    }
    assert_eq!(env.status(&names[0]).await.failed_attempts, 1);
    env.check_invariants(&names).await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    env.finish().await;
}

/// The API server stops answering for 20 s (SIGSTOP): workers and controllers wait it out,
/// and the runs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_apiserver_unreachable_for_20s_then_back_runs_finish() {
    let env = NodeEnv::start("api-pause").await;
    let names: Vec<String> = vec!["ap-1".into(), "ap-2".into()];
    env.create_scripted(&names, &Script::new(8, 1000)).await;
    for name in &names {
        env.wait_worker(name, 1).await;
        env.wait_effect(name, 1).await;
    }
    tokio::task::spawn_blocking(|| node_sh(&["pause-apiserver"]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await; // the outage itself, not a wait
    tokio::task::spawn_blocking(|| node_sh(&["resume-apiserver"]))
        .await
        .unwrap();
    for name in &names {
        let st = env.wait_succeeded(name).await;
        assert_eq!(
            st.output.as_deref(),
            Some(format!("{name}: all 8 turns done").as_str())
        );
    }
    env.check_invariants(&names).await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    env.finish().await;
}

/// `examples/budget.yaml` as a user applies it: it stops before its fourth model call,
/// `Failed`/`BudgetExceeded` naming the limit, with its usage in status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_budget_example_stops_at_its_limit() {
    let env = NodeEnv::start("example-budget").await;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/budget.yaml");
    kubectl(&["-n", &env.ns, "apply", "-f", path]).expect("kubectl apply -f the example");
    let st = env
        .wait_run("budgeted", RUN_TIMEOUT, "terminal", |s| {
            s.phase.is_terminal()
        })
        .await;
    assert_eq!(st.phase, Phase::Failed, "{st:#?}");
    assert_eq!(st.reason.as_deref(), Some("BudgetExceeded"), "{st:#?}");
    assert!(
        st.message
            .clone()
            .unwrap_or_default()
            .contains("spec.budget.maxModelCalls")
    );
    let usage = st.usage.clone().expect("status.usage");
    assert_eq!((usage.model_calls, usage.tool_calls), (3, 3), "{usage:?}");
    assert_eq!(
        usage.total_tokens,
        300 + 40 + 400 + 40 + 500 + 40,
        "{usage:?}"
    );
    assert!(
        st.output.unwrap_or_default().contains("Step three"),
        "salvaged"
    );
    env.finish().await;
}

/// `examples/approval.yaml` as a user applies it: `kubectl wait` sees WaitingApproval, the
/// call is in status and an Event, the worker pod is gone and nothing ran; `baton approve`
/// (the binary) resumes it in a new pod that runs exactly that call, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_approval_example_waits_then_runs_the_call_once_approved() {
    let env = NodeEnv::start("example-approval").await;
    let name = "gated-deploy";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/approval.yaml");
    kubectl(&["-n", &env.ns, "apply", "-f", path]).expect("kubectl apply -f the example");
    let target = format!("agentrun/{name}");
    kubectl(&[
        "-n",
        &env.ns,
        "wait",
        "--for=jsonpath={.status.phase}=WaitingApproval",
        &target,
        "--timeout=180s",
    ])
    .expect("kubectl wait for WaitingApproval");
    let st = env.status(name).await;
    let pending = st.pending_approval.clone().expect("status.pendingApproval");
    assert_eq!(
        (pending.step, pending.tool.as_str()),
        (2, "deploy"),
        "{st:?}"
    );
    assert!(pending.arguments.contains("deployed 2.4.1"), "{pending:?}");
    let pod = baton::fence::worker_pod_name(name, st.fence);
    env.wait_container_gone(&pod, RUN_TIMEOUT).await;
    let events = kubectl(&["-n", &env.ns, "get", "events", "-o", "json"]).unwrap();
    assert!(
        events.contains("ApprovalRequested")
            && events.contains(&format!("baton approve {name} --step 2")),
        "an Event says what waits and how to decide it"
    );
    let said = baton_cli(&["approve", name, "-n", &env.ns]).expect("baton approve");
    assert!(said.contains("step 2 approved"), "{said}");
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some("Shipped."));
    assert_eq!((st.failed_attempts, st.pending_approval), (0, None));
    let events: Vec<LedgerEvent> = env
        .ledger(name)
        .await
        .iter()
        .flat_map(|s| s.spec.events.clone())
        .collect();
    let ran = events.iter().filter(|e| {
        matches!(e, LedgerEvent::StepResult { step: 2, output, is_error: false } if output.contains("deployed 2.4.1"))
    });
    assert_eq!(ran.count(), 1, "the approved call ran once: {events:?}");
    let err = baton_cli(&["approve", name, "-n", &env.ns]).unwrap_err();
    assert!(err.contains("is not waiting for approval"), "{err}");
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// Nobody decides within `approvalTimeoutSeconds`: the controller claims the run when its
/// clock passes the deadline, and the new worker denies the call by default (never run),
/// telling the model; the run goes on to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_an_approval_nobody_gives_times_out_and_the_call_is_denied() {
    let env = NodeEnv::start("approval-timeout").await;
    let name = "unattended";
    let sink = env.effects.addr.as_str();
    let turns = vec![
        ScriptTurn {
            text: Some("deploying".into()),
            tool_calls: vec![tool_call(
                "deploy",
                "command",
                &effect_command(sink, name, 1, 0),
            )],
            delay_milliseconds: Some(100),
            usage: None,
        },
        ScriptTurn {
            text: Some("not deployed".into()),
            ..ScriptTurn::default()
        },
    ];
    let mut deploy = shell_tool("deploy");
    deploy.approval = Some(baton::crd::v1alpha1::ApprovalPolicy::Required);
    let mut run = run_with(name, turns, vec![deploy]);
    run.spec.approval_timeout_seconds = Some(5);
    env.create(&run).await;
    env.wait_run(name, RUN_TIMEOUT, "WaitingApproval", |s| {
        s.phase == Phase::WaitingApproval
    })
    .await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some("not deployed"));
    assert_eq!(
        effects(&env).count(name, 1),
        0,
        "a call nobody approved never runs"
    );
    let ledger: Vec<LedgerEvent> = env
        .ledger(name)
        .await
        .iter()
        .flat_map(|s| s.spec.events.clone())
        .collect();
    assert!(
        ledger.iter().any(|e| matches!(
            e,
            LedgerEvent::ApprovalDecided {
                outcome: baton::crd::v1alpha1::ApprovalOutcome::TimedOut,
                ..
            }
        )),
        "{ledger:?}"
    );
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}
