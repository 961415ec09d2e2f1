//! A run's ledger as A2A (protocol 0.3) objects and events (pure): the Responses fold
//! ([`crate::server::responses`]) made into a Task, status updates and artifact updates, so
//! both protocols number the same events the same way. Every event carries its number in its
//! `metadata` under the ledger-cursor extension ([`CURSOR_EXTENSION`]).

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::crd::v1alpha1::{AgentRun, LedgerEvent, Phase};
use crate::requests::phase_of;
use crate::server::responses::fold::{END_SLOT, End, Fold, PER_POSITION};

/// The A2A extension whose metadata carries each event's ledger number, and whose header
/// ([`STARTING_AFTER_HEADER`]) resumes a `tasks/resubscribe` after one.
pub const CURSOR_EXTENSION: &str = "https://baton.dev/a2a/ledger-cursor/v1";
/// The header a client resumes with: the number of the last event it has.
pub const STARTING_AFTER_HEADER: &str = "baton-starting-after";

/// Who the task is: the run and its thread.
#[derive(Clone, Debug, Default)]
pub struct TaskIds {
    pub task: String,
    pub context: String,
}

/// The number as an event's metadata says it.
pub fn cursor(number: i64) -> Value {
    json!({ CURSOR_EXTENSION: {"sequenceNumber": number} })
}

/// Turns the fold's Responses events into A2A events, remembering which artifacts it began.
#[derive(Clone, Debug, Default)]
pub struct Translator {
    begun: HashSet<String>,
}

impl Translator {
    /// The A2A event of one Responses event, if it has one.
    pub fn event(&mut self, ids: &TaskIds, event: &Value) -> Option<Value> {
        let number = event["sequence_number"].as_i64()?;
        let item = &event["item"];
        let made = match event["type"].as_str()? {
            "response.in_progress" => status_update(ids, "working", None, false),
            "response.output_text.delta" => {
                let id = event["item_id"].as_str()?.to_string();
                let append = !self.begun.insert(id.clone());
                let parts = json!([{"kind": "text", "text": event["delta"]}]);
                artifact_update(ids, &id, parts, append, false)
            }
            "response.output_item.done" if item["type"] == "message" => {
                let id = item["id"].as_str()?.to_string();
                match item["status"].as_str()? {
                    // Withdrawn (its attempt died): replaced by nothing.
                    "incomplete" => {
                        let parts = json!([{"kind": "text", "text": ""}]);
                        artifact_update(ids, &id, parts, false, true)
                    }
                    _ => artifact_update(ids, &id, json!([]), true, true),
                }
            }
            "response.output_item.added" | "response.output_item.done"
                if item["type"] == "mcp_call" =>
            {
                let message = data_message(ids, item);
                status_update(ids, "working", Some(message), false)
            }
            "response.completed" | "response.failed" | "response.cancelled" => {
                let response = &event["response"];
                let state = state_of_status(response["status"].as_str()?);
                let text = match &response["error"] {
                    Value::Null => String::new(),
                    error => format!("{}: {}", error["code"], error["message"]),
                };
                let message = (!text.is_empty()).then(|| text_message(ids, "end", &text));
                status_update(ids, state, message, true)
            }
            _ => return None,
        };
        Some(with_number(made, number))
    }

    /// What the run waits on, from the position's own ledger events: the states the
    /// Responses events do not say (their place: just before the end's).
    pub fn waiting(&self, ids: &TaskIds, position: i64, events: &[&LedgerEvent]) -> Vec<Value> {
        let number = position * PER_POSITION + END_SLOT - 2;
        events
            .iter()
            .filter_map(|event| match event {
                LedgerEvent::WaitingInput { question, .. } => {
                    let message = text_message(ids, &format!("question-{position}"), question);
                    Some(status_update(ids, "input-required", Some(message), false))
                }
                LedgerEvent::ApprovalRequested { step, .. } => {
                    let text = format!("step {step} waits for a person's approval");
                    let message = text_message(ids, &format!("approval-{step}"), &text);
                    Some(status_update(ids, "auth-required", Some(message), false))
                }
                _ => None,
            })
            .map(|made| with_number(made, number))
            .collect()
    }
}

fn with_number(mut event: Value, number: i64) -> Value {
    event["metadata"] = cursor(number);
    event
}

fn status_update(ids: &TaskIds, state: &str, message: Option<Value>, last: bool) -> Value {
    let mut status = json!({"state": state});
    if let Some(message) = message {
        status["message"] = message;
    }
    json!({
        "kind": "status-update", "taskId": ids.task, "contextId": ids.context,
        "status": status, "final": last,
    })
}

fn artifact_update(ids: &TaskIds, id: &str, parts: Value, append: bool, last: bool) -> Value {
    json!({
        "kind": "artifact-update", "taskId": ids.task, "contextId": ids.context,
        "artifact": {"artifactId": id, "parts": parts},
        "append": append, "lastChunk": last,
    })
}

fn text_message(ids: &TaskIds, id: &str, text: &str) -> Value {
    json!({
        "kind": "message", "messageId": format!("{}-{id}", ids.task), "role": "agent",
        "taskId": ids.task, "contextId": ids.context,
        "parts": [{"kind": "text", "text": text}],
    })
}

fn data_message(ids: &TaskIds, item: &Value) -> Value {
    json!({
        "kind": "message", "messageId": format!("{}-{}-{}", ids.task, item["id"].as_str().unwrap_or(""), item["status"].as_str().unwrap_or("")),
        "role": "agent", "taskId": ids.task, "contextId": ids.context,
        "parts": [{"kind": "data", "data": item}],
    })
}

fn state_of_status(status: &str) -> &'static str {
    match status {
        "completed" => "completed",
        "failed" => "failed",
        "cancelled" => "canceled",
        "queued" => "submitted",
        _ => "working",
    }
}

/// The task's state: the end the ledger folds to first, else the run's phase.
pub fn state(fold: &Fold, run: &AgentRun) -> &'static str {
    if let Some(end) = fold.end() {
        return state_of_status(end.status());
    }
    match phase_of(run) {
        Phase::Pending => "submitted",
        Phase::WaitingInput => "input-required",
        Phase::WaitingApproval => "auth-required",
        Phase::Succeeded => state_of_status(End::Completed.status()),
        Phase::Failed | Phase::Interrupted => "failed",
        Phase::Stopped => "canceled",
        _ => "working",
    }
}

/// The Task as the fold stands: its state, the user's input as its history, each complete
/// answer an artifact; `number`, the last event folded into it.
pub fn task(ids: &TaskIds, fold: &Fold, run: &AgentRun, number: i64) -> Value {
    let object = fold.object(&Default::default(), "");
    let artifacts: Vec<Value> = object["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message" && i["status"] == "completed")
        .map(|i| {
            let text = i["content"][0]["text"].clone();
            json!({"artifactId": i["id"], "parts": [{"kind": "text", "text": text}]})
        })
        .collect();
    let input = json!({
        "kind": "message", "messageId": format!("{}-input", ids.task), "role": "user",
        "taskId": ids.task, "contextId": ids.context,
        "parts": [{"kind": "text", "text": run.spec.input}],
    });
    json!({
        "kind": "task", "id": ids.task, "contextId": ids.context,
        "status": {"state": state(fold, run)},
        "artifacts": artifacts, "history": [input], "metadata": cursor(number),
    })
}
