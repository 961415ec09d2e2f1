//! The agent an AgentRun runs: its model, its tools (shell, http, MCP, probes) and when
//! their calls wait for a human.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a tool's calls wait for a human's approval before they run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ApprovalPolicy {
    /// Calls run at once.
    #[default]
    NotRequired,
    /// Each call is recorded, then the run waits (`WaitingApproval`) for a decision in
    /// `spec.approvals`.
    Required,
}

/// The agent that executes the turn.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// The model that drives the agent.
    pub model: ModelSpec,
    /// System prompt given to the model before the user's input (at most 128 Ki characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 131072))]
    pub system_prompt: Option<String>,
    /// Maximum number of tool steps in the turn; the run fails with `MaxStepsExceeded` past it.
    #[serde(default = "default_max_steps")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_steps: i32,
    /// Tools the model may call (at most 128).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub tools: Vec<ToolSpec>,
    /// Whether tool calls wait for approval, for every tool that does not say itself
    /// (`tools[].approval`). `askUser` never waits: it is a human gate already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
    /// Bring your own agent: the run's agent is this container, not baton's built-in loop.
    /// Its model calls go through the worker's gateway on the pod's loopback
    /// (docs/byo-agent.md), which journals them, and `tools` are served to it as one MCP
    /// server, each call a write-ahead step; a later attempt runs it again from the top and
    /// answers its recorded calls from the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<AgentContainer>,
}

/// The user's agent, as a container of the run's pod beside the worker. It holds no model key
/// and no API token: the worker hands it a key for its gateway, good for this attempt only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentContainer {
    /// The agent's image.
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// What to run, as an argv (no shell). Required: baton starts it itself, through its
    /// executor, and never reads the image's own entrypoint.
    #[schemars(length(min = 1, max = 64))]
    pub command: Vec<String>,
    /// Arguments after `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub args: Vec<String>,
    /// Plain environment variables. Names baton sets (`OPENAI_*`, `ANTHROPIC_*`, `BATON_*`)
    /// are refused; a key belongs in `agent.model.apiKeySecretRef`, where the agent never sees
    /// it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<PlainEnvVar>,
    /// The container's resources (unset: none requested, no limit but the node's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// What a later attempt does when the agent's model call differs from the one recorded
    /// at its place: `Fail` (the default) ends the run `ResumeDiverged`, naming the call and
    /// the first field that differs; `Continue` records the divergence and goes live from
    /// there.
    #[serde(default)]
    pub on_divergence: OnDivergence,
}

/// A plain environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PlainEnvVar {
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub name: String,
    /// Its value (`""` for an empty one).
    #[schemars(length(max = 32768))]
    pub value: String,
}

/// What a resumed agent's model call that differs from the recorded one does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnDivergence {
    /// The run fails `ResumeDiverged`.
    #[default]
    Fail,
    /// The divergence is recorded and the call, and every one after it, goes to the model.
    Continue,
}

fn default_max_steps() -> i32 {
    50
}

/// Which model provider drives the agent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Provider {
    /// Deterministic turns from `script`: no network; for demos and tests.
    #[default]
    Scripted,
    /// An OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, llama.cpp).
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
}

/// The model and how to reach it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Model provider.
    #[serde(default)]
    pub provider: Provider,
    /// Model name as the provider knows it (for example `gpt-4o-mini`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Base URL of the provider's API; defaults to the provider's public endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Secret key holding the API key. It reaches the worker only as an environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,
    /// For `scripted`: the model's turns, in order. A turn without tool calls ends the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script: Vec<ScriptTurn>,
    /// The longest a model call waits with nothing from the server: for its answer to begin,
    /// and between two events of its stream (pings do not count). Then the call fails and is
    /// retried. Default 300: models can think for minutes before their first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub idle_timeout_seconds: Option<i64>,
}

