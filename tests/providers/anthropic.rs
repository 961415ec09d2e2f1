//! The Anthropic provider against a local server speaking the Messages API.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{ModelSpec, Provider, ToolKind, ToolSpec};
use baton::ledger::ReplayedMessage;
use baton::worker::model::anthropic::AnthropicModel;
use baton::worker::model::retry::{RetryPolicy, with_retries};
use baton::worker::model::{ModelError, ModelRequest, ModelTurn, Usage};
use baton_testkit::model::{Reply, Server, answer_tool_calls, calls_of, split_every};
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-ant-api03-Zq8Xw7Vv6Uu5Tt4Ss3Rr2Qq1Pp0";

fn model(server: &Server) -> AnthropicModel {
    let spec = ModelSpec {
        provider: Provider::Anthropic,
        name: Some("claude-test".into()),
        endpoint: Some(server.url.clone()),
        ..ModelSpec::default()
    };
    AnthropicModel::new(&spec, Some(KEY.into()))
        .unwrap()
        .with_max_tokens(1000)
}

fn tool(name: &str, kind: ToolKind) -> ToolSpec {
    serde_json::from_value(
        json!({"name": name, "kind": kind, "description": format!("the {name} tool")}),
    )
    .unwrap()
}

use crate::offered;

fn request(messages: Vec<ReplayedMessage>) -> ModelRequest {
    ModelRequest {
        system_prompt: Some("You are terse.".into()),
        messages,
        tools: offered(vec![
            tool("sh", ToolKind::Shell),
            tool("fetch", ToolKind::Http),
        ]),
    }
}

fn event(data: Value) -> String {
    format!(
        "event: {}\ndata: {data}\n\n",
        data["type"].as_str().unwrap()
    )
}

fn start() -> String {
    event(
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    )
}

fn text_block(index: u64, pieces: &[&str]) -> String {
    let mut out = event(
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    );
    out.push_str(&event(json!({"type": "ping"})));
    for piece in pieces {
        out.push_str(&event(json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}})));
    }
    out + &event(json!({"type": "content_block_stop", "index": index}))
}

fn end(reason: &str) -> String {
    event(
        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": 15}}),
    ) + &event(json!({"type": "message_stop"}))
}

async fn complete(
    model: &AnthropicModel,
    request: &ModelRequest,
) -> (Result<ModelTurn, ModelError>, String) {
    let (tx, mut rx) = unbounded_channel();
    let result = model.complete(request, &tx).await;
    let mut streamed = String::new();
    while let Ok(piece) = rx.try_recv() {
        streamed.push_str(&piece);
    }
    (result, streamed)
}

fn assert_no_key(err: &ModelError) {
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(
            !shown.contains(KEY) && !shown.contains("Zq8Xw7Vv6Uu5"),
            "key leaked: {shown}"
        );
    }
}

#[tokio::test]
async fn streams_text_with_the_required_headers_and_body() {
    let stream = start() + &text_block(0, &["Hel", "lo, ", "wörld"]) + &end("end_turn");
    let server = Server::start(vec![Reply::sse(split_every(&stream, 13))]).await;
    let (turn, streamed) = complete(
        &model(&server),
        &request(vec![ReplayedMessage::User("hi".into())]),
    )
    .await;
    assert_eq!(
        turn.unwrap(),
        ModelTurn {
            text: "Hello, wörld".into(),
            tool_calls: vec![],
            // Input from message_start, output from message_delta (cumulative: the last).
            usage: Some(Usage {
                input_tokens: 10,
                output_tokens: 15
            }),
        }
    );
    assert_eq!(streamed, "Hello, wörld");

    let r = &server.received()[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(r.header("x-api-key"), Some(KEY));
    assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(r.header("authorization"), None);
    assert_eq!(r.body["model"], "claude-test");
    assert_eq!(r.body["max_tokens"], 1000);
    assert_eq!(r.body["stream"], true);
    assert_eq!(r.body["system"], "You are terse.");
    assert_eq!(
        r.body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
    assert_eq!(r.body["tools"][0]["name"], "sh");
    assert_eq!(r.body["tools"][0]["description"], "the sh tool");
    assert_eq!(
        r.body["tools"][0]["input_schema"]["required"],
        json!(["command"])
    );
    assert_eq!(
        r.body["tools"][1]["input_schema"]["properties"]["method"]["type"],
        "string"
    );
}

fn tool_use(index: u64, id: &str, name: &str, pieces: &[&str]) -> String {
    let mut out = event(
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
    );
    for piece in pieces {
        out.push_str(&event(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})));
    }
    out + &event(json!({"type": "content_block_stop", "index": index}))
}

