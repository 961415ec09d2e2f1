//! A run's ledger as OpenAI Responses events and a Response object (pure): folded from the
//! first position on, so the same ledger gives every reader the same events with the same
//! numbers, whichever attempt wrote them and whenever the reader came.
//!
//! Every event's `sequence_number` is its ledger position × [`PER_POSITION`] plus its place
//! among the events of that position: monotonic across attempts, and `starting_after=N`
//! resumes exactly after event N. The response's end takes the last place of its position
//! ([`END_SLOT`]), so an end seen in the run's status before its `closed` seal is written gets
//! the number the seal's position gives it later.
//!
//! Items: the assistant's messages (`message`, streamed text as `output_text` deltas), each tool
//! call baton ran (`mcp_call`, with its output: baton runs the tools, as a remote MCP server
//! would), and each call waiting for a person (`mcp_approval_request`). Text streamed by an
//! attempt that died is withdrawn: its item ends `incomplete` with no content, and the next
//! attempt's answer is a new item; the output's text is an uninterrupted run's.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::crd::v1alpha1::{LedgerEvent, Role};
use crate::fence::CloseReason;

/// Event numbers per ledger position.
pub const PER_POSITION: i64 = 1_000_000;
/// The place of a response's end among its position's events: the last.
pub const END_SLOT: i64 = PER_POSITION - 1;
/// The error of a call whose worker died while it ran.
pub const UNKNOWN_EFFECT: &str =
    "its worker died while it ran: its effect is unknown, and it is not run again";
/// The `server_label` of baton's tool calls.
pub const SERVER_LABEL: &str = "baton";

/// How a response ended.
#[derive(Clone, Debug, PartialEq)]
pub enum End {
    Completed,
    Failed { code: String, message: String },
    Cancelled,
}

impl End {
    pub fn status(&self) -> &'static str {
        match self {
            End::Completed => "completed",
            End::Failed { .. } => "failed",
            End::Cancelled => "cancelled",
        }
    }

    fn event_type(&self) -> &'static str {
        match self {
            End::Completed => "response.completed",
            End::Failed { .. } => "response.failed",
            // Not among the stream events OpenAI lists; named as its webhook names the same
            // end (docs/reference/responses-api.md).
            End::Cancelled => "response.cancelled",
        }
    }
}

/// What the response object says besides what the ledger folds to.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub id: String,
    pub created_at: i64,
    pub model: String,
    pub background: bool,
    /// The thread whose turn this is.
    pub conversation: Option<String>,
}

/// The fold: the output items and usage so far, and the end once the ledger says it.
/// Cloned when followers share it (`server::shared_fold`): [`Fold::weight`] says the cost.
#[derive(Clone, Debug, Default)]
pub struct Fold {
    items: Vec<Value>,
    /// The message item being streamed (deltas, no closing message yet).
    streaming: Option<usize>,
    /// Its text so far (written into the item when the object is made: a long answer's
    /// deltas each add their text, not a copy of all before them).
    streamed: String,
    /// The `mcp_call` item of each step.
    steps: HashMap<i64, usize>,
    input_tokens: i64,
    output_tokens: i64,
    /// The assistant's last complete message.
    last_answer: Option<String>,
    started: bool,
    end: Option<End>,
    /// The user's answers to the run's questions: each the number of output items before it,
    /// and its text (a conversation's items put it in its place).
    answers: Vec<(usize, String)>,
    /// About the bytes of text it holds.
    weight: usize,
}

/// The events of one position, numbered as they are made.
struct Numbering {
    base: i64,
    next: i64,
    out: Vec<Value>,
}

impl Numbering {
    fn push(&mut self, mut event: Value) {
        event["sequence_number"] = json!(self.base + self.next);
        self.next += 1;
        self.out.push(event);
    }
}

impl Fold {
    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    pub fn answers(&self) -> &[(usize, String)] {
        &self.answers
    }

    /// About the bytes a copy of the fold copies: the text it holds (it only grows).
    pub fn weight(&self) -> usize {
        self.weight
    }

