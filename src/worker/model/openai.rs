//! The OpenAI-compatible Chat Completions provider (OpenAI, vLLM, Ollama, llama.cpp server):
//! one streamed `POST {endpoint}/chat/completions` per model turn.
//!
//! It also holds what both HTTP providers derive from baton's own types: the tool argument
//! schemas and a conversation in which every tool call is answered right after it is made.

use std::collections::BTreeMap;

use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde_json::{Value, json};

use super::answer::{self, Answer};
use super::body::{Bounds, Target};
use super::endpoint::{self, ApiKey};
use super::sse::{self, SseReader};
use super::{DeltaSink, ModelError, ModelRequest, ModelToolCall, ModelTurn, Usage};
use crate::crd::v1alpha1::ModelSpec;
use crate::ledger::{ReplayedMessage, ToolCallRecord};
use crate::worker::toolbox::ModelTool;

/// OpenAI's public API.
pub const DEFAULT_ENDPOINT: &str = "https://api.openai.com/v1";

/// What a tool call answered by nothing gets, so the provider accepts the conversation.
const MISSING_RESULT: &str = "No result was recorded for this tool call.";

/// An OpenAI-compatible chat model.
#[derive(Debug, Clone)]
pub struct OpenAiModel {
    client: reqwest::Client,
    target: Target,
    model: String,
}

impl OpenAiModel {
    /// Checks the spec (a model name, an http(s) endpoint, a usable key) without any I/O.
    pub fn new(spec: &ModelSpec, api_key: Option<String>) -> Result<Self, ModelError> {
        let base = endpoint::base_url(spec.endpoint.as_deref(), DEFAULT_ENDPOINT)?;
        let key = ApiKey::new(api_key);
        key.header("Bearer ")?;
        Ok(Self {
            client: endpoint::http_client()?,
            target: Target {
                url: format!("{base}/chat/completions"),
                key,
                bounds: Bounds::for_spec(spec),
            },
            model: model_name(spec, "openai")?,
        })
    }

    /// Its HTTP client and where its calls go (the agent container's gateway forwards through
    /// them: one place builds a provider's endpoint).
    pub fn endpoint(&self) -> (&reqwest::Client, &Target) {
        (&self.client, &self.target)
    }

    /// Asks for the next turn, streaming its text to `deltas`.
    pub async fn complete(
        &self,
        request: &ModelRequest,
        deltas: &DeltaSink,
    ) -> Result<ModelTurn, ModelError> {
        let target = &self.target;
        let mut http = self
            .client
            .post(&target.url)
            .header(ACCEPT, "text/event-stream")
            .json(&request_body(&self.model, request));
        if let Some(auth) = target.key.header("Bearer ")? {
            http = http.header(AUTHORIZATION, auth);
        }
        let response = answer::send(http, target).await?;
        match answer::receive(response, target).await? {
            Answer::Stream(mut reader) => read_turn(&mut reader, &target.key, deltas).await,
            Answer::Whole(answer) => whole_turn(&answer, target, deltas),
        }
    }
}

/// The model name the spec gives; the providers' APIs require one.
pub(super) fn model_name(spec: &ModelSpec, provider: &str) -> Result<String, ModelError> {
    match spec.name.as_deref().map(str::trim) {
        Some(name) if !name.is_empty() => Ok(name.to_string()),
        _ => Err(ModelError::Permanent {
            status: None,
            message: format!("spec.agent.model.name is required for provider {provider}"),
        }),
    }
}

// === request ===

fn request_body(model: &str, request: &ModelRequest) -> Value {
    // `include_usage`: the last chunk before `[DONE]` carries the call's token usage.
    let mut body = json!({
        "model": model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": messages(request),
    });
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(tool).collect();
    }
    body
}

fn messages(request: &ModelRequest) -> Vec<Value> {
    let system = request.system_prompt.as_deref().filter(|p| !p.is_empty());
    let system = system.map(|p| json!({"role": "system", "content": p}));
    system
        .into_iter()
        .chain(chat_messages(&request.messages))
        .collect()
}

/// `conversation` as Chat Completions messages, each tool result after its call: what the
/// model is sent, and what an agent container of a thread's turn is given as its history.
pub fn chat_messages(conversation: &[ReplayedMessage]) -> Vec<Value> {
    paired_tool_results(conversation)
        .iter()
        .map(message)
        .collect()
}

fn message(m: &ReplayedMessage) -> Value {
    match m {
        ReplayedMessage::System(text) => json!({"role": "system", "content": text}),
        ReplayedMessage::User(text) => json!({"role": "user", "content": text}),
        ReplayedMessage::Assistant { text, tool_calls } => assistant(text, tool_calls),
        ReplayedMessage::ToolResult {
            call_id,
            content,
            is_error,
            ..
        } => json!({
            "role": "tool",
            "tool_call_id": call_id,
            // Chat Completions has no error flag: say it in the content.
            "content": if *is_error { format!("ERROR: {content}") } else { content.clone() },
        }),
    }
}

