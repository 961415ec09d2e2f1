//! The `AgentRun` custom resource: one long-lived agent turn.

// kube's `printcolumn(...)` attributes repeat `type_` by design; clippy reads that as a mistake.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An agent turn that baton keeps alive across pod deaths, drains and rollouts.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "baton.dev",
    version = "v1alpha1",
    kind = "AgentRun",
    plural = "agentruns",
    singular = "agentrun",
    shortname = "ar",
    namespaced,
    status = "AgentRunStatus",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Attempt", type_ = "integer", json_path = ".status.attempt"),
    printcolumn(name = "Steps", type_ = "integer", json_path = ".status.steps"),
    printcolumn(
        name = "Tokens",
        type_ = "integer",
        json_path = ".status.usage.totalTokens"
    ),
    printcolumn(
        name = "Unknown effects",
        type_ = "integer",
        json_path = ".status.unknownEffectCount"
    ),
    printcolumn(name = "Worker", type_ = "string", json_path = ".status.worker"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AgentRunSpec {
    /// The user message that starts the turn (at most 64 Ki characters).
    #[schemars(length(min = 1, max = 65536))]
    pub input: String,
    /// Later user messages, append-only: answers to a run that is `WaitingInput` (at most
    /// 256, each at most 64 Ki characters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 65536)))]
    pub inputs: Vec<String>,
    /// Decisions on tool calls that wait for approval, append-only (`baton approve`,
    /// `baton deny`). Each names the step and the call it decides, so it can never apply to
    /// another call, twice, or after the run moved on: one that names no waiting step is
    /// ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalDecision>,
    /// How long a tool call may wait for its decision before it is denied by default.
    /// Unset: it waits until decided (or the run is stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub approval_timeout_seconds: Option<i64>,
    /// Admission key: at most one live run per (namespace, threadKey). Others wait `Pending`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub thread_key: Option<String>,
    /// The agent: its model, system prompt, step budget and tools.
    pub agent: AgentSpec,
    /// Run lease timing: how the worker proves it is alive.
    #[serde(default)]
    pub lease: LeaseSpec,
    /// How many attempts may end by dying (lease expiry or pod death) before the run ends
    /// `Interrupted`. A graceful handoff or an input wait does not count.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 100))]
    pub max_attempts: i32,
    /// Set to true to stop the run. The worker cancels the step in flight and the run ends `Stopped`.
    #[serde(default)]
    pub stop: bool,
    /// Delete the run (and, by owner references, its ledger) this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,
    /// Settings for the worker pods that execute the run.
    #[serde(default)]
    pub worker: WorkerSpec,
    /// Limits on what the run may spend, counted from its ledger (no crash, handoff or
    /// controller restart resets them). Checked before each model call and tool step, so a
    /// limit is passed by at most the one call in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// A workspace that outlives each pod: one PersistentVolumeClaim per run (owned by the
    /// run), mounted at `/workspace` in every attempt's tools container. Without it the
    /// workspace is an `emptyDir`, lost with the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceSpec>,
}

/// What a run may spend. A run that reaches a limit ends `Failed` with reason
/// `BudgetExceeded` (`DeadlineExceeded` for the deadline), naming it, its output salvaged.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpec {
    /// Input plus output tokens of all model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tokens: Option<i64>,
    /// Model calls (a call cut short by a crash counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_model_calls: Option<i64>,
    /// Tool steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tool_calls: Option<i64>,
    /// Wall time since the run started (`status.startTime`), across attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub deadline_seconds: Option<i64>,
}

/// A human's decision on one tool call that waits for approval.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// The step that waits (`status.pendingApproval.step`).
    #[schemars(range(min = 1))]
    pub step: i64,
    /// The model's id of the call (`status.pendingApproval.callId`): a decision for the same
    /// step number of another call does not match.
    #[schemars(length(min = 1))]
    pub call_id: String,
    /// `Approve` runs the call; `Deny` skips it and tells the model why.
    pub decision: Verdict,
    /// Why: shown to the model for a denial, recorded in the ledger for both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A decision on a tool call.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Verdict {
    Approve,
    Deny,
}

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

/// The run's persistent workspace: the claim the controller creates for it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// Requested size, as a Kubernetes quantity (`10Gi`).
    pub size: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    /// Storage class of the claim; the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Access modes of the claim. `ReadWriteOnce` (the default) ties the volume to one node
    /// at a time: after a node is lost, the next pod waits until the volume is detached from
    /// it. `ReadWriteMany` avoids that wait where the storage offers it.
    #[serde(default = "default_access_modes")]
    #[schemars(length(min = 1))]
    pub access_modes: Vec<WorkspaceAccessMode>,
}