    /// The events of `events`, the ledger's position `position`.
    pub fn position(&mut self, meta: &Meta, position: i64, events: &[&LedgerEvent]) -> Vec<Value> {
        let mut out = Numbering {
            base: position * PER_POSITION,
            next: 0,
            out: Vec::new(),
        };
        for event in events {
            if self.end.is_some() {
                break;
            }
            self.event(meta, position, event, &mut out);
        }
        out.out
    }

    fn event(&mut self, meta: &Meta, position: i64, event: &LedgerEvent, out: &mut Numbering) {
        match event {
            LedgerEvent::Claimed { fence, .. } => {
                self.withdraw_streamed(out);
                if !self.started && fence.is_first() {
                    self.started = true;
                    let response = self.object(meta, "in_progress");
                    out.push(json!({"type": "response.in_progress", "response": response}));
                }
            }
            LedgerEvent::ModelDelta { text } => self.delta(position, text, out),
            LedgerEvent::Message {
                role: Role::Assistant,
                content,
            } => self.message(position, content, out),
            LedgerEvent::ModelCall {
                input_tokens,
                output_tokens,
            } => {
                self.input_tokens += input_tokens.unwrap_or(0);
                self.output_tokens += output_tokens.unwrap_or(0);
            }
            LedgerEvent::StepIntent {
                step, tool, input, ..
            } => self.tool_call(*step, tool, input, out),
            LedgerEvent::ApprovalRequested { step, .. } => self.approval_request(*step, out),
            LedgerEvent::StepResult {
                step,
                output,
                is_error,
            } => self.tool_result(*step, output, *is_error, out),
            LedgerEvent::StepUnknown { step, .. } => self.tool_unknown(*step, out),
            LedgerEvent::WaitingInput { question, .. } => self.message(position, question, out),
            LedgerEvent::Input { content, .. } => {
                self.answers.push((self.items.len(), content.clone()));
                self.weight += content.len();
            }
            LedgerEvent::Final { output } => {
                if self.last_answer.as_deref() != Some(output.as_str()) {
                    self.message(position, output, out);
                }
                self.finish(meta, End::Completed, out);
            }
            LedgerEvent::Failed { reason, message } => {
                let code = reason.as_str().to_string();
                let message = message.clone();
                self.finish(meta, End::Failed { code, message }, out);
            }
            LedgerEvent::Stopped => self.finish(meta, End::Cancelled, out),
            LedgerEvent::Closed { reason, .. } => self.finish(meta, closed_end(*reason), out),
            _ => {}
        }
    }

    fn delta(&mut self, position: i64, text: &str, out: &mut Numbering) {
        let index = match self.streaming {
            Some(index) => index,
            None => {
                let index = self.open_message(position, out);
                self.streaming = Some(index);
                index
            }
        };
        self.streamed.push_str(text);
        self.weight += text.len();
        out.push(json!({
            "type": "response.output_text.delta",
            "item_id": self.items[index]["id"], "output_index": index, "content_index": 0,
            "delta": text, "logprobs": [],
        }));
    }

    /// The message item being streamed, no longer streamed: its text so far is dropped (the
    /// message that ends it carries it whole, or it is withdrawn).
    fn take_streaming(&mut self) -> Option<usize> {
        self.streamed.clear();
        self.streaming.take()
    }

    /// A new message item, its text part added and empty; its index.
    fn open_message(&mut self, position: i64, out: &mut Numbering) -> usize {
        let id = format!("msg_{position}_{}", out.next);
        let index = self.add_item(message_item(&id, "in_progress", None), out);
        out.push(json!({
            "type": "response.content_part.added",
            "item_id": id, "output_index": index, "content_index": 0,
            "part": text_part(""),
        }));
        index
    }

