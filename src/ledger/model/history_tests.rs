//! Unit tests of history building: which history a ledger fixes, and each earlier turn's
//! conversation rebuilt in order with every tool call answered.

use super::*;
use crate::crd::v1alpha1::{ContextPolicy, Overflow, Role};
use crate::fence::EndReason;
use crate::fence::Fence;
use crate::fence::test_segment as seg;
use crate::ledger::UNKNOWN_EFFECT_NOTICE;

fn message(role: Role, text: &str) -> LedgerEvent {
    LedgerEvent::Message {
        role,
        content: text.into(),
    }
}

fn intent(step: i64) -> LedgerEvent {
    LedgerEvent::StepIntent {
        step,
        tool: "sh".into(),
        call_id: format!("c{step}"),
        input: "ls".into(),
        idempotent: false,
    }
}

fn result(step: i64, output: &str) -> LedgerEvent {
    LedgerEvent::StepResult {
        step,
        output: output.into(),
        is_error: false,
    }
}

fn claimed(fence: i64) -> LedgerEvent {
    LedgerEvent::Claimed {
        fence: Fence::new(fence),
        pod: format!("r-w{fence}"),
    }
}

fn history(up_to: i64) -> LedgerEvent {
    LedgerEvent::History {
        thread: "t".into(),
        turns: vec![turn(up_to)],
        context: None,
    }
}

fn turn(up_to: i64) -> HistoryTurn {
    HistoryTurn {
        run: "t-1".into(),
        uid: "u1".into(),
        up_to,
        ledger_backend: None,
    }
}

#[test]
fn only_the_first_seals_history_counts() {
    let fixed = [seg(1, 1, vec![claimed(1), history(4)])];
    let expected = FixedHistory {
        thread: "t".into(),
        turns: vec![turn(4)],
        context: None,
    };
    assert_eq!(recorded_history(&fixed), Some(expected));
    // A `history` event anywhere else is not the controller's first seal: not read.
    let later = [seg(1, 1, vec![claimed(1)]), seg(2, 1, vec![history(9)])];
    assert_eq!(recorded_history(&later), None);
    let unsealed = [seg(1, 1, vec![history(9)])];
    assert_eq!(recorded_history(&unsealed), None);
    let second_fence = [seg(1, 2, vec![claimed(2), history(9)])];
    assert_eq!(recorded_history(&second_fence), None);
}

#[test]
fn a_turn_is_rebuilt_in_order_up_to_its_fixed_position() {
    let ledger = [
        seg(1, 1, vec![claimed(1)]),
        seg(2, 1, vec![message(Role::User, "capital of France?")]),
        seg(3, 1, vec![message(Role::Assistant, "checking"), intent(1)]),
        seg(
            4,
            1,
            vec![result(1, "Paris"), message(Role::Assistant, "Paris.")],
        ),
        // Written after the history was fixed: not part of it.
        seg(5, 1, vec![message(Role::Assistant, "later")]),
    ];
    let messages = turn_conversation(&turn(4), &ledger).unwrap();
    let texts: Vec<String> = messages
        .iter()
        .map(|m| match m {
            ReplayedMessage::User(t) => format!("user:{t}"),
            ReplayedMessage::Assistant { text, tool_calls } => {
                format!("assistant:{text}:{}", tool_calls.len())
            }
            ReplayedMessage::ToolResult { content, .. } => format!("tool:{content}"),
            ReplayedMessage::System(t) => format!("system:{t}"),
        })
        .collect();
    assert_eq!(
        texts,
        [
            "user:capital of France?",
            "assistant:checking:1",
            "tool:Paris",
            "assistant:Paris.:0"
        ]
    );
}

