//! Table-driven tests of `decide`: phase × lease state × pod state × attempts left.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

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
        stop_seen_at: None,
        desired_image: IMAGE.into(),
        rollout: RolloutPolicy::Handoff,
        rollout_slot: true,
        close_recorded: false,
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
fn waiting_input_is_claimed_only_when_a_new_input_arrives() {
    let now = Instant::now();
    let mut r = run(Phase::WaitingInput, 2, 0, 3);
    for l in LEASES {
        for pod in pods() {
            let d = decide(&obs(&r, Some(lease(l, 2, now)), pod.clone(), now));
            assert_eq!(
                d,
                Decision {
                    action: Action::Nothing,
                    requeue: None
                }
            );
        }
    }
    r.spec.inputs.push("yes".into());
    let d = decide(&obs(
        &r,
        Some(lease(L::Released, 2, now)),
        PodState::Terminated,
        now,
    ));
    assert_eq!(d.action, claim(ClaimReason::InputReceived, false));
    r.status.as_mut().unwrap().inputs_consumed = 1;
    let d = decide(&obs(
        &r,
        Some(lease(L::Released, 2, now)),
        PodState::Terminated,
        now,
    ));
    assert_eq!(d.action, Action::Nothing);
}

/// A run that waits for approval of step 3 (call c3), requested at `requested`.
fn waiting_approval(requested: Timestamp, timeout: Option<i64>) -> AgentRun {
    let mut r = run(Phase::WaitingApproval, 2, 0, 3);
    r.spec.approval_timeout_seconds = timeout;
    r.status.as_mut().unwrap().pending_approval = Some(crate::approval::pending(
        3,
        "c3",
        "deploy",
        "{}",
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(requested),
    ));
    r
}

fn decision(step: i64, call_id: &str) -> crate::crd::v1alpha1::ApprovalDecision {
    crate::crd::v1alpha1::ApprovalDecision {
        step,
        call_id: call_id.into(),
        decision: crate::crd::v1alpha1::Verdict::Approve,
        reason: None,
    }
}

#[test]
fn waiting_approval_is_claimed_only_for_a_decision_on_its_own_call() {
    let now = Instant::now();
    let mut r = waiting_approval(Timestamp::now(), None);
    for l in LEASES {
        for pod in pods() {
            let d = decide(&obs(&r, Some(lease(l, 2, now)), pod.clone(), now));
            assert_eq!(d, Decision::wait(None), "lease {l:?}, pod {pod:?}");
        }
    }
    r.spec.approvals = vec![decision(2, "c3"), decision(3, "c2")];
    let released = || Some(lease(L::Released, 2, now));
    let d = decide(&obs(&r, released(), PodState::Terminated, now));
    assert_eq!(d.action, Action::Nothing, "a decision for another call");
    r.spec.approvals.push(decision(3, "c3"));
    let d = decide(&obs(&r, released(), PodState::Terminated, now));
    assert_eq!(d.action, claim(ClaimReason::ApprovalDecided, false));
    r.spec.stop = true;
    let d = decide(&obs(&r, released(), PodState::Terminated, now));
    assert!(matches!(d.action, Action::Close(c) if c.reason == CloseReason::StopRequested));
}

#[test]
fn waiting_approval_times_out_at_its_deadline_on_the_controllers_clock() {
    let now = Instant::now();
    let wall = Timestamp::now();
    let released = || Some(lease(L::Released, 2, now));
    let r = waiting_approval(wall - SignedDuration::from_secs(50), Some(60));
    let mut o = obs(&r, released(), PodState::Terminated, now);
    o.wall = wall;
    let d = decide(&o);
    assert_eq!(d.action, Action::Nothing);
    let left = d.requeue.expect("woken at the deadline");
    assert!(
        left >= Duration::from_secs(10) && left < Duration::from_secs(11),
        "{left:?}"
    );
    o.wall = wall + SignedDuration::from_secs(10);
    assert_eq!(
        decide(&o).action,
        claim(ClaimReason::ApprovalTimedOut, false),
        "a timeout is not a death"
    );
}

#[test]
fn a_waiting_run_past_its_budget_deadline_ends_failed_and_is_woken_at_it_before() {
    let now = Instant::now();
    let wall = Timestamp::now();
    for phase in [Phase::WaitingInput, Phase::WaitingApproval] {
        let mut r = waiting_approval(wall, None);
        let status = r.status.as_mut().unwrap();
        status.phase = phase;
        status.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            wall - SignedDuration::from_secs(100),
        ));
        r.spec.budget = Some(crate::crd::v1alpha1::BudgetSpec {
            deadline_seconds: Some(200),
            ..Default::default()
        });
        let mut o = obs(
            &r,
            Some(lease(L::Released, 2, now)),
            PodState::Terminated,
            now,
        );
        o.wall = wall;
        let d = decide(&o);
        assert_eq!(d.action, Action::Nothing, "{phase}");
        let left = d.requeue.expect("woken at the deadline");
        assert!(
            left >= Duration::from_secs(100) && left < Duration::from_secs(101),
            "{phase}: {left:?}"
        );
        o.wall = wall + SignedDuration::from_secs(100);
        match decide(&o).action {
            Action::Close(c) => {
                assert_eq!(c.reason, CloseReason::DeadlineExceeded, "{phase}");
                assert_eq!(c.phase(), Phase::Failed);
                assert!(c.message.contains("spec.budget.deadlineSeconds"));
            }
            other => panic!("{phase}: {other:?}"),
        }
    }
}

