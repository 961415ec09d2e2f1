//! Resume beyond the plain crash: the zombie that wakes after its run was claimed again,
//! effect probes, idempotent re-runs, and askUser answered by a later worker.

use std::time::Duration;

use crate::{create, status};
use baton::crd::v1alpha1::{
    AgentRun, AgentRunStatus, LeaseSpec, LedgerEvent, Phase, ProbeSpec, ScriptToolCall, ScriptTurn,
    ToolKind, ToolSpec,
};
use baton::fence::Fence;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;
use kube::Api;
use kube::api::{Patch, PatchParams};

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn worker_zombie_writes_nothing_after_the_claim_and_exits() {
    let ns = TestNamespace::new("worker-zombie").await;
    let counter = counter_file("zombie");
    let cmd = format!("echo x >> {}; sleep 1", counter.display());
    let script = vec![
        shell_turn("one", "sh", &cmd, 0),
        shell_turn("two", "sh", &cmd, 500),
        final_turn("done", 0),
    ];
    let lease = LeaseSpec {
        duration_seconds: 3,
        renew_seconds: 1,
        startup_seconds: 30,
    };
    create(
        &ns,
        &scripted_run("zombie", script, vec![shell_tool("sh", false)], lease),
    )
    .await;
    let pod = claim(&ns.client, &ns.name, "zombie", 1).await;
    let mut a = spawn_worker(&ns.name, "zombie", 1, &pod, &[]);
    wait_until(TIMEOUT, "the first step", || async { count(&counter) == 1 }).await;
    a.signal(libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(3500)).await; // the lease expires
    let pod2 = claim(&ns.client, &ns.name, "zombie", 2).await;
    let seal = segments(&ns.client, &ns.name, "zombie").await.len() as i64;
    let mut b = spawn_worker(&ns.name, "zombie", 2, &pod2, &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.signal(libc::SIGCONT);
    let a_exit = a.wait(TIMEOUT).await;
    assert_eq!(b.wait(TIMEOUT).await, 0, "{}", b.log_text());
    assert_eq!(a_exit, 3, "the zombie exits as lost: {}", a.log_text());

    let segs = segments(&ns.client, &ns.name, "zombie").await;
    let late: Vec<_> = segs
        .iter()
        .filter(|s| s.spec.seq > seal && s.spec.fence == Fence::new(1))
        .collect();
    assert!(
        late.is_empty(),
        "the zombie wrote after the claim: {late:?}"
    );
    let st = status(&ns, "zombie").await;
    assert_eq!(
        (st.phase, st.outcome, st.fence.get()),
        (Phase::Finishing, Some(Phase::Succeeded), 2)
    );
    assert_eq!(st.unknown_effect_count, 1);
    assert_eq!(count(&counter), 2, "step 1 not re-run, step 2 run once");
    ns.cleanup().await;
}

/// Kills worker A while step 1's tool sleeps (its effect landed), resumes with B.
async fn kill_during_tool_then_resume(
    ns: &TestNamespace,
    tool: ToolSpec,
    counter: &std::path::Path,
) -> AgentRunStatus {
    let cmd = format!("echo x >> {}; sleep 20", counter.display());
    let script = vec![shell_turn("go", &tool.name, &cmd, 0), final_turn("done", 0)];
    create(
        ns,
        &scripted_run("r", script, vec![tool], LeaseSpec::default()),
    )
    .await;
    let pod = claim(&ns.client, &ns.name, "r", 1).await;
    let mut a = spawn_worker(&ns.name, "r", 1, &pod, &[]);
    wait_until(TIMEOUT, "the tool's effect", || async {
        count(counter) == 1
    })
    .await;
    a.kill9().await;
    let pod2 = claim(&ns.client, &ns.name, "r", 2).await;
    let mut b = spawn_worker(&ns.name, "r", 2, &pod2, &[]);
    assert_eq!(b.wait(TIMEOUT).await, 0, "{}", b.log_text());
    let st = status(ns, "r").await;
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded)),
        "{st:?}"
    );
    st
}

