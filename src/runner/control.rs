//! The runner's local HTTP control endpoint (on 127.0.0.1 only), for the demo and for tests
//! that run `baton-runner` as a separate process, and a minimal client for `baton-runner ctl`.
//!
//! | request | effect |
//! |---|---|
//! | `GET /pods` | JSON list of the pods the runner knows (namespace, name, pid, detached, finished) |
//! | `GET /pods/{ns}/{pod}/pid` | the pid (= session id) of the pod's live process |
//! | `POST /pods/{ns}/{pod}/kill` | SIGKILL the group (kill -9) |
//! | `POST /pods/{ns}/{pod}/pause` | SIGSTOP the group |
//! | `POST /pods/{ns}/{pod}/resume` | SIGCONT the group |
//! | `POST /pods/{ns}/{pod}/term` | SIGTERM the group (no deletion) |
//! | `POST /pods/{ns}/{pod}/detach` | stop reporting the pod (a lost node) |
//! | `POST /drain` | gracefully delete every pod on the node; JSON list of them |
//!
//! Answers: 200 with a body, 404 when no process runs for the pod, 400 for an unknown action,
//! 500 on an API error.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Error, RunnerHandle, Signal};

/// The default control address.
pub const DEFAULT_CONTROL_ADDR: &str = "127.0.0.1:7391";

/// Errors of the control client.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot reach the runner's control endpoint at {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("control endpoint i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed answer from the control endpoint")]
    Malformed,
}

/// The control routes over a runner handle.
pub fn router(handle: RunnerHandle) -> Router {
    Router::new()
        .route("/pods", get(list))
        .route("/pods/{ns}/{pod}/pid", get(pid))
        .route("/pods/{ns}/{pod}/{action}", post(act))
        .route("/drain", post(drain))
        .with_state(handle)
}

/// Serves the control endpoint on `listener` until `shutdown` completes.
pub async fn serve(
    handle: RunnerHandle,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(handle))
        .with_graceful_shutdown(shutdown)
        .await
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(err: Error) -> Response {
    let status = match err {
        Error::NoProcess(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, format!("{err}\n")).into_response()
}

async fn list(State(handle): State<RunnerHandle>) -> Response {
    json(serde_json::to_string(&handle.pods()).unwrap_or_default())
}

async fn pid(
    State(handle): State<RunnerHandle>,
    Path((ns, pod)): Path<(String, String)>,
) -> Response {
    match handle.pid(&ns, &pod) {
        Some(pid) => format!("{pid}\n").into_response(),
        None => error(Error::NoProcess(super::PodKey::new(ns, pod))),
    }
}

async fn act(
    State(handle): State<RunnerHandle>,
    Path((ns, pod, action)): Path<(String, String, String)>,
) -> Response {
    let result = match action.as_str() {
        "kill" => handle.signal(&ns, &pod, Signal::Kill),
        "pause" => handle.signal(&ns, &pod, Signal::Stop),
        "resume" => handle.signal(&ns, &pod, Signal::Cont),
        "term" => handle.signal(&ns, &pod, Signal::Term),
        "detach" => handle.detach(&ns, &pod),
        other => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown action {other:?}\n"),
            )
                .into_response();
        }
    };
    match result {
        Ok(()) => "ok\n".into_response(),
        Err(e) => error(e),
    }
}

async fn drain(State(handle): State<RunnerHandle>) -> Response {
    match handle.drain().await {
        Ok(pods) => json(
            serde_json::to_string(&pods.iter().map(ToString::to_string).collect::<Vec<_>>())
                .unwrap_or_default(),
        ),
        Err(e) => error(e),
    }
}

/// Sends one request to a control endpoint; returns the HTTP status code and the body.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Result<(u16, String), ControlError> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|source| ControlError::Connect { addr, source })?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse_response(&String::from_utf8_lossy(&raw)).ok_or(ControlError::Malformed)
}

/// Status code and body of an HTTP/1.1 response with a fixed-length body.
fn parse_response(raw: &str) -> Option<(u16, String)> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head
        .lines()
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((code, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_response() {
        let raw = "HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\nnope";
        assert_eq!(parse_response(raw), Some((404, "nope".to_string())));
        assert_eq!(parse_response("garbage"), None);
    }
}
