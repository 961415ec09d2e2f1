//! Helpers for the `worker_*` tests that drive a real worker through the OpenAI-compatible
//! provider or watch what it does: Chat Completions streams, a worker started with extra
//! environment, a watch of the ledger, and a plain HTTP GET for the admin server.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use baton::crd::v1alpha1::LedgerSegment;

// === Chat Completions streams ===

/// A chunk as a server sends it: `fields` with the chunk's id, object, time and model.
fn data(mut chunk: Value) -> String {
    chunk["id"] = json!("chatcmpl-1");
    chunk["object"] = json!("chat.completion.chunk");
    chunk["created"] = json!(1);
    chunk["model"] = json!("local-model");
    format!("data: {chunk}\n\n")
}

/// A streamed turn that calls `tool` once with `{"command": command}`, the arguments split
/// over several deltas.
pub fn tool_call_stream(call_id: &str, tool: &str, command: &str) -> Vec<String> {
    let arguments = json!({ "command": command }).to_string();
    let (head, tail) = arguments.split_at(arguments.len() / 2);
    let call =
        |fields: Value| data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [fields]}}]}));
    vec![
        data(
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me check."}}]}),
        ),
        call(
            json!({"index": 0, "id": call_id, "type": "function", "function": {"name": tool, "arguments": ""}}),
        ),
        call(json!({"index": 0, "function": {"arguments": head}})),
        call(json!({"index": 0, "function": {"arguments": tail}})),
        data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})),
        "data: [DONE]\n\n".to_string(),
    ]
}

/// A streamed final answer, one delta per word.
pub fn answer_stream(text: &str) -> Vec<String> {
    let mut pieces: Vec<String> = text
        .split_inclusive(' ')
        .map(|w| data(json!({"choices": [{"index": 0, "delta": {"content": w}}]})))
        .collect();
    pieces.push(data(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ));
    pieces.push("data: [DONE]\n\n".to_string());
    pieces
}

// === Chat Completions answers, whole ===

/// A whole Chat Completions answer that calls `tool` once with `arguments`.
pub fn chat_call(id: &str, tool: &str, arguments: &Value) -> Value {
    let call = json!({"id": id, "type": "function",
        "function": {"name": tool, "arguments": arguments.to_string()}});
    let message = json!({"role": "assistant", "content": null, "tool_calls": [call]});
    chat_completion(message, "tool_calls")
}

/// A whole Chat Completions answer with the final text `text`.
pub fn chat_answer(text: &str) -> Value {
    chat_completion(json!({"role": "assistant", "content": text}), "stop")
}

fn chat_completion(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "local-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
}

/// The `tool` messages of a Chat Completions request body, as (call id, content).
pub fn tool_messages(body: &Value) -> Vec<(String, String)> {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let id = m["tool_call_id"].as_str().unwrap_or_default().to_string();
            let content = m["content"].as_str().unwrap_or_default().to_string();
            (id, content)
        })
        .collect()
}

// === Responses answers ===

/// A whole Responses answer whose output is `items`.
pub fn responses_answer_of(items: Vec<Value>) -> Value {
    json!({
        "id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
        "model": "local-model", "output": items,
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    })
}

