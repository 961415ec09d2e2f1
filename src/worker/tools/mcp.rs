//! MCP tools: one client per server per attempt, on the official SDK (`rmcp`), its Streamable
//! HTTP transport running over the worker's own reqwest client (one TLS provider; no
//! redirects, so a header from the Secret never follows one).
//!
//! Each call carries baton's run, fence, step and idempotency key as request metadata
//! (`_meta`: `dev.baton/run`, `dev.baton/fence`, `dev.baton/step`, `dev.baton/idempotencyKey`),
//! so a fence-aware server can refuse a zombie. Every way a call can go wrong (the server
//! unreachable, a JSON-RPC error, the tool's own error, a timeout, a result too large) gives
//! the model a bounded result naming the server; none of them hangs. rmcp's own replay of a
//! request after an expired session is turned off: a call is sent once.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, JsonObject, RequestMetaObject,
};
use rmcp::service::{RoleClient, RunningService, ServiceError, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::NeverRetry;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use tokio_util::sync::CancellationToken;

use super::{OUTPUT_CAP_BYTES, ToolEnv, ToolOutput, capped_text, truncation_marker};
use crate::crd::v1alpha1::{McpSpec, McpToolRecord};
use crate::worker::toolbox::McpTarget;

/// The largest response body accepted from a server (rmcp refuses a larger one before
/// decoding it); what reaches the model is cut to `OUTPUT_CAP_BYTES` anyway.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// How long connecting (and the MCP handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The attempt's MCP servers by the spec's tool name, or why one could not be reached.
pub type McpServers = BTreeMap<String, Result<Arc<McpServer>, String>>;

/// Why a server could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error("MCP server {server} ({url}) could not be reached: {detail}")]
    Unreachable {
        server: String,
        url: String,
        detail: String,
    },
    #[error("MCP server {server} ({url}) did not list its tools: {detail}")]
    List {
        server: String,
        url: String,
        detail: String,
    },
    #[error("the headers of MCP server {server} (spec headersFromSecret): {detail}")]
    Headers { server: String, detail: String },
}

/// A connected server.
pub struct McpServer {
    name: String,
    url: String,
    service: RunningService<RoleClient, ClientConfig>,
    /// The header values from the Secret: scrubbed from everything the worker records.
    secrets: Vec<String>,
}

/// Header values shorter than this are not taken for secrets (scrubbing a 2-character value
/// would mangle every result); a credential is longer.
const MIN_SECRET_CHARS: usize = 8;

/// Connects to the server of the spec's `mcp` tool `name`. Its headers, if the spec names a
/// Secret, are the files of `headers_dir/<name>/` (the Secret's volume, in the worker
/// container only).
pub async fn connect(
    name: &str,
    spec: &McpSpec,
    headers_dir: &Path,
) -> Result<McpServer, McpError> {
    let headers = match &spec.headers_from_secret {
        Some(secret) => read_headers(name, secret, &headers_dir.join(name))?,
        None => HashMap::new(),
    };
    let secrets = headers
        .values()
        .filter_map(|v| v.to_str().ok())
        .filter(|v| v.trim().chars().count() >= MIN_SECRET_CHARS)
        .map(String::from)
        .collect();
    let unreachable = |detail: String| McpError::Unreachable {
        server: name.into(),
        url: spec.url.clone(),
        detail,
    };
    crate::kube_util::ensure_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| unreachable(e.to_string()))?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(spec.url.clone())
        .custom_headers(headers)
        .max_json_response_size(MAX_RESPONSE_BYTES)
        .reinit_on_expired_session(false);
    config.retry_config = Arc::new(NeverRetry::default());
    let transport = StreamableHttpClientTransport::with_client(client, config);
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("baton", env!("CARGO_PKG_VERSION")),
    );
    let service = tokio::time::timeout(CONNECT_TIMEOUT, info.serve(transport))
        .await
        .map_err(|_| unreachable(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())))?
        .map_err(|e| unreachable(error_chain(&e)))?;
    Ok(McpServer {
        name: name.into(),
        url: spec.url.clone(),
        service,
        secrets,
    })
}

