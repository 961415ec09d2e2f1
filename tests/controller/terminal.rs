//! The terminal claim is a claim (docs/protocol.md, "The terminal claim"): the two traces in
//! which a give-up, decided on a view of the run that was already behind, sealed the ledger
//! after the very attempt it judged dead had handed off. The test holds the controller's stale
//! copy of the run and applies the controller's own decision on it (`controller::testing`),
//! then lets a controller with a fresh cache go on.

use std::time::{Duration, Instant};

use baton::controller::decide::{
    Action, Admission, CloseReason, LeaseObs, Observation, PodState, RolloutPolicy, decide,
};
use baton::controller::testing::{self, Applied};
use baton::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerStats, Phase, Resolution, UnknownEffect};
use baton::fence::Fence;
use baton::lease::LeaseSighting;
use baton::ledger::SegmentStore;
use baton::status::cas_status;
use baton_testkit::controller::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

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
    let fence = Fence::of_run(run);
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
        on_busy: baton::crd::v1alpha1::BusyPolicy::Enqueue,
        holder_stopping: false,
        stop_seen_at: None,
        desired_image: "baton:dev".into(),
        rollout: RolloutPolicy::Keep,
        rollout_slot: false,
        rolled_out: false,
        close_recorded: false,
        identity_left: true,
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
    let (fence, pod) = (w.fence, w.pod.clone());
    w.finish(vec![LedgerEvent::AttemptStarted { fence, pod }])
        .await;
}

