//! What an AgentRun reports: its phase, its status, and what its ledger says it spent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fence::value::Fence;

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
    pub fence: Fence,
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
    /// Where the run's ledger lives, recorded by the controller's first status write and never
    /// changed after (absent: `LedgerSegments`, as every run before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_backend: Option<LedgerBackend>,
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
    /// The attempt (its fence) that started the step.
    pub attempt: Fence,
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
    /// Adds what another run spent (a thread sums its turns').
    pub fn add(&mut self, other: &RunUsage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.total_tokens += other.total_tokens;
        self.model_calls += other.model_calls;
        self.tool_calls += other.tool_calls;
        self.unknown_model_calls += other.unknown_model_calls;
    }

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

/// The store of a run's ledger (docs/ledger-backends.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum LedgerBackend {
    /// LedgerSegment objects in the API server (etcd).
    #[default]
    LedgerSegments,
    /// Rows in PostgreSQL, written through `baton server`.
    PostgreSQL,
}

impl LedgerBackend {
    /// The backend of `status` (absent: `LedgerSegments`).
    pub fn of(status: Option<&AgentRunStatus>) -> Self {
        status.and_then(|s| s.ledger_backend).unwrap_or_default()
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