    /// A complete assistant message: the streamed item it ends, or a new one.
    fn message(&mut self, position: i64, content: &str, out: &mut Numbering) {
        self.last_answer = Some(content.to_string());
        // Kept twice: the last answer and its item.
        self.weight += 2 * content.len();
        let index = match self.take_streaming() {
            Some(index) => index,
            None if content.is_empty() => return,
            None => {
                let index = self.open_message(position, out);
                let id = self.items[index]["id"].clone();
                out.push(json!({
                    "type": "response.output_text.delta",
                    "item_id": id, "output_index": index, "content_index": 0,
                    "delta": content, "logprobs": [],
                }));
                index
            }
        };
        let id = self.items[index]["id"].clone();
        self.items[index] = message_item(id.as_str().unwrap_or(""), "completed", Some(content));
        out.push(json!({
            "type": "response.output_text.done",
            "item_id": id, "output_index": index, "content_index": 0,
            "text": content, "logprobs": [],
        }));
        out.push(json!({
            "type": "response.content_part.done",
            "item_id": id, "output_index": index, "content_index": 0,
            "part": text_part(content),
        }));
        self.item_done(index, out);
    }

    /// Text streamed by an attempt that died before its message: withdrawn, the item ends
    /// incomplete and empty.
    fn withdraw_streamed(&mut self, out: &mut Numbering) {
        if let Some(index) = self.take_streaming() {
            let id = self.items[index]["id"].clone();
            self.items[index] = message_item(id.as_str().unwrap_or(""), "incomplete", None);
            self.item_done(index, out);
        }
    }

    fn tool_call(&mut self, step: i64, tool: &str, arguments: &str, out: &mut Numbering) {
        let id = format!("mcp_{step}");
        let item = json!({
            "type": "mcp_call", "id": id, "server_label": SERVER_LABEL, "name": tool,
            "arguments": arguments, "status": "in_progress", "output": null, "error": null,
        });
        let index = self.add_item(item, out);
        self.steps.insert(step, index);
        self.weight += tool.len() + arguments.len();
        out.push(json!({
            "type": "response.mcp_call_arguments.done",
            "item_id": id, "output_index": index, "arguments": arguments,
        }));
        out.push(
            json!({"type": "response.mcp_call.in_progress", "item_id": id, "output_index": index}),
        );
    }

    fn approval_request(&mut self, step: i64, out: &mut Numbering) {
        let Some(&call) = self.steps.get(&step) else {
            return;
        };
        let (name, arguments) = (
            self.items[call]["name"].clone(),
            self.items[call]["arguments"].clone(),
        );
        let item = json!({
            "type": "mcp_approval_request", "id": format!("mcpr_{step}"),
            "server_label": SERVER_LABEL, "name": name, "arguments": arguments,
        });
        let index = self.add_item(item, out);
        self.item_done(index, out);
    }

    fn tool_result(&mut self, step: i64, output: &str, is_error: bool, out: &mut Numbering) {
        let Some(&index) = self.steps.get(&step) else {
            return;
        };
        let item = &mut self.items[index];
        if item["status"] != "in_progress" {
            return;
        }
        let (status, kind) = match is_error {
            false => ("completed", "response.mcp_call.completed"),
            true => ("failed", "response.mcp_call.failed"),
        };
        item["status"] = json!(status);
        item["output"] = json!(output);
        if is_error {
            item["error"] = json!(output);
        }
        self.weight += output.len() * (1 + usize::from(is_error));
        let id = item["id"].clone();
        out.push(json!({"type": kind, "item_id": id, "output_index": index}));
        self.item_done(index, out);
    }

    /// The call's worker died while it ran: its effect is unknown, and baton never runs it
    /// again on its own (docs/protocol.md).
    fn tool_unknown(&mut self, step: i64, out: &mut Numbering) {
        let Some(&index) = self.steps.get(&step) else {
            return;
        };
        let item = &mut self.items[index];
        if item["status"] != "in_progress" {
            return;
        }
        item["status"] = json!("incomplete");
        item["error"] = json!(UNKNOWN_EFFECT);
        let id = item["id"].clone();
        out.push(json!({"type": "response.mcp_call.failed", "item_id": id, "output_index": index}));
        self.item_done(index, out);
    }

    /// The response ends: what is still open ends incomplete (shown so in the object the end
    /// carries), and the end takes the last place of the position.
    fn finish(&mut self, meta: &Meta, end: End, out: &mut Numbering) {
        let position = out.base / PER_POSITION;
        out.out.push(self.end_event(meta, end, position));
    }