/// After the stale give-up: a controller with a fresh cache claims the handoff (no failed
/// attempt), the next worker finishes, and the run succeeds, with one seal per fence.
async fn claimed_again_as_the_handoff_and_succeeds(ns: &TestNamespace) {
    let _c = start(&ns.client, config(&ns.name));
    let run = wait_run(ns, "r", T, |s| {
        s.fence >= Fence::new(2) || s.phase.is_terminal()
    })
    .await;
    let s = status(&run);
    assert_eq!(
        (
            s.phase,
            s.fence.get(),
            s.failed_attempts,
            s.reason.as_deref()
        ),
        (Phase::Running, 2, 0, Some("Handoff")),
        "a handed-off run is claimed again, not ended: {s:#?}"
    );
    wait_lease(ns, "r", "r-w2", 2, T).await;
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
/// looks like a death, which with `maxAttempts: 1` gives the run up. The terminal claim finds
/// the run changed before it seals anything (before the rule it sealed `closed{2}` after the
/// handoff, and the run ended Interrupted); were it to seal, trace 2 below shows the rest.
#[tokio::test]
async fn a_give_up_decided_on_a_stale_copy_of_a_handed_off_run_becomes_its_handoff_claim() {
    let (ns, controller, _) = started("ctl-term-stale", one_attempt_run()).await;
    drop(controller);
    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    w1.renew().await.unwrap();
    let pod = w1.pod.clone();
    w1.append(vec![LedgerEvent::AttemptStarted {
        fence: Fence::new(1),
        pod,
    }])
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
/// the controller gives up on it, confirms the run unchanged and finds the ledger's end; then
/// the worker wakes, starts, hands off and releases its Lease, all before the seal, which
/// walks past its writes. The give-up's status CAS loses to `Handoff`, and its `claimed{2}`
/// seal, after the handoff, is the one the handoff's claim reuses.
#[tokio::test]
async fn a_give_up_on_a_paused_worker_that_hands_off_before_the_seal_becomes_its_handoff_claim() {
    let (ns, controller, _) = started("ctl-term-pause", one_attempt_run()).await;
    drop(controller);
    let current = get(&ns, "r").await;
    let action = decided_on(&current, true, false);
    let Action::Close(give_up) = &action else {
        panic!("a give-up: {action:?}");
    };
    assert!(is_give_up(&action));

    let mut w1 = FakeWorker::new(&ns, "r", 1);
    let wakes = async {
        w1.resume().await;
        let pod = w1.pod.clone();
        w1.append(vec![LedgerEvent::AttemptStarted {
            fence: Fence::new(1),
            pod,
        }])
        .await
        .unwrap();
        hand_off(&mut w1).await;
    };
    let ctx = testing::detached(ns.client.clone());
    let applied = testing::terminal_claim_paused(&ctx, &current, give_up, wakes)
        .await
        .unwrap();
    assert_eq!(applied, Applied::Conflict, "the status moved on: Handoff");
    let segments = ledger(&ns, "r").await;
    let handoff = segments
        .iter()
        .position(|s| s.spec.events.contains(&LedgerEvent::Handoff));
    assert!(
        handoff.is_some_and(|h| h + 1 < segments.len()),
        "the seal landed after the handoff: {:?}",
        seals(&segments)
    );
    assert_eq!(
        seals(&segments),
        vec![(1, false), (2, false)],
        "a `claimed` seal, no `closed`"
    );
    claimed_again_as_the_handoff_and_succeeds(&ns).await;
    ns.cleanup().await;
}

/// A run whose one attempt died in the middle of a step, with `maxAttempts: 1`, and what its
/// worker wrote: the first claim was made by a controller that then stopped.
async fn a_run_that_died_mid_step(test: &str) -> TestNamespace {
    let (ns, controller, _) = started(test, one_attempt_run()).await;
    drop(controller);
    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    w1.renew().await.unwrap();
    let events = died_mid_step(1, &w1.pod);
    w1.append(events).await.unwrap();
    ns
}

/// The terminal claim's seal, `claimed{2}`, as a controller writes it before it stops.
async fn seal_as_the_controller(ns: &TestNamespace) -> i64 {
    let run = get(ns, "r").await;
    let store = SegmentStore::for_run(ns.client.clone(), &run);
    let tail = store.list().await.unwrap().len() as i64;
    let claimed = LedgerEvent::Claimed {
        fence: Fence::new(2),
        pod: "r-w2".into(),
    };
    store
        .append(tail, Fence::new(2), vec![claimed])
        .await
        .unwrap()
        .tail
}

/// The run ended exactly once, with its salvage: Interrupted at fence 2, one failed attempt,
/// the partial answer and the step in flight reported; the ledger holds one seal per fence and
/// one `closed` record, the open step reported unknown in it.
async fn ended_once_with_its_salvage(ns: &TestNamespace) {
    let run = wait_run(ns, "r", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(
        (
            s.phase,
            s.fence.get(),
            s.failed_attempts,
            s.reason.as_deref()
        ),
        (Phase::Interrupted, 2, 1, Some("MaxAttemptsExceeded")),
        "{s:#?}"
    );
    assert!(
        s.output
            .as_deref()
            .unwrap_or_default()
            .contains("partial answer")
    );
    assert_eq!(s.unknown_effects.len(), 1, "{:?}", s.unknown_effects);
    let segments = ledger_recorded(ns, "r").await;
    // Another pass or two must not record it again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = ledger(ns, "r").await;
    assert_eq!(again.len(), segments.len(), "the end is recorded once");
    assert_eq!(seals(&again), vec![(1, false), (2, false), (2, true)]);
    let record = &again.last().unwrap().spec.events;
    assert!(
        matches!(
            record.as_slice(),
            [
                LedgerEvent::StepUnknown { step: 1, .. },
                LedgerEvent::Closed { fence, .. }
            ] if fence.get() == 2
        ),
        "{record:?}"
    );
    let completed = status(&get(ns, "r").await).completion_time;
    assert_eq!(completed, s.completion_time, "the status was written once");
}

/// A controller stopped right after its terminal claim's seal: the next one decides again,
/// reuses the seal, and ends the run with its salvage.
#[tokio::test]
async fn a_terminal_claim_stopped_after_its_seal_ends_the_run_once() {
    let ns = a_run_that_died_mid_step("ctl-term-seal").await;
    seal_as_the_controller(&ns).await;
    let _c = start(&ns.client, config(&ns.name));
    ended_once_with_its_salvage(&ns).await;
    ns.cleanup().await;
}

/// A controller stopped right after its terminal claim's status CAS: the next one appends the
/// `closed` record, once, and leaves the status as it was.
#[tokio::test]
async fn a_terminal_claim_stopped_after_its_status_gets_its_record_from_the_next_pass() {
    let ns = a_run_that_died_mid_step("ctl-term-status").await;
    let seal = seal_as_the_controller(&ns).await;
    let run = get(&ns, "r").await;
    let mut s = status(&run);
    s.phase = Phase::Interrupted;
    (s.fence, s.attempt, s.failed_attempts, s.worker) = (Fence::new(2), 2, 1, None);
    s.reason = Some("MaxAttemptsExceeded".into());
    s.output = Some("partial answer".into());
    s.output_partial = true;
    s.unknown_effects = vec![UnknownEffect {
        step: 1,
        tool: "sh".into(),
        attempt: Fence::new(1),
        resolution: Resolution::Unknown,
        summary: "sh rm -rf /tmp/x".into(),
    }];
    s.ledger = Some(LedgerStats {
        segments: seal,
        ..LedgerStats::default()
    });
    s.completion_time = Some(Time(Timestamp::now()));
    cas_status(&ns.api(), &run, s).await.unwrap();
    let _c = start(&ns.client, config(&ns.name));
    ended_once_with_its_salvage(&ns).await;
    // The run's Lease is released, after the status: waited for, not read at once.
    wait_lease_released(&ns, "r", 2, T).await;
    ns.cleanup().await;
}