#[test]
fn finishing_is_completed_whatever_the_lease_and_pod() {
    let now = Instant::now();
    let r = run(Phase::Finishing, 2, 0, 3);
    for l in LEASES {
        for pod in pods() {
            let d = decide(&obs(&r, Some(lease(l, 2, now)), pod.clone(), now));
            assert_eq!(d.action, Action::Finish, "lease {l:?}, pod {pod:?}");
        }
    }
}

#[test]
fn pending_admission_table() {
    let now = Instant::now();
    let r = run(Phase::Pending, 0, 0, 3);
    let busy = Admission::Busy {
        holder: "first".into(),
    };
    let stale = Admission::Stale {
        holder: "gone".into(),
    };
    let cases = [
        (Admission::NotRequired, claim(ClaimReason::Start, false)),
        (Admission::Held, claim(ClaimReason::Start, false)),
        (Admission::Free, Action::Admit),
        (
            busy,
            Action::Queue {
                holder: "first".into(),
            },
        ),
        (stale, Action::ClearStaleAdmission),
    ];
    for (admission, expected) in cases {
        let mut o = obs(&r, None, PodState::Missing, now);
        o.admission = admission.clone();
        assert_eq!(decide(&o).action, expected, "{admission:?}");
    }
}

#[test]
fn a_queued_run_does_not_rewrite_its_condition() {
    let now = Instant::now();
    let mut r = run(Phase::Pending, 0, 0, 3);
    r.spec.thread_key = Some("t".into());
    r.status = Some(super::super::statuses::queued(&r, "first"));
    let mut o = obs(&r, None, PodState::Missing, now);
    o.admission = Admission::Busy {
        holder: "first".into(),
    };
    let d = decide(&o);
    assert_eq!(d.action, Action::Nothing);
    assert_eq!(d.requeue, Some(ADMISSION_RECHECK));
}

#[test]
fn an_invalid_spec_is_rejected_before_admission() {
    let now = Instant::now();
    let mut r = run(Phase::Pending, 0, 0, 3);
    r.spec.lease.renew_seconds = 30;
    let d = decide(&obs(&r, None, PodState::Missing, now));
    assert!(
        matches!(d.action, Action::Reject { ref message } if message.contains("spec.lease.renewSeconds"))
    );
}

#[test]
fn a_run_whose_worker_account_name_would_be_too_long_is_rejected_unless_it_names_one() {
    let now = Instant::now();
    let mut r = run(Phase::Pending, 0, 0, 3);
    r.metadata.name = Some("a".repeat(250));
    let d = decide(&obs(&r, None, PodState::Missing, now));
    assert!(
        matches!(d.action, Action::Reject { ref message } if message.contains("too long")),
        "{d:?}"
    );
    r.spec.worker.service_account_name = Some("custom".into());
    let d = decide(&obs(&r, None, PodState::Missing, now));
    assert_eq!(d.action, claim(ClaimReason::Start, false));
}

#[test]
fn stop_ends_idle_runs_at_once_and_running_ones_after_the_lease_duration() {
    let now = Instant::now();
    for phase in [Phase::Pending, Phase::Handoff, Phase::WaitingInput] {
        let mut r = run(phase, 1, 0, 3);
        r.spec.stop = true;
        let d = decide(&obs(
            &r,
            Some(lease(L::Released, 1, now)),
            PodState::Missing,
            now,
        ));
        assert!(
            matches!(d.action, Action::Close(ref c) if c.phase() == Phase::Stopped),
            "{phase:?}"
        );
    }
    let mut r = run(Phase::Running, 1, 0, 3);
    r.spec.stop = true;
    let running = PodState::Running {
        image: IMAGE.into(),
    };
    let mut o = obs(&r, Some(lease(L::Fresh, 1, now)), running, now);
    o.stop_seen_at = Some(now - Duration::from_secs(10));
    let d = decide(&o);
    assert_eq!(
        d,
        Decision {
            action: Action::Nothing,
            requeue: Some(Duration::from_secs(20))
        }
    );
    o.stop_seen_at = Some(now - Duration::from_secs(30));
    assert!(matches!(decide(&o).action, Action::Close(ref c) if c.phase() == Phase::Stopped));
    // A stopped run whose worker died is ended, not taken over.
    o.stop_seen_at = Some(now);
    o.pod = PodState::Terminated;
    assert!(matches!(decide(&o).action, Action::Close(ref c) if c.phase() == Phase::Stopped));
}

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
    (s.fence, s.reason) = (0, Some("InvalidSpec".into()));
    assert_eq!(
        decide(&obs(&refused, None, PodState::Missing, now)).action,
        Action::Nothing
    );
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
        assert_eq!(CloseReason::from_seal(reason.as_str()), reason);
        let recorded = Close::recorded(reason.as_str(), 3);
        assert_eq!((recorded.reason, recorded.phase()), (reason, phase));
        assert!(recorded.message.contains("fence 3"));
    }
    // A reason another version wrote still ends the run, as an interrupted one.
    let unknown = Close::recorded("SomethingNew", 2);
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
