//! The `AgentRun` custom resource: one long-lived agent turn.

// kube's `printcolumn(...)` attributes repeat `type_` by design; clippy reads that as a mistake.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AgentRunStatus, AgentSpec};

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
// A run names its agent, or the thread whose agent it takes: the API server refuses neither.
#[schemars(extend("anyOf" = [{"required": ["agent"]}, {"required": ["thread"]}]))]
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
    /// Admission key: at most one live run per (namespace, threadKey); others wait `Pending`.
    /// A thread without a conversation: the runs take turns but carry nothing of one another.
    /// Not with `thread` (whose name is the key of its turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub thread_key: Option<String>,
    /// The AgentThread this run is a turn of: it takes its agent, budget, worker and lease
    /// settings from the thread when admitted, and its model sees the thread's earlier turns.
    /// A turn sets none of those itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub thread: Option<String>,
    /// The agent: its model, system prompt, step budget and tools. Required, except on a turn
    /// (`thread`), which the controller gives its thread's agent when it admits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
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

impl AgentRun {
    /// The owner reference of a turn to its thread: set when the turn joined it.
    pub fn thread_owner(&self) -> Option<&OwnerReference> {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "AgentThread")
    }

    /// The order runs of one thread (or thread key) take turns in: a turn's place in its
    /// thread (set when it joined), then creation time, then name.
    pub fn turn_order(&self) -> (Option<i64>, Option<k8s_openapi::jiff::Timestamp>, String) {
        let place = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::crd::TURN_ANNOTATION))
            .and_then(|v| v.parse().ok());
        let created = self.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (
            place,
            created,
            self.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// True when the run is a turn whose thread owns it: it has joined (taken the thread's
    /// agent and settings).
    pub fn has_joined(&self) -> bool {
        let thread = self.spec.thread.as_deref();
        thread.is_some_and(|t| self.thread_owner().is_some_and(|o| o.name == t))
    }

    /// Whether this run is a turn of the thread named `thread` with UID `uid` (in the run's
    /// namespace): it names the thread in `spec.thread` and, once joined, the thread that owns
    /// it is that one. A turn of a deleted thread of the same name is not; a turn that has not
    /// joined yet is (the controller joins it to the thread its name gives). The one
    /// definition of a thread's turns, for the controller, the server and the CLI.
    pub fn is_turn_of(&self, thread: &str, uid: &str) -> bool {
        self.spec.thread.as_deref() == Some(thread)
            && self.thread_owner().is_none_or(|o| o.uid == uid)
    }
}

impl AgentRunSpec {
    /// The agent, for a turn once it is admitted (it has its thread's from then on).
    pub fn agent(&self) -> Option<&AgentSpec> {
        self.agent.as_ref()
    }

    /// The key of the thread the run takes turns on: its thread's name, or its threadKey.
    pub fn admission_key(&self) -> Option<&str> {
        self.thread.as_deref().or(self.thread_key.as_deref())
    }

    /// The agent's tools (none before a turn is admitted).
    pub fn tools(&self) -> &[super::ToolSpec] {
        self.agent.as_ref().map_or(&[], |a| a.tools.as_slice())
    }

    /// True when `name` is the model's name of a tool of one of the agent's MCP servers
    /// (`<server>__<tool>`: the name approvals and the ledger know it by).
    pub fn names_an_mcp_tool(&self, name: &str) -> bool {
        name.split_once(super::MCP_SEPARATOR)
            .is_some_and(|(server, _)| {
                self.tools()
                    .iter()
                    .any(|t| t.kind == super::ToolKind::Mcp && t.name == server)
            })
    }

    /// The run's own agent to edit, an empty one set first if it has none.
    pub fn agent_mut(&mut self) -> &mut AgentSpec {
        self.agent.get_or_insert_with(AgentSpec::default)
    }
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
