//! The `AgentThread` custom resource: a conversation. It holds the agent once, and its turns
//! (AgentRuns with `spec.thread`) continue one another: each turn's model sees the turns
//! before it.

// kube's `printcolumn(...)` attributes repeat `type_` by design; clippy reads that as a mistake.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AgentSpec, BudgetSpec, LeaseSpec, Phase, RunUsage, WorkerSpec};

/// A conversation whose turns continue one another.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "baton.dev",
    version = "v1alpha1",
    kind = "AgentThread",
    plural = "agentthreads",
    singular = "agentthread",
    shortname = "at",
    namespaced,
    status = "AgentThreadStatus",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Turns", type_ = "integer", json_path = ".status.turns"),
    printcolumn(name = "Last turn", type_ = "string", json_path = ".status.lastTurn"),
    printcolumn(
        name = "Tokens",
        type_ = "integer",
        json_path = ".status.usage.totalTokens"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AgentThreadSpec {
    /// The agent every turn runs: its model, system prompt, step budget and tools. A turn
    /// takes it when it is admitted (copied into the turn's `spec.agent`), so editing it
    /// changes the turns admitted later, never one already admitted.
    pub agent: AgentSpec,
    /// What each turn may spend (each turn counts its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// Settings for the worker pods of every turn.
    #[serde(default)]
    pub worker: WorkerSpec,
    /// Run lease timing of every turn.
    #[serde(default)]
    pub lease: LeaseSpec,
    /// How many attempts of a turn may end by dying before the turn ends `Interrupted`.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 100))]
    pub max_attempts: i32,
    /// What a new turn does while another turn of the thread is live.
    #[serde(default)]
    pub on_busy: BusyPolicy,
    /// How much of the conversation a turn's model is sent. Unset: all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextPolicy>,
    /// Start the next turn's worker pod ahead of it, so a turn created under the name the
    /// thread offers (`status.nextTurn`) starts on a pod already running. Unset: every turn
    /// starts a pod of its own when it is claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmSpec>,
}

/// How long a thread keeps its next turn's pod started ahead.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmSpec {
    /// How long the pod waits for the next turn after the thread's last turn ended (and the
    /// most a started pod waits): past it the pod exits and the thread holds no pod until its
    /// next turn.
    #[serde(default = "default_warm_idle_seconds")]
    #[schemars(range(min = 10, max = 86400))]
    pub idle_seconds: i64,
}

fn default_warm_idle_seconds() -> i64 {
    300
}

/// How much of the conversation a turn's model is sent. Fixed for a turn when it is first
/// claimed (recorded in its ledger with its history).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextPolicy {
    /// The most tokens the earlier turns may take, estimated as the scripted provider
    /// estimates usage (one token per 4 bytes of text).
    #[schemars(range(min = 1))]
    pub max_history_tokens: i64,
    /// What a turn whose history is larger does.
    #[serde(default)]
    pub on_overflow: Overflow,
}

/// What a turn whose history passes `maxHistoryTokens` does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Overflow {
    /// The turn ends `Failed`, reason `ContextExceeded`, naming the sizes.
    #[default]
    Fail,
    /// The oldest whole turns are left out until the rest fits (never a tool call without its
    /// result); which ones, and their tokens, is recorded in the turn's ledger.
    DropOldestTurns,
}

fn default_max_attempts() -> i32 {
    3
}

/// What a new turn does while another turn of the thread is live. Either way at most one turn
/// of a thread is live at a time.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BusyPolicy {
    /// The turn waits `Pending`; turns run in creation order.
    #[default]
    Enqueue,
    /// The turn ends `Failed` at once, reason `ThreadBusy`.
    Reject,
    /// The live turn is stopped, as `baton stop` stops it (its step in flight cancelled and
    /// recorded), and ends `Stopped`, reason `Interrupted`; the new turn runs next and its
    /// model sees what the stopped turn recorded.
    Interrupt,
}

/// Whether a turn of the thread is live.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ThreadPhase {
    /// No turn is live.
    #[default]
    Idle,
    /// A turn is live (running, waiting for input or an approval, or finishing).
    Busy,
}

