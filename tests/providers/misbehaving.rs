//! Both providers against a server that answers what no reference API would: a whole JSON
//! answer where a stream was asked, an HTML page, a stream that stalls, pings forever, never
//! stops, ends without its end, or breaks mid-stream. Each call ends within seconds in a
//! result or an error that says what came; none waits on events that will not come.

use std::time::Duration;

use baton::crd::v1alpha1::{ModelSpec, Provider};
use baton::ledger::ReplayedMessage;
use baton::worker::model::anthropic::AnthropicModel;
use baton::worker::model::openai::OpenAiModel;
use baton::worker::model::{ModelError, ModelRequest, ModelTurn, Usage};
use baton_testkit::model::{Reply, Server};
use serde_json::json;
use tokio::sync::mpsc::unbounded_channel;

const KEY: &str = "sk-misbehave-5e4d3c2b1a0f9e8d7c6b";
/// The idle bound these tests set (`idleTimeoutSeconds`).
const IDLE: i64 = 1;
/// Longer than any call here may take: a call still waiting then is the defect under test.
const NO_SILENT_WAIT: Duration = Duration::from_secs(30);
/// The same for a call that must first take in the bound on one answer (32 MiB of events,
/// parsed by a debug build beside the other tests on 2 cores): it ends, but it works first.
const NO_SILENT_WAIT_AFTER_32_MIB: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug)]
enum Api {
    OpenAi,
    Anthropic,
}

const BOTH: [Api; 2] = [Api::OpenAi, Api::Anthropic];

impl Api {
    /// One call, without retries, to a server that sends `reply`; the turn (or error) and the
    /// text streamed on the way.
    async fn call(self, reply: Reply) -> (Result<ModelTurn, ModelError>, String) {
        self.call_within(reply, NO_SILENT_WAIT).await
    }

    /// [`Api::call`], failing if it still waits after `wait`.
    async fn call_within(
        self,
        reply: Reply,
        wait: Duration,
    ) -> (Result<ModelTurn, ModelError>, String) {
        let server = Server::start(vec![reply]).await;
        let spec = ModelSpec {
            provider: match self {
                Api::OpenAi => Provider::Openai,
                Api::Anthropic => Provider::Anthropic,
            },
            name: Some("m".into()),
            endpoint: Some(format!("{}/v1", server.url)),
            idle_timeout_seconds: Some(IDLE),
            ..ModelSpec::default()
        };
        let request = ModelRequest {
            system_prompt: None,
            messages: vec![ReplayedMessage::User("hi".into())],
            tools: vec![],
        };
        let (tx, mut rx) = unbounded_channel();
        let call = async {
            match self {
                Api::OpenAi => {
                    let model = OpenAiModel::new(&spec, Some(KEY.into())).unwrap();
                    model.complete(&request, &tx).await
                }
                Api::Anthropic => {
                    let model = AnthropicModel::new(&spec, Some(KEY.into())).unwrap();
                    model.complete(&request, &tx).await
                }
            }
        };
        let result = tokio::time::timeout(wait, call)
            .await
            .unwrap_or_else(|_| panic!("{self:?}: the call still waited after {wait:?}"));
        let mut streamed = String::new();
        while let Ok(piece) = rx.try_recv() {
            streamed.push_str(&piece);
        }
        (result, streamed)
    }

