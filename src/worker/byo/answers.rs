//! What the gateway answers an agent with (pure): a recorded or forwarded answer, whole or as
//! an event stream, and errors in the OpenAI API's own shape, so an SDK raises them as it
//! would a provider's.

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::ledger::model_api::ModelApi;
use crate::worker::model::ModelError;

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

/// An error inside a stream, as the API sends one (the SDKs raise it).
pub fn stream_error(api: ModelApi, message: &str) -> Bytes {
    let body = match api {
        ModelApi::Chat => json!({"error": {"message": message, "type": "provider_error"}}),
        ModelApi::Responses => {
            json!({"type": "error", "code": "provider_error", "message": message})
        }
        ModelApi::Messages => {
            json!({"type": "error", "error": {"type": "api_error", "message": message}})
        }
    };
    Bytes::from(api.frame(&body))
}

/// A recorded call's answer: the whole answer, or its stream's events (then the API's end).
pub fn recorded(api: ModelApi, streamed: bool, response: &Value) -> Response {
    match (streamed, response) {
        (true, Value::Array(events)) => {
            let mut body = String::new();
            for event in events {
                body.push_str(&api.frame(event));
            }
            body.extend(api.stream_end());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_recorded_stream_is_sent_again_event_by_event_then_done() {
        let events = json!([{"a": 1}, {"b": 2}]);
        let response = recorded(ModelApi::Chat, true, &events);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(
            body,
            "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n"
        );
        let mismatch = recorded(ModelApi::Chat, false, &events);
        assert_eq!(mismatch.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