fn assistant(text: &str, calls: &[ToolCallRecord]) -> Value {
    if calls.is_empty() {
        return json!({"role": "assistant", "content": text});
    }
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.tool, "arguments": c.input},
            })
        })
        .collect();
    let content = if text.is_empty() {
        Value::Null
    } else {
        text.into()
    };
    json!({"role": "assistant", "content": content, "tool_calls": calls})
}

fn tool(t: &ModelTool) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
        },
    })
}

/// The conversation with each assistant turn's tool results moved right after it, in call
/// order. Both APIs reject a tool call whose answer is not next (or missing): a call the
/// ledger holds no result for gets a placeholder, a result without its call becomes user
/// text. Nothing is dropped.
pub(super) fn paired_tool_results(messages: &[ReplayedMessage]) -> Vec<ReplayedMessage> {
    let mut used = vec![false; messages.len()];
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if used[i] {
            continue;
        }
        match m {
            ReplayedMessage::Assistant { tool_calls, .. } => {
                out.push(m.clone());
                for call in tool_calls {
                    out.push(take_result(call, messages, i, &mut used));
                }
            }
            ReplayedMessage::ToolResult {
                call_id,
                tool,
                content,
                ..
            } => out.push(ReplayedMessage::User(format!(
                "Result of the {tool} call {call_id}:\n{content}"
            ))),
            other => out.push(other.clone()),
        }
    }
    out
}

/// The result of `call` between its assistant turn (`from`) and the next one.
fn take_result(
    call: &ToolCallRecord,
    messages: &[ReplayedMessage],
    from: usize,
    used: &mut [bool],
) -> ReplayedMessage {
    let turn_end = messages[from + 1..]
        .iter()
        .position(|m| matches!(m, ReplayedMessage::Assistant { .. }))
        .map_or(messages.len(), |p| from + 1 + p);
    let found = (from + 1..turn_end).find(|&j| {
        !used[j] && matches!(&messages[j], ReplayedMessage::ToolResult { call_id, .. } if *call_id == call.call_id)
    });
    match found {
        Some(j) => {
            used[j] = true;
            messages[j].clone()
        }
        None => ReplayedMessage::ToolResult {
            step: call.step,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
            content: MISSING_RESULT.into(),
            is_error: true,
        },
    }
}

// === response ===

async fn read_turn(
    reader: &mut SseReader,
    key: &ApiKey,
    deltas: &DeltaSink,
) -> Result<ModelTurn, ModelError> {
    let mut turn = TurnBuilder::default();
    while let Some(event) = reader.next().await? {
        let data = event.data.trim();
        if data == "[DONE]" {
            return turn.build();
        }
        if data.is_empty() {
            continue;
        }
        turn.apply(&sse::json_data(data)?, key, deltas)?;
    }
    // Some servers close without `[DONE]`; a finish reason says the turn was complete.
    match turn.finished {
        true => turn.build(),
        false => Err(reader.ended_early("[DONE] nor finish reason")),
    }
}

/// A completion sent whole (a server that does not stream, or not on this endpoint): its
/// message is read as one chunk's delta, its text sent on as one piece.
fn whole_turn(
    answer: &Value,
    target: &Target,
    deltas: &DeltaSink,
) -> Result<ModelTurn, ModelError> {
    if let Some(error) = answer.get("error").filter(|e| !e.is_null()) {
        return Err(endpoint::stream_error(error, &target.key));
    }
    let choice = answer["choices"].as_array().and_then(|c| c.first());
    let Some(choice) = choice.filter(|c| c["message"].is_object()) else {
        return Err(target.not_an_answer(answer, "choices[0].message"));
    };
    let chunk = json!({
        "choices": [{"delta": choice["message"], "finish_reason": choice["finish_reason"]}],
        "usage": answer["usage"],
    });
    let mut turn = TurnBuilder::default();
    turn.apply(&chunk, &target.key, deltas)?;
    turn.build()
}

