//! What the gateway answers an agent with (pure): a recorded or forwarded completion, whole or
//! as an event stream, and errors in the OpenAI API's own shape, so an SDK raises them as it
//! would a provider's.

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::worker::model::ModelError;

/// The last event of a Chat Completions stream.
pub const DONE: &str = "[DONE]";

/// An error as the OpenAI API words one: `{"error": {"message", "type", "code"}}`.
pub fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": null}});
    (status, axum::Json(body)).into_response()
}

/// A provider's failure, passed on: its status when it gave one (so the agent's SDK retries
/// what it would retry), else 502 for a call worth retrying and 500 for one that is not.
pub fn provider_error(err: &ModelError) -> Response {
    let (status, message) = match err {
        ModelError::Retryable { message, .. } => (StatusCode::BAD_GATEWAY, message),
        ModelError::Permanent { status, message } => (
            status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message,
        ),
    };
    error(status, "provider_error", message)
}

/// One event of a stream, as sent: `data: …` and a blank line.
pub fn sse_event(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// A recorded call's answer: the completion whole, or its stream's events then [`DONE`].
pub fn recorded(streamed: bool, response: &Value) -> Response {
    match (streamed, response) {
        (true, Value::Array(events)) => {
            let mut body = Vec::new();
            for event in events {
                body.extend_from_slice(&sse_event(&event.to_string()));
            }
            body.extend_from_slice(&sse_event(DONE));
            event_stream(Body::from(body))
        }
        (false, whole @ Value::Object(_)) => axum::Json(whole.clone()).into_response(),
        _ => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "baton_journal",
            "the recorded answer of this call is not of the shape its request asks for",
        ),
    }
}

/// A streamed answer's response around `body`.
pub fn event_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

/// The tokens a completion reports (whole, or the stream's usage event), if it does.
pub fn usage(response: &Value) -> Option<(i64, i64)> {
    let of = |v: &Value| {
        let usage = v.get("usage")?;
        Some((
            usage.get("prompt_tokens")?.as_i64()?,
            usage.get("completion_tokens")?.as_i64()?,
        ))
    };
    match response {
        Value::Array(events) => events.iter().rev().find_map(of),
        whole => of(whole),
    }
}

/// Whether a whole JSON answer is a completion (it has its choices), not an error document a
/// server sent with a 2xx.
pub fn is_completion(answer: &Value) -> bool {
    answer.get("choices").is_some_and(Value::is_array)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_is_read_from_a_whole_answer_or_a_streams_last_usage() {
        let whole = json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        assert_eq!(usage(&whole), Some((3, 2)));
        let stream = json!([{"choices": []}, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}]);
        assert_eq!(usage(&stream), Some((5, 1)));
        assert_eq!(usage(&json!([{"choices": []}])), None);
        assert!(is_completion(&whole) && !is_completion(&json!({"error": {}})));
    }

    #[tokio::test]
    async fn a_recorded_stream_is_sent_again_event_by_event_then_done() {
        let events = json!([{"a": 1}, {"b": 2}]);
        let response = recorded(true, &events);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(
            body,
            "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n"
        );
        let mismatch = recorded(false, &events);
        assert_eq!(mismatch.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
