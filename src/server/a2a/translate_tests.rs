//! A2A events from the Responses fold: what each says, and the numbers they keep.

use serde_json::{Value, json};

use super::translate::{CURSOR_EXTENSION, TaskIds, Translator};
use crate::crd::v1alpha1::{LedgerEvent, Role};
use crate::fence::Fence;
use crate::server::responses::fold::{Fold, Meta, PER_POSITION};

fn ids() -> TaskIds {
    TaskIds {
        task: "chat-1".into(),
        context: "chat".into(),
    }
}

/// Every A2A event of `ledger` (a position per entry, from 1).
fn translated(ledger: &[Vec<LedgerEvent>]) -> Vec<Value> {
    let (mut fold, mut translator) = (Fold::default(), Translator::default());
    let mut out = Vec::new();
    for (i, events) in ledger.iter().enumerate() {
        let events: Vec<&LedgerEvent> = events.iter().collect();
        let position = i as i64 + 1;
        for e in fold.position(&Meta::default(), position, &events) {
            out.extend(translator.event(&ids(), &e));
        }
        out.extend(translator.waiting(&ids(), position, &events));
    }
    out
}

fn number(event: &Value) -> i64 {
    event["metadata"][CURSOR_EXTENSION]["sequenceNumber"]
        .as_i64()
        .unwrap()
}

fn claimed(fence: i64) -> LedgerEvent {
    LedgerEvent::Claimed {
        fence: Fence::new(fence),
        pod: "p".into(),
    }
}

#[test]
fn streamed_text_is_an_artifact_appended_to_and_an_answer_ends_it() {
    let events = translated(&[
        vec![claimed(1)],
        vec![LedgerEvent::ModelDelta { text: "He".into() }],
        vec![LedgerEvent::ModelDelta { text: "llo".into() }],
        vec![
            LedgerEvent::Message {
                role: Role::Assistant,
                content: "Hello".into(),
            },
            LedgerEvent::Final {
                output: "Hello".into(),
            },
        ],
    ]);
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "status-update",
            "artifact-update",
            "artifact-update",
            "artifact-update",
            "status-update"
        ]
    );
    assert_eq!(events[1]["append"], false);
    assert_eq!(events[2]["append"], true);
    assert_eq!(events[3]["lastChunk"], true);
    let end = events.last().unwrap();
    assert_eq!(
        (end["status"]["state"].as_str(), end["final"].as_bool()),
        (Some("completed"), Some(true))
    );
    let numbers: Vec<i64> = events.iter().map(number).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    assert!(
        events
            .iter()
            .all(|e| e["taskId"] == "chat-1" && e["contextId"] == "chat")
    );
}

#[test]
fn text_of_an_attempt_that_died_is_replaced_by_nothing() {
    let events = translated(&[
        vec![claimed(1)],
        vec![LedgerEvent::ModelDelta { text: "Hel".into() }],
        vec![claimed(2)],
    ]);
    let withdrawn = events.last().unwrap();
    assert_eq!(withdrawn["kind"], "artifact-update");
    assert_eq!(withdrawn["append"], false, "replaces what was appended");
    assert_eq!(
        withdrawn["artifact"]["parts"],
        json!([{"kind": "text", "text": ""}])
    );
    assert_eq!(number(withdrawn) / PER_POSITION, 3);
}

#[test]
fn a_question_is_input_required_and_an_approval_auth_required() {
    let events = translated(&[
        vec![claimed(1)],
        vec![LedgerEvent::WaitingInput {
            step: 1,
            question: "Which order?".into(),
        }],
    ]);
    let asked = events.last().unwrap();
    assert_eq!(asked["status"]["state"], "input-required");
    assert_eq!(
        asked["status"]["message"]["parts"][0]["text"],
        "Which order?"
    );
    assert_eq!(asked["final"], false, "the task goes on once answered");
    let intent = LedgerEvent::StepIntent {
        step: 2,
        tool: "refund".into(),
        call_id: "c".into(),
        input: "{}".into(),
        idempotent: false,
    };
    let approval = LedgerEvent::ApprovalRequested {
        step: 2,
        call_id: "c".into(),
        requested_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
    };
    let events = translated(&[vec![claimed(1)], vec![intent, approval]]);
    assert_eq!(events.last().unwrap()["status"]["state"], "auth-required");
}
