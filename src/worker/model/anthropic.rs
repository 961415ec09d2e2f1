//! The Anthropic Messages provider: one streamed `POST {endpoint}/v1/messages` per turn,
//! with tool use.

use std::collections::BTreeMap;

use reqwest::header::ACCEPT;
use serde_json::{Value, json};

use super::answer::{self, Answer};
use super::body::{Bounds, Target};
use super::endpoint::{self, ApiKey};
use super::openai::{model_name, paired_tool_results};
use super::sse::{self, SseReader};
use super::{DeltaSink, ModelError, ModelRequest, ModelToolCall, ModelTurn, Usage};
use crate::crd::v1alpha1::ModelSpec;
use crate::ledger::{ReplayedMessage, ToolCallRecord};
use crate::worker::toolbox::ModelTool;

/// Anthropic's public API.
pub const DEFAULT_ENDPOINT: &str = "https://api.anthropic.com";
/// The Messages API version this provider speaks.
pub const API_VERSION: &str = "2023-06-01";
/// The API requires an output bound; 4096 is accepted by every current model.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// An Anthropic model.
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    client: reqwest::Client,
    target: Target,
    model: String,
    max_tokens: u32,
}

impl AnthropicModel {
    /// Checks the spec (a model name, an http(s) endpoint, a usable key) without any I/O.
    pub fn new(spec: &ModelSpec, api_key: Option<String>) -> Result<Self, ModelError> {
        let base = endpoint::base_url(spec.endpoint.as_deref(), DEFAULT_ENDPOINT)?;
        let key = ApiKey::new(api_key);
        key.header("")?;
        // Accept an endpoint given with or without the version segment.
        let url = match base.ends_with("/v1") {
            true => format!("{base}/messages"),
            false => format!("{base}/v1/messages"),
        };
        Ok(Self {
            client: endpoint::http_client()?,
            target: Target {
                url,
                key,
                bounds: Bounds::for_spec(spec),
            },
            model: model_name(spec, "anthropic")?,
            max_tokens: DEFAULT_MAX_TOKENS,
        })
    }

    /// Its client and target: the gateway of an agent container forwards through them.
    pub fn endpoint(&self) -> (&reqwest::Client, &Target) {
        (&self.client, &self.target)
    }

    /// The same model with another output bound.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens.max(1);
        self
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
            .header("anthropic-version", API_VERSION)
            .json(&request_body(&self.model, self.max_tokens, request));
        if let Some(key) = target.key.header("")? {
            http = http.header("x-api-key", key);
        }
        let response = answer::send(http, target).await?;
        match answer::receive(response, target).await? {
            Answer::Stream(mut reader) => read_turn(&mut reader, &target.key, deltas).await,
            Answer::Whole(answer) => whole_turn(&answer, target, deltas),
        }
    }
}

// === request ===

fn request_body(model: &str, max_tokens: u32, request: &ModelRequest) -> Value {
    let (system, messages) = conversation(request);
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "stream": true,
        "messages": messages,
    });
    if !system.is_empty() {
        body["system"] = system.into();
    }
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(tool).collect();
    }
    body
}

fn tool(t: &ModelTool) -> Value {
    json!({
        "name": t.name,
        "description": t.description,
        "input_schema": t.parameters,
    })
}

/// The system text (the prompt, then any system messages: the API has no system role in
/// `messages`) and the messages, consecutive same-role ones merged as the API requires.
fn conversation(request: &ModelRequest) -> (String, Vec<Value>) {
    let mut system: Vec<&str> = request.system_prompt.as_deref().into_iter().collect();
    let mut messages: Vec<Value> = Vec::new();
    let paired = paired_tool_results(&request.messages);
    for m in &paired {
        match m {
            ReplayedMessage::System(text) => system.push(text),
            ReplayedMessage::User(text) => push(&mut messages, "user", text_block(text)),
            ReplayedMessage::Assistant { text, tool_calls } => push(
                &mut messages,
                "assistant",
                assistant_blocks(text, tool_calls),
            ),
            ReplayedMessage::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => push(
                &mut messages,
                "user",
                vec![tool_result(call_id, content, *is_error)],
            ),
        }
    }
    messages.iter_mut().for_each(tool_results_first);
    let system = system.into_iter().filter(|s| !s.trim().is_empty());
    (system.collect::<Vec<_>>().join("\n\n"), messages)
}