/// A whole Responses answer with the message `text`.
pub fn responses_answer(text: &str) -> Value {
    responses_answer_of(vec![json!({
        "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })])
}

/// A whole Responses answer that calls `tool` once with `{"command": command}`.
pub fn responses_call(call_id: &str, tool: &str, command: &str) -> Value {
    let arguments = json!({ "command": command }).to_string();
    responses_answer_of(vec![json!({
        "type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
        "name": tool, "arguments": arguments, "status": "completed",
    })])
}

/// `answer` as a Responses stream: created, a text delta per word of its message, completed.
pub fn responses_stream(answer: &Value) -> Vec<String> {
    let frame = |event: Value| {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        format!("event: {kind}\ndata: {event}\n\n")
    };
    let mut created = answer.clone();
    created["status"] = json!("in_progress");
    created["output"] = json!([]);
    let mut pieces = vec![frame(
        json!({"type": "response.created", "sequence_number": 0, "response": created}),
    )];
    let text = answer
        .pointer("/output/0/content/0/text")
        .and_then(Value::as_str)
        .unwrap_or_default();
    for (i, word) in text.split_inclusive(' ').enumerate() {
        pieces.push(frame(json!({
            "type": "response.output_text.delta", "sequence_number": i + 1, "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": word, "logprobs": [],
        })));
    }
    pieces.push(frame(
        json!({"type": "response.completed", "sequence_number": 99, "response": answer}),
    ));
    pieces
}

// === Anthropic Messages answers ===

/// A whole Messages answer whose content is `blocks`.
pub fn messages_answer_of(blocks: Vec<Value>, stop_reason: &str) -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "local-model",
        "content": blocks, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    })
}

/// A whole Messages answer with the text `text`.
pub fn messages_text(text: &str) -> Value {
    messages_answer_of(vec![json!({"type": "text", "text": text})], "end_turn")
}

/// A whole Messages answer that uses `tool` once with `{"command": command}`.
pub fn messages_tool_use(id: &str, tool: &str, command: &str) -> Value {
    let block = json!({"type": "tool_use", "id": id, "name": tool, "input": {"command": command}});
    messages_answer_of(vec![block], "tool_use")
}

/// `message` as a Messages stream: its start, each block whole in one delta, its end.
pub fn messages_stream(message: &Value) -> Vec<String> {
    let frame = |event: Value| {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        format!("event: {kind}\ndata: {event}\n\n")
    };
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"] = json!({"input_tokens": 10, "output_tokens": 1});
    let mut pieces = vec![frame(json!({"type": "message_start", "message": start}))];
    let blocks = message["content"].as_array().cloned().unwrap_or_default();
    for (index, block) in blocks.iter().enumerate() {
        let (empty, delta) = match block["type"].as_str() {
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            ),
            _ => (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            ),
        };
        pieces.push(frame(
            json!({"type": "content_block_start", "index": index, "content_block": empty}),
        ));
        pieces.push(frame(
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        pieces.push(frame(json!({"type": "content_block_stop", "index": index})));
    }
    pieces.push(frame(json!({
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null},
        "usage": {"output_tokens": 5},
    })));
    pieces.push(frame(json!({"type": "message_stop"})));
    pieces
}

// === worker processes ===

/// The address a worker's admin server listens on, from its log.
pub fn admin_addr(log: &str) -> Option<String> {
    let listening = |l: &&str| l.contains("listening") && l.contains("admin");
    let line = log.lines().find(listening)?;
    let start = line.find("addr=")? + "addr=".len();
    let addr: String = line[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '"' && *c != ',')
        .collect();
    Some(addr)
}

/// `GET path` on `addr`: (status code, body).
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut socket = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting to the admin server");
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of an unlabelled (or fully labelled) sample in a Prometheus exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

// === watching the ledger ===

/// Every watch event on LedgerSegments in a namespace, as (type, name, resourceVersion).
pub struct SegmentWatch {
    pub seen: Arc<Mutex<Vec<(String, String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SegmentWatch {
    /// Starts watching from now (existing segments are reported as ADDED first).
    pub async fn start(api: Api<LedgerSegment>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let stream = api
            .watch(&WatchParams::default().timeout(290), "0")
            .await
            .expect("watching segments");
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                let (kind, seg) = match event {
                    WatchEvent::Added(s) => ("ADDED", s),
                    WatchEvent::Modified(s) => ("MODIFIED", s),
                    WatchEvent::Deleted(s) => ("DELETED", s),
                    _ => continue,
                };
                let name = seg.metadata.name.clone().unwrap_or_default();
                let rv = seg.metadata.resource_version.clone().unwrap_or_default();
                log.lock().unwrap().push((kind.to_string(), name, rv));
            }
        });
        Self { seen, task }
    }

    /// Stops the watch and returns what it saw.
    pub fn stop(self) -> Vec<(String, String, String)> {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}