/// How a workspace volume may be mounted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum WorkspaceAccessMode {
    ReadWriteOnce,
    ReadWriteMany,
}

fn default_access_modes() -> Vec<WorkspaceAccessMode> {
    vec![WorkspaceAccessMode::ReadWriteOnce]
}

fn default_max_attempts() -> i32 {
    3
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

/// Run lease timing.
///
/// `renewSeconds < durationSeconds` is checked by the controller (the run fails `InvalidSpec`).
/// Not by a CEL rule in the schema: servers before 1.25 refuse a server-side applied CRD (and
/// Helm's install) that carries `x-kubernetes-validations`, and the chart supports 1.20.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSpec {
    /// How long a worker's claim lasts without renewal. Must exceed `renewSeconds`.
    #[serde(default = "default_lease_duration")]
    #[schemars(range(min = 2, max = 3600))]
    pub duration_seconds: i32,
    /// How often the worker renews its claim.
    #[serde(default = "default_renew")]
    #[schemars(range(min = 1, max = 3599))]
    pub renew_seconds: i32,
    /// How long a new worker pod may take to make its first renewal.
    #[serde(default = "default_startup")]
    #[schemars(range(min = 1, max = 86400))]
    pub startup_seconds: i32,
}

fn default_lease_duration() -> i32 {
    30
}
fn default_renew() -> i32 {
    10
}
fn default_startup() -> i32 {
    300
}

impl Default for LeaseSpec {
    fn default() -> Self {
        Self {
            duration_seconds: default_lease_duration(),
            renew_seconds: default_renew(),
            startup_seconds: default_startup(),
        }
    }
}

/// Settings for the worker pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSpec {
    /// Worker image; defaults to the controller's configured worker image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Compute resources of the worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// ServiceAccount the worker pod runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Node selector of the worker pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the worker pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Image of the tools container, where shell tools and probes run: the user's toolchain
    /// (git, python, compilers). Any image with `/bin/sh`; baton's executor is copied into it
    /// at start. Defaults to the worker's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub tools_image: Option<String>,
    /// Compute resources of the tools container. Unset: baton's bounded defaults (a memory
    /// and an ephemeral-storage limit, small requests; see docs/architecture.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_resources: Option<ResourceRequirements>,
    /// Size limit of `/workspace` when it is an `emptyDir` (no `spec.workspace`); the kubelet
    /// evicts a pod whose workspace outgrows it. Default 4Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size_limit: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// RuntimeClass of the worker pod, e.g. one for gVisor or Kata, to put the tools behind
    /// a sandboxed kernel as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub runtime_class_name: Option<String>,
}

/// Where a run is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Waiting for admission (its thread is busy) or for its first claim.
    #[default]
    Pending,
    /// A worker holds the run and works on it.
    Running,
    /// The worker handed the run off (drain, rollout); the next worker continues at once.
    Handoff,
    /// The agent asked the user a question; a new entry in `spec.inputs` resumes it.
    WaitingInput,
    /// A tool call waits for a human's decision (`status.pendingApproval`); an entry in
    /// `spec.approvals` for it, or `approvalTimeoutSeconds`, resumes the run.
    WaitingApproval,
    /// The worker committed the outcome; the controller releases the lease and admission.
    Finishing,
    /// The turn ended with a final answer.
    Succeeded,
    /// The turn cannot succeed (bad spec, permanent provider error, step budget).
    Failed,
    /// The run kept dying, or its transcript could not be stored; partial output salvaged.
    Interrupted,
    /// Stopped on request (`spec.stop`).
    Stopped,
}

