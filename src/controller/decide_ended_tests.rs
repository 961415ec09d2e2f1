//! The decision's cases for runs that have ended: what they still hold is released (their
//! Lease, their thread, a live pod, their worker identity), a terminal claim's record is
//! completed, then the TTL. The fixtures are `decide_tests.rs`'.

use std::time::Instant;

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::crd::v1alpha1::Phase;

#[test]
fn terminal_runs_release_what_they_hold_then_wait_for_their_ttl() {
    let now = Instant::now();
    let mut r = run(Phase::Succeeded, 2, 0, 3);
    let held = Some(lease(L::Fresh, 2, now));
    assert_eq!(
        decide(&obs(&r, held, PodState::Terminated, now)).action,
        Action::ReleaseLease
    );
    let released = Some(lease(L::Released, 2, now));
    let mut o = obs(&r, released.clone(), PodState::Terminated, now);
    o.admission = Admission::Held;
    assert_eq!(decide(&o).action, Action::ReleaseAdmission);
    let running = PodState::Running {
        image: IMAGE.into(),
    };
    let d = decide(&obs(&r, released.clone(), running, now));
    assert_eq!(d.action, Action::DeletePod { rollout: false });
    assert_eq!(
        decide(&obs(&r, released.clone(), PodState::Terminated, now)).requeue,
        None
    );
    r.spec.ttl_seconds_after_finished = Some(60);
    let done = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(50);
    r.status.as_mut().unwrap().completion_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(done));
    let d = decide(&obs(&r, released.clone(), PodState::Terminated, now));
    assert_eq!(d.action, Action::Nothing);
    assert!(d.requeue.is_some_and(|t| t <= Duration::from_secs(10)));
    r.spec.ttl_seconds_after_finished = Some(10);
    assert_eq!(
        decide(&obs(&r, released, PodState::Terminated, now)).action,
        Action::DeleteRun
    );
}

/// A run ended by a terminal claim gets its `closed` record once the status has landed (a
/// later pass appends it if the pass that wrote the status stopped first), before anything
/// else; a run its worker ended has nothing to record.
#[test]
fn a_run_ended_by_a_terminal_claim_gets_its_record_once() {
    let now = Instant::now();
    let mut r = run(Phase::Interrupted, 3, 2, 2);
    {
        let s = r.status.as_mut().unwrap();
        s.worker = None;
        s.reason = Some(CloseReason::MaxAttemptsExceeded.as_str().into());
    }
    let held = Some(lease(L::Fresh, 2, now));
    let mut o = obs(&r, held, PodState::Terminated, now);
    assert_eq!(decide(&o).action, Action::RecordClose);
    o.close_recorded = true;
    assert_eq!(decide(&o).action, Action::ReleaseLease);
    // The worker ended it (its pod named), or the spec was refused before any claim.
    let mut by_worker = r.clone();
    by_worker.status.as_mut().unwrap().worker = Some("r-w3".into());
    let o = obs(&by_worker, None, PodState::Terminated, now);
    assert_eq!(decide(&o).action, Action::Nothing);
    let mut refused = r.clone();
    let s = refused.status.as_mut().unwrap();
    (s.fence, s.reason) = (Fence::new(0), Some("InvalidSpec".into()));
    assert_eq!(
        decide(&obs(&refused, None, PodState::Missing, now)).action,
        Action::Nothing
    );
}

/// An ended run's worker identity goes once nothing of its last attempt can still run: after
/// its Lease, its thread and a live pod are seen to, not while its pod is stopping, and before
/// its TTL deletes the run; never one it does not have (it names its own ServiceAccount).
#[test]
fn an_ended_run_gives_up_its_worker_identity_once_its_pod_is_gone() {
    let now = Instant::now();
    let mut r = run(Phase::Succeeded, 1, 0, 3);
    r.status.as_mut().unwrap().worker = Some("r-w1".into());
    let running = PodState::Running {
        image: IMAGE.into(),
    };
    let with_identity = |r: &AgentRun, lease: Option<LeaseObs>, pod: PodState| {
        let mut o = obs(r, lease, pod, now);
        o.identity_left = true;
        decide(&o).action
    };
    let held = Some(lease(L::Fresh, 1, now));
    assert_eq!(
        with_identity(&r, held, PodState::Missing),
        Action::ReleaseLease
    );
    assert_eq!(
        with_identity(&r, None, running),
        Action::DeletePod { rollout: false }
    );
    assert_eq!(with_identity(&r, None, PodState::Deleting), Action::Nothing);
    for gone in [
        PodState::Missing,
        PodState::Terminated,
        PodState::Unstartable {
            message: "secret \"k\" not found".into(),
        },
    ] {
        assert_eq!(with_identity(&r, None, gone), Action::RemoveIdentity);
    }
    r.spec.ttl_seconds_after_finished = Some(0);
    r.status.as_mut().unwrap().completion_time = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
    );
    assert_eq!(
        with_identity(&r, None, PodState::Terminated),
        Action::RemoveIdentity
    );
    // Removed (or none of baton's): the TTL's turn.
    let o = obs(&r, None, PodState::Terminated, now);
    assert_eq!(decide(&o).action, Action::DeleteRun);
}
