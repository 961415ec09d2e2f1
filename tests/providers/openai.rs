//! The OpenAI-compatible provider against a local server speaking Chat Completions.
//! The tests' shared helpers and stream fixtures are in `openai_support`.

use std::time::{Duration, Instant};

use crate::openai_support::{
    KEY, assert_no_key, complete, data, drain, fast_retries, finish, model, parallel_calls_stream,
    request, text_chunk, text_stream,
};
use baton::crd::v1alpha1::{ModelSpec, Provider};
use baton::ledger::{ReplayedMessage, ToolCallRecord};
use baton::worker::model::ModelError;
use baton::worker::model::openai::OpenAiModel;
use baton::worker::model::retry::with_retries;
use baton_testkit::model::{Reply, Server, answer_tool_calls, calls_of, split_every};
use serde_json::json;
use tokio::sync::mpsc::unbounded_channel;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn streams_text_and_sends_a_well_formed_request() {
    let server = Server::start(vec![Reply::sse(text_stream(&[
        "Hello",
        ", wor",
        "ld — ok",
    ]))])
    .await;
    let previous = ToolCallRecord {
        step: 1,
        call_id: "call_prev".into(),
        tool: "sh".into(),
        input: r#"{"command":"ls"}"#.into(),
    };
    let conversation = vec![
        ReplayedMessage::User("list files".into()),
        ReplayedMessage::Assistant {
            text: "Looking.".into(),
            tool_calls: vec![previous],
        },
        ReplayedMessage::ToolResult {
            step: 1,
            call_id: "call_prev".into(),
            tool: "sh".into(),
            content: "a\nb".into(),
            is_error: false,
        },
    ];
    let (turn, streamed) = complete(&model(&server), &request(conversation)).await;
    let turn = turn.unwrap();
    assert_eq!(turn.text, "Hello, world — ok");
    assert!(turn.tool_calls.is_empty());
    assert_eq!(streamed, turn.text);

    let received = server.received();
    assert_eq!(received.len(), 1);
    let r = &received[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {KEY}").as_str()),
        "key trimmed of its newline"
    );
    assert_eq!(r.body["model"], "gpt-test");
    assert_eq!(r.body["stream"], true);
    assert_eq!(r.body["stream_options"]["include_usage"], true);
    let roles: Vec<&str> = r.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    let messages = &r.body["messages"];
    assert_eq!(messages[0]["content"], "You are terse.");
    assert_eq!(messages[2]["content"], "Looking.");
    assert_eq!(
        messages[2]["tool_calls"][0],
        json!({"id": "call_prev", "type": "function", "function": {"name": "sh", "arguments": "{\"command\":\"ls\"}"}})
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "call_prev", "content": "a\nb"})
    );
    let tools = r.body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3);
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "sh");
    assert_eq!(
        tools[0]["function"]["parameters"]["required"],
        json!(["command"])
    );
    assert_eq!(
        tools[1]["function"]["parameters"]["properties"]["url"]["type"],
        "string"
    );
    assert_eq!(
        tools[2]["function"]["parameters"]["required"],
        json!(["question"])
    );
}

/// The usage-only chunk the server sends before `[DONE]` (asked for with
/// `stream_options.include_usage`) is the turn's usage; a server that sends none gives none.
#[tokio::test]
async fn the_usage_chunk_is_the_turns_token_usage() {
    let mut stream: String = ["Hi", " there"].iter().map(|w| text_chunk(w)).collect();
    stream.push_str(&finish("stop"));
    stream.push_str(&data(
        json!({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38}}),
    ));
    stream.push_str("data: [DONE]\n\n");
    let server = Server::start(vec![
        Reply::sse(split_every(&stream, 11)),
        Reply::sse(text_stream(&["no usage"])),
    ])
    .await;
    let model = model(&server);
    let (turn, _) = complete(&model, &request(vec![ReplayedMessage::User("hi".into())])).await;
    let usage = turn.unwrap().usage.expect("the usage chunk");
    assert_eq!((usage.input_tokens, usage.output_tokens), (31, 7));
    let (turn, _) = complete(&model, &request(vec![ReplayedMessage::User("hi".into())])).await;
    assert_eq!(turn.unwrap().usage, None);
}

#[tokio::test]
async fn parallel_tool_calls_assemble_and_their_ids_round_trip() {
    let server = Server::start(vec![
        Reply::sse(parallel_calls_stream()),
        Reply::sse(text_stream(&["done"])),
    ])
    .await;
    let model = model(&server);
    let mut conversation = vec![ReplayedMessage::User("date and fetch".into())];
    let (turn, streamed) = complete(&model, &request(conversation.clone())).await;
    let turn = turn.unwrap();
    assert_eq!(streamed, "Running both.");
    assert_eq!(
        calls_of(&turn),
        [
            ("call_A", "sh", r#"{"command":"date"}"#),
            ("call_B", "fetch", r#"{"method":"GET","url":"http://x"}"#)
        ]
    );

    // The agent loop records the calls and their results; the next request carries them back.
    answer_tool_calls(&mut conversation, &turn);
    let (second, _) = complete(&model, &request(conversation)).await;
    assert_eq!(second.unwrap().text, "done");

    let body = &server.received()[1].body;
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    let ids: Vec<&str> = messages[2]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_A", "call_B"]);
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "call_A", "content": "out 0"})
    );
    assert_eq!(
        messages[4],
        json!({"role": "tool", "tool_call_id": "call_B", "content": "ERROR: out 1"})
    );
}

