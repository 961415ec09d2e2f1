//! The fence's rules, case by case (`src/fence/`).

use super::test_segment as seg;
use super::*;

fn closed(fence: i64) -> LedgerEvent {
    LedgerEvent::Closed {
        fence: Fence::new(fence),
        reason: CloseReason::StopRequested,
    }
}

#[test]
fn segment_names_sort_in_ledger_order() {
    assert_eq!(segment_name("run", 7), "run-000007");
    assert!(segment_name("run", 10) > segment_name("run", 9));
}

#[test]
fn a_segment_is_older_own_newer_or_closed() {
    let two = Fence::new(2);
    let step = vec![LedgerEvent::Handoff];
    assert_eq!(verdict(two, &seg(5, 1, step.clone()), None), Verdict::Older);
    assert_eq!(
        verdict(two, &seg(5, 2, step.clone()), None),
        Verdict::OwnRetry
    );
    assert_eq!(verdict(two, &seg(5, 3, step.clone()), None), Verdict::Newer);
    // A `closed` of any fence ends ownership: nothing is appended after it.
    let sealed = Verdict::Closed {
        fence: Fence::new(1),
        reason: CloseReason::StopRequested,
    };
    assert_eq!(verdict(two, &seg(5, 1, vec![closed(1)]), None), sealed);
    assert!(sealed.ends_ownership() && Verdict::Newer.ends_ownership());
    assert!(!Verdict::Older.ends_ownership() && !Verdict::OwnRetry.ends_ownership());
}

#[test]
fn a_collision_under_our_fence_is_ours_only_with_our_content() {
    let two = Fence::new(2);
    let ours = vec![LedgerEvent::Handoff];
    let same = seg(5, 2, ours.clone());
    assert_eq!(verdict(two, &same, Some(&ours)), Verdict::OwnRetry);
    let other = seg(5, 2, vec![LedgerEvent::Stopped]);
    assert_eq!(verdict(two, &other, Some(&ours)), Verdict::Newer);
    assert_eq!(
        verdict(two, &seg(5, 1, vec![]), Some(&ours)),
        Verdict::Older
    );
}

#[test]
fn over_a_ledger_a_close_decides_then_a_newer_fence_then_our_own() {
    let two = Fence::new(2);
    let history = [seg(1, 1, vec![]), seg(2, 1, vec![])];
    assert_eq!(ledger_verdict(two, &history), Verdict::Older);
    assert_eq!(ledger_verdict(two, &[]), Verdict::Older);
    let resealed = [seg(1, 1, vec![]), seg(2, 2, vec![])];
    assert_eq!(ledger_verdict(two, &resealed), Verdict::OwnRetry);
    let taken = [seg(1, 1, vec![]), seg(2, 2, vec![]), seg(3, 3, vec![])];
    assert_eq!(ledger_verdict(two, &taken), Verdict::Newer);
    // A seal of our fence followed by our own `closed`: the close decides.
    let ended = [
        seg(1, 1, vec![]),
        seg(2, 2, vec![]),
        seg(3, 2, vec![closed(2)]),
    ];
    assert!(matches!(
        ledger_verdict(two, &ended),
        Verdict::Closed { fence, .. } if fence == Fence::new(2)
    ));
}

#[test]
fn a_terminal_claim_salvages_up_to_its_own_seal() {
    let two = Fence::new(2);
    let sealed = LedgerEvent::Claimed {
        fence: Fence::new(2),
        pod: "r-w2".into(),
    };
    let step = LedgerEvent::Handoff;
    let ledger = [
        seg(1, 1, vec![]),
        seg(2, 1, vec![step.clone()]),
        seg(3, 2, vec![sealed.clone()]),
    ];
    assert_eq!(salvage_end(two, &ledger), Some(2));
    // Its own `closed` record after the seal: the end was written already.
    let recorded = [
        seg(1, 1, vec![]),
        seg(2, 2, vec![sealed.clone()]),
        seg(3, 2, vec![closed(2)]),
    ];
    assert_eq!(salvage_end(two, &recorded), None);
    // Taken by a newer claim, or not sealed at all: nothing to salvage for this claim.
    let taken = [
        seg(1, 1, vec![]),
        seg(2, 2, vec![sealed]),
        seg(3, 3, vec![]),
    ];
    assert_eq!(salvage_end(two, &taken), None);
    assert_eq!(salvage_end(two, &[seg(1, 1, vec![step])]), None);
}

#[test]
fn first_claim_never_claimed_and_the_previous_fence() {
    let cases = [
        (0, false, true, None),
        (1, true, false, None),
        (2, false, false, Some(1)),
        (7, false, false, Some(6)),
    ];
    for (fence, first, never, previous) in cases {
        let f = Fence::new(fence);
        assert_eq!(
            (f.is_first(), f.never_claimed(), f.previous()),
            (first, never, previous.map(Fence::new)),
            "fence {fence}"
        );
    }
}

