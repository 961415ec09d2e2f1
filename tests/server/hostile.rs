//! Senders with no credential, or that withhold what they send, against the real serving
//! layer (`baton::listener`, as `baton server` serves): each answered or dropped within
//! seconds, never holding the server's memory for as long as they like. Raw TCP, so the test
//! controls every byte and every pause.

use std::time::{Duration, Instant};

use baton::server::APPEND_BODY_LIMIT;
use baton::serving::bounds::{BODY_FRAME_TIMEOUT, HEADER_TIMEOUT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use baton_testkit::server::start_ledger_server;

/// Sends `head` (and `body_start`) on a new connection and waits up to `wait` for the
/// server's first bytes: the status line, or None when it closed or stayed silent.
async fn answer_to(base: &str, head: &str, body_start: &[u8], wait: Duration) -> Option<String> {
    let addr = base.trim_start_matches("http://");
    let mut tcp = TcpStream::connect(addr).await.expect("the server's port");
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body_start).await.unwrap();
    let mut buf = vec![0u8; 512];
    match tokio::time::timeout(wait, tcp.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            Some(text.lines().next().unwrap_or_default().to_string())
        }
        _ => None,
    }
}

fn post(path: &str, auth: Option<&str>, length: usize) -> String {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: Bearer {a}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: baton\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {length}\r\n\r\n"
    )
}

const APPEND: &str = "/ledger/v1/namespaces/team/runs/r/segments";

#[tokio::test]
async fn an_append_without_a_valid_token_is_refused_before_its_body_is_read() {
    let (base, _server) = start_ledger_server(vec![]).await;
    // A whole segment announced, 1 KiB sent: the answer comes now, not after the rest.
    for auth in [None, Some("not-a-token")] {
        let head = post(APPEND, auth, APPEND_BODY_LIMIT);
        let status = answer_to(&base, &head, &[b' '; 1024], Duration::from_secs(5)).await;
        assert_eq!(
            status.as_deref(),
            Some("HTTP/1.1 401 Unauthorized"),
            "{auth:?}"
        );
    }
    // More than a segment announced: refused by its length alone, whoever sends it.
    let head = post(APPEND, Some("not-a-token"), 60_000_000);
    let status = answer_to(&base, &head, &[b' '; 1024], Duration::from_secs(5)).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
}

/// The caller's routes too: a credential the API server does not accept is refused from the
/// headers, before a byte of the body (a SelfSubjectAccessReview made as the caller). Before,
/// the body was read first: the answer came only after the body stalled (10 s).
#[tokio::test]
async fn a_callers_write_without_a_valid_token_is_refused_before_its_body_is_read() {
    let (base, _server) = start_ledger_server(vec![]).await;
    for path in [
        "runs/r/inputs",
        "runs/r/approvals",
        "runs/r/stop",
        "threads/t/turns",
    ] {
        let route = format!("/api/v1/namespaces/team/{path}");
        let head = post(&route, Some("not-a-token"), 400 * 1024);
        let status = answer_to(&base, &head, &[b' '; 1024], Duration::from_secs(5)).await;
        assert_eq!(
            status.as_deref(),
            Some("HTTP/1.1 401 Unauthorized"),
            "{route}"
        );
    }
}

#[tokio::test]
async fn a_body_over_its_routes_bound_is_refused_unread() {
    let (base, _server) = start_ledger_server(vec![]).await;
    // The caller's routes: 512 KiB at most (an input is at most 64 Ki characters).
    let input = "/api/v1/namespaces/team/runs/r/inputs";
    let head = post(input, Some("any-token"), 600 * 1024);
    let status = answer_to(&base, &head, b"{", Duration::from_secs(5)).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
    // The sign-in form is read before its token is checked (the token is in it): 16 KiB.
    let head = post("/console/login", None, 100 * 1024);
    let status = answer_to(&base, &head, b"token=", Duration::from_secs(5)).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
}

#[tokio::test]
async fn a_withheld_head_or_body_holds_the_connection_for_seconds_only() {
    let (base, _server) = start_ledger_server(vec![]).await;
    let patience = HEADER_TIMEOUT.max(BODY_FRAME_TIMEOUT) + Duration::from_secs(10);
    // Half a request head, then silence: the connection is closed.
    let addr = base.trim_start_matches("http://").to_string();
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"POST /api/v1/namespaces/team/runs/r/inputs HTTP/1.1\r\nHost: b")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(patience, tcp.read(&mut buf)).await;
    assert!(
        read.is_ok(),
        "a silent head kept its connection over {patience:?}"
    );
    assert!(started.elapsed() >= HEADER_TIMEOUT - Duration::from_secs(1));
    // A whole head, a body announced and stopped short: the request ends with an answer.
    let input = "/api/v1/namespaces/team/runs/r/inputs";
    let head = post(input, Some("any-token"), 1000);
    let status = answer_to(&base, &head, b"{\"text\":", patience).await;
    let status = status.expect("an answer once the body stalled");
    assert!(status.starts_with("HTTP/1.1 4"), "{status}");
}