/// The header files of a mounted Secret: each file's name is a header, its content the
/// value (a trailing newline dropped). The volume's own entries (`..data`) are skipped.
fn read_headers(
    server: &str,
    secret: &str,
    dir: &Path,
) -> Result<HashMap<http::HeaderName, http::HeaderValue>, McpError> {
    let fail = |detail: String| McpError::Headers {
        server: server.into(),
        detail,
    };
    // The volume is optional: a Secret that does not exist mounts as an empty directory.
    let missing = || fail(format!("Secret {secret} does not exist or holds no keys"));
    let entries = std::fs::read_dir(dir).map_err(|_| missing())?;
    let mut headers = HashMap::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().to_string();
        if file.starts_with('.') {
            continue;
        }
        let value =
            std::fs::read_to_string(entry.path()).map_err(|e| fail(format!("{file}: {e}")))?;
        let name = http::HeaderName::try_from(file.as_str())
            .map_err(|_| fail(format!("key {file:?} is not an HTTP header name")))?;
        let mut value = http::HeaderValue::try_from(value.trim_end_matches(['\r', '\n']))
            .map_err(|_| fail(format!("the value of {file:?} is not a valid header value")))?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    if headers.is_empty() {
        return Err(missing());
    }
    Ok(headers)
}

/// An error and its sources, on one line (rmcp wraps the reqwest error that says why).
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

impl McpServer {
    /// The values of the headers from the Secret (those long enough to be credentials).
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// The server's tools, as they are recorded in the ledger.
    pub async fn list(&self) -> Result<Vec<McpToolRecord>, McpError> {
        let listed = tokio::time::timeout(CONNECT_TIMEOUT, self.service.list_all_tools()).await;
        let fail = |detail: String| McpError::List {
            server: self.name.clone(),
            url: self.url.clone(),
            detail,
        };
        let tools = listed
            .map_err(|_| fail(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())))?
            .map_err(|e| fail(error_chain(&e)))?;
        Ok(tools.into_iter().map(record).collect())
    }

    /// Calls `tool` with `arguments` (a JSON object); cancelling `cancel` abandons the call.
    pub async fn call(
        &self,
        tool: &str,
        arguments: &str,
        env: &ToolEnv,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> ToolOutput {
        let arguments: JsonObject = match serde_json::from_str(arguments) {
            Ok(object) => object,
            Err(e) => return ToolOutput::error(format!("arguments are not a JSON object: {e}")),
        };
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject::from(meta(env)));
        let server = &self.name;
        tokio::select! {
            r = tokio::time::timeout(timeout, self.service.call_tool(params)) => match r {
                Ok(Ok(result)) => output_of(result),
                Ok(Err(ServiceError::McpError(e))) => ToolOutput::error(format!(
                    "MCP server {server} refused the call of {tool}: {}", e.message
                )),
                Ok(Err(e)) => ToolOutput::error(format!(
                    "MCP server {server}: the call of {tool} failed ({}); whether it took effect is unknown",
                    error_chain(&e)
                )),
                Err(_) => ToolOutput::error(format!(
                    "MCP server {server}: the call of {tool} timed out after {}s; whether it took effect is unknown",
                    timeout.as_secs()
                )),
            },
            _ = cancel.cancelled() => ToolOutput::error(format!(
                "the call of {tool} on MCP server {server} was cancelled"
            )),
        }
    }
}

/// baton's request metadata for one call.
fn meta(env: &ToolEnv) -> JsonObject {
    let mut meta = JsonObject::new();
    meta.insert("dev.baton/run".into(), env.run.clone().into());
    meta.insert("dev.baton/fence".into(), env.fence.get().into());
    meta.insert("dev.baton/step".into(), env.step.into());
    meta.insert(
        "dev.baton/idempotencyKey".into(),
        env.idempotency_key().into(),
    );
    // Where MCP's proposal for trace context puts it (the W3C key, in `_meta`).
    if let Some(traceparent) = &env.traceparent {
        meta.insert("traceparent".into(), traceparent.clone().into());
    }
    meta
}