    /// A whole answer of this API: `text`, one call of tool `sh`, its usage.
    fn whole_answer(self) -> String {
        match self {
            Api::OpenAi => json!({
                "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Let me look.",
                    "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "sh", "arguments": "{\"command\":\"ls\"}"}}]}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
            }),
            Api::Anthropic => json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "sh", "input": {"command": "ls"}},
                ],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 12, "output_tokens": 7},
            }),
        }
        .to_string()
    }

    /// A well-formed stream of this API that says "partial" and then stops short of its end.
    fn unfinished_stream(self) -> Vec<String> {
        match self {
            Api::OpenAi => vec![format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": null}]})
            )],
            Api::Anthropic => vec![
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n".into(),
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"partial\"}}\n\n".into(),
            ],
        }
    }

    /// What this API's stream misses when it ends early.
    fn end_named(self) -> &'static str {
        match self {
            Api::OpenAi => "no [DONE] nor finish reason",
            Api::Anthropic => "no message_stop nor stop reason",
        }
    }

    fn ping(self) -> &'static str {
        match self {
            Api::OpenAi => ": keep-alive\n\n",
            Api::Anthropic => "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        }
    }

    fn text_event(self, text: &str) -> String {
        match self {
            Api::OpenAi => format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
            ),
            Api::Anthropic => format!(
                "event: content_block_delta\ndata: {}\n\n",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
            ),
        }
    }
}

fn retryable(api: Api, result: Result<ModelTurn, ModelError>, said: &[&str]) -> String {
    let err = result.expect_err("an error");
    assert!(
        matches!(err, ModelError::Retryable { .. }),
        "{api:?}: {err:?}"
    );
    says(api, &err, said)
}

fn permanent(api: Api, result: Result<ModelTurn, ModelError>, said: &[&str]) -> String {
    let err = result.expect_err("an error");
    assert!(
        matches!(err, ModelError::Permanent { .. }),
        "{api:?}: {err:?}"
    );
    says(api, &err, said)
}

fn says(api: Api, err: &ModelError, said: &[&str]) -> String {
    let text = err.to_string();
    for words in said {
        assert!(text.contains(words), "{api:?}: {words:?} not in: {text}");
    }
    assert!(!text.contains(KEY), "{api:?}: the key in: {text}");
    text
}

