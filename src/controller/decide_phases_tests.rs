//! The decision's cases for runs that wait (for input, an approval), are pending admission,
//! or are stopped (ended runs: `decide_ended_tests.rs`). The fixtures are `decide_tests.rs`'.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::*;
use crate::crd::v1alpha1::Phase;

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
    r.status = Some(crate::controller::statuses::queued(&r, "first"));
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

/// A turn of thread `t`, as created (not joined yet: no agent, no owner).
fn turn_of_t() -> AgentRun {
    let mut r = run(Phase::Pending, 0, 0, 3);
    r.spec.thread = Some("t".into());
    r.spec.agent = None;
    r
}

fn joined_to_t(mut r: AgentRun) -> AgentRun {
    r.spec.agent = AgentRun::builder("x").spec().agent;
    r.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "baton.dev/v1alpha1".into(),
            kind: "AgentThread".into(),
            name: "t".into(),
            uid: "thread-uid".into(),
            ..Default::default()
        },
    ]);
    r
}

#[test]
fn a_turn_joins_its_thread_before_anything_else() {
    let now = Instant::now();
    let r = turn_of_t();
    assert_eq!(
        decide(&obs(&r, None, PodState::Missing, now)).action,
        Action::JoinThread
    );
    // Joined, it is admitted on its thread like any run of a thread key.
    let r = joined_to_t(r);
    let mut o = obs(&r, None, PodState::Missing, now);
    o.admission = Admission::Free;
    assert_eq!(decide(&o).action, Action::Admit);
}

#[test]
fn a_turn_that_sets_what_its_thread_gives_is_rejected_naming_the_field() {
    let now = Instant::now();
    for (field, set) in [
        (
            "spec.agent",
            (|r: &mut AgentRun| r.spec.agent = AgentRun::builder("x").spec().agent)
                as fn(&mut AgentRun),
        ),
        ("spec.budget", |r| r.spec.budget = Some(Default::default())),
        ("spec.ttlSecondsAfterFinished", |r| {
            r.spec.ttl_seconds_after_finished = Some(1)
        }),
    ] {
        let mut r = turn_of_t();
        set(&mut r);
        let d = decide(&obs(&r, None, PodState::Missing, now));
        assert!(
            matches!(&d.action, Action::Reject { message } if message.starts_with(field) && message.contains("thread t")),
            "{field}: {d:?}"
        );
    }
    let mut r = joined_to_t(turn_of_t());
    r.spec.thread_key = Some("k".into());
    let d = decide(&obs(&r, None, PodState::Missing, now));
    assert!(
        matches!(&d.action, Action::Reject { message } if message.contains("spec.threadKey")),
        "{d:?}"
    );
}

#[test]
fn a_turn_of_a_busy_thread_waits_or_ends_thread_busy_by_its_policy() {
    let now = Instant::now();
    let r = joined_to_t(turn_of_t());
    let mut o = obs(&r, None, PodState::Missing, now);
    o.admission = Admission::Busy {
        holder: "first".into(),
    };
    assert_eq!(
        decide(&o).action,
        Action::Queue {
            holder: "first".into()
        }
    );
    o.on_busy = crate::crd::v1alpha1::BusyPolicy::Reject;
    let d = decide(&o);
    assert!(
        matches!(&d.action, Action::Close(c) if c.reason == CloseReason::ThreadBusy
            && c.phase() == Phase::Failed && c.message.contains("first")),
        "{d:?}"
    );
}

#[test]
fn a_turn_of_a_thread_that_interrupts_stops_the_live_turn_once_then_waits() {
    let now = Instant::now();
    let r = joined_to_t(turn_of_t());
    let mut o = obs(&r, None, PodState::Missing, now);
    o.admission = Admission::Busy {
        holder: "first".into(),
    };
    o.on_busy = crate::crd::v1alpha1::BusyPolicy::Interrupt;
    assert_eq!(
        decide(&o).action,
        Action::Interrupt {
            holder: "first".into()
        }
    );
    o.holder_stopping = true;
    assert_eq!(
        decide(&o).action,
        Action::Queue {
            holder: "first".into()
        }
    );
}

#[test]
fn a_stop_for_a_newer_turn_ends_interrupted() {
    let now = Instant::now();
    let mut r = joined_to_t(run(Phase::WaitingInput, 1, 0, 3));
    r.spec.stop = true;
    r.metadata.annotations = Some(
        [(
            crate::crd::INTERRUPTED_BY_ANNOTATION.to_string(),
            "second".to_string(),
        )]
        .into(),
    );
    let d = decide(&obs(&r, None, PodState::Missing, now));
    assert!(
        matches!(&d.action, Action::Close(c) if c.reason == CloseReason::Interrupted
            && c.phase() == Phase::Stopped && c.message.contains("second")),
        "{d:?}"
    );
}