fn record(tool: rmcp::model::Tool) -> McpToolRecord {
    let hints = tool.annotations.as_ref();
    McpToolRecord {
        name: tool.name.to_string(),
        description: tool.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: serde_json::Value::Object((*tool.input_schema).clone()),
        read_only_hint: hints.and_then(|h| h.read_only_hint),
        idempotent_hint: hints.and_then(|h| h.idempotent_hint),
        destructive_hint: hints.and_then(|h| h.destructive_hint),
    }
}

/// What the model gets of a result: its text blocks (other blocks as JSON; the structured
/// content when there is no block), cut to `OUTPUT_CAP_BYTES`.
fn output_of(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => text.text.clone(),
            other => serde_json::to_string(other).unwrap_or_default(),
        })
        .collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = parts.join("\n");
    let (mut output, dropped) = capped_text(text.as_bytes(), text.len(), OUTPUT_CAP_BYTES);
    if dropped > 0 {
        output.push_str(&truncation_marker(dropped));
    }
    ToolOutput {
        output,
        is_error: result.is_error == Some(true),
    }
}

/// Runs the call of `target` on its server, or says why that server is not there.
pub async fn call_target(
    servers: &McpServers,
    target: &McpTarget,
    arguments: &str,
    env: &ToolEnv,
    timeout: Duration,
    cancel: &CancellationToken,
) -> ToolOutput {
    match servers.get(&target.server) {
        Some(Ok(server)) => {
            server
                .call(&target.tool, arguments, env, timeout, cancel)
                .await
        }
        Some(Err(why)) => ToolOutput::error(format!("[not run: {why}]")),
        None => ToolOutput::error(format!(
            "[not run: MCP server {} is not connected]",
            target.server
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::Fence;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("baton-mcp-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_secrets_files_are_its_headers_and_the_volumes_own_entries_are_skipped() {
        let d = dir("headers");
        std::fs::write(d.join("x-api-key"), "k3y\n").unwrap();
        std::fs::create_dir_all(d.join("..2026_12_01")).unwrap();
        let headers = read_headers("files", "files-auth", &d).unwrap();
        assert_eq!(headers.len(), 1);
        let value = &headers[&http::HeaderName::from_static("x-api-key")];
        assert_eq!(value.to_str().unwrap(), "k3y");
        assert!(value.is_sensitive(), "never printed");
        std::fs::write(d.join("not a header"), "x").unwrap();
        let err = read_headers("files", "files-auth", &d).unwrap_err();
        assert!(
            err.to_string().contains("is not an HTTP header name"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_secret_that_is_missing_or_empty_is_named() {
        let empty = dir("empty");
        for d in [empty.clone(), empty.join("nope")] {
            let err = read_headers("files", "files-auth", &d).unwrap_err();
            assert_eq!(
                err.to_string(),
                "the headers of MCP server files (spec headersFromSecret): Secret files-auth does not exist or holds no keys"
            );
        }
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn a_result_is_its_text_cut_to_the_cap_and_keeps_its_error_flag() {
        let ok = output_of(CallToolResult::success(vec![
            ContentBlock::text("one"),
            ContentBlock::text("two"),
        ]));
        assert_eq!(
            ok,
            ToolOutput {
                output: "one\ntwo".into(),
                is_error: false
            }
        );
        let failed = output_of(CallToolResult::error(vec![ContentBlock::text("no")]));
        assert!(failed.is_error);
        let big = output_of(CallToolResult::success(vec![ContentBlock::text(
            "x".repeat(OUTPUT_CAP_BYTES + 10),
        )]));
        assert!(big.output.ends_with(&truncation_marker(10)), "marked");
    }

    #[test]
    fn each_call_carries_the_run_fence_step_and_idempotency_key() {
        let env = ToolEnv {
            run: "r".into(),
            run_uid: "u".into(),
            fence: Fence::new(3),
            step: 7,
            traceparent: None,
        };
        let m = meta(&env);
        assert_eq!(m["dev.baton/fence"], 3);
        assert_eq!(m["dev.baton/step"], 7);
        assert_eq!(m["dev.baton/idempotencyKey"], "u/7");
        assert_eq!(m["dev.baton/run"], "r");
        assert!(!m.contains_key("traceparent"), "traces off");
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let traced = meta(&ToolEnv {
            traceparent: Some(traceparent.into()),
            ..env
        });
        assert_eq!(traced["traceparent"], traceparent);
    }
}