/// A gateway that answers a streamed request with the whole answer as JSON (the LiteLLM
/// proxy's `/v1/messages` does): the answer is taken, text, tool call and usage.
#[tokio::test]
async fn a_whole_json_answer_to_a_streamed_request_is_the_turn() {
    for api in BOTH {
        // Some servers say `"error": null` in an answer that is not one.
        let mut answer: serde_json::Value = serde_json::from_str(&api.whole_answer()).unwrap();
        answer["error"] = serde_json::Value::Null;
        let (turn, streamed) = api.call(Reply::json(200, &answer.to_string())).await;
        let turn = turn.unwrap_or_else(|e| panic!("{api:?}: {e}"));
        assert_eq!(turn.text, "Let me look.", "{api:?}");
        assert_eq!(
            streamed, "Let me look.",
            "{api:?}: the text goes on as a delta"
        );
        assert_eq!(turn.tool_calls.len(), 1, "{api:?}");
        assert_eq!(turn.tool_calls[0].tool, "sh");
        assert_eq!(turn.tool_calls[0].call_id, "call_1");
        assert_eq!(turn.tool_calls[0].arguments, r#"{"command":"ls"}"#);
        let usage = Usage {
            input_tokens: 12,
            output_tokens: 7,
        };
        assert_eq!(turn.usage, Some(usage), "{api:?}");
    }
}

/// JSON that is an error is the provider's error, classified as in a stream; JSON that is
/// neither an answer nor an error fails for good, showing what came.
#[tokio::test]
async fn whole_json_errors_and_json_that_is_no_answer() {
    for api in BOTH {
        let error =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let (result, _) = api.call(Reply::json(200, error)).await;
        retryable(api, result, &["Overloaded (overloaded_error)"]);
        let invalid =
            r#"{"error":{"type":"invalid_request_error","message":"max_tokens is too large"}}"#;
        let (result, _) = api.call(Reply::json(200, invalid)).await;
        permanent(api, result, &["max_tokens is too large"]);
        let (result, _) = api.call(Reply::json(200, r#"{"status":"queued"}"#)).await;
        permanent(
            api,
            result,
            &["a JSON answer without", r#"{"status":"queued"}"#],
        );
        let (result, _) = api.call(Reply::json(200, "<html>not json</html>")).await;
        permanent(
            api,
            result,
            &["application/json", "is not JSON", "<html>not json"],
        );
    }
}

/// An HTML or text page with a 200 (a captive portal, a proxy's login page) is no answer:
/// the call fails for good, naming the status, the content type and the first bytes. The
/// same page with a 502 is the server's error, worth a retry, and says as much.
#[tokio::test]
async fn a_page_where_an_answer_was_asked_names_what_came() {
    let page = "<html><body><h1>Sign in to continue</h1></body></html>";
    for api in BOTH {
        let (result, _) = api
            .call(Reply::page(200, "text/html; charset=utf-8", page))
            .await;
        permanent(
            api,
            result,
            &[
                "HTTP 200",
                "content type text/html",
                "<h1>Sign in to continue",
            ],
        );
        let (result, _) = api
            .call(Reply::page(200, "text/plain", "upstream busy"))
            .await;
        permanent(api, result, &["text/plain", "upstream busy"]);
        let (result, _) = api.call(Reply::page(502, "text/html", page)).await;
        retryable(api, result, &["HTTP 502", "Sign in to continue"]);
    }
}

/// A body with no content type is read as a stream (local servers send none); when no event
/// comes, the error shows what did.
#[tokio::test]
async fn an_untyped_body_that_holds_no_event_shows_what_came() {
    for api in BOTH {
        let (result, _) = api.call(Reply::untyped(r#"{"detail":"Not Found"}"#)).await;
        retryable(
            api,
            result,
            &[
                "ended before the turn was complete",
                "no event came",
                r#"{"detail":"Not Found"}"#,
            ],
        );
    }
}

/// A stream that stops sending, a server that never answers, a server that only pings: each
/// call ends after the idle bound, saying so and naming the field that sets it.
#[tokio::test]
async fn silence_ends_the_call_after_the_idle_bound() {
    for api in BOTH {
        let started = std::time::Instant::now();
        let (result, streamed) = api.call(Reply::stall(api.unfinished_stream())).await;
        let said = retryable(
            api,
            result,
            &["sent nothing for 1 s mid-answer", "idleTimeoutSeconds"],
        );
        assert_eq!(streamed, "partial", "{api:?}: {said}");
        let (result, _) = api.call(Reply::silent()).await;
        retryable(
            api,
            result,
            &["sent nothing for 1 s before its answer began"],
        );
        let (result, _) = api.call(Reply::endless(api.ping())).await;
        retryable(api, result, &["sent nothing for 1 s"]);
        println!("{api:?}: three silences ended in {:?}", started.elapsed());
    }
}

/// A server that streams without end: the call stops at the bound on one answer.
#[tokio::test]
async fn a_stream_without_end_stops_at_the_size_bound() {
    for api in BOTH {
        let piece = api.text_event("la la la la la la la la la la la la la la la la ");
        let started = std::time::Instant::now();
        let reply = Reply::endless(&piece);
        let (result, _) = api.call_within(reply, NO_SILENT_WAIT_AFTER_32_MIB).await;
        println!(
            "{api:?}: stopped at the bound after {:?}",
            started.elapsed()
        );
        permanent(
            api,
            result,
            &["passed 32 MiB", "the bound on one model answer"],
        );
    }
}

/// A stream that ends without its end, or whose connection breaks: retryable, saying which
/// and how much had come.
#[tokio::test]
async fn an_unfinished_stream_and_a_broken_one_say_which() {
    for api in BOTH {
        let (result, _) = api.call(Reply::sse(api.unfinished_stream())).await;
        let expected = api.unfinished_stream().len().to_string() + " events came";
        retryable(
            api,
            result,
            &[
                "ended before the turn was complete",
                api.end_named(),
                &expected,
            ],
        );
        let (result, _) = api.call(Reply::cut(api.unfinished_stream())).await;
        retryable(api, result, &["the connection broke mid-answer after"]);
    }
}
