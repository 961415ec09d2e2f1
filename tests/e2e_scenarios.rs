//! End to end: rollouts, controller crashes and failover, runs that keep dying, thread
//! admission, stop, and askUser — with the controller and the local pod runner in-process and
//! real `baton worker` processes.

mod e2e_support;

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerEvent, Phase, Role, ScriptToolCall, ScriptTurn, ToolKind};
use e2e_support::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

fn done(name: &str, turns: usize) -> String {
    format!("{name}: all {turns} turns done")
}

async fn assert_all_succeeded(env: &E2e, names: &[String], turns: usize) {
    for name in names {
        let st = env.wait_succeeded(name).await;
        assert_eq!(st.output.as_deref(), Some(done(name, turns).as_str()));
    }
    env.check_invariants(names, true).await;
}

/// A worker rollout: the controller restarts with another worker image; live runs move to
/// pods of the new image by handoff (no attempt consumed) and finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_rollout_moves_live_runs_by_handoff() {
    let mut env = E2e::start_with(
        "rollout",
        Opts {
            worker_image: "baton:old".into(),
            images: vec!["baton:new".into()],
            ..Opts::default()
        },
    )
    .await;
    let script = Script::new(8, 1000);
    let names: Vec<String> = (1..=2).map(|i| format!("roll-{i}")).collect();
    env.create_scripted(&names, &script).await;
    for name in &names {
        env.wait_worker(name, 1).await;
        env.wait_effect(name, 1).await;
    }
    env.config.worker_image = "baton:new".into();
    env.start_controller(0);

    assert_all_succeeded(&env, &names, 8).await;
    for name in &names {
        let st = env.status(name).await;
        assert_eq!(
            st.failed_attempts, 0,
            "{name}: a rollout consumes no attempt"
        );
        let ledger = env.ledger(name).await;
        assert!(
            ledger
                .iter()
                .any(|s| s.spec.events.contains(&LedgerEvent::Handoff)),
            "{name} moved by handoff"
        );
        let last = baton::crd::worker_pod_name(name, st.fence);
        let images = env.pod_images.lock().unwrap().clone();
        assert_eq!(
            images
                .get(&baton::crd::worker_pod_name(name, 1))
                .map(String::as_str),
            Some("baton:old"),
            "{name} started on the old image: {images:?}"
        );
        assert_eq!(
            images.get(&last).map(String::as_str),
            Some("baton:new"),
            "{name} finished on the new image: {images:?}"
        );
    }
    env.finish().await;
}

/// The controller is killed mid-run; while it is down a worker dies too. Restarted, it picks
/// up where it stopped: both runs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_killed_and_restarted_mid_run() {
    let mut env = E2e::start("ctrl-restart").await;
    let script = Script::new(5, 1000);
    let names: Vec<String> = (1..=2).map(|i| format!("cr-{i}")).collect();
    env.create_scripted(&names, &script).await;
    let (pod, _, _) = env.wait_worker(&names[0], 1).await;
    env.wait_worker(&names[1], 1).await;
    env.wait_effect(&names[0], 1).await;
    env.kill_controller(0);
    env.runner.kill(&env.ns, &pod).expect("kill -9");
    tokio::time::sleep(Duration::from_secs(2)).await; // the controller stays down a while
    env.start_controller(0);

    assert_all_succeeded(&env, &names, 5).await;
    assert_eq!(env.status(&names[0]).await.failed_attempts, 1);
    env.finish().await;
}

/// Two controller replicas with leader election; the leader is killed (and a worker dies
/// right after): the other replica takes the lead and the runs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_the_other_replica_takes_over() {
    let mut env = E2e::start_with(
        "leader",
        Opts {
            controllers: 2,
            ..Opts::default()
        },
    )
    .await;
    let script = Script::new(5, 1000);
    let names: Vec<String> = (1..=2).map(|i| format!("le-{i}")).collect();
    env.create_scripted(&names, &script).await;
    let (pod, _, _) = env.wait_worker(&names[0], 1).await;
    env.wait_effect(&names[0], 1).await;

    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let lease = retry(|| leases.get(baton::controller::LEADER_LEASE_NAME)).await;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .expect("a leader");
    let leader = env
        .identities
        .iter()
        .position(|id| *id == holder)
        .unwrap_or_else(|| panic!("leader {holder} is none of {:?}", env.identities));
    env.kill_controller(leader);
    env.runner.kill(&env.ns, &pod).expect("kill -9");

    assert_all_succeeded(&env, &names, 5).await;
    let lease = retry(|| leases.get(baton::controller::LEADER_LEASE_NAME)).await;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(env.identities[1 - leader].as_str()),
        "the surviving replica leads"
    );
    env.finish().await;
}