/// The thread as its turns show it; written by the controller only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentThreadStatus {
    #[serde(default)]
    pub phase: ThreadPhase,
    /// Turns of the thread that exist, pending ones included.
    #[serde(default)]
    pub turns: i64,
    /// The newest turn that was admitted (or refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_turn: Option<String>,
    /// That turn's phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_turn_phase: Option<Phase>,
    /// What the thread's existing turns spent, summed from their own `status.usage`.
    #[serde(default)]
    pub usage: RunUsage,
    /// Turns that ever joined the thread: the next one to join takes place `joined + 1`
    /// (the order of its history), counted by compare-and-swap on this status.
    #[serde(default)]
    pub joined: i64,
    /// With `spec.warm`: the name the next turn takes to start on the pod started for it
    /// (a turn of another name starts a pod of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_turn: Option<String>,
    /// `Busy`: True while a turn is live (its message names it), False otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl AgentThread {
    /// A new turn of this thread, as a user writes one: its input and its thread, named
    /// `status.nextTurn` when the thread starts its next turn's pod ahead (`spec.warm`), else
    /// `<thread>-<random>` by the API server. Everything else it takes from the thread when
    /// it joins.
    pub fn new_turn(&self, input: &str) -> super::AgentRun {
        let thread = kube::ResourceExt::name_any(self);
        // Through serde: the spec's defaults are the schema's (what the API server fills in).
        let spec: super::AgentRunSpec =
            serde_json::from_value(serde_json::json!({ "input": input, "thread": thread }))
                .expect("a turn's spec is valid JSON for its type");
        let turn = super::AgentRun {
            metadata: kube::api::ObjectMeta::default(),
            spec,
            status: None,
        };
        match self.offered_turn_name() {
            Some(name) => super::AgentRun {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                ..turn
            },
            None => self.named_by_server(turn),
        }
    }

    /// The name the thread offers its next turn: `status.nextTurn`, while `spec.warm` is set.
    pub fn offered_turn_name(&self) -> Option<&str> {
        self.spec.warm.as_ref()?;
        self.status.as_ref()?.next_turn.as_deref()
    }

    /// `turn` named by the API server (`<thread>-<random>`): what a creator falls back to when
    /// the offered name was taken meanwhile (by another turn, or by any run of that name).
    pub fn named_by_server(&self, mut turn: super::AgentRun) -> super::AgentRun {
        turn.metadata.name = None;
        turn.metadata.generate_name = Some(format!("{}-", kube::ResourceExt::name_any(self)));
        turn
    }

    /// Its settings (`agent`, `budget`, `worker`, `lease`, `maxAttempts`) and itself as owner
    /// on `turn`, which joins it at `place`: what the join writes, and what a turn's pod
    /// started ahead is built from.
    pub fn lend_to(&self, turn: &mut super::AgentRun, place: i64) {
        use kube::{Resource, ResourceExt};
        turn.annotations_mut()
            .insert(crate::crd::TURN_ANNOTATION.into(), place.to_string());
        let spec = &mut turn.spec;
        spec.agent = Some(self.spec.agent.clone());
        spec.budget = self.spec.budget.clone();
        spec.worker = self.spec.worker.clone();
        spec.lease = self.spec.lease.clone();
        spec.max_attempts = self.spec.max_attempts;
        if let Some(owner) = self.controller_owner_ref(&()) {
            // Not blocking: deleting the thread needs no permission on its turns' finalizers.
            let reference = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                controller: Some(false),
                block_owner_deletion: None,
                ..owner
            };
            turn.owner_references_mut().push(reference);
        }
    }

    /// What the `Busy` condition says while a turn is live ("turn X is live"); None when
    /// the thread is idle.
    pub fn busy(&self) -> Option<&str> {
        let status = self.status.as_ref()?;
        if status.phase != ThreadPhase::Busy {
            return None;
        }
        let busy = status.conditions.iter().find(|c| c.type_ == "Busy")?;
        Some(busy.message.as_str())
    }
}
