//! The ledger format as a contract: ledgers written in each released format (checked in under
//! tests/fixtures/ledger/, never regenerated) read and replay the same with this version, and
//! an event of a kind this version does not know is kept whole and reported, never a ledger
//! that cannot be read.

use super::*;
use crate::crd::v1alpha1::{LedgerSegmentSpec, UnrecognizedEvent};
use crate::fence::test_segment;

/// Every format a release wrote, oldest first.
/// Every format a release wrote, oldest first; within a format, the kinds each release added
/// (0.2.0: an agent container's model calls).
const FORMATS: &[(i32, &str)] = &[
    (
        1,
        include_str!("../../../tests/fixtures/ledger/format-1.json"),
    ),
    (
        1,
        include_str!("../../../tests/fixtures/ledger/format-1-since-0.2.json"),
    ),
];

fn ledgers(text: &str) -> serde_json::Map<String, serde_json::Value> {
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    doc["ledgers"].as_object().unwrap().clone()
}

fn segments(ledger: &serde_json::Value) -> Vec<LedgerSegment> {
    let specs: Vec<LedgerSegmentSpec> = serde_json::from_value(ledger.clone()).unwrap();
    specs
        .into_iter()
        .map(|spec| {
            let mut seg = test_segment(spec.seq, spec.fence.get(), spec.events.clone());
            seg.spec = spec;
            seg
        })
        .collect()
}

/// Each kind's name on the wire. No wildcard: a new kind does not compile until it is named
/// here, and then the test below fails until a fixture holds it.
fn kind(event: &LedgerEvent) -> &str {
    use LedgerEvent as E;
    match event {
        E::AttemptStarted { .. } => "attemptStarted",
        E::Message { .. } => "message",
        E::ModelDelta { .. } => "modelDelta",
        E::ModelCall { .. } => "modelCall",
        E::StepIntent { .. } => "stepIntent",
        E::ApprovalRequested { .. } => "approvalRequested",
        E::ApprovalDecided { .. } => "approvalDecided",
        E::McpTools { .. } => "mcpTools",
        E::StepResult { .. } => "stepResult",
        E::StepUnknown { .. } => "stepUnknown",
        E::StepProbed { .. } => "stepProbed",
        E::Input { .. } => "input",
        E::WaitingInput { .. } => "waitingInput",
        E::Handoff => "handoff",
        E::Final { .. } => "final",
        E::Failed { .. } => "failed",
        E::Stopped => "stopped",
        E::Claimed { .. } => "claimed",
        E::History { .. } => "history",
        E::HistoryDropped { .. } => "historyDropped",
        E::Closed { .. } => "closed",
        E::Chunk { .. } => "chunk",
        E::GatewayCall { .. } => "gatewayCall",
        E::GatewayDiverged { .. } => "gatewayDiverged",
        E::Unrecognized(event) => event.kind(),
    }
}

const EVERY_KIND: &[&str] = &[
    "attemptStarted",
    "message",
    "modelDelta",
    "modelCall",
    "stepIntent",
    "approvalRequested",
    "approvalDecided",
    "mcpTools",
    "stepResult",
    "stepUnknown",
    "stepProbed",
    "input",
    "waitingInput",
    "handoff",
    "final",
    "failed",
    "stopped",
    "claimed",
    "history",
    "historyDropped",
    "closed",
    "chunk",
    "gatewayCall",
    "gatewayDiverged",
];

#[test]
fn every_released_format_holds_every_kind_and_reads_back_as_written() {
    let mut seen = std::collections::BTreeSet::new();
    for (format, text) in FORMATS {
        for (name, ledger) in ledgers(text) {
            for seg in segments(&ledger) {
                assert_eq!(seg.spec.format, *format, "{name}");
                for event in &seg.spec.events {
                    assert!(
                        !matches!(event, LedgerEvent::Unrecognized(_)),
                        "format {format}, {name}: {event:?} is a kind this version must know"
                    );
                    seen.insert(kind(event).to_string());
                }
            }
            // Written back, each ledger is what the release wrote, field for field.
            let written: Vec<LedgerSegmentSpec> = serde_json::from_value(ledger.clone()).unwrap();
            assert_eq!(serde_json::to_value(&written).unwrap(), ledger, "{name}");
        }
    }
    let missing: Vec<_> = EVERY_KIND.iter().filter(|k| !seen.contains(**k)).collect();
    assert!(missing.is_empty(), "no released ledger holds {missing:?}");
}

