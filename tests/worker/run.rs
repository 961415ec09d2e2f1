//! `baton worker` against the real API server: a run from claim to Finishing, the handoff
//! on SIGTERM, a stop request, and the zombie that wakes up after its run was claimed again.

use std::time::Duration;

use crate::{EXIT_TIMEOUT, create, status};
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, Phase};
use baton::lease::{LeaseClient, lease_holder};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;
use kube::Api;
use kube::api::{Patch, PatchParams};

async fn lease_holder_of(ns: &TestNamespace, name: &str) -> Option<String> {
    let lease = LeaseClient::new(ns.client.clone(), &ns.name)
        .get(name)
        .await
        .unwrap()
        .unwrap();
    lease_holder(&lease).map(String::from)
}

#[tokio::test]
async fn worker_runs_a_scripted_turn_to_finishing() {
    let ns = TestNamespace::new("worker-happy").await;
    let counter = counter_file("happy");
    let cmd = format!(
        "echo x >> {}; echo step=$BATON_STEP fence=$BATON_FENCE",
        counter.display()
    );
    let script = vec![
        shell_turn("first", "sh", &cmd, 0),
        shell_turn("second", "sh", &cmd, 0),
        final_turn("all done", 0),
    ];
    create(
        &ns,
        &scripted_run(
            "happy",
            script,
            vec![shell_tool("sh", false)],
            LeaseSpec::default(),
        ),
    )
    .await;
    let pod = claim(&ns.client, &ns.name, "happy", 1).await;
    let mut worker = spawn_worker(&ns.name, "happy", 1, &pod, &[]);
    assert_eq!(worker.wait(EXIT_TIMEOUT).await, 0, "{}", worker.log_text());

    assert_eq!(count(&counter), 2);
    let st = status(&ns, "happy").await;
    assert_eq!(st.phase, Phase::Finishing);
    assert_eq!(st.outcome, Some(Phase::Succeeded));
    assert_eq!(st.output.as_deref(), Some("all done"));
    assert_eq!(st.steps, 2);
    assert!(
        st.ledger.as_ref().is_some_and(|l| l.segments >= 3),
        "{:?}",
        st.ledger
    );
    assert_eq!(
        lease_holder_of(&ns, "happy").await,
        None,
        "the lease was released"
    );

    let evs = events(&segments(&ns.client, &ns.name, "happy").await);
    assert!(matches!(evs[0].1, LedgerEvent::Claimed { fence, .. } if fence.get() == 1));
    assert!(matches!(
        evs[1].1,
        LedgerEvent::AttemptStarted { fence, .. } if fence.get() == 1
    ));
    assert!(
        matches!(&evs.last().unwrap().1, LedgerEvent::Final { output } if output == "all done")
    );
    let result = evs.iter().find_map(|(_, e)| match e {
        LedgerEvent::StepResult {
            step: 2, output, ..
        } => Some(output.clone()),
        _ => None,
    });
    assert_eq!(result.as_deref(), Some("step=2 fence=1\n[exit code: 0]"));
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_that_is_not_the_holder_exits_quietly() {
    let ns = TestNamespace::new("worker-superseded").await;
    create(
        &ns,
        &scripted_run(
            "sup",
            vec![final_turn("x", 0)],
            vec![],
            LeaseSpec::default(),
        ),
    )
    .await;
    claim(&ns.client, &ns.name, "sup", 1).await;
    let pod2 = claim(&ns.client, &ns.name, "sup", 2).await;
    let mut old = spawn_worker(&ns.name, "sup", 1, "sup-w1", &[]);
    assert_eq!(old.wait(EXIT_TIMEOUT).await, 0, "{}", old.log_text());
    let evs = events(&segments(&ns.client, &ns.name, "sup").await);
    assert_eq!(evs.len(), 2, "only the two seals: {evs:?}");
    assert_eq!(
        status(&ns, "sup").await.worker.as_deref(),
        Some(pod2.as_str())
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_hands_off_on_sigterm_and_the_next_worker_continues() {
    let ns = TestNamespace::new("worker-sigterm").await;
    let counter = counter_file("sigterm");
    let cmd = format!("echo x >> {}", counter.display());
    let script = vec![
        shell_turn("one", "sh", &cmd, 0),
        shell_turn("two", "sh", &cmd, 4000),
        final_turn("finished", 0),
    ];
    create(
        &ns,
        &scripted_run(
            "term",
            script,
            vec![shell_tool("sh", false)],
            LeaseSpec::default(),
        ),
    )
    .await;
    let pod = claim(&ns.client, &ns.name, "term", 1).await;
    let mut a = spawn_worker(&ns.name, "term", 1, &pod, &[]);
    wait_until(EXIT_TIMEOUT, "the first step's effect", || async {
        count(&counter) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal(libc::SIGTERM);
    assert_eq!(a.wait(EXIT_TIMEOUT).await, 0, "{}", a.log_text());

    let st = status(&ns, "term").await;
    assert_eq!(st.phase, Phase::Handoff);
    assert_eq!(lease_holder_of(&ns, "term").await, None);
    let evs = events(&segments(&ns.client, &ns.name, "term").await);
    assert_eq!(evs.last().unwrap().1, LedgerEvent::Handoff);

    let pod2 = claim(&ns.client, &ns.name, "term", 2).await;
    let mut b = spawn_worker(&ns.name, "term", 2, &pod2, &[]);
    assert_eq!(b.wait(EXIT_TIMEOUT).await, 0, "{}", b.log_text());
    let st = status(&ns, "term").await;
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded))
    );
    assert_eq!(count(&counter), 2, "each step ran once");
    assert!(st.unknown_effects.is_empty(), "{:?}", st.unknown_effects);
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_stops_on_request_and_kills_the_tool() {
    let ns = TestNamespace::new("worker-stop").await;
    let counter = counter_file("stop");
    let cmd = format!("echo x >> {}; sleep 30", counter.display());
    let script = vec![shell_turn("one", "sh", &cmd, 0), final_turn("never", 0)];
    create(
        &ns,
        &scripted_run(
            "stop",
            script,
            vec![shell_tool("sh", false)],
            LeaseSpec::default(),
        ),
    )
    .await;
    let pod = claim(&ns.client, &ns.name, "stop", 1).await;
    let mut a = spawn_worker(&ns.name, "stop", 1, &pod, &[]);
    wait_until(EXIT_TIMEOUT, "the tool to start", || async {
        count(&counter) == 1
    })
    .await;
    let runs: Api<AgentRun> = ns.api();
    let patch = serde_json::json!({"spec": {"stop": true}});
    runs.patch("stop", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert_eq!(a.wait(EXIT_TIMEOUT).await, 0, "{}", a.log_text());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the tool was killed, not waited for"
    );
    let st = status(&ns, "stop").await;
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Stopped))
    );
    let evs = events(&segments(&ns.client, &ns.name, "stop").await);
    assert_eq!(evs.last().unwrap().1, LedgerEvent::Stopped);
    ns.cleanup().await;
}
