//! The `http` tool: one request, body capped. GET is idempotent; every other method carries an
//! `Idempotency-Key: <run-uid>/<step>` header so the server can recognise a re-run.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{
    OUTPUT_CAP_BYTES, ToolEnv, ToolOutput, capped_text, parse_arguments, truncation_marker,
};

/// Header carrying the step's idempotency key on non-GET requests.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// The request method of a call's arguments (GET when absent or unreadable).
pub fn method_of(arguments: &str) -> String {
    parse_arguments(arguments)
        .ok()
        .and_then(|a| a.get("method").cloned())
        .map(|m| m.to_ascii_uppercase())
        .unwrap_or_else(|| "GET".into())
}

/// Sends the request described by `args` (`method`, `url`, `body`).
pub async fn run(
    args: &BTreeMap<String, String>,
    tool_env: &ToolEnv,
    timeout: Duration,
    cancel: &CancellationToken,
) -> ToolOutput {
    let Some(url) = args.get("url") else {
        return ToolOutput::error("the http tool needs a `url` argument");
    };
    let method = args
        .get("method")
        .map(|m| m.to_ascii_uppercase())
        .unwrap_or_else(|| "GET".into());
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return ToolOutput::error(format!("unknown HTTP method {method:?}"));
    };
    crate::kube_util::ensure_crypto_provider();
    let client = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(c) => c,
        Err(e) => return ToolOutput::error(format!("building the HTTP client: {e}")),
    };
    let mut request = client.request(method.clone(), url);
    if method != reqwest::Method::GET {
        request = request.header(IDEMPOTENCY_HEADER, tool_env.idempotency_key());
    }
    for (name, value) in tool_env.vars() {
        request = request.header(format!("X-{}", name.replace('_', "-")), value);
    }
    if let Some(traceparent) = &tool_env.traceparent {
        request = request.header("traceparent", traceparent);
    }
    if let Some(body) = args.get("body") {
        request = request.body(body.clone());
    }
    tokio::select! {
        out = send(request) => out,
        _ = cancel.cancelled() => ToolOutput::error("[cancelled: the request was abandoned]"),
    }
}

async fn send(request: reqwest::RequestBuilder) -> ToolOutput {
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) => return ToolOutput::error(format!("request failed: {e}")),
    };
    let status = response.status();
    let mut kept = Vec::new();
    let mut total = 0usize;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                total += chunk.len();
                let room = OUTPUT_CAP_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) => break,
            Err(e) => {
                return ToolOutput::error(format!("HTTP {status}: reading the body failed: {e}"));
            }
        }
    }
    let (body, dropped) = capped_text(&kept, total, OUTPUT_CAP_BYTES);
    let mut output = format!("HTTP {}\n{body}", status.as_u16());
    if dropped > 0 {
        output.push_str(&truncation_marker(dropped));
    }
    ToolOutput {
        output,
        is_error: !status.is_success(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::Fence;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server that answers `body` and hands back the request it got.
    async fn serve_once(body: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let n = sock.read(&mut buf).await.unwrap();
            let reply = format!(
                "HTTP/1.1 201 Created\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (format!("http://{addr}/thing"), handle)
    }

    fn env() -> ToolEnv {
        ToolEnv {
            run: "r".into(),
            run_uid: "uid".into(),
            fence: Fence::new(2),
            step: 5,
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        }
    }

    #[tokio::test]
    async fn a_post_carries_the_idempotency_key() {
        let (url, server) = serve_once("made").await;
        let args = BTreeMap::from([
            ("method".to_string(), "post".to_string()),
            ("url".to_string(), url),
            ("body".to_string(), "x".to_string()),
        ]);
        let out = run(
            &args,
            &env(),
            Duration::from_secs(5),
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(out.output, "HTTP 201\nmade");
        assert!(!out.is_error);
        let request = server.await.unwrap().to_ascii_lowercase();
        assert!(request.starts_with("post /thing"), "{request}");
        assert!(request.contains("idempotency-key: uid/5"), "{request}");
        assert!(
            request.contains(
                "\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            ),
            "the step's span, for the server's own spans to join: {request}"
        );
    }

    #[tokio::test]
    async fn a_get_has_no_idempotency_key() {
        let (url, server) = serve_once("ok").await;
        let args = BTreeMap::from([("url".to_string(), url)]);
        run(
            &args,
            &env(),
            Duration::from_secs(5),
            &CancellationToken::new(),
        )
        .await;
        let request = server.await.unwrap().to_ascii_lowercase();
        assert!(!request.contains("\r\nidempotency-key:"), "{request}");
        assert!(request.contains("x-baton-fence: 2"), "{request}");
    }

    #[test]
    fn method_defaults_to_get() {
        assert_eq!(method_of("{}"), "GET");
        assert_eq!(method_of(r#"{"method":"put"}"#), "PUT");
    }
}