impl Phase {
    /// True for the phases a run never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Phase::Succeeded | Phase::Failed | Phase::Interrupted | Phase::Stopped
        )
    }

    /// The name as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Handoff => "Handoff",
            Phase::WaitingInput => "WaitingInput",
            Phase::WaitingApproval => "WaitingApproval",
            Phase::Finishing => "Finishing",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Interrupted => "Interrupted",
            Phase::Stopped => "Stopped",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of a run. Every write is a resourceVersion compare-and-swap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRunStatus {
    /// Where the run is in its life.
    #[serde(default)]
    pub phase: Phase,
    /// The current attempt; equals the fence.
    #[serde(default)]
    pub attempt: i64,
    /// Attempts that ended by dying (lease expiry or pod death).
    #[serde(default)]
    pub failed_attempts: i32,
    /// The fencing token of the current owner. Only a writer holding it may write.
    #[serde(default)]
    pub fence: i64,
    /// The worker pod of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// When the run was first claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Tool steps taken so far.
    #[serde(default)]
    pub steps: i64,
    /// Steps whose effects are unknown because their worker died while they ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown_effects: Vec<UnknownEffect>,
    /// Number of entries in `unknownEffects` (for `kubectl get`).
    #[serde(default)]
    pub unknown_effect_count: i64,
    /// Size of the durable ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<LedgerStats>,
    /// What the run has spent, summed from its ledger (so no crash or handoff loses or
    /// double-counts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<RunUsage>,
    /// The tool call that waits for a decision, while the run is `WaitingApproval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_approval: Option<PendingApproval>,
    /// How many entries of `spec.inputs` the run has consumed.
    #[serde(default)]
    pub inputs_consumed: i64,
    /// The final answer, or the salvaged partial output when `Interrupted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// True when `output` is a partial salvage rather than a final answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_partial: bool,
    /// True when `output` is cut at the status cap (32 KiB); the whole text is in the ledger
    /// (`baton transcript`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// The phase a `Finishing` run ends in (`Succeeded` or `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Phase>,
    /// Machine-readable reason for the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail for the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions in the Kubernetes convention: Admitted, LeaseHeld, Resumed, Complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A tool call recorded in the ledger that has not run: it waits for a decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    /// Step number: what a decision names.
    pub step: i64,
    /// The model's id of the call: what a decision names too.
    pub call_id: String,
    /// Tool the call asks for.
    pub tool: String,
    /// The call's arguments as the model gave them (JSON; cut at 4 KiB, the ledger holds
    /// all of it).
    pub arguments: String,
    /// When the call was recorded: `approvalTimeoutSeconds` counts from here.
    pub requested_at: Time,
}

/// A step whose effect is unknown: its worker died between recording the intent and the result.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnknownEffect {
    /// Step number.
    pub step: i64,
    /// Tool the step called.
    pub tool: String,
    /// The attempt that started the step.
    pub attempt: i64,
    /// What was done about it: `unknown`, `applied` (probe), `notApplied` (probe, then re-run),
    /// `rerun` (idempotent).
    pub resolution: Resolution,
    /// A short summary of the call.
    pub summary: String,
}

/// What a resumed attempt did about a step whose effect was unknown. On the wire: the
/// camelCase name.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Resolution {
    /// Nothing could be done: reported, never re-run.
    #[default]
    Unknown,
    /// A probe found the effect had landed: recorded as done, not re-run.
    Applied,
    /// A probe found the effect had not landed: run again.
    NotApplied,
    /// The tool is idempotent: run again.
    Rerun,
}

impl Resolution {
    pub const ALL: [Resolution; 4] = [
        Resolution::Unknown,
        Resolution::Applied,
        Resolution::NotApplied,
        Resolution::Rerun,
    ];

    /// The wire name (also the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Unknown => "unknown",
            Resolution::Applied => "applied",
            Resolution::NotApplied => "notApplied",
            Resolution::Rerun => "rerun",
        }
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a run has spent, as its ledger records it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunUsage {
    /// Input (prompt) tokens of the recorded model calls.
    #[serde(default)]
    pub input_tokens: i64,
    /// Output (completion) tokens of the recorded model calls.
    #[serde(default)]
    pub output_tokens: i64,
    /// Input plus output.
    #[serde(default)]
    pub total_tokens: i64,
    /// Model calls that completed and were recorded.
    #[serde(default)]
    pub model_calls: i64,
    /// Tool steps the model asked for (each recorded before it ran).
    #[serde(default)]
    pub tool_calls: i64,
    /// Model calls whose tokens are not known: a call cut short by its attempt's death (its
    /// streamed text is in the ledger, its usage never was), or a provider that reported
    /// none. Their tokens are not in the sums above. A call that died before its first
    /// streamed text reached the ledger leaves no trace and is not counted.
    #[serde(default)]
    pub unknown_model_calls: i64,
}

impl RunUsage {
    /// Folds one recorded model call in.
    pub fn add_model_call(&mut self, input_tokens: Option<i64>, output_tokens: Option<i64>) {
        match (input_tokens, output_tokens) {
            (Some(input), Some(output)) => {
                self.model_calls += 1;
                self.input_tokens += input;
                self.output_tokens += output;
                self.total_tokens = self.input_tokens + self.output_tokens;
            }
            _ => {
                self.model_calls += 1;
                self.unknown_model_calls += 1;
            }
        }
    }
}

/// Size of a run's ledger.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerStats {
    /// Number of LedgerSegments.
    pub segments: i64,
    /// Number of events.
    pub events: i64,
    /// Bytes stored.
    pub bytes: i64,
}