#[test]
fn a_call_the_turn_ended_without_a_result_is_answered_as_unknown() {
    let ledger = [
        seg(1, 1, vec![claimed(1), message(Role::User, "go")]),
        seg(2, 1, vec![message(Role::Assistant, "deleting"), intent(1)]),
        seg(3, 1, vec![LedgerEvent::Stopped]),
    ];
    let messages = turn_conversation(&turn(3), &ledger).unwrap();
    let last = messages.last().unwrap();
    assert!(
        matches!(last, ReplayedMessage::ToolResult { step: 1, call_id, content, is_error: true, .. }
            if call_id == "c1" && content == ENDED_WITHOUT_RESULT),
        "{messages:?}"
    );
    // One whose worker died keeps the notice the turn itself saw: no second result.
    let ledger = [
        seg(1, 1, vec![claimed(1), message(Role::User, "go")]),
        seg(2, 1, vec![message(Role::Assistant, "deleting"), intent(1)]),
        seg(3, 2, vec![claimed(2)]),
        seg(
            4,
            2,
            vec![LedgerEvent::StepUnknown {
                step: 1,
                attempt: Fence::new(1),
            }],
        ),
        seg(5, 2, vec![message(Role::Assistant, "done")]),
    ];
    let messages = turn_conversation(&turn(5), &ledger).unwrap();
    let results: Vec<&String> = messages
        .iter()
        .filter_map(|m| match m {
            ReplayedMessage::ToolResult { content, .. } => Some(content),
            _ => None,
        })
        .collect();
    assert_eq!(results, [UNKNOWN_EFFECT_NOTICE]);
}

#[test]
fn a_turn_whose_answer_is_only_its_final_ends_with_that_answer() {
    // An agent container's turn: its model calls are gatewayCalls, its answer the final.
    let call = LedgerEvent::GatewayCall {
        call: 1,
        api: "chat.completions".into(),
        request: serde_json::json!({}),
        response: serde_json::json!({}),
    };
    let ledger = [
        seg(1, 1, vec![claimed(1), message(Role::User, "go")]),
        seg(2, 1, vec![call, intent(1)]),
        seg(3, 1, vec![result(1, "3 files")]),
        seg(
            4,
            1,
            vec![LedgerEvent::Final {
                output: "there are 3".into(),
            }],
        ),
    ];
    let messages = turn_conversation(&turn(4), &ledger).unwrap();
    assert!(
        matches!(messages.last(), Some(ReplayedMessage::Assistant { text, tool_calls })
            if text == "there are 3" && tool_calls.is_empty()),
        "{messages:?}"
    );
    // A built-in turn's answer is its last assistant message already: not said twice.
    let ledger = [
        seg(1, 1, vec![claimed(1), message(Role::User, "go")]),
        seg(2, 1, vec![message(Role::Assistant, "there are 3")]),
        seg(
            3,
            1,
            vec![LedgerEvent::Final {
                output: "there are 3".into(),
            }],
        ),
    ];
    let messages = turn_conversation(&turn(3), &ledger).unwrap();
    let said = messages
        .iter()
        .filter(|m| matches!(m, ReplayedMessage::Assistant { .. }))
        .count();
    assert_eq!(said, 1, "{messages:?}");
}

#[test]
fn a_turn_missing_any_segment_up_to_its_position_fails_naming_it() {
    let ledger = [
        seg(1, 1, vec![claimed(1), message(Role::User, "go")]),
        seg(3, 1, vec![message(Role::Assistant, "x")]),
    ];
    let err = turn_conversation(&turn(3), &ledger).unwrap_err();
    assert!(
        matches!(&err, HistoryError::Missing { run, up_to: 3, .. } if run == "t-1"),
        "{err}"
    );
    let gone = turn_conversation(&turn(2), &[]).unwrap_err();
    assert!(gone.to_string().contains("turn t-1"), "{gone}");
}

/// Turn `run` whose conversation is `bytes` bytes of user text (bytes / 4 tokens).
fn sized(run: &str, bytes: usize) -> (HistoryTurn, Vec<ReplayedMessage>) {
    let turn = HistoryTurn {
        run: run.into(),
        uid: format!("uid-{run}"),
        up_to: 1,
        ledger_backend: None,
    };
    (turn, vec![ReplayedMessage::User("x".repeat(bytes))])
}

fn policy(max: i64, on_overflow: Overflow) -> ContextPolicy {
    ContextPolicy {
        max_history_tokens: max,
        on_overflow,
    }
}