/// A turn as its chunks arrive: text, and tool calls assembled by their index.
#[derive(Debug, Default)]
struct TurnBuilder {
    text: String,
    calls: BTreeMap<u64, PartialCall>,
    finished: bool,
    usage: Option<Usage>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl TurnBuilder {
    fn apply(&mut self, chunk: &Value, key: &ApiKey, deltas: &DeltaSink) -> Result<(), ModelError> {
        if let Some(error) = chunk.get("error") {
            return Err(endpoint::stream_error(error, key));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(Usage {
                input_tokens: usage["prompt_tokens"].as_i64().unwrap_or(0),
                output_tokens: usage["completion_tokens"].as_i64().unwrap_or(0),
            });
        }
        // One choice is asked for (no `n`), so the first is the turn.
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
            return Ok(()); // e.g. a final usage-only chunk
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text.push_str(text);
            let _ = deltas.send(text.to_string());
        }
        let calls = delta["tool_calls"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (position, call) in calls.iter().enumerate() {
            self.apply_call(position, call);
        }
        self.finished |= choice["finish_reason"].is_string();
        Ok(())
    }

    /// The id and name come once, with the first fragment; arguments come in pieces. A
    /// server that sends whole calls without an index gets them ordered by position.
    fn apply_call(&mut self, position: usize, call: &Value) {
        let index = call["index"].as_u64().unwrap_or(position as u64);
        let partial = self.calls.entry(index).or_default();
        if let Some(id) = call["id"].as_str().filter(|id| !id.is_empty()) {
            partial.id = id.to_string();
        }
        let function = &call["function"];
        if let Some(name) = function["name"]
            .as_str()
            .filter(|_| partial.name.is_empty())
        {
            partial.name = name.to_string();
        }
        match &function["arguments"] {
            Value::String(piece) => partial.arguments.push_str(piece),
            Value::Object(whole) => partial.arguments = Value::Object(whole.clone()).to_string(),
            _ => {}
        }
    }

    fn build(self) -> Result<ModelTurn, ModelError> {
        let usage = self.usage;
        let turn =
            ModelTurn::assembled(self.text, self.calls.into_values().map(PartialCall::finish))?;
        Ok(ModelTurn { usage, ..turn })
    }
}

impl PartialCall {
    fn finish(self) -> Result<ModelToolCall, ModelError> {
        ModelToolCall::from_stream(self.id, self.name, self.arguments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::ToolKind;
    use crate::worker::toolbox::builtin_parameters;

    fn call(id: &str) -> ToolCallRecord {
        ToolCallRecord {
            step: 1,
            call_id: id.into(),
            tool: "sh".into(),
            input: "{}".into(),
        }
    }

    fn result(id: &str) -> ReplayedMessage {
        ReplayedMessage::ToolResult {
            step: 1,
            call_id: id.into(),
            tool: "sh".into(),
            content: format!("out {id}"),
            is_error: false,
        }
    }

    #[test]
    fn tool_results_follow_their_calls_in_order() {
        let messages = vec![
            ReplayedMessage::User("go".into()),
            ReplayedMessage::Assistant {
                text: String::new(),
                tool_calls: vec![call("a"), call("b"), call("c")],
            },
            result("b"),
            ReplayedMessage::User("answer".into()),
            result("a"),
            result("orphan"),
        ];
        let paired = paired_tool_results(&messages);
        let shape: Vec<String> = paired
            .iter()
            .map(|m| match m {
                ReplayedMessage::ToolResult {
                    call_id, is_error, ..
                } => format!("result {call_id} {is_error}"),
                ReplayedMessage::User(text) => {
                    format!("user {}", text.lines().next().unwrap_or(""))
                }
                _ => "assistant".into(),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "user go",
                "assistant",
                "result a false",
                "result b false",
                "result c true",
                "user answer",
                "user Result of the sh call orphan:",
            ]
        );
    }

    #[test]
    fn schemas_per_tool_kind() {
        let http = builtin_parameters(ToolKind::Http);
        assert_eq!(http["required"], json!(["method", "url"]));
        assert_eq!(http["properties"]["body"]["type"], "string");
        assert_eq!(
            builtin_parameters(ToolKind::Shell)["required"],
            json!(["command"])
        );
        assert_eq!(
            builtin_parameters(ToolKind::AskUser)["required"],
            json!(["question"])
        );
    }

    #[test]
    fn tool_call_fragments_assemble_by_index() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let key = ApiKey::default();
        let mut turn = TurnBuilder::default();
        let chunks = [
            json!({"choices": [{"delta": {"content": "Hi"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "web", "arguments": "{\"u"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "sh", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": "\":1}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        for chunk in &chunks {
            turn.apply(chunk, &key, &tx).unwrap();
        }
        assert!(turn.finished);
        let turn = turn.build().unwrap();
        assert_eq!(turn.text, "Hi");
        assert_eq!(rx.try_recv().unwrap(), "Hi");
        let calls: Vec<_> = turn
            .tool_calls
            .iter()
            .map(|c| (&*c.call_id, &*c.tool, &*c.arguments))
            .collect();
        assert_eq!(calls, [("c1", "sh", "{}"), ("c2", "web", "{\"u\":1}")]);
    }

    #[test]
    fn a_missing_name_is_an_error() {
        let spec = ModelSpec {
            name: Some(" ".into()),
            ..ModelSpec::default()
        };
        let err = OpenAiModel::new(&spec, None).unwrap_err();
        assert!(err.to_string().contains("model.name is required"), "{err}");
    }
}