#[test]
fn a_lease_is_reached_at_or_past_the_claim_and_held_at_exactly_its_fence() {
    let f = Fence::new;
    // (carried, claim, reached)
    let reached = [
        (None, 1, false),
        (Some(1), 2, false),
        (Some(2), 2, true),
        (Some(3), 2, true),
    ];
    for (carried, claim, want) in reached {
        assert_eq!(
            lease_reached(carried.map(f), f(claim)),
            want,
            "{carried:?} for {claim}"
        );
    }
    assert!(lease_held(Some("r-w2"), Some(f(2)), "r-w2", f(2)));
    assert!(
        !lease_held(Some("r-w2"), Some(f(3)), "r-w2", f(2)),
        "moved on"
    );
    assert!(
        !lease_held(Some("r-w3"), Some(f(2)), "r-w2", f(2)),
        "another holder"
    );
    assert!(!lease_held(None, Some(f(2)), "r-w2", f(2)), "released");
    assert!(!lease_held(Some("r-w2"), None, "r-w2", f(2)), "no fence");
}

#[test]
fn the_status_names_an_attempt_until_a_newer_claim() {
    let f = Fence::new;
    // (status, ours, names, superseded)
    let cases = [
        (2, 2, true, false),
        (3, 2, false, true),
        (1, 2, false, false),
    ];
    for (status, ours, names, past) in cases {
        assert_eq!(
            (
                status_names(f(status), f(ours)),
                superseded(f(status), f(ours))
            ),
            (names, past),
            "status {status}, ours {ours}"
        );
    }
}

#[test]
fn the_worker_appends_up_to_the_status_fence_the_controller_one_above() {
    let f = Fence::new;
    // (segment, status, by controller, admitted)
    let cases = [
        (2, 2, false, true),
        (1, 2, false, true),
        (3, 2, false, false),
        (3, 2, true, true),
        (4, 2, true, false),
        (1, 0, true, true),
    ];
    for (segment, status, controller, want) in cases {
        assert_eq!(
            may_append_at(f(segment), f(status), controller),
            want,
            "{segment} at status {status}, controller {controller}"
        );
    }
    assert!(written_before(&seg(1, 1, vec![]), f(2)));
    assert!(!written_before(&seg(1, 2, vec![]), f(2)));
}

#[test]
fn a_holder_names_its_pod_and_lease() {
    let run = AgentRun::builder("r").namespace("ns").stored("u").build();
    let holder = RunHolder::of(&run, Fence::of_run(&run).next());
    assert_eq!(holder.fence, Fence::new(1));
    assert_eq!(holder.pod, "r-w1");
    assert_eq!(holder.lease_name(), "run.r");
    assert_eq!(
        (holder.namespace.as_str(), holder.uid.as_str()),
        ("ns", "u")
    );
}

#[test]
fn a_run_lease_names_its_run() {
    assert_eq!(run_of_lease(&run_lease_name("r")), Some("r"));
    assert_eq!(run_of_lease("thread.t"), None);
    assert_eq!(run_of_lease("run."), None);
}

#[test]
fn long_names_make_valid_label_values() {
    let long = format!("{}-x", "a".repeat(62));
    assert_eq!(label_value(&long), "a".repeat(62));
}

#[test]
fn a_claim_follows_the_attempt_just_before_it() {
    let f = Fence::new;
    assert!(follows(f(3), f(2)));
    assert!(!follows(f(3), f(1)));
    assert!(!follows(f(3), f(3)));
    assert!(!follows(f(1), f(0)), "the first claim follows no attempt");
    assert_eq!(append_ceiling(f(2), true), f(3));
    assert_eq!(append_ceiling(f(2), false), f(2));
}

#[test]
fn the_fence_and_the_seals_reason_are_plain_on_the_wire() {
    let seal = LedgerEvent::Closed {
        fence: Fence::new(3),
        reason: CloseReason::StopRequested,
    };
    let json = serde_json::to_value(&seal).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"type": "closed", "fence": 3, "reason": "StopRequested"})
    );
    assert_eq!(serde_json::from_value::<LedgerEvent>(json).unwrap(), seal);
    // A reason a newer version wrote still reads: the seal ends the run all the same.
    let newer = serde_json::json!({"type": "closed", "fence": 4, "reason": "SomethingNew"});
    assert_eq!(
        serde_json::from_value::<LedgerEvent>(newer).unwrap(),
        LedgerEvent::Closed {
            fence: Fence::new(4),
            reason: CloseReason::Unrecognized,
        }
    );
    assert!("x7".parse::<Fence>().is_err());
    assert_eq!(" 7".parse::<Fence>(), Ok(Fence::new(7)));
}

#[test]
fn a_released_lease_never_goes_back_a_fence() {
    let (two, three) = (Fence::new(2), Fence::new(3));
    assert_eq!(lease_released_at(Some(three), two), three);
    assert_eq!(lease_released_at(Some(two), three), three);
    assert_eq!(lease_released_at(None, two), two);
}

#[test]
fn a_failed_turns_reason_is_kept_as_written_when_unknown() {
    let failed = LedgerEvent::Failed {
        reason: EndReason::BudgetExceeded,
        message: "m".into(),
    };
    let json = serde_json::to_value(&failed).unwrap();
    assert_eq!(json["reason"], "BudgetExceeded");
    assert_eq!(serde_json::from_value::<LedgerEvent>(json).unwrap(), failed);
    let newer = serde_json::json!({"type": "failed", "reason": "QuotaRevoked", "message": "m"});
    let read = serde_json::from_value::<LedgerEvent>(newer).unwrap();
    let LedgerEvent::Failed { reason, .. } = read else {
        panic!("a failed event reads as one: {read:?}");
    };
    assert_eq!(reason, EndReason::Unrecognized("QuotaRevoked".into()));
    assert_eq!(reason.to_string(), "QuotaRevoked");
}
