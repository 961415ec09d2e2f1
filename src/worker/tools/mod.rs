//! Tools the agent may call, and the probes that check an unknown step's effect at resume.
//!
//! Every tool and probe gets `BATON_RUN`, `BATON_FENCE`, `BATON_STEP` and
//! `BATON_IDEMPOTENCY_KEY` (`<run-uid>/<step>`), so fence-aware systems can refuse a zombie too.
//! Tool arguments arrive as a JSON object, serialized. `shell` tools and probes run in the
//! tools container through its executor (`executor`); `http` tools are the worker's own
//! requests, with no credential of the worker's in them.

pub mod executor;
pub mod http;
pub mod mcp;
pub mod probe;
pub mod shell;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use baton_exec::capture::capped_text;
use executor::{Executor, ExecutorLost};
use mcp::McpServers;

use super::toolbox::ToolEntry;

use crate::crd::env;
use crate::crd::v1alpha1::{ToolKind, ToolSpec};
use crate::fence::Fence;

/// Bytes of tool output kept, at most; the rest is dropped and marked.
pub const OUTPUT_CAP_BYTES: usize = 64 * 1024;

/// Who is calling a tool: the run, the fence and the step.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEnv {
    pub run: String,
    pub run_uid: String,
    pub fence: Fence,
    pub step: i64,
    /// The W3C `traceparent` of the step's span, when traces are on: what the tool is given
    /// (a `traceparent` header, MCP's `_meta.traceparent`, a process's `TRACEPARENT`), so its
    /// own spans join the run's trace under the call.
    pub traceparent: Option<String>,
}

impl ToolEnv {
    /// `<run-uid>/<step>`: the same for every attempt at the step, so a re-run is recognisable.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}", self.run_uid, self.step)
    }

    /// The `BATON_*` environment of a tool or probe process.
    pub fn vars(&self) -> Vec<(String, String)> {
        vec![
            (env::RUN.into(), self.run.clone()),
            (env::FENCE.into(), self.fence.to_string()),
            (env::STEP.into(), self.step.to_string()),
            (env::IDEMPOTENCY_KEY.into(), self.idempotency_key()),
        ]
    }

    /// [`ToolEnv::vars`], and `TRACEPARENT` (OpenTelemetry's name for the context a process
    /// is handed in its environment) when traces are on: a process's whole environment.
    pub fn process_vars(&self) -> Vec<(String, String)> {
        let mut vars = self.vars();
        vars.extend(
            self.traceparent
                .clone()
                .map(|t| ("TRACEPARENT".to_string(), t)),
        );
        vars
    }
}

/// What a tool call returns to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub output: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn error(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            is_error: true,
        }
    }
}

/// Parses a tool call's arguments (a JSON object) into strings; non-string values keep their JSON text.
pub fn parse_arguments(json: &str) -> Result<BTreeMap<String, String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("arguments are not JSON: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err("arguments must be a JSON object".into());
    };
    Ok(map
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

/// True when re-running a step of this tool has the effect of running it once.
/// `askUser` has no effect outside the ledger; a GET is idempotent by HTTP's definition.
pub fn is_idempotent(spec: &ToolSpec, arguments: &str) -> bool {
    match spec.kind {
        ToolKind::AskUser => true,
        ToolKind::Http => spec.idempotent || http::method_of(arguments) == "GET",
        ToolKind::Shell | ToolKind::Mcp => spec.idempotent,
    }
}

/// The tools container's executor, or why this worker has none (a shell step then fails
/// with that message).
pub type Tools = Result<std::sync::Arc<Executor>, String>;

/// Runs a `shell`, `http` or MCP tool (askUser is the agent's business). Cancelling `cancel`
/// kills it. `Err`: the executor went away mid-command, so the step's effect is unknown.
pub async fn run(
    tools: &Tools,
    servers: &McpServers,
    entry: &ToolEntry,
    arguments: &str,
    tool_env: &ToolEnv,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ExecutorLost> {
    let spec = &entry.spec;
    let timeout = Duration::from_secs(spec.timeout_seconds.max(1) as u64);
    if let Some(target) = &entry.mcp {
        let output = mcp::call_target(servers, target, arguments, tool_env, timeout, cancel);
        return Ok(output.await);
    }
    let args = match parse_arguments(arguments) {
        Ok(args) => args,
        Err(message) => return Ok(ToolOutput::error(message)),
    };
    match spec.kind {
        ToolKind::Shell => {
            let Some(command) = args.get("command") else {
                return Ok(ToolOutput::error(
                    "the shell tool needs a `command` argument",
                ));
            };
            let executor = match tools {
                Ok(executor) => executor,
                Err(why) => return Ok(ToolOutput::error(format!("[could not start: {why}]"))),
            };
            let outcome =
                shell::run(executor, command, &tool_env.process_vars(), timeout, cancel).await?;
            Ok(shell::to_tool_output(&outcome))
        }
        ToolKind::Http => Ok(http::run(&args, tool_env, timeout, cancel).await),
        ToolKind::AskUser => Ok(ToolOutput::error("askUser is handled by the agent loop")),
        ToolKind::Mcp => Ok(ToolOutput::error(
            "an MCP server is called through its tools",
        )),
    }
}

/// The marker appended to an output that was cut.
pub fn truncation_marker(dropped: usize) -> String {
    format!("\n[output truncated: {dropped} bytes]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_a_json_object_of_strings() {
        let args = parse_arguments(r#"{"command":"echo hi","n":3}"#).unwrap();
        assert_eq!(args["command"], "echo hi");
        assert_eq!(args["n"], "3");
        assert!(parse_arguments("[1]").is_err());
        assert!(parse_arguments("nope").is_err());
    }

    #[test]
    fn the_idempotency_key_is_run_uid_and_step() {
        let env = ToolEnv {
            run: "r".into(),
            run_uid: "u-1".into(),
            fence: Fence::new(3),
            step: 7,
            traceparent: None,
        };
        assert_eq!(env.idempotency_key(), "u-1/7");
        assert!(env.vars().contains(&("BATON_FENCE".into(), "3".into())));
        assert_eq!(env.process_vars(), env.vars(), "traces off: no TRACEPARENT");
        let traced = ToolEnv {
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            ..env
        };
        assert!(traced.process_vars().contains(&(
            "TRACEPARENT".into(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()
        )));
    }
}
