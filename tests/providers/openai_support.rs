//! What the `openai` tests share: the model on the local server, requests, Chat Completions SSE.

use std::time::Duration;

use crate::offered;
use baton::crd::v1alpha1::{ModelSpec, Provider, ToolKind, ToolSpec};
use baton::ledger::ReplayedMessage;
use baton::worker::model::openai::OpenAiModel;
use baton::worker::model::retry::RetryPolicy;
use baton::worker::model::{ModelError, ModelRequest, ModelTurn};
use baton_testkit::model::{Server, split_every};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

pub const KEY: &str = "sk-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0";

pub fn model(server: &Server) -> OpenAiModel {
    let spec = ModelSpec {
        provider: Provider::Openai,
        name: Some("gpt-test".into()),
        endpoint: Some(format!("{}/v1", server.url)),
        ..ModelSpec::default()
    };
    OpenAiModel::new(&spec, Some(format!("{KEY}\n"))).unwrap()
}

fn tool(name: &str, kind: ToolKind) -> ToolSpec {
    serde_json::from_value(json!({"name": name, "kind": kind})).unwrap()
}

pub fn request(messages: Vec<ReplayedMessage>) -> ModelRequest {
    ModelRequest {
        system_prompt: Some("You are terse.".into()),
        messages,
        tools: offered(vec![
            tool("sh", ToolKind::Shell),
            tool("fetch", ToolKind::Http),
            tool("ask", ToolKind::AskUser),
        ]),
    }
}

pub fn data(chunk: Value) -> String {
    format!("data: {chunk}\n\n")
}

pub fn text_chunk(text: &str) -> String {
    data(
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
    )
}

pub fn finish(reason: &str) -> String {
    data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
}

/// A text answer, its SSE stream split every 7 characters.
pub fn text_stream(words: &[&str]) -> Vec<String> {
    let mut stream: String = words.iter().map(|w| text_chunk(w)).collect();
    stream.push_str(&finish("stop"));
    stream.push_str("data: [DONE]\n\n");
    split_every(&stream, 7)
}

pub async fn complete(
    model: &OpenAiModel,
    request: &ModelRequest,
) -> (Result<ModelTurn, ModelError>, String) {
    let (tx, mut rx) = unbounded_channel();
    let result = model.complete(request, &tx).await;
    (result, drain(&mut rx))
}

pub fn drain(rx: &mut UnboundedReceiver<String>) -> String {
    let mut streamed = String::new();
    while let Ok(piece) = rx.try_recv() {
        streamed.push_str(&piece);
    }
    streamed
}

pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        ..RetryPolicy::default()
    }
}

pub fn assert_no_key(err: &ModelError) {
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(
            !shown.contains(KEY) && !shown.contains("9f8e7d6c5b4a"),
            "key leaked: {shown}"
        );
    }
}

/// Two parallel calls whose fragments interleave, split across network chunks.
pub fn parallel_calls_stream() -> Vec<String> {
    let call = |index: u64, mut fields: Value| {
        fields["index"] = index.into();
        data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [fields]}}]}))
    };
    let stream = [
        data(
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Running both."}}]}),
        ),
        call(
            0,
            json!({"id": "call_A", "type": "function", "function": {"name": "sh", "arguments": ""}}),
        ),
        call(0, json!({"function": {"arguments": "{\"comm"}})),
        call(
            1,
            json!({"id": "call_B", "type": "function", "function": {"name": "fetch", "arguments": "{\"method\":\"GET\","}}),
        ),
        call(0, json!({"function": {"arguments": "and\":\"date\"}"}})),
        call(
            1,
            json!({"function": {"arguments": "\"url\":\"http://x\"}"}}),
        ),
        finish("tool_calls"),
        "data: [DONE]\n\n".to_string(),
    ];
    split_every(&stream.concat(), 11)
}
