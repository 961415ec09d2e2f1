//! Table-driven tests of `decide`: phase × lease state × pod state × attempts left.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::crd::v1alpha1::Phase;
use crate::lease::LeaseSighting;

const IMAGE: &str = "baton:v1";

/// Lease states, as the controller's clock sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L {
    /// Renewed 5 s ago (duration 30).
    Fresh,
    /// Unchanged for 31 s after renewals.
    Expired,
    /// Holder cleared 5 s ago (handoff / input wait / finish).
    Released,
    /// Moved to the new pod 60 s ago, no renewal yet (startup 300).
    Startup,
    /// Moved, never renewed, past startupSeconds.
    StartupExpired,
}

const LEASES: [L; 5] = [
    L::Fresh,
    L::Expired,
    L::Released,
    L::Startup,
    L::StartupExpired,
];

fn pods() -> Vec<PodState> {
    vec![
        PodState::Missing,
        PodState::Pending {
            image: IMAGE.into(),
            unbound_claim: None,
            started: false,
        },
        PodState::Running {
            image: IMAGE.into(),
        },
        PodState::Terminated,
        PodState::Deleting,
    ]
}

fn run(phase: Phase, fence: i64, failed: i32, max_attempts: i32) -> AgentRun {
    AgentRun::builder("r")
        .namespace("ns")
        .stored("u")
        .max_attempts(max_attempts)
        .reply("x")
        .at(phase, fence, failed)
        .build()
}

fn lease(state: L, fence: i64, now: Instant) -> LeaseObs {
    let (ago, renewed, held) = match state {
        L::Fresh => (5, true, true),
        L::Expired => (31, true, true),
        L::Released => (5, true, false),
        L::Startup => (60, false, true),
        L::StartupExpired => (301, false, true),
    };
    LeaseObs {
        holder: held.then(|| format!("r-w{fence}")),
        fence: Some(Fence::new(fence)),
        sighting: LeaseSighting {
            version: "7".into(),
            seen_at: now - Duration::from_secs(ago),
            renewed,
            held,
        },
    }
}

fn obs<'a>(
    run: &'a AgentRun,
    lease: Option<LeaseObs>,
    pod: PodState,
    now: Instant,
) -> Observation<'a> {
    Observation {
        run,
        lease,
        pod,
        admission: Admission::NotRequired,
        on_busy: crate::crd::v1alpha1::BusyPolicy::Enqueue,
        holder_stopping: false,
        stop_seen_at: None,
        desired_image: IMAGE.into(),
        rollout: RolloutPolicy::Handoff,
        rollout_slot: true,
        rolled_out: false,
        close_recorded: false,
        identity_left: false,
        now,
        wall: Timestamp::now(),
    }
}

fn claim(reason: ClaimReason, failed: bool) -> Action {
    Action::Claim(Claim { reason, failed })
}

fn is_give_up(action: &Action) -> bool {
    matches!(action, Action::Close(c) if c.phase() == Phase::Interrupted && c.reason == CloseReason::MaxAttemptsExceeded)
}

/// What a Running run must do, for every lease × pod state, with attempts left.
fn expected_running(l: L, pod: &PodState) -> Action {
    match (pod, l) {
        (PodState::Terminated, _) => claim(ClaimReason::PodTerminated, true),
        // The Lease names the pod: renewed → the pod existed → gone; never renewed → grace.
        (PodState::Missing, L::Fresh | L::Expired | L::Released) => {
            claim(ClaimReason::PodGone, true)
        }
        (PodState::Missing, L::Startup | L::StartupExpired) => claim(ClaimReason::PodGone, false),
        (_, L::Expired | L::StartupExpired) => claim(ClaimReason::LeaseExpired, true),
        _ => Action::Nothing,
    }
}

#[test]
fn running_phase_over_every_lease_and_pod_state_with_attempts_left() {
    let now = Instant::now();
    let r = run(Phase::Running, 2, 1, 3);
    for l in LEASES {
        for pod in pods() {
            let d = decide(&obs(&r, Some(lease(l, 2, now)), pod.clone(), now));
            assert_eq!(
                d.action,
                expected_running(l, &pod),
                "lease {l:?}, pod {pod:?}"
            );
        }
    }
}

#[test]
fn running_phase_with_the_budget_spent_gives_up_on_every_death() {
    let now = Instant::now();
    let r = run(Phase::Running, 3, 2, 3);
    for l in LEASES {
        for pod in pods() {
            let d = decide(&obs(&r, Some(lease(l, 3, now)), pod.clone(), now));
            match expected_running(l, &pod) {
                Action::Claim(Claim { failed: true, .. }) => {
                    assert!(
                        is_give_up(&d.action),
                        "lease {l:?}, pod {pod:?}: {:?}",
                        d.action
                    )
                }
                other => assert_eq!(d.action, other, "lease {l:?}, pod {pod:?}"),
            }
        }
    }
}