/// The API rejects empty text blocks and empty messages: both are left out.
fn text_block(text: &str) -> Vec<Value> {
    match text.trim().is_empty() {
        true => vec![],
        false => vec![json!({"type": "text", "text": text})],
    }
}

fn assistant_blocks(text: &str, calls: &[ToolCallRecord]) -> Vec<Value> {
    let uses = calls.iter().map(|c| {
        json!({"type": "tool_use", "id": c.call_id, "name": c.tool, "input": tool_input(&c.input)})
    });
    text_block(text).into_iter().chain(uses).collect()
}

/// `input` must be an object; arguments that are not one are passed on, not dropped.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ if arguments.trim().is_empty() => json!({}),
        _ => json!({"arguments": arguments}),
    }
}

fn tool_result(call_id: &str, content: &str, is_error: bool) -> Value {
    let mut block = json!({"type": "tool_result", "tool_use_id": call_id});
    if !content.is_empty() {
        block["content"] = content.into();
    }
    if is_error {
        block["is_error"] = true.into();
    }
    block
}

fn push(messages: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = messages.last_mut().filter(|m| m["role"] == role)
        && let Some(content) = last["content"].as_array_mut()
    {
        content.extend(blocks);
        return;
    }
    messages.push(json!({"role": role, "content": blocks}));
}

/// In a user message, tool results must come before any text.
fn tool_results_first(message: &mut Value) {
    if let Some(content) = message["content"].as_array_mut() {
        content.sort_by_key(|block| block["type"] != "tool_result");
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
        if event.data.trim().is_empty() {
            continue;
        }
        turn.apply(&sse::json_data(&event.data)?, key, deltas)?;
        if turn.stopped {
            return turn.build();
        }
    }
    match turn.stop_reason {
        true => turn.build(),
        false => Err(reader.ended_early("message_stop nor stop reason")),
    }
}

/// A message sent whole (a gateway that does not stream this endpoint): its content blocks
/// are read as their starts would be, their text sent on as one piece.
fn whole_turn(
    answer: &Value,
    target: &Target,
    deltas: &DeltaSink,
) -> Result<ModelTurn, ModelError> {
    if answer["type"] == "error" || answer.get("error").is_some_and(|e| !e.is_null()) {
        return Err(endpoint::stream_error(&answer["error"], &target.key));
    }
    let Some(blocks) = answer["content"].as_array() else {
        return Err(target.not_an_answer(answer, "content"));
    };
    let mut turn = TurnBuilder::default();
    turn.count_usage(&answer["usage"]);
    for (index, block) in blocks.iter().enumerate() {
        turn.start(index as u64, block, deltas);
    }
    turn.build()
}

/// A turn as its events arrive: text as streamed, tool uses by content block index.
#[derive(Debug, Default)]
struct TurnBuilder {
    text: String,
    tools: BTreeMap<u64, ToolUse>,
    /// `message_delta` carried a stop reason: all content is in.
    stop_reason: bool,
    /// `message_stop`: the stream is over.
    stopped: bool,
    /// Input tokens come with `message_start`, output tokens with `message_delta`.
    usage: Usage,
    usage_seen: bool,
}

#[derive(Debug, Default)]
struct ToolUse {
    id: String,
    name: String,
    /// The input given with the block's start (the API sends `{}` and streams the rest).
    initial: Option<Value>,
    json: String,
}

