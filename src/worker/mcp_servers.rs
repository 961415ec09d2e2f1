//! At the start of every attempt: connect to the run's MCP servers and record, once, the
//! tools each offers. The ledger's record is what the model is offered from then on: a
//! resumed run presents the same tools, and a server whose list changed since is said in
//! condition `McpToolsChanged` (the run goes on with the recorded list).

use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::finish::Ending;
use super::session::Session;
use super::toolbox::Toolbox;
use super::tools::mcp::{self, McpError, McpServer};
use crate::crd::v1alpha1::{LedgerEvent, McpSpec, McpToolRecord, ToolKind};
use crate::fence::EndReason;

/// Waits between connection attempts: a server that is starting gets a few seconds.
const RETRIES: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(3)];

/// Connects every server, records the tools of those not recorded yet, and rebuilds the
/// toolbox. Err: a server the run has no record of cannot be reached or listed (the run
/// fails, naming it).
pub async fn connect_all(s: &mut Session) -> Result<(), Ending> {
    let mut changed = Vec::new();
    for (name, spec) in servers_of(s) {
        let recorded = s.turn.replay.mcp_tools.get(&name).cloned();
        let listed = connect_and_list(&name, &spec, &s.me.cfg.mcp_headers_dir).await;
        match (recorded, listed) {
            (None, Ok((server, tools))) => {
                s.buffer(LedgerEvent::McpTools {
                    tool: name.clone(),
                    tools,
                });
                s.io.mcp.insert(name, Ok(server));
            }
            (None, Err(err)) => {
                return Err(Ending::Failed {
                    reason: EndReason::McpServerUnavailable,
                    message: err.to_string(),
                });
            }
            (Some(recorded), Ok((server, tools))) => {
                if let Some(what) = difference(&recorded, &tools) {
                    changed.push(format!("{name}: {what}"));
                }
                s.io.mcp.insert(name, Ok(server));
            }
            (Some(_), Err(err)) => {
                // Its calls say so to the model; the recorded list stands.
                warn!(error = %err, "an MCP server is not reachable at resume");
                s.io.mcp.insert(name, Err(err.to_string()));
            }
        }
    }
    s.io.toolbox = Toolbox::new(s.spec(), &s.turn.replay.mcp_tools);
    if !changed.is_empty() {
        let message = format!(
            "MCP servers offer other tools than the run recorded when it started ({}); the run goes on with the recorded ones",
            changed.join("; ")
        );
        s.io.progress
            .send_modify(|p| p.mcp_tools_changed = Some(message));
    }
    Ok(())
}

/// The spec's MCP servers: each `mcp` tool's name and server.
fn servers_of(s: &Session) -> Vec<(String, McpSpec)> {
    s.spec()
        .tools()
        .iter()
        .filter(|t| t.kind == ToolKind::Mcp)
        .filter_map(|t| Some((t.name.clone(), t.mcp.clone()?)))
        .collect()
}

/// A connected server and its tools, after a few tries.
async fn connect_and_list(
    name: &str,
    spec: &McpSpec,
    headers_dir: &std::path::Path,
) -> Result<(Arc<McpServer>, Vec<McpToolRecord>), McpError> {
    let mut tries = RETRIES.iter();
    loop {
        let attempt = async {
            let server = mcp::connect(name, spec, headers_dir).await?;
            let tools = server.list().await?;
            Ok::<_, McpError>((Arc::new(server), tools))
        };
        match (attempt.await, tries.next()) {
            (Ok(found), _) => return Ok(found),
            // A Secret that is not as it must be does not get better by waiting.
            (Err(err @ McpError::Headers { .. }), _) | (Err(err), None) => return Err(err),
            (Err(_), Some(pause)) => tokio::time::sleep(*pause).await,
        }
    }
}

/// What differs between the recorded list and the one offered now (None: nothing).
pub fn difference(recorded: &[McpToolRecord], now: &[McpToolRecord]) -> Option<String> {
    let names = |list: &[McpToolRecord], other: &[McpToolRecord]| -> Vec<String> {
        list.iter()
            .filter(|t| !other.iter().any(|o| o.name == t.name))
            .map(|t| t.name.clone())
            .collect()
    };
    let added = names(now, recorded);
    let removed = names(recorded, now);
    let altered: Vec<String> = recorded
        .iter()
        .filter(|t| now.iter().any(|o| o.name == t.name && o != *t))
        .map(|t| t.name.clone())
        .collect();
    let parts: Vec<String> = [("added", added), ("removed", removed), ("changed", altered)]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("{what} {}", names.join(", ")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str) -> McpToolRecord {
        McpToolRecord {
            name: name.into(),
            description: description.into(),
            input_schema: serde_json::json!({"type": "object"}),
            read_only_hint: None,
            idempotent_hint: None,
            destructive_hint: None,
        }
    }

    #[test]
    fn a_changed_list_says_what_was_added_removed_and_changed() {
        let recorded = [tool("a", "x"), tool("b", "x"), tool("c", "x")];
        assert_eq!(difference(&recorded, &recorded), None);
        let now = [tool("a", "x"), tool("c", "other"), tool("d", "x")];
        assert_eq!(
            difference(&recorded, &now).as_deref(),
            Some("added d, removed b, changed c")
        );
    }
}