#[tokio::test]
async fn parallel_tool_uses_assemble_and_round_trip_as_tool_results() {
    let stream = start()
        + &text_block(0, &["Checking."])
        + &tool_use(1, "toolu_A", "sh", &["", "{\"command\": ", "\"date\"}"])
        + &tool_use(
            2,
            "toolu_B",
            "fetch",
            &["{\"method\":\"GET\",\"url\":", "\"http://x\"}"],
        )
        + &end("tool_use");
    let server = Server::start(vec![
        Reply::sse(split_every(&stream, 17)),
        Reply::sse(vec![start() + &text_block(0, &["done"]) + &end("end_turn")]),
    ])
    .await;
    let model = model(&server);
    let mut conversation = vec![ReplayedMessage::User("date and fetch".into())];
    let (turn, streamed) = complete(&model, &request(conversation.clone())).await;
    let turn = turn.unwrap();
    assert_eq!(
        (turn.text.as_str(), streamed.as_str()),
        ("Checking.", "Checking.")
    );
    assert_eq!(
        calls_of(&turn),
        [
            ("toolu_A", "sh", r#"{"command": "date"}"#),
            ("toolu_B", "fetch", r#"{"method":"GET","url":"http://x"}"#)
        ]
    );

    answer_tool_calls(&mut conversation, &turn);
    conversation.push(ReplayedMessage::User("and summarise".into()));
    let (second, _) = complete(&model, &request(conversation)).await;
    assert_eq!(second.unwrap().text, "done");

    assert_eq!(
        server.received()[1].body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "date and fetch"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_A", "name": "sh", "input": {"command": "date"}},
                {"type": "tool_use", "id": "toolu_B", "name": "fetch", "input": {"method": "GET", "url": "http://x"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_A", "content": "out 0"},
                {"type": "tool_result", "tool_use_id": "toolu_B", "content": "out 1", "is_error": true},
                {"type": "text", "text": "and summarise"},
            ]},
        ])
    );
}