#[test]
fn a_history_within_its_policy_is_sent_whole() {
    let turns = vec![sized("t-1", 400), sized("t-2", 400)];
    let whole = fit(turns.clone(), None).unwrap();
    assert_eq!(whole.messages.len(), 2);
    let within = fit(turns, Some(&policy(200, Overflow::Fail))).unwrap();
    assert_eq!(within.messages.len(), 2);
    assert!(within.dropped.is_empty());
}

#[test]
fn a_history_over_its_policy_fails_naming_the_sizes() {
    let turns = vec![sized("t-1", 400), sized("t-2", 404)];
    let err = fit(turns, Some(&policy(150, Overflow::Fail))).unwrap_err();
    assert_eq!(
        err,
        HistoryError::TooLong {
            turns: 2,
            tokens: 201,
            max: 150
        }
    );
    assert_eq!(err.reason(), EndReason::ContextExceeded);
    assert!(err.to_string().contains("201 tokens") && err.to_string().contains("(150)"));
}

#[test]
fn dropping_leaves_out_whole_oldest_turns_until_the_rest_fits() {
    let mut turns = vec![sized("t-1", 400), sized("t-2", 400), sized("t-3", 400)];
    // A turn with a tool call keeps it with its result, or goes whole.
    turns[1].1 = vec![
        ReplayedMessage::Assistant {
            text: "x".repeat(392),
            tool_calls: vec![crate::ledger::ToolCallRecord {
                step: 1,
                call_id: "c1".into(),
                tool: "sh".into(),
                input: "ls".into(),
            }],
        },
        ReplayedMessage::ToolResult {
            step: 1,
            call_id: "c1".into(),
            tool: "sh".into(),
            content: "abcdef".into(),
            is_error: false,
        },
    ];
    let fitted = fit(turns.clone(), Some(&policy(150, Overflow::DropOldestTurns))).unwrap();
    assert_eq!(fitted.dropped, ["t-1", "t-2"]);
    assert_eq!(fitted.dropped_tokens, 200);
    assert_eq!(fitted.messages, turns[2].1);
    let fitted = fit(turns.clone(), Some(&policy(200, Overflow::DropOldestTurns))).unwrap();
    assert_eq!(fitted.dropped, ["t-1"]);
    assert_eq!(fitted.messages.len(), 3);
    // Even the newest turn alone too large: none is sent.
    let none = fit(turns, Some(&policy(10, Overflow::DropOldestTurns))).unwrap();
    assert_eq!(none.dropped.len(), 3);
    assert!(none.messages.is_empty());
}

/// Position `seq` of run `run` (UID `uid`), as its store writes it.
fn of_run(run: &str, uid: &str, seq: i64) -> LedgerSegment {
    crate::ledger::segment_of_run(run, uid, seq, Fence::new(1), vec![claimed(1)])
}

fn earlier(run: &str, uid: &str, up_to: i64) -> HistoryTurn {
    HistoryTurn {
        run: run.into(),
        uid: uid.into(),
        up_to,
        ledger_backend: None,
    }
}

fn positions(found: &Option<Vec<LedgerSegment>>) -> Option<Vec<i64>> {
    found
        .as_ref()
        .map(|segments| segments.iter().map(|s| s.spec.seq).collect())
}

#[test]
fn one_listing_gives_each_turn_its_own_segments_up_to_its_position() {
    let mut renamed = of_run("c", "uc", 2);
    renamed.metadata.name = Some("x-000002".into());
    let listed = vec![
        of_run("a", "ua", 2),
        of_run("b", "ub", 1),
        of_run("a", "ua", 1),
        of_run("a", "ua", 3),
        // A namesake of `b` (another UID) and a stranger: neither is a turn's.
        of_run("b", "other", 2),
        of_run("z", "uz", 1),
        of_run("c", "uc", 1),
        renamed,
    ];
    let turns = [
        earlier("a", "ua", 2),
        earlier("b", "ub", 2),
        earlier("c", "uc", 2),
        earlier("d", "ud", 1),
    ];
    let found = turns_in_listing(listed, &turns);
    let found: Vec<_> = found.iter().map(positions).collect();
    // `a` up to its fixed position (its third is past it); `b` lacks its second (the namesake's
    // is not its), `c` its second (named for another run), `d` everything: each is read alone.
    assert_eq!(found, vec![Some(vec![1, 2]), None, None, None]);
}