/// The conversation the next model request of the first format's `resumable` ledger carries.
fn first_format_conversation() -> Vec<ReplayedMessage> {
    let call = |step: i64, tool: &str, input: &str| ToolCallRecord {
        step,
        call_id: format!("call_{step}"),
        tool: tool.into(),
        input: input.into(),
    };
    let result =
        |step: i64, tool: &str, content: &str, is_error: bool| ReplayedMessage::ToolResult {
            step,
            call_id: format!("call_{step}"),
            tool: tool.into(),
            content: content.into(),
            is_error,
        };
    let assistant = |text: &str, calls: Vec<ToolCallRecord>| ReplayedMessage::Assistant {
        text: text.into(),
        tool_calls: calls,
    };
    vec![
        ReplayedMessage::User("list the files".into()),
        assistant("Listing.", vec![call(1, "sh", r#"{"command":"ls"}"#)]),
        result(1, "sh", "a b", false),
        assistant("Reading a.", vec![call(2, "sh", r#"{"command":"cat a"}"#)]),
        result(2, "sh", UNKNOWN_EFFECT_NOTICE, true),
        assistant(
            "What next?",
            vec![call(3, "ask", r#"{"question":"What next?"}"#)],
        ),
        result(3, "ask", "stop here", false),
    ]
}

#[test]
fn a_ledger_of_the_first_format_resumes_where_it_stood() {
    let ledgers = ledgers(FORMATS[0].1);
    let replay = Replay::from_segments(&segments(&ledgers["resumable"])).unwrap();
    assert_eq!(replay.messages, first_format_conversation());
    assert_eq!(replay.tail, 11);
    assert_eq!(replay.inputs_consumed, 1);
    assert_eq!(replay.handoffs, 1);
    assert!(replay.history_dropped);
    assert!(replay.steps[&1].approved);
    assert_eq!(
        replay.steps[&2].state,
        StepState::Unknown {
            probe: Some(ProbeOutcome::Unknown)
        }
    );
    assert_eq!(replay.usage.model_calls, 3);
    assert_eq!(
        (replay.usage.input_tokens, replay.usage.output_tokens),
        (13, 9)
    );
    assert_eq!(replay.mcp_tools["files"][0].name, "read");
    assert!(replay.unrecognized.is_empty());
}

#[test]
fn ledgers_of_the_first_format_that_ended_read_their_end() {
    let ledgers = ledgers(FORMATS[0].1);
    let ended = Replay::from_segments(&segments(&ledgers["ended"])).unwrap();
    assert_eq!(ended.final_output.as_deref(), Some("hello"));
    let failed = Replay::from_segments(&segments(&ledgers["failed"])).unwrap();
    assert_eq!(
        failed.failure.as_ref().map(|f| f.0.as_str()),
        Some("ProviderError")
    );
    assert!(failed.stopped);
}

/// What a newer version wrote and this one does not know: kept whole (a copy of the ledger,
/// the server's stream, the PostgreSQL backend write it back unchanged), passed over by the
/// fold and named in `unrecognized`; the events around it fold as ever.
#[test]
fn an_event_of_a_newer_kind_is_kept_whole_and_reported() {
    let newer =
        serde_json::json!({"type": "responsesCall", "callId": "g1", "request": {"model": "m"}});
    let event: LedgerEvent = serde_json::from_value(newer.clone()).unwrap();
    let LedgerEvent::Unrecognized(kept) = &event else {
        panic!("{event:?}");
    };
    assert_eq!(kept.kind(), "responsesCall");
    assert_eq!(serde_json::to_value(&event).unwrap(), newer);
    assert_eq!(
        event,
        LedgerEvent::Unrecognized(UnrecognizedEvent(newer.as_object().unwrap().clone()))
    );

    let user = LedgerEvent::Message {
        role: Role::User,
        content: "hi".into(),
    };
    let replay = Replay::from_segments(&[test_segment(1, 1, vec![user, event])]).unwrap();
    assert_eq!(replay.messages, vec![ReplayedMessage::User("hi".into())]);
    assert_eq!(replay.unrecognized, vec!["responsesCall".to_string()]);
}

/// A kind this version knows, with fields it cannot read, is an error, as is an event with no
/// kind: only an unknown kind is passed over.
#[test]
fn a_known_kind_with_bad_fields_and_an_event_without_a_kind_are_errors() {
    for bad in [
        serde_json::json!({"type": "stepIntent", "step": "one"}),
        serde_json::json!({"step": 1}),
        serde_json::json!({"type": 7}),
        serde_json::json!("message"),
    ] {
        let read = serde_json::from_value::<LedgerEvent>(bad.clone());
        assert!(read.is_err(), "{bad}: {read:?}");
    }
}

#[test]
fn an_agent_containers_journal_replays_by_place_past_its_divergence() {
    use crate::ledger::journal::answer_text;
    let ledger = &ledgers(FORMATS[1].1)["agent-container"];
    let replay = Replay::from_segments(&segments(ledger)).unwrap();
    let journal = &replay.journal;
    assert_eq!(journal.calls.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(journal.diverged, [(2, "/messages/1/content".to_string())]);
    let text =
        |place: i64| answer_text(&journal.calls[&place].api, &journal.calls[&place].response);
    assert_eq!((text(1).as_str(), text(2).as_str()), ("one", "two"));
    assert_eq!(journal.next_place(), 3);
    assert_eq!(
        (replay.usage.model_calls, replay.usage.total_tokens),
        (2, 12)
    );
    assert_eq!(
        replay.final_output.as_deref(),
        Some("answer after 2 calls: two")
    );
}