impl TurnBuilder {
    fn apply(&mut self, event: &Value, key: &ApiKey, deltas: &DeltaSink) -> Result<(), ModelError> {
        let index = event["index"].as_u64().unwrap_or_default();
        match event["type"].as_str().unwrap_or_default() {
            "content_block_start" => self.start(index, &event["content_block"], deltas),
            "content_block_delta" => self.delta(index, &event["delta"], deltas),
            "message_start" => self.count_usage(&event["message"]["usage"]),
            "message_delta" => {
                self.stop_reason |= event["delta"]["stop_reason"].is_string();
                self.count_usage(&event["usage"]);
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(endpoint::stream_error(&event["error"], key)),
            // content_block_stop, ping, and whatever a later API adds.
            _ => {}
        }
        Ok(())
    }

    /// Input tokens (cache reads and writes included: they are input too) and output tokens;
    /// `message_delta`'s output count is cumulative, so the last one stands.
    fn count_usage(&mut self, usage: &Value) {
        if !usage.is_object() {
            return;
        }
        self.usage_seen = true;
        let input: i64 = [
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ]
        .iter()
        .filter_map(|k| usage[*k].as_i64())
        .sum();
        if input > 0 {
            self.usage.input_tokens = input;
        }
        if let Some(output) = usage["output_tokens"].as_i64() {
            self.usage.output_tokens = output;
        }
    }

    fn start(&mut self, index: u64, block: &Value, deltas: &DeltaSink) {
        match block["type"].as_str() {
            Some("text") => self.push_text(block["text"].as_str().unwrap_or_default(), deltas),
            Some("tool_use") => {
                let tool = ToolUse {
                    id: block["id"].as_str().unwrap_or_default().to_string(),
                    name: block["name"].as_str().unwrap_or_default().to_string(),
                    initial: block.get("input").cloned(),
                    json: String::new(),
                };
                self.tools.insert(index, tool);
            }
            // Thinking blocks and the like are not part of the answer.
            _ => {}
        }
    }

    fn delta(&mut self, index: u64, delta: &Value, deltas: &DeltaSink) {
        match delta["type"].as_str() {
            Some("text_delta") => {
                self.push_text(delta["text"].as_str().unwrap_or_default(), deltas)
            }
            Some("input_json_delta") => {
                let piece = delta["partial_json"].as_str().unwrap_or_default();
                self.tools.entry(index).or_default().json.push_str(piece);
            }
            _ => {}
        }
    }

    fn push_text(&mut self, text: &str, deltas: &DeltaSink) {
        if !text.is_empty() {
            self.text.push_str(text);
            let _ = deltas.send(text.to_string());
        }
    }

    fn build(self) -> Result<ModelTurn, ModelError> {
        let usage = self.usage_seen.then_some(self.usage);
        let turn = ModelTurn::assembled(self.text, self.tools.into_values().map(ToolUse::finish))?;
        Ok(ModelTurn { usage, ..turn })
    }
}

impl ToolUse {
    /// A block without a streamed `partial_json` keeps the input its start carried.
    fn finish(self) -> Result<ModelToolCall, ModelError> {
        let arguments = match (self.json.trim(), self.initial) {
            ("", Some(initial @ Value::Object(_))) => initial.to_string(),
            _ => self.json,
        };
        ModelToolCall::from_stream(self.id, self.name, arguments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(messages: Vec<ReplayedMessage>) -> ModelRequest {
        ModelRequest {
            system_prompt: Some("be brief".into()),
            messages,
            tools: vec![],
        }
    }

    #[test]
    fn same_role_messages_merge_with_tool_results_first() {
        let call = ToolCallRecord {
            step: 1,
            call_id: "tu_1".into(),
            tool: "sh".into(),
            input: "not json".into(),
        };
        let (system, messages) = conversation(&request(vec![
            ReplayedMessage::System("notice".into()),
            ReplayedMessage::User("go".into()),
            ReplayedMessage::Assistant {
                text: "  ".into(),
                tool_calls: vec![call],
            },
            ReplayedMessage::User("and then".into()),
            ReplayedMessage::ToolResult {
                step: 1,
                call_id: "tu_1".into(),
                tool: "sh".into(),
                content: "boom".into(),
                is_error: true,
            },
            ReplayedMessage::User("more".into()),
        ]));
        assert_eq!(system, "be brief\n\nnotice");
        assert_eq!(
            Value::Array(messages),
            json!([
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "tu_1", "name": "sh", "input": {"arguments": "not json"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu_1", "content": "boom", "is_error": true},
                    {"type": "text", "text": "and then"},
                    {"type": "text", "text": "more"},
                ]},
            ])
        );
    }

    #[test]
    fn an_endpoint_with_or_without_the_version() {
        let spec = |endpoint: &str| ModelSpec {
            name: Some("claude".into()),
            endpoint: Some(endpoint.into()),
            ..ModelSpec::default()
        };
        let url = |endpoint| {
            AnthropicModel::new(&spec(endpoint), None)
                .unwrap()
                .target
                .url
        };
        assert_eq!(url("http://h:1"), "http://h:1/v1/messages");
        assert_eq!(url("http://h:1/v1/"), "http://h:1/v1/messages");
    }

    #[test]
    fn a_tool_use_without_streamed_input_keeps_its_initial_input() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut turn = TurnBuilder::default();
        let start = json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "ask", "input": {"question": "why"}}});
        turn.apply(&start, &ApiKey::default(), &tx).unwrap();
        let turn = turn.build().unwrap();
        assert_eq!(turn.tool_calls[0].arguments, r#"{"question":"why"}"#);
    }
}