#[test]
fn a_live_lease_is_looked_at_again_exactly_when_it_would_expire() {
    let now = Instant::now();
    let r = run(Phase::Running, 1, 0, 3);
    let running = PodState::Running {
        image: IMAGE.into(),
    };
    let fresh = decide(&obs(
        &r,
        Some(lease(L::Fresh, 1, now)),
        running.clone(),
        now,
    ));
    assert_eq!(fresh.requeue, Some(Duration::from_secs(25)));
    let startup = decide(&obs(&r, Some(lease(L::Startup, 1, now)), running, now));
    assert_eq!(startup.requeue, Some(Duration::from_secs(240)));
}

#[test]
fn a_missing_never_renewed_pod_waits_for_the_create_grace_first() {
    let now = Instant::now();
    let r = run(Phase::Running, 1, 0, 3);
    let mut l = lease(L::Startup, 1, now);
    l.sighting.seen_at = now - Duration::from_secs(3);
    let d = decide(&obs(&r, Some(l), PodState::Missing, now));
    assert_eq!(d.action, Action::Nothing);
    assert_eq!(d.requeue, Some(POD_CREATE_GRACE - Duration::from_secs(3)));
}

#[test]
fn status_ahead_of_the_lease_completes_the_claim_whatever_the_pod() {
    let now = Instant::now();
    let r = run(Phase::Running, 2, 0, 3);
    for l in LEASES {
        for pod in pods() {
            let behind = decide(&obs(&r, Some(lease(l, 1, now)), pod.clone(), now));
            assert_eq!(
                behind.action,
                Action::CompleteClaim,
                "lease {l:?}, pod {pod:?}"
            );
        }
        let missing = decide(&obs(&r, None, PodState::Missing, now));
        assert_eq!(missing.action, Action::CompleteClaim);
    }
}

#[test]
fn handoff_is_claimed_at_once_without_a_failed_attempt_even_with_the_budget_spent() {
    let now = Instant::now();
    let r = run(Phase::Handoff, 3, 2, 3);
    for l in LEASES {
        for pod in pods() {
            let d = decide(&obs(&r, Some(lease(l, 3, now)), pod.clone(), now));
            assert_eq!(
                d.action,
                claim(ClaimReason::Handoff, false),
                "lease {l:?}, pod {pod:?}"
            );
        }
    }
}

#[test]
fn rollout_moves_a_live_run_off_an_old_image_at_a_bounded_pace_or_keeps_it() {
    let now = Instant::now();
    let r = run(Phase::Running, 1, 0, 3);
    let old = PodState::Running {
        image: "baton:v0".into(),
    };
    let mut o = obs(&r, Some(lease(L::Fresh, 1, now)), old, now);
    assert_eq!(decide(&o).action, Action::DeletePod { rollout: true });
    o.rollout_slot = false;
    assert_eq!(
        decide(&o),
        Decision {
            action: Action::Nothing,
            requeue: Some(ROLLOUT_RECHECK)
        }
    );
    o.rollout_slot = true;
    o.rollout = RolloutPolicy::Keep;
    assert_eq!(decide(&o).action, Action::Nothing);
    // A worker that never renewed cannot hand off yet: no rollout.
    o.rollout = RolloutPolicy::Handoff;
    o.lease = Some(lease(L::Startup, 1, now));
    assert_eq!(decide(&o).action, Action::Nothing);
}

#[test]
fn a_pod_the_rollout_deleted_that_did_not_hand_off_costs_the_run_no_attempt() {
    let now = Instant::now();
    // Two deaths already, of three allowed: one more would end the run.
    let r = run(Phase::Running, 3, 2, 3);
    for (pod, reason) in [
        (PodState::Missing, ClaimReason::PodGone),
        (PodState::Terminated, ClaimReason::PodTerminated),
    ] {
        let mut o = obs(&r, Some(lease(L::Fresh, 3, now)), pod, now);
        o.lease.as_mut().unwrap().sighting.renewed = true;
        assert!(
            matches!(decide(&o).action, Action::Close(_)),
            "not the rollout's: a death"
        );
        o.rolled_out = true;
        let claim = Action::Claim(Claim {
            reason,
            failed: false,
        });
        assert_eq!(decide(&o).action, claim, "the rollout's");
    }
}

#[test]
fn a_worker_that_cannot_start_fails_the_run_after_a_grace_naming_what_is_missing() {
    let now = Instant::now();
    let r = run(Phase::Running, 1, 0, 3);
    let unstartable = PodState::Unstartable {
        message: "secret \"model-key\" not found".into(),
    };
    let mut l = lease(L::Startup, 1, now);
    l.sighting.seen_at = now - Duration::from_secs(5);
    let early = decide(&obs(&r, Some(l.clone()), unstartable.clone(), now));
    assert_eq!(
        early.action,
        Action::Nothing,
        "a Secret applied with the run may still come"
    );
    assert_eq!(
        early.requeue,
        Some(UNSTARTABLE_GRACE - Duration::from_secs(5))
    );

    l.sighting.seen_at = now - UNSTARTABLE_GRACE;
    let late = decide(&obs(&r, Some(l.clone()), unstartable, now));
    let Action::Close(close) = late.action else {
        panic!("expected the run to end: {late:?}");
    };
    assert_eq!(close.phase(), Phase::Failed);
    assert_eq!(close.reason, CloseReason::SecretNotFound);
    assert!(close.message.contains("\"model-key\""), "{}", close.message);
    assert!(!close.failed, "no attempt died: the pod never ran");

    let other = PodState::Unstartable {
        message: "couldn't find key api-key in Secret ns/model-key".into(),
    };
    let Action::Close(close) = decide(&obs(&r, Some(l), other, now)).action else {
        panic!("expected the run to end");
    };
    assert_eq!(close.reason, CloseReason::WorkerConfigError);
    assert!(close.message.contains("api-key"), "{}", close.message);
}