#[tokio::test]
async fn worker_probe_confirms_an_unknown_effect_and_does_not_rerun() {
    let ns = TestNamespace::new("worker-probe").await;
    let counter = counter_file("probe");
    let tool = ToolSpec {
        probe: Some(ProbeSpec {
            command: format!("[ \"$BATON_STEP\" = 1 ] && grep -q x {}", counter.display()),
            timeout_seconds: 10,
        }),
        ..shell_tool("sh", false)
    };
    let st = kill_during_tool_then_resume(&ns, tool, &counter).await;
    assert_eq!(count(&counter), 1);
    assert_eq!(st.unknown_effects[0].resolution.as_str(), "applied");
    let evs = events(&segments(&ns.client, &ns.name, "r").await);
    assert!(
        evs.iter()
            .any(|(_, e)| matches!(e, LedgerEvent::StepProbed { step: 1, .. }))
    );
    assert!(evs.iter().any(|(_, e)| matches!(e, LedgerEvent::StepResult { step: 1, output, .. } if output.contains("confirmed applied by probe"))));
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_reruns_an_idempotent_step_found_open() {
    let ns = TestNamespace::new("worker-idem").await;
    let counter = counter_file("idem");
    let tool = shell_tool("sh", true);
    // The re-run sleeps too: shorten it by making the command's sleep conditional on fence 1.
    let cmd_counter = counter.clone();
    let st = {
        let cmd = format!(
            "echo x >> {}; [ $BATON_FENCE = 1 ] && sleep 20; true",
            cmd_counter.display()
        );
        let script = vec![shell_turn("go", "sh", &cmd, 0), final_turn("done", 0)];
        create(
            &ns,
            &scripted_run("r", script, vec![tool], LeaseSpec::default()),
        )
        .await;
        let pod = claim(&ns.client, &ns.name, "r", 1).await;
        let mut a = spawn_worker(&ns.name, "r", 1, &pod, &[]);
        wait_until(TIMEOUT, "the tool's effect", || async {
            count(&counter) == 1
        })
        .await;
        a.kill9().await;
        let pod2 = claim(&ns.client, &ns.name, "r", 2).await;
        let mut b = spawn_worker(&ns.name, "r", 2, &pod2, &[]);
        assert_eq!(b.wait(TIMEOUT).await, 0, "{}", b.log_text());
        status(&ns, "r").await
    };
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded))
    );
    assert_eq!(count(&counter), 2, "idempotent: re-run");
    assert_eq!(st.unknown_effects[0].resolution.as_str(), "rerun");
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_waits_for_input_and_a_later_worker_consumes_the_answer() {
    let ns = TestNamespace::new("worker-ask").await;
    let ask = ScriptTurn {
        text: Some("I need to know".into()),
        tool_calls: vec![ScriptToolCall {
            tool: "ask".into(),
            arguments: [("question".to_string(), "your name?".to_string())].into(),
        }],
        delay_milliseconds: None,
        usage: None,
    };
    let tool = ToolSpec {
        kind: ToolKind::AskUser,
        ..shell_tool("ask", false)
    };
    create(
        &ns,
        &scripted_run(
            "ask",
            vec![ask, final_turn("hello", 0)],
            vec![tool],
            LeaseSpec::default(),
        ),
    )
    .await;
    let pod = claim(&ns.client, &ns.name, "ask", 1).await;
    let mut a = spawn_worker(&ns.name, "ask", 1, &pod, &[]);
    assert_eq!(a.wait(TIMEOUT).await, 0, "{}", a.log_text());
    let st = status(&ns, "ask").await;
    assert_eq!(st.phase, Phase::WaitingInput);
    assert_eq!(st.message.as_deref(), Some("your name?"));

    // A worker claimed before the answer arrives goes back to waiting.
    let pod2 = claim(&ns.client, &ns.name, "ask", 2).await;
    let mut b = spawn_worker(&ns.name, "ask", 2, &pod2, &[]);
    assert_eq!(b.wait(TIMEOUT).await, 0, "{}", b.log_text());
    assert_eq!(status(&ns, "ask").await.phase, Phase::WaitingInput);

    let runs: Api<AgentRun> = ns.api();
    let patch = serde_json::json!({"spec": {"inputs": ["bob"]}});
    runs.patch("ask", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let pod3 = claim(&ns.client, &ns.name, "ask", 3).await;
    let mut c = spawn_worker(&ns.name, "ask", 3, &pod3, &[]);
    assert_eq!(c.wait(TIMEOUT).await, 0, "{}", c.log_text());
    let st = status(&ns, "ask").await;
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded))
    );
    assert_eq!(st.inputs_consumed, 1);
    let evs = events(&segments(&ns.client, &ns.name, "ask").await);
    assert!(evs.iter().any(|(f, e)| *f == 3
        && *e
            == LedgerEvent::Input {
                index: 0,
                content: "bob".into()
            }));
    assert!(evs.iter().any(|(f, e)| *f == 3
        && matches!(e, LedgerEvent::StepResult { step: 1, output, .. } if output == "bob")));
    ns.cleanup().await;
}
