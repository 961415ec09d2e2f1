//! The terminal claim is a claim (docs/protocol.md, "The terminal claim"): the two traces in
//! which a give-up, decided on a view of the run that was already behind, sealed the ledger
//! after the very attempt it judged dead had handed off. The test holds the controller's stale
//! copy of the run and applies the controller's own decision on it (`controller::testing`),
//! then lets a controller with a fresh cache go on.

use std::time::{Duration, Instant};

use crate::controller_support::*;
use baton::controller::decide::{
    Action, Admission, CloseReason, LeaseObs, Observation, PodState, RolloutPolicy, decide,
};
use baton::controller::testing::{self, Applied};
use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Phase};
use baton::lease::LeaseSighting;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// A run with one attempt to spend: a death gives it up.
fn one_attempt_run() -> AgentRun {
    let mut run = agent_run("r", 3);
    run.spec.max_attempts = 1;
    run
}

/// What a controller decides on `run` when the run's Lease (released or not) has not changed
/// on its clock for longer than any allowance.
fn decided_on(run: &AgentRun, held: bool, renewed: bool) -> Action {
    let now = Instant::now();
    let fence = run.status.as_ref().map_or(0, |s| s.fence);
    let lease = LeaseObs {
        holder: held.then(|| format!("r-w{fence}")),
        fence: Some(fence),
        sighting: LeaseSighting {
            version: "seen".into(),
            seen_at: now.checked_sub(Duration::from_secs(30)).unwrap(),
            renewed,
            held,
        },
    };
    let obs = Observation {
        run,
        lease: Some(lease),
        pod: PodState::Running {
            image: "baton:dev".into(),
        },
        admission: Admission::NotRequired,
        stop_seen_at: None,
        desired_image: "baton:dev".into(),
        rollout: RolloutPolicy::Keep,
        rollout_slot: false,
        close_recorded: false,
        now,
        wall: Timestamp::now(),
    };
    decide(&obs).action
}

fn is_give_up(action: &Action) -> bool {
    matches!(action, Action::Close(c) if c.reason == CloseReason::MaxAttemptsExceeded)
}

/// The worker of `fence` hands off as a worker does on SIGTERM: `handoff` in the ledger, the
/// status `Handoff`, the Lease released.
async fn hand_off(w: &mut FakeWorker) {
    w.append(vec![LedgerEvent::Handoff]).await.unwrap();
    w.write_status(|s| s.phase = Phase::Handoff).await.unwrap();
    w.lease.release().await.unwrap();
}

/// The attempt of `fence` starts and ends with a final answer.
async fn finish(ns: &TestNamespace, fence: i64) {
    let mut w = FakeWorker::new(ns, "r", fence);
    w.resume().await;
    w.renew().await.unwrap();
    let pod = w.pod.clone();
    w.append(vec![
        LedgerEvent::AttemptStarted { fence, pod },
        LedgerEvent::Final {
            output: "done".into(),
        },
    ])
    .await
    .unwrap();
    w.write_status(|s| {
        s.phase = Phase::Finishing;
        s.outcome = Some(Phase::Succeeded);
        s.output = Some("done".into());
    })
    .await
    .unwrap();
}

/// After the stale give-up: a controller with a fresh cache claims the handoff (no failed
/// attempt), the next worker finishes, and the run succeeds, with one seal per fence.
async fn claimed_again_as_the_handoff_and_succeeds(ns: &TestNamespace) {
    let _c = start(&ns.client, config(&ns.name));
    let run = wait_run(ns, "r", T, |s| s.fence >= 2 || s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(
        (s.phase, s.fence, s.failed_attempts, s.reason.as_deref()),
        (Phase::Running, 2, 0, Some("Handoff")),
        "a handed-off run is claimed again, not ended: {s:#?}"
    );
    finish(ns, 2).await;
    let run = wait_run(ns, "r", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!((s.phase, s.failed_attempts), (Phase::Succeeded, 0));
    let segments = ledger(ns, "r").await;
    assert_eq!(
        seals(&segments),
        vec![(1, false), (2, false)],
        "the give-up's seal was reused by the handoff's claim"
    );
}

/// Trace 1 (stale cache, one fault): the worker hands off and releases its Lease while the
/// controller's copy still says Running; the released Lease, unchanged past its allowance,
/// looks like a death, which with `maxAttempts: 1` gives the run up.
#[tokio::test]
async fn a_give_up_decided_on_a_stale_copy_of_a_handed_off_run_becomes_its_handoff_claim() {
    let (ns, controller, _) = started("ctl-term-stale", one_attempt_run()).await;
    drop(controller);
    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    w1.renew().await.unwrap();
    let pod = w1.pod.clone();
    w1.append(vec![LedgerEvent::AttemptStarted { fence: 1, pod }])
        .await
        .unwrap();
    let stale = get(&ns, "r").await;
    hand_off(&mut w1).await;

    let action = decided_on(&stale, false, true);
    assert!(is_give_up(&action), "{action:?}");
    let ctx = testing::detached(ns.client.clone());
    let applied = testing::apply_on(&ctx, &stale, &action).await.unwrap();
    assert_eq!(applied, Applied::Conflict, "the status moved on: Handoff");
    claimed_again_as_the_handoff_and_succeeds(&ns).await;
    ns.cleanup().await;
}

/// Trace 2 (pause): the worker is paused past its startup allowance before its first write;
/// the controller gives up on it; the worker wakes, starts, hands off and releases its Lease
/// before the controller's seal lands.
#[tokio::test]
async fn a_give_up_on_a_paused_worker_that_hands_off_meanwhile_becomes_its_handoff_claim() {
    let (ns, controller, _) = started("ctl-term-pause", one_attempt_run()).await;
    drop(controller);
    let stale = get(&ns, "r").await;
    let action = decided_on(&stale, true, false);
    assert!(is_give_up(&action), "{action:?}");

    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    let pod = w1.pod.clone();
    w1.append(vec![LedgerEvent::AttemptStarted { fence: 1, pod }])
        .await
        .unwrap();
    hand_off(&mut w1).await;

    let ctx = testing::detached(ns.client.clone());
    let applied = testing::apply_on(&ctx, &stale, &action).await.unwrap();
    assert_eq!(applied, Applied::Conflict, "the status moved on: Handoff");
    assert_eq!(stale.name_any(), "r");
    claimed_again_as_the_handoff_and_succeeds(&ns).await;
    ns.cleanup().await;
}