#[tokio::test]
async fn a_bad_request_is_permanent_with_the_providers_message() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1: tool_use ids must be unique"}}"#;
    let server = Server::start(vec![Reply::json(400, body)]).await;
    let (result, _) = complete(
        &model(&server),
        &request(vec![ReplayedMessage::User("hi".into())]),
    )
    .await;
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Permanent {
                status: Some(400),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("tool_use ids must be unique (invalid_request_error)"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unknown_model_and_a_bad_key_are_permanent_and_never_show_the_key() {
    let unknown =
        r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-test"}}"#;
    let bad_key = format!(
        r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {KEY}"}}}}"#
    );
    let server = Server::start(vec![Reply::json(404, unknown), Reply::json(401, &bad_key)]).await;
    let model = model(&server);
    for (status, expected) in [(404, "model: claude-test"), (401, "invalid x-api-key")] {
        let (result, _) =
            complete(&model, &request(vec![ReplayedMessage::User("hi".into())])).await;
        let err = result.unwrap_err();
        assert!(
            matches!(err, ModelError::Permanent { status: Some(s), .. } if s == status),
            "{err:?}"
        );
        assert!(err.to_string().contains(expected), "{err}");
        assert_no_key(&err);
    }
    assert!(!format!("{model:?}").contains(KEY));
}

#[tokio::test]
async fn overloaded_then_success_through_retries() {
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let server = Server::start(vec![
        Reply::json(529, overloaded).header("retry-after", "0"),
        Reply::json(
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        )
        .header("retry-after-ms", "25"),
        Reply::sse(vec![
            start() + &text_block(0, &["finally"]) + &end("end_turn"),
        ]),
    ])
    .await;
    let model = model(&server);
    let request = request(vec![ReplayedMessage::User("hi".into())]);
    let (tx, _rx) = unbounded_channel();
    let policy = RetryPolicy {
        base_delay: Duration::from_millis(1),
        ..RetryPolicy::default()
    };
    let begin = Instant::now();
    let turn = with_retries(&policy, &CancellationToken::new(), || {
        model.complete(&request, &tx)
    })
    .await;
    assert_eq!(turn.unwrap().text, "finally");
    assert!(begin.elapsed() >= Duration::from_millis(25));
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn server_errors_broken_streams_and_stream_errors_are_retryable() {
    let partial = start() + &text_block(0, &["half an ans"]);
    let in_stream_error = start()
        + &event(
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        );
    let server = Server::start(vec![
        Reply::json(
            500,
            r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        ),
        Reply::cut(split_every(&partial, 20)),
        Reply::sse(vec![partial]),
        Reply::sse(vec![in_stream_error]),
    ])
    .await;
    let model = model(&server);
    let request = request(vec![ReplayedMessage::User("hi".into())]);
    let expectations = [
        "HTTP 500: Internal server error (api_error)",
        "POST ",
        "ended before the turn was complete",
        "Overloaded (overloaded_error)",
    ];
    for expected in expectations {
        let (result, _) = complete(&model, &request).await;
        let err = result.unwrap_err();
        assert!(matches!(err, ModelError::Retryable { .. }), "{err:?}");
        assert!(err.to_string().contains(expected), "{expected}: {err}");
        assert_no_key(&err);
    }
}

#[tokio::test]
async fn an_invalid_request_reported_in_the_stream_is_permanent() {
    let stream = start()
        + &event(
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long"}}),
        );
    let server = Server::start(vec![Reply::sse(vec![stream])]).await;
    let (result, _) = complete(
        &model(&server),
        &request(vec![ReplayedMessage::User("hi".into())]),
    )
    .await;
    let err = result.unwrap_err();
    assert!(matches!(err, ModelError::Permanent { .. }), "{err:?}");
    assert!(err.to_string().contains("prompt is too long"), "{err}");
}

/// The endpoint answers with a redirect to another host (another loopback address): the
/// client does not follow it, the other host never sees the key, and the call fails naming
/// where the redirect pointed. A redirect within the endpoint's own origin is followed.
#[tokio::test]
async fn a_redirect_to_another_host_is_not_followed_and_carries_no_key() {
    let other = Server::start_on(
        "127.0.0.2",
        vec![Reply::sse(vec![start(), end("end_turn")])],
    )
    .await;
    let elsewhere = format!("{}/v1/messages", other.url);
    let server = Server::start(vec![
        Reply::json(307, "{}").header("location", &elsewhere),
        Reply::json(307, "{}").header("location", "/v1/moved"),
        Reply::sse(vec![start(), text_block(0, &["moved"]), end("end_turn")]),
    ])
    .await;
    let model = model(&server);
    let ask = || request(vec![ReplayedMessage::User("hi".into())]);
    let (result, _) = complete(&model, &ask()).await;
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Permanent {
                status: Some(307),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains(&elsewhere), "{err}");
    assert_no_key(&err);
    assert!(
        other.received().is_empty(),
        "the other host was never asked"
    );

    let (result, streamed) = complete(&model, &ask()).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(streamed, "moved");
    let paths: Vec<String> = server.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/v1/messages", "/v1/messages", "/v1/moved"]);
}
