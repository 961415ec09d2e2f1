//! A ledger holding an event of a kind this worker does not know (a newer baton wrote it, as
//! during a rollout): the worker resumes the run past it, says so in a Warning Event naming
//! the kind, and the event stays in the ledger whole.

use crate::{EXIT_TIMEOUT, create};
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, Phase, Role, UnrecognizedEvent};
use baton::fence::Fence;
use baton::ledger::SegmentStore;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, segments};
use baton_testkit::common::events::notes;
use baton_testkit::common::worker_proc::*;
use kube::Api;

#[tokio::test]
async fn a_worker_resumes_past_an_event_of_a_newer_kind_and_says_so() {
    let ns = TestNamespace::new("worker-newer-kind").await;
    let run = scripted_run(
        "newer",
        vec![final_turn("done", 0)],
        vec![],
        LeaseSpec::default(),
    );
    create(&ns, &run).await;
    // Attempt 1, as a newer worker would have written it: the input, then a kind of its own.
    claim(&ns.client, &ns.name, "newer", 1).await;
    let newer =
        serde_json::json!({"type": "responsesCall", "callId": "g1", "request": {"model": "m"}});
    let newer = UnrecognizedEvent(newer.as_object().unwrap().clone());
    let runs: Api<AgentRun> = ns.api();
    let store = SegmentStore::for_run(ns.client.clone(), &runs.get("newer").await.unwrap());
    let first = vec![
        LedgerEvent::AttemptStarted {
            fence: Fence::new(1),
            pod: "newer-1".into(),
        },
        LedgerEvent::Message {
            role: Role::User,
            content: "do the thing".into(),
        },
        LedgerEvent::Unrecognized(newer.clone()),
    ];
    store
        .append(1, Fence::new(1), first)
        .await
        .expect("attempt 1's write");

    let pod = claim(&ns.client, &ns.name, "newer", 2).await;
    let mut worker = spawn_worker(&ns.name, "newer", 2, &pod, &[]);
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", worker.log_text());

    let st = runs.get("newer").await.unwrap().status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("done"));
    let kept = segments(&ns.client, &ns.name, "newer").await;
    let kept: Vec<_> = kept.iter().flat_map(|s| s.spec.events.clone()).collect();
    assert!(kept.contains(&LedgerEvent::Unrecognized(newer)), "{kept:?}");
    let said = notes(&ns.api(), "newer", "UnrecognizedLedgerEvents").await;
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("responsesCall"), "{said:?}");
}