#[tokio::test]
async fn a_bad_request_is_permanent_with_the_providers_message() {
    let body = r#"{"error":{"message":"Invalid schema for function 'sh'","type":"invalid_request_error","param":"tools","code":null}}"#;
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
            .contains("Invalid schema for function 'sh' (invalid_request_error)"),
        "{err}"
    );
    assert_no_key(&err);
}

#[tokio::test]
async fn an_unknown_model_is_permanent() {
    // Ollama's shape: a plain string error.
    let server = Server::start(vec![Reply::json(
        404,
        r#"{"error":"model \"gpt-test\" not found, try pulling it first"}"#,
    )])
    .await;
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
                status: Some(404),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("not found, try pulling it first"),
        "{err}"
    );
}

#[tokio::test]
async fn a_rejected_key_is_permanent_and_never_shown() {
    let echo = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {KEY}. Also '{}...{}'","type":"invalid_request_error","code":"invalid_api_key"}}}}"#,
        &KEY[..20],
        &KEY[30..]
    );
    let server = Server::start(vec![Reply::json(401, &echo)]).await;
    let model = model(&server);
    let (result, _) = complete(&model, &request(vec![ReplayedMessage::User("hi".into())])).await;
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Permanent {
                status: Some(401),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("Incorrect API key provided"),
        "{err}"
    );
    assert_no_key(&err);
    let shown = format!("{model:?}");
    assert!(
        !shown.contains(KEY) && !shown.contains("9f8e7d6c5b4a"),
        "{shown}"
    );
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_then_the_turn_succeeds() {
    let limited = Reply::json(
        429,
        r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#,
    )
    .header("retry-after-ms", "30");
    let server = Server::start(vec![
        limited,
        Reply::sse(text_stream(&["after ", "the wait"])),
    ])
    .await;
    let model = model(&server);
    let request = request(vec![ReplayedMessage::User("hi".into())]);
    let (tx, mut rx) = unbounded_channel();
    let start = Instant::now();
    let turn = with_retries(&fast_retries(), &CancellationToken::new(), || {
        model.complete(&request, &tx)
    })
    .await;
    assert_eq!(turn.unwrap().text, "after the wait");
    assert!(
        start.elapsed() >= Duration::from_millis(30),
        "retry-after honoured"
    );
    assert_eq!(server.received().len(), 2);
    assert_eq!(
        server.received()[0].body,
        server.received()[1].body,
        "the same turn is asked again"
    );
    assert_eq!(drain(&mut rx), "after the wait");
}

#[tokio::test]
async fn a_429_alone_is_retryable_with_its_retry_after() {
    let server = Server::start(vec![Reply::json(429, "{}").header("retry-after", "7")]).await;
    let (result, _) = complete(&model(&server), &request(vec![])).await;
    match result.unwrap_err() {
        ModelError::Retryable { retry_after, .. } => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn server_errors_and_broken_streams_are_retryable() {
    let broken = split_every(&[text_chunk("partial "), text_chunk("answer")].concat(), 9);
    let server = Server::start(vec![
        Reply::json(
            500,
            r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
        ),
        Reply::cut(broken.clone()),
        Reply::sse(broken),
        Reply::sse(vec![data(
            json!({"error": {"message": "overloaded", "type": "server_error"}}),
        )]),
    ])
    .await;
    let model = model(&server);
    let request = request(vec![ReplayedMessage::User("hi".into())]);
    let expectations = [
        "HTTP 500: The server had an error",
        "POST ",
        "ended before the turn was complete",
        "overloaded",
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
async fn retries_get_through_a_500_and_a_cut_stream() {
    let server = Server::start(vec![
        Reply::json(503, "upstream down"),
        Reply::cut(split_every(&text_chunk("lost"), 5)),
        Reply::sse(text_stream(&["made it"])),
    ])
    .await;
    let model = model(&server);
    let request = request(vec![ReplayedMessage::User("hi".into())]);
    let (tx, _rx) = unbounded_channel();
    let turn = with_retries(&fast_retries(), &CancellationToken::new(), || {
        model.complete(&request, &tx)
    })
    .await;
    assert_eq!(turn.unwrap().text, "made it");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let spec = ModelSpec {
        provider: Provider::Openai,
        name: Some("m".into()),
        endpoint: Some(url),
        ..ModelSpec::default()
    };
    let model = OpenAiModel::new(&spec, None).unwrap();
    let (result, _) = complete(&model, &request(vec![])).await;
    assert!(
        matches!(result, Err(ModelError::Retryable { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn no_key_no_authorization_header() {
    let server = Server::start(vec![Reply::sse(text_stream(&["local"]))]).await;
    let spec = ModelSpec {
        provider: Provider::Openai,
        name: Some("llama".into()),
        endpoint: Some(server.url.clone()),
        ..ModelSpec::default()
    };
    let model = OpenAiModel::new(&spec, Some("".into())).unwrap();
    let (turn, _) = complete(&model, &request(vec![])).await;
    assert_eq!(turn.unwrap().text, "local");
    let received = &server.received()[0];
    assert_eq!(received.path, "/chat/completions");
    assert_eq!(received.header("authorization"), None);
}