    /// The end at position `position` from the run's phase, when the ledger read to its end
    /// says none (the `closed` seal not written yet: it will be at `position`): the fold ends.
    pub fn end_from_phase(&mut self, meta: &Meta, end: End, position: i64) -> Option<Value> {
        if self.end.is_some() {
            return None;
        }
        Some(self.end_event(meta, end, position))
    }

    /// The event [`Self::end_from_phase`] makes, the fold left as it is (followers may share
    /// it, and their streams end with this event).
    pub fn ending_from_phase(&self, meta: &Meta, end: End, position: i64) -> Option<Value> {
        if self.end.is_some() {
            return None;
        }
        let response = self.object_as(meta, Some(&end), true);
        Some(end_event(&end, response, position))
    }

    fn end_event(&mut self, meta: &Meta, end: End, position: i64) -> Value {
        self.close_open();
        let response = self.object_as(meta, Some(&end), false);
        let event = end_event(&end, response, position);
        self.end = Some(end);
        event
    }

    fn close_open(&mut self) {
        if let Some(index) = self.take_streaming() {
            close_streamed(&mut self.items[index]);
        }
        close_in_progress(&mut self.items);
    }

    fn add_item(&mut self, item: Value, out: &mut Numbering) -> usize {
        let index = self.items.len();
        out.push(
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        );
        self.items.push(item);
        index
    }

    fn item_done(&self, index: usize, out: &mut Numbering) {
        let item = self.items[index].clone();
        out.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }

    /// The Response object as the fold stands, with `status`.
    pub fn object(&self, meta: &Meta, status: &str) -> Value {
        let mut object = self.object_as(meta, self.end.as_ref(), false);
        object["status"] = json!(status);
        object
    }

    /// The Response object as the fold stands, ended by `end` (its status and error; None: not
    /// ended), with what is still open closed when `close` says so.
    fn object_as(&self, meta: &Meta, end: Option<&End>, close: bool) -> Value {
        let error = match end {
            Some(End::Failed { code, message }) => json!({"code": code, "message": message}),
            _ => Value::Null,
        };
        let status = end.map_or("", End::status);
        let usage = json!({
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        });
        let mut items = self.items.clone();
        match self.streaming {
            Some(index) if close => close_streamed(&mut items[index]),
            Some(index) => items[index]["content"] = json!([text_part(&self.streamed)]),
            None => {}
        }
        if close {
            close_in_progress(&mut items);
        }
        json!({
            "id": meta.id, "object": "response", "created_at": meta.created_at,
            "status": status, "background": meta.background, "model": meta.model,
            "output": items, "usage": usage, "error": error,
            "incomplete_details": null, "instructions": null, "metadata": {},
            "parallel_tool_calls": false, "tool_choice": "auto", "tools": [],
            "temperature": null, "top_p": null,
            "conversation": meta.conversation.as_ref().map(|c| json!({"id": c})),
        })
    }
}

fn end_event(end: &End, response: Value, position: i64) -> Value {
    json!({
        "type": end.event_type(), "response": response,
        "sequence_number": position * PER_POSITION + END_SLOT,
    })
}

/// A streamed message item whose message never came: incomplete, with no content.
fn close_streamed(item: &mut Value) {
    let id = item["id"].as_str().unwrap_or("").to_string();
    *item = message_item(&id, "incomplete", None);
}

/// Items still in progress end incomplete.
fn close_in_progress(items: &mut [Value]) {
    for item in items {
        if item["status"] == "in_progress" {
            item["status"] = json!("incomplete");
        }
    }
}

/// How a run the controller ended (its `closed` seal) ends its response.
fn closed_end(reason: CloseReason) -> End {
    match reason {
        CloseReason::StopRequested | CloseReason::Interrupted => End::Cancelled,
        other => End::Failed {
            code: other.as_str().to_string(),
            message: format!("baton ended the run: {}", other.as_str()),
        },
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn message_item(id: &str, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(text) => json!([text_part(text)]),
        None => json!([]),
    };
    json!({"type": "message", "id": id, "role": "assistant", "status": status, "content": content})
}