/// Every attempt dies (the tool kills its own worker with kill -9): after maxAttempts the run
/// ends Interrupted (MaxAttemptsExceeded) with its partial output and transcript salvaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_always_dies_ends_interrupted() {
    let env = E2e::start("always-dies").await;
    let name = "doomed";
    let mut turns = vec![ScriptTurn {
        text: Some("first, a harmless step".into()),
        tool_calls: vec![call(
            "sh",
            "command",
            &effect_command(&env.effects, name, 1, 0),
        )],
        delay_milliseconds: Some(200),
    }];
    // From turn 2 on, each tool call records its effect and then kills its own worker:
    // an unknown step is not re-run, so the resumed attempt dies on the next turn.
    for t in 2..=6 {
        let cmd = format!(
            "{}; kill -9 $PPID; sleep 5",
            effect_command(&env.effects, name, t, 0)
        );
        turns.push(ScriptTurn {
            text: Some(format!("attempting step {t}")),
            tool_calls: vec![call("sh", "command", &cmd)],
            delay_milliseconds: Some(200),
        });
    }
    turns.push(ScriptTurn {
        text: Some("never reached".into()),
        ..ScriptTurn::default()
    });
    let mut run = run_with(name, turns, vec![shell_tool("sh")]);
    run.spec.max_attempts = 2;
    env.create(&run).await;

    let st = env.wait_terminal(name).await;
    assert_eq!(
        st.phase,
        Phase::Interrupted,
        "{st:#?}\n{}",
        env.pod_logs(name)
    );
    assert_eq!(st.reason.as_deref(), Some("MaxAttemptsExceeded"), "{st:#?}");
    assert_eq!(st.failed_attempts, 2, "{st:#?}");
    assert!(st.output_partial, "the output is a salvage: {st:#?}");
    let output = st.output.clone().unwrap_or_default();
    assert!(!output.is_empty(), "partial output salvaged: {st:#?}");
    assert!(
        st.unknown_effects.len() >= 2,
        "each dead attempt left its step unknown: {:#?}",
        st.unknown_effects
    );
    // The transcript survives: the assistant's turns and the first step's result are in the
    // ledger (the user's input is spec.input), which ends with the controller's `closed` seal.
    let ledger = env.ledger(name).await;
    let events: Vec<&LedgerEvent> = ledger.iter().flat_map(|s| &s.spec.events).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, LedgerEvent::StepResult { step: 1, .. }))
    );
    assert!(
        events
            .iter()
            .filter(|e| matches!(
                e,
                LedgerEvent::Message {
                    role: Role::Assistant,
                    ..
                }
            ))
            .count()
            >= 2
    );
    assert!(matches!(events.last(), Some(LedgerEvent::Closed { .. })));
    assert_eq!(env.effects().count(name, 1), 1);
    env.check_invariants(&[name.to_string()], true).await;
    env.finish().await;
}

/// Two runs on one thread key run strictly one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_on_one_thread_run_one_after_the_other() {
    let env = E2e::start("thread").await;
    let script = Script::new(3, 800);
    let names: Vec<String> = vec!["first".into(), "second".into()];
    for name in &names {
        let mut run = scripted_run(&env.effects, name, &script);
        run.spec.thread_key = Some("thread-a".into());
        env.create(&run).await;
    }
    env.wait_worker("first", 1).await;
    assert_eq!(
        env.status("second").await.phase,
        Phase::Pending,
        "the second run waits while the first is live"
    );
    assert_all_succeeded(&env, &names, 3).await;
    // Every effect of the first precedes every effect of the second.
    let lines = env.effects().lines;
    let last_first = lines.iter().rposition(|(r, ..)| r == "first").unwrap();
    let first_second = lines.iter().position(|(r, ..)| r == "second").unwrap();
    assert!(last_first < first_second, "interleaved: {lines:?}");
    env.finish().await;
}

/// spec.stop → the worker stops the step in flight and the run ends Stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_the_run_stopped() {
    let env = E2e::start("stop").await;
    let name = "stopme";
    let script = Script::new(3, 30_000);
    env.start_run(name, &script).await;
    let asked = Instant::now();
    env.stop(name).await;
    let st = env.wait_terminal(name).await;
    assert_eq!(st.phase, Phase::Stopped, "{st:#?}\n{}", env.pod_logs(name));
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "stopped before the 30 s tool ended (the step was cancelled)"
    );
    assert_eq!(
        env.effects().count(name, 2),
        0,
        "nothing ran after the stop"
    );
    env.check_invariants(&[name.to_string()], true).await;
    env.finish().await;
}

/// askUser → WaitingInput (the worker exits) → an input → resumed in a new pod → Succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_user_waits_for_input_then_resumes() {
    let env = E2e::start("ask").await;
    let name = "ask";
    let turns = vec![
        ScriptTurn {
            text: Some("Which environment?".into()),
            tool_calls: vec![call("ask", "question", "staging or production?")],
            delay_milliseconds: Some(200),
        },
        ScriptTurn {
            text: Some("deploying".into()),
            tool_calls: vec![call(
                "sh",
                "command",
                &effect_command(&env.effects, name, 2, 0),
            )],
            delay_milliseconds: Some(200),
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
    // The worker of the waiting run exits.
    let pod = st.worker.clone().unwrap_or_default();
    let deadline = Instant::now() + RUN_TIMEOUT;
    while env.runner.pid(&env.ns, &pod).is_some() {
        assert!(Instant::now() < deadline, "the waiting worker never exited");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.effects().count(name, 2), 0);

    env.answer(name, "staging").await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some("deployed"));
    assert!(st.fence > waiting_fence, "resumed in a new pod");
    assert_eq!(st.failed_attempts, 0, "an input wait consumes no attempt");
    assert_eq!(env.effects().count(name, 2), 1);
    let ledger = env.ledger(name).await;
    assert!(
        ledger
            .iter()
            .flat_map(|s| &s.spec.events)
            .any(|e| matches!(e, LedgerEvent::Input { content, .. } if content == "staging"))
    );
    env.check_invariants(&[name.to_string()], true).await;
    env.finish().await;
}

fn call(tool: &str, arg: &str, value: &str) -> ScriptToolCall {
    ScriptToolCall {
        tool: tool.into(),
        arguments: [(arg.to_string(), value.to_string())].into(),
    }
}
