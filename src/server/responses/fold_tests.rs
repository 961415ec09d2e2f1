//! The Responses fold: the numbers, the items, and what an attempt that died leaves.

use serde_json::Value;

use super::fold::{END_SLOT, End, Fold, Meta, PER_POSITION};
use crate::crd::v1alpha1::{LedgerEvent, Role};
use crate::fence::{CloseReason, Fence};

fn claimed(fence: i64) -> LedgerEvent {
    LedgerEvent::Claimed {
        fence: Fence::new(fence),
        pod: format!("p{fence}"),
    }
}

fn delta(text: &str) -> LedgerEvent {
    LedgerEvent::ModelDelta { text: text.into() }
}

fn answer(text: &str) -> LedgerEvent {
    LedgerEvent::Message {
        role: Role::Assistant,
        content: text.into(),
    }
}

fn intent(step: i64) -> LedgerEvent {
    LedgerEvent::StepIntent {
        step,
        tool: "charge".into(),
        call_id: format!("c{step}"),
        input: "{\"cents\":5}".into(),
        idempotent: false,
    }
}

fn result(step: i64) -> LedgerEvent {
    LedgerEvent::StepResult {
        step,
        output: "charged".into(),
        is_error: false,
    }
}

fn meta() -> Meta {
    Meta {
        id: "resp-1".into(),
        model: "thread/t".into(),
        ..Meta::default()
    }
}

/// Every event of `ledger` (one position per entry, from 1), folded.
fn fold_all(ledger: &[Vec<LedgerEvent>]) -> (Fold, Vec<Value>) {
    let mut fold = Fold::default();
    let mut out = Vec::new();
    for (i, events) in ledger.iter().enumerate() {
        let events: Vec<&LedgerEvent> = events.iter().collect();
        out.extend(fold.position(&meta(), i as i64 + 1, &events));
    }
    (fold, out)
}

