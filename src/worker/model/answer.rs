//! A model call's exchange: the request sent, its answer sorted before it is read. Servers and
//! gateways do not all answer as the reference APIs do: asked for an event stream, one sends
//! a whole JSON document, another an HTML page with a 200. Whatever comes ends the call with a
//! result or an error that says what came, within the call's bounds ([`super::body`]).

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use reqwest::{RequestBuilder, Response};
use serde_json::Value;

use super::ModelError;
use super::body::{BodyReader, SHOWN_BYTES, Target};
use super::endpoint::{MAX_ERROR_BODY, status_error, transport_error};
use super::sse::SseReader;

/// Sends a request; anything but a 2xx becomes a `ModelError`. Its answer must begin (its
/// status and headers) within the target's idle bound, and an error body is read within it.
pub async fn send(request: RequestBuilder, target: &Target) -> Result<Response, ModelError> {
    let (key, url) = (&target.key, target.url.as_str());
    let sent = tokio::time::timeout(target.bounds.idle, request.send()).await;
    let response = match sent {
        Err(_) => return Err(target.silent("before its answer began")),
        Ok(sent) => sent.map_err(|e| transport_error(&e, key, url))?,
    };
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let headers = response.headers().clone();
    let body = read_capped(response, target.bounds.idle).await;
    Err(status_error(status, &headers, &body, key, url))
}

/// What a 2xx answer is.
pub enum Answer {
    /// An event stream, as asked.
    Stream(Box<SseReader>),
    /// One JSON document: the whole answer (or an error) at once.
    Whole(Value),
}

/// Sorts a 2xx answer by its content type: an event stream (or no content type: some local
/// servers send none) is read as events; JSON is read whole; anything else fails the call
/// for good, naming the status, the content type and the first bytes.
pub async fn receive(response: Response, target: &Target) -> Result<Answer, ModelError> {
    let status = response.status().as_u16();
    let content_type = media_type(&response);
    let mut body = BodyReader::new(response, target.clone());
    match content_type.as_str() {
        "" | "text/event-stream" => Ok(Answer::Stream(Box::new(SseReader::new(body)))),
        json if json == "application/json" || json.ends_with("+json") => {
            body.whole_json(&content_type).await.map(Answer::Whole)
        }
        other => {
            body.read_some(SHOWN_BYTES).await?;
            Err(ModelError::Permanent {
                status: Some(status),
                message: target.error_text(&format!(
                    "HTTP {status} with content type {other}, neither an event stream nor JSON; it began: {}",
                    body.shown()
                )),
            })
        }
    }
}

/// The media type of a response, lowercased, without parameters.
fn media_type(response: &Response) -> String {
    let value = response.headers().get(CONTENT_TYPE);
    let value = value.and_then(|v| v.to_str().ok()).unwrap_or_default();
    let essence = value.split(';').next().unwrap_or_default();
    essence.trim().to_ascii_lowercase()
}

/// An error body, up to [`MAX_ERROR_BODY`]; what came before a silence of `idle`.
async fn read_capped(mut response: Response, idle: Duration) -> String {
    let mut body = Vec::new();
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout(idle, response.chunk()).await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY {
            body.truncate(MAX_ERROR_BODY);
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}