#[test]
fn a_close_reason_is_read_back_from_its_seal_with_the_phase_it_ends_in() {
    use CloseReason::*;
    for (reason, phase) in [
        (StopRequested, Phase::Stopped),
        (MaxAttemptsExceeded, Phase::Interrupted),
        (SecretNotFound, Phase::Failed),
        (WorkerConfigError, Phase::Failed),
        (PodRejected, Phase::Failed),
    ] {
        assert_eq!(CloseReason::named(reason.as_str()), reason);
        let recorded = Close::recorded(reason, Fence::new(3));
        assert_eq!((recorded.reason, recorded.phase()), (reason, phase));
        assert!(recorded.message.contains("fence 3"));
    }
    // A reason another version wrote still ends the run, as an interrupted one.
    let unknown = Close::recorded(CloseReason::named("SomethingNew"), Fence::new(2));
    assert_eq!(unknown.reason, Unrecognized);
    assert_eq!(unknown.phase(), Phase::Interrupted);
}

fn pending(unbound_claim: Option<&str>, started: bool) -> PodState {
    PodState::Pending {
        image: IMAGE.into(),
        unbound_claim: unbound_claim.map(String::from),
        started,
    }
}

fn with_workspace(mut r: AgentRun) -> AgentRun {
    let spec = serde_json::json!({"size": "1Gi", "storageClassName": "fast"});
    r.spec.workspace = Some(serde_json::from_value(spec).unwrap());
    r
}

#[test]
fn a_pod_whose_claim_is_not_bound_says_so_in_a_condition() {
    let now = Instant::now();
    let r = run(Phase::Running, 1, 0, 3);
    let unbound = pending(
        Some("0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims."),
        false,
    );
    let mut l = lease(L::Startup, 1, now);
    l.sighting.seen_at = now;
    // Without spec.workspace there is nothing to say.
    let o = obs(&r, Some(l.clone()), unbound.clone(), now);
    assert_eq!(decide(&o).action, Action::Nothing);
    let r = with_workspace(r);
    let Action::Workspace(c) = decide(&obs(&r, Some(l), unbound, now)).action else {
        panic!("expected the workspace condition");
    };
    assert_eq!((c.ready, c.reason), (false, "ClaimPending"));
    assert!(
        c.message.contains("r-workspace") && c.message.contains("fast"),
        "{}",
        c.message
    );
}

#[test]
fn a_pod_that_starts_nothing_for_a_minute_says_it_waits_for_its_volume() {
    let now = Instant::now();
    let r = with_workspace(run(Phase::Running, 1, 0, 3));
    let mut l = lease(L::Startup, 1, now);
    l.sighting.seen_at = now;
    // Said only after the patience, and looked at again then.
    let early = decide(&obs(&r, Some(l.clone()), pending(None, false), now));
    assert_eq!(early.action, Action::Nothing);
    assert!(
        early.requeue.is_some_and(|d| d <= VOLUME_PATIENCE),
        "{early:?}"
    );
    l.sighting.seen_at = now - VOLUME_PATIENCE;
    let Action::Workspace(c) = decide(&obs(&r, Some(l), pending(None, false), now)).action else {
        panic!("expected the workspace condition");
    };
    assert_eq!((c.ready, c.reason), (false, "VolumeNotReady"));
    assert!(c.message.contains("ReadWriteMany"), "{}", c.message);
}

#[test]
fn a_running_pod_has_its_workspace_said_once() {
    let now = Instant::now();
    let mut r = with_workspace(run(Phase::Running, 1, 0, 3));
    let running = PodState::Running {
        image: IMAGE.into(),
    };
    let fresh = lease(L::Fresh, 1, now);
    let o = obs(&r, Some(fresh.clone()), running.clone(), now);
    let Action::Workspace(c) = decide(&o).action else {
        panic!("expected the workspace condition");
    };
    assert_eq!((c.ready, c.reason), (true, "Mounted"));
    let mut status = r.status.clone().unwrap();
    let ready = crate::status::condition::WORKSPACE_READY;
    crate::status::set_condition(&mut status.conditions, ready, true, "Mounted", "", None);
    r.status = Some(status);
    assert_eq!(
        decide(&obs(&r, Some(fresh), running, now)).action,
        Action::Nothing
    );
}

/// The waiting, pending and stop phases' cases, with these fixtures.
#[path = "decide_phases_tests.rs"]
mod phases;

/// The ended runs' cases, with these fixtures.
#[path = "decide_ended_tests.rs"]
mod ended;