/// A key in a Secret in the run's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key within the Secret.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// One scripted model turn.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptTurn {
    /// Text the model says in this turn (streamed as deltas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Tool calls the model makes in this turn, run in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptToolCall>,
    /// How long the scripted model "thinks" before answering, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600000))]
    pub delay_milliseconds: Option<i64>,
    /// The tokens this turn reports using. Unset: a deterministic estimate, one token per 4
    /// bytes of the request's messages (input) and of the turn's text and arguments (output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ScriptUsage>,
}

/// The tokens a scripted turn reports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptUsage {
    #[schemars(range(min = 0))]
    pub input_tokens: i64,
    #[schemars(range(min = 0))]
    pub output_tokens: i64,
}

/// A scripted tool call.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptToolCall {
    /// Name of a tool in `agent.tools`.
    #[schemars(length(min = 1))]
    pub tool: String,
    /// Arguments, as the tool expects them (`command` for shell; `method`, `url`, `body` for http;
    /// `question` for askUser).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
}

/// Between an `mcp` tool's name and its server's name for one of its tools
/// (`<server>__<tool>`).
pub const MCP_SEPARATOR: &str = "__";

/// What a tool does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ToolKind {
    /// Runs `sh -c <command>` in the worker container.
    Shell,
    /// Sends an HTTP request; non-GET requests carry an `Idempotency-Key` header.
    Http,
    /// Asks the user a question: the run waits (`WaitingInput`) for an entry in `spec.inputs`.
    AskUser,
    /// The tools of a Model Context Protocol server (`mcp`), each offered to the model as
    /// `<name>__<tool>`.
    Mcp,
}

/// A tool the model may call.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// Name the model calls the tool by.
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[a-zA-Z0-9_-]+$"))]
    pub name: String,
    /// What the tool does.
    pub kind: ToolKind,
    /// Description given to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// True when running the tool twice has the effect of running it once. Only idempotent
    /// tools are re-run when a resumed run finds their effect unknown.
    #[serde(default)]
    pub idempotent: bool,
    /// How long one call may take before it is cancelled and reported as timed out.
    #[serde(default = "default_tool_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i64,
    /// A check, run at resume, of whether a step whose effect is unknown landed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSpec>,
    /// Whether this tool's calls wait for approval; unset: `agent.approval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
    /// For `kind: mcp`: the server, and which of its tools the model gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpSpec>,
}

/// A Model Context Protocol server reached over Streamable HTTP. Its tool list is read when
/// the run starts and recorded in the ledger: a resumed run offers the same tools.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpSpec {
    /// The server's Streamable HTTP endpoint, e.g. `http://tools.team-a:8000/mcp`.
    #[schemars(length(min = 1), regex(pattern = r"^https?://"))]
    pub url: String,
    /// A Secret in the run's namespace whose every key is an HTTP header sent with each
    /// request to the server (its value the header's value): for auth. It is mounted in the
    /// worker container only, never in the tools container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub headers_from_secret: Option<String>,
    /// Only these of the server's tools (default: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// None of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Per-tool settings that override the server's hints and this tool's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<McpToolOverride>,
    /// Take the server's `readOnlyHint` and `idempotentHint` as saying that a call may be run
    /// again when a crash left its effect unknown. Off by default: the hints come from the
    /// server, and a re-run must be the manifest's choice.
    #[serde(default)]
    pub trust_hints: bool,
}

/// Settings for one tool of an MCP server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpToolOverride {
    /// The tool's name as the server gives it.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Whether a call may be run again when its effect is unknown (wins over the hints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// Whether its calls wait for approval (wins over the server's `approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
}

fn default_tool_timeout() -> i64 {
    60
}

/// A shell command that tells whether a step's effect landed. It runs with the step's
/// `BATON_*` environment and its arguments as `BATON_ARG_<NAME>`.
/// Exit 0: applied (recorded, not re-run). Exit 1: not applied (safe to run). Anything else: unknown.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// Command run with `sh -c`.
    #[schemars(length(min = 1))]
    pub command: String,
    /// How long the probe may take.
    #[serde(default = "default_probe_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i64,
}

fn default_probe_timeout() -> i64 {
    30
}
