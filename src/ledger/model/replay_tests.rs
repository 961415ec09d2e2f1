//! Unit tests of the ledger replay.

use super::*;

use crate::fence::test_segment as seg;

fn intent(step: i64) -> LedgerEvent {
    LedgerEvent::StepIntent {
        step,
        tool: "sh".into(),
        call_id: format!("c{step}"),
        input: "{}".into(),
        idempotent: false,
    }
}

fn assistant(text: &str) -> LedgerEvent {
    LedgerEvent::Message {
        role: Role::Assistant,
        content: text.into(),
    }
}

#[test]
fn an_intent_without_a_result_is_an_open_step() {
    let r = Replay::from_segments(&[seg(1, 1, vec![assistant("working"), intent(1)])]).unwrap();
    assert_eq!(r.open_steps().len(), 1);
    assert_eq!(r.open_steps()[0].attempt, Fence::new(1));
    assert_eq!(r.last_step(), 1);
}

#[test]
fn an_unknown_step_tells_the_model_and_a_later_result_replaces_the_notice() {
    let segments = [
        seg(1, 1, vec![assistant("a"), intent(1)]),
        seg(
            2,
            2,
            vec![LedgerEvent::StepUnknown {
                step: 1,
                attempt: Fence::new(1),
            }],
        ),
    ];
    let mut r = Replay::from_segments(&segments).unwrap();
    assert!(r.open_steps().is_empty());
    assert_eq!(r.unknown_steps().len(), 1);
    let notice = |r: &Replay| {
        r.messages
            .iter()
            .filter_map(|m| match m {
                ReplayedMessage::ToolResult { content, .. } => Some(content.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(notice(&r), vec![UNKNOWN_EFFECT_NOTICE.to_string()]);

    r.extend(&[seg(
        3,
        2,
        vec![LedgerEvent::StepResult {
            step: 1,
            output: "ok".into(),
            is_error: false,
        }],
    )])
    .unwrap();
    assert_eq!(
        notice(&r),
        vec!["ok".to_string()],
        "one result per call, replaced in place"
    );
    assert!(r.steps[&1].was_unknown);
}

#[test]
fn tool_calls_attach_to_the_assistant_turn_that_made_them() {
    let segments = [seg(
        1,
        1,
        vec![
            assistant("two calls"),
            intent(1),
            LedgerEvent::StepResult {
                step: 1,
                output: "1".into(),
                is_error: false,
            },
            intent(2),
        ],
    )];
    let r = Replay::from_segments(&segments).unwrap();
    let ReplayedMessage::Assistant { tool_calls, .. } = &r.messages[0] else {
        panic!("not assistant")
    };
    assert_eq!(tool_calls.len(), 2);
    assert_eq!(r.assistant_turns(), 1);
}

#[test]
fn streamed_text_of_a_dead_attempt_is_salvaged_but_never_a_message() {
    let segments = [
        seg(1, 1, vec![assistant("first part")]),
        seg(
            2,
            1,
            vec![LedgerEvent::ModelDelta {
                text: "half an ans".into(),
            }],
        ),
    ];
    let r = Replay::from_segments(&segments).unwrap();
    assert_eq!(r.assistant_turns(), 1);
    assert_eq!(r.salvage(), "first part\n\nhalf an ans");
}

#[test]
fn a_new_attempt_discards_the_streamed_tail() {
    let segments = [
        seg(
            1,
            1,
            vec![LedgerEvent::ModelDelta {
                text: "lost".into(),
            }],
        ),
        seg(
            2,
            2,
            vec![LedgerEvent::AttemptStarted {
                fence: Fence::new(2),
                pod: "p".into(),
            }],
        ),
    ];
    let r = Replay::from_segments(&segments).unwrap();
    assert_eq!(r.streamed_tail, "");
    assert_eq!(r.attempts, vec![Fence::new(2)]);
}

#[test]
fn final_waiting_and_inputs_are_honoured() {
    let segments = [
        seg(
            1,
            1,
            vec![LedgerEvent::WaitingInput {
                step: 1,
                question: "which?".into(),
            }],
        ),
        seg(
            2,
            2,
            vec![LedgerEvent::Input {
                index: 0,
                content: "that one".into(),
            }],
        ),
        seg(
            3,
            2,
            vec![LedgerEvent::Final {
                output: "done".into(),
            }],
        ),
    ];
    let r = Replay::from_segments(&segments[..1]).unwrap();
    assert_eq!(r.waiting, Some((1, "which?".into())));
    let r = Replay::from_segments(&segments).unwrap();
    assert_eq!(r.waiting, None);
    assert_eq!(r.inputs_consumed, 1);
    assert_eq!(r.final_output.as_deref(), Some("done"));
    assert_eq!(r.salvage(), "done");
}

#[test]
fn a_gap_is_refused() {
    let err = Replay::from_segments(&[seg(1, 1, vec![]), seg(3, 1, vec![])]).unwrap_err();
    assert!(matches!(
        err,
        LedgerError::Gap {
            expected: 2,
            found: 3
        }
    ));
}

/// A worker killed (or superseded) between the chunks of an event too large for one segment:
/// the next owner's seal follows the incomplete chunks. The event is dropped (its append was
/// never acknowledged), the step it would have closed stays open, and the ledger replays.
#[test]
fn a_chunked_event_its_writer_never_finished_is_dropped_and_the_ledger_replays() {
    let result = LedgerEvent::StepResult {
        step: 1,
        output: "y".repeat(4000),
        is_error: false,
    };
    let groups = crate::ledger::encode_events(vec![result], 1500).unwrap();
    assert!(groups.len() > 2, "the result is split into several chunks");
    let mut segments = vec![seg(1, 1, vec![intent(1)])];
    // All but the last chunk landed, then the writer died.
    for (i, group) in groups[..groups.len() - 1].iter().enumerate() {
        segments.push(seg(2 + i as i64, 1, group.clone()));
    }
    let next = segments.len() as i64 + 1;
    segments.push(seg(
        next,
        2,
        vec![LedgerEvent::Claimed {
            fence: Fence::new(2),
            pod: "r-w2".into(),
        }],
    ));
    let r = Replay::from_segments(&segments).unwrap();
    assert_eq!(r.abandoned_chunks(), 1);
    assert_eq!(
        r.open_steps().len(),
        1,
        "the step the lost result would have closed is open"
    );
    // A chunked event written whole after it is rebuilt as usual.
    let done = LedgerEvent::Final {
        output: "z".repeat(4000),
    };
    let mut seq = next;
    for group in crate::ledger::encode_events(vec![done], 1500).unwrap() {
        seq += 1;
        segments.push(seg(seq, 2, group));
    }
    let r = Replay::from_segments(&segments).unwrap();
    assert_eq!(r.final_output.as_deref().map(str::len), Some(4000));
    assert_eq!(r.abandoned_chunks(), 1);
}

fn call(input: i64, output: i64) -> LedgerEvent {
    LedgerEvent::ModelCall {
        input_tokens: Some(input),
        output_tokens: Some(output),
    }
}

fn unreported_call() -> LedgerEvent {
    LedgerEvent::ModelCall {
        input_tokens: None,
        output_tokens: None,
    }
}

fn ok_result(step: i64) -> LedgerEvent {
    LedgerEvent::StepResult {
        step,
        output: "ok".into(),
        is_error: false,
    }
}

fn delta(text: &str) -> LedgerEvent {
    LedgerEvent::ModelDelta { text: text.into() }
}

fn started(fence: i64) -> LedgerEvent {
    LedgerEvent::AttemptStarted {
        fence: Fence::new(fence),
        pod: format!("r-w{fence}"),
    }
}

#[test]
fn usage_is_summed_from_the_ledger_across_attempts_and_a_cut_call_is_unknown() {
    let segments = [
        seg(
            1,
            1,
            vec![started(1), assistant("a"), call(100, 10), intent(1)],
        ),
        // Attempt 1 dies while its second model call streams: text, no call record.
        seg(2, 1, vec![ok_result(1), delta("half an ans")]),
        seg(
            3,
            2,
            vec![started(2), assistant("b"), call(150, 20), intent(2)],
        ),
        // A provider that reported no usage.
        seg(4, 2, vec![assistant("c"), unreported_call()]),
    ];
    let r = Replay::from_segments(&segments).unwrap();
    assert_eq!(
        r.usage,
        RunUsage {
            input_tokens: 250,
            output_tokens: 30,
            total_tokens: 280,
            model_calls: 4,
            tool_calls: 2,
            unknown_model_calls: 2,
        }
    );
    // Replaying again gives the same sums: nothing is counted twice.
    assert_eq!(Replay::from_segments(&segments).unwrap().usage, r.usage);
}

fn requested(step: i64) -> LedgerEvent {
    LedgerEvent::ApprovalRequested {
        step,
        call_id: format!("c{step}"),
        requested_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

fn decided(step: i64, outcome: ApprovalOutcome) -> LedgerEvent {
    LedgerEvent::ApprovalDecided {
        step,
        outcome,
        reason: String::new(),
    }
}

#[test]
fn a_step_that_waits_for_approval_is_not_open_until_approved() {
    let waiting = seg(1, 1, vec![assistant("deploy?"), intent(1), requested(1)]);
    let r = Replay::from_segments(std::slice::from_ref(&waiting)).unwrap();
    assert!(
        r.open_steps().is_empty(),
        "it never ran: not an unknown effect"
    );
    assert_eq!(r.awaiting_approval().map(|s| s.step), Some(1));
    let approved = seg(2, 2, vec![decided(1, ApprovalOutcome::Approved)]);
    let r = Replay::from_segments(&[waiting, approved]).unwrap();
    assert_eq!(r.awaiting_approval(), None);
    assert_eq!(
        r.open_steps().len(),
        1,
        "approved, it may have run: a death from here leaves its effect unknown"
    );
}

#[test]
fn a_denied_step_is_done_with_its_result_and_the_model_sees_it() {
    let r = Replay::from_segments(&[
        seg(1, 1, vec![assistant("deploy?"), intent(1), requested(1)]),
        seg(
            2,
            2,
            vec![
                decided(1, ApprovalOutcome::Denied),
                LedgerEvent::StepResult {
                    step: 1,
                    output: "not run".into(),
                    is_error: true,
                },
            ],
        ),
    ])
    .unwrap();
    assert_eq!(r.awaiting_approval(), None);
    assert!(r.open_steps().is_empty());
    assert!(matches!(
        r.messages.last(),
        Some(ReplayedMessage::ToolResult { content, is_error: true, .. }) if content == "not run"
    ));
}