fn numbers(events: &[Value]) -> Vec<i64> {
    events
        .iter()
        .map(|e| e["sequence_number"].as_i64().unwrap())
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn output_text(object: &Value) -> String {
    let items = object["output"].as_array().unwrap();
    items
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect()
}

fn a_run() -> Vec<Vec<LedgerEvent>> {
    vec![
        vec![claimed(1)],
        vec![delta("Char"), delta("ging")],
        vec![answer("Charging"), intent(1)],
        vec![result(1)],
        vec![delta("Done")],
        vec![
            answer("Done."),
            LedgerEvent::Final {
                output: "Done.".into(),
            },
        ],
    ]
}

#[test]
fn numbers_grow_with_the_position_and_the_end_takes_the_last_place() {
    let (fold, events) = fold_all(&a_run());
    let n = numbers(&events);
    assert!(n.windows(2).all(|w| w[0] < w[1]), "{n:?}");
    assert_eq!(n[0], PER_POSITION, "the first claim's in_progress");
    assert_eq!(*n.last().unwrap(), 6 * PER_POSITION + END_SLOT);
    assert_eq!(types(&events).last(), Some(&"response.completed"));
    assert_eq!(fold.end(), Some(&End::Completed));
    let last = events.last().unwrap();
    assert_eq!(last["response"]["status"], "completed");
    assert_eq!(output_text(&last["response"]), "ChargingDone.");
}

#[test]
fn the_same_ledger_folds_to_the_same_events() {
    let (_, once) = fold_all(&a_run());
    let (_, again) = fold_all(&a_run());
    assert_eq!(once, again);
}

#[test]
fn a_tool_call_is_an_mcp_call_with_its_output() {
    let (fold, events) = fold_all(&a_run());
    let t = types(&events);
    let at = |kind: &str| t.iter().position(|k| *k == kind).unwrap();
    assert!(at("response.mcp_call.in_progress") < at("response.mcp_call.completed"));
    let object = fold.object(&meta(), "completed");
    let call = object["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "mcp_call")
        .unwrap();
    assert_eq!(call["name"], "charge");
    assert_eq!(call["output"], "charged");
    assert_eq!(call["status"], "completed");
    assert_eq!(call["server_label"], "baton");
}

#[test]
fn text_of_an_attempt_that_died_is_withdrawn_and_the_output_is_an_uninterrupted_runs() {
    let interrupted = vec![
        vec![claimed(1)],
        vec![delta("Hel")],
        vec![claimed(2)],
        vec![delta("Hello")],
        vec![
            answer("Hello"),
            LedgerEvent::Final {
                output: "Hello".into(),
            },
        ],
    ];
    let (fold, events) = fold_all(&interrupted);
    let object = fold.object(&meta(), "completed");
    assert_eq!(output_text(&object), "Hello");
    let withdrawn = events
        .iter()
        .find(|e| e["type"] == "response.output_item.done" && e["item"]["status"] == "incomplete")
        .expect("the dead attempt's item ends incomplete");
    assert_eq!(withdrawn["item"]["content"], serde_json::json!([]));
    assert!(withdrawn["sequence_number"].as_i64().unwrap() / PER_POSITION == 3);
    let uninterrupted = vec![
        vec![claimed(1)],
        vec![delta("Hello")],
        vec![
            answer("Hello"),
            LedgerEvent::Final {
                output: "Hello".into(),
            },
        ],
    ];
    let (plain, _) = fold_all(&uninterrupted);
    assert_eq!(output_text(&plain.object(&meta(), "completed")), "Hello");
}

#[test]
fn an_end_the_status_shows_first_has_the_number_its_seal_gets_later() {
    let mut ledger = vec![vec![claimed(1)], vec![intent(1)], vec![claimed(2)]];
    let (mut early, _) = fold_all(&ledger);
    let end = End::Failed {
        code: "MaxAttemptsExceeded".into(),
        message: String::new(),
    };
    // A stream's view of the end leaves the fold as it is; the one-shot fold ends.
    let viewed = early.ending_from_phase(&meta(), end.clone(), 4).unwrap();
    assert!(early.end().is_none());
    let from_phase = early.end_from_phase(&meta(), end, 4).unwrap();
    assert_eq!(viewed, from_phase);
    assert!(early.end().is_some());
    ledger.push(vec![
        LedgerEvent::StepUnknown {
            step: 1,
            attempt: Fence::new(1),
        },
        LedgerEvent::Closed {
            fence: Fence::new(2),
            reason: CloseReason::MaxAttemptsExceeded,
        },
    ]);
    let (late, events) = fold_all(&ledger);
    let sealed = events.last().unwrap();
    assert_eq!(sealed["sequence_number"], from_phase["sequence_number"]);
    assert_eq!(sealed["type"], "response.failed");
    assert_eq!(sealed["response"]["error"]["code"], "MaxAttemptsExceeded");
    let object = late.object(&meta(), "failed");
    assert_eq!(object["output"][0]["status"], "incomplete", "the open call");
    assert_eq!(object["output"][0]["error"], super::fold::UNKNOWN_EFFECT);
    let failed = events
        .iter()
        .find(|e| e["type"] == "response.mcp_call.failed");
    assert!(
        failed.is_some(),
        "the unknown call is said to have failed: {events:?}"
    );
}

#[test]
fn nothing_after_the_end_is_folded() {
    let mut ledger = a_run();
    ledger.push(vec![answer("late")]);
    let (fold, events) = fold_all(&ledger);
    assert_eq!(types(&events).last(), Some(&"response.completed"));
    assert!(!output_text(&fold.object(&meta(), "completed")).contains("late"));
}

#[test]
fn a_stop_ends_cancelled_and_a_failure_says_its_reason() {
    let (_, stopped) = fold_all(&[vec![claimed(1)], vec![LedgerEvent::Stopped]]);
    assert_eq!(stopped.last().unwrap()["type"], "response.cancelled");
    assert_eq!(stopped.last().unwrap()["response"]["status"], "cancelled");
    let failed = LedgerEvent::Failed {
        reason: crate::fence::EndReason::BudgetExceeded,
        message: "tokens".into(),
    };
    let (_, events) = fold_all(&[vec![claimed(1)], vec![failed]]);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["error"]["code"], "BudgetExceeded");
    assert_eq!(last["response"]["error"]["message"], "tokens");
}

#[test]
fn usage_adds_every_model_call() {
    let call = |i, o| LedgerEvent::ModelCall {
        input_tokens: Some(i),
        output_tokens: Some(o),
    };
    let (fold, _) = fold_all(&[vec![claimed(1)], vec![call(10, 2)], vec![call(5, 1)]]);
    let usage = &fold.object(&meta(), "in_progress")["usage"];
    assert_eq!(usage["input_tokens"], 15);
    assert_eq!(usage["output_tokens"], 3);
    assert_eq!(usage["total_tokens"], 18);
}

#[test]
fn an_answer_to_a_question_is_kept_in_its_place_among_the_items() {
    let ask = LedgerEvent::WaitingInput {
        step: 2,
        question: "Which order?".into(),
    };
    let given = LedgerEvent::Input {
        index: 0,
        content: "1234".into(),
    };
    let (fold, _) = fold_all(&[
        vec![claimed(1)],
        vec![intent(1), result(1)],
        vec![ask],
        vec![given],
    ]);
    assert_eq!(
        fold.answers(),
        [(2, "1234".to_string())],
        "after the call and the question"
    );
}
