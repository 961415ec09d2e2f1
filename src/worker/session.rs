//! The state of one attempt: the run as read at start, the replayed conversation, the
//! appender, the stop signals and the progress reported in status.

use std::sync::Arc;

use kube::runtime::events::EventType;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::WorkerConfig;
use super::api_count::ApiCounters;
use super::appender::{AppendError, Appender};
use super::guard::{Interrupts, LostGuard};
use super::holder::Holder;
use super::metrics::WorkerMetrics;
use super::model::endpoint::ApiKey;
use super::progress::Progress;
use super::provider::Model;
use super::toolbox::{ToolEntry, Toolbox};
use super::tools::mcp::McpServers;
use super::tools::{ToolEnv, Tools};
use crate::crd::v1alpha1::{
    AgentRun, AgentRunSpec, AgentSpec, LedgerEvent, LedgerStats, UnknownEffect,
};
use crate::fence::Fence;
use crate::ledger::{Fitted, HistoryError, Replay, ReplayedMessage};

/// One attempt at a run: who it is, what it acts through, and where its turn stands.
pub(super) struct Session {
    pub(super) me: Identity,
    pub(super) io: Handles,
    pub(super) turn: TurnState,
    tasks: Tasks,
}

/// Who the attempt is.
pub(super) struct Identity {
    /// The settings the pod was started with.
    pub(super) cfg: WorkerConfig,
    /// The run as read at start (its spec drives the attempt).
    pub(super) run: AgentRun,
    /// Its agent (a turn's is its thread's, copied in when it was admitted).
    pub(super) agent: AgentSpec,
    /// A turn's history: its thread's earlier turns as its first seal fixed them, fitted to
    /// its context policy (empty for a run that is no turn), or why it cannot be sent.
    pub(super) history: Result<Fitted, HistoryError>,
    /// The attempt's exported span (`crate::traces`), the parent of its model and tool calls'
    /// spans. Never entered, so no task the attempt spawns holds it: it ends with the session,
    /// before the process exports its last spans.
    pub(super) span: tracing::Span,
    /// The run's ids in its trace, which every attempt computes alike.
    pub(super) trace: crate::traces::RunTrace,
}

/// What the attempt acts through. None of it is a raw API client: the holder is its only way
/// to write the ledger, Lease and status.
pub(super) struct Handles {
    /// The attempt's hold on the run.
    pub(super) holder: Holder,
    pub(super) appender: Appender,
    pub(super) ledger_stats: watch::Receiver<LedgerStats>,
    pub(super) guard: LostGuard,
    pub(super) interrupts: Interrupts,
    pub(super) progress: watch::Sender<Progress>,
    pub(super) counters: Arc<ApiCounters>,
    pub(super) metrics: Arc<WorkerMetrics>,
    /// The model, or why it could not be built (the run fails with that message).
    pub(super) model: Result<Arc<Model>, String>,
    /// The tools container's executor, or why there is none.
    pub(super) tools: Tools,
    /// Every tool offered, by the model's name for it (MCP tools as the ledger recorded them).
    pub(super) toolbox: Toolbox,
    /// The run's MCP servers, connected for this attempt.
    pub(super) mcp: McpServers,
}

/// Where the turn stands.
#[derive(Default)]
pub(super) struct TurnState {
    /// The ledger as replayed at start plus everything this attempt appended or buffered.
    pub(super) replay: Replay,
    /// Events that go with the next awaited append (the assistant message of a turn).
    pub(super) pending: Vec<LedgerEvent>,
    /// Drop buffered deltas at the next awaited append: the turn's message replaces them.
    pub(super) drop_deltas: bool,
}

/// The attempt's background tasks, stopped by [`Session::stop_progress`] and
/// [`Session::stop_heartbeat`].
struct Tasks {
    /// Renewals and the run watch: stopped before the lease is released.
    heartbeat: Vec<JoinHandle<()>>,
    /// The progress writer: stopped before the final status write.
    progress: Option<JoinHandle<()>>,
}

impl Session {
    pub fn new(
        me: Identity,
        io: Handles,
        replay: Replay,
        heartbeat: Vec<JoinHandle<()>>,
        progress: JoinHandle<()>,
    ) -> Self {
        Self {
            me,
            io,
            turn: TurnState {
                replay,
                ..TurnState::default()
            },
            tasks: Tasks {
                heartbeat,
                progress: Some(progress),
            },
        }
    }

    /// Stops the progress writer (before the final status write).
    pub fn stop_progress(&mut self) {
        if let Some(task) = self.tasks.progress.take() {
            task.abort();
        }
    }

    /// Stops the renewals and the run watch (before the lease is released).
    pub fn stop_heartbeat(&mut self) {
        for task in self.tasks.heartbeat.drain(..) {
            task.abort();
        }
    }

    pub fn spec(&self) -> &AgentRunSpec {
        &self.me.run.spec
    }

    pub fn agent(&self) -> &AgentSpec {
        &self.me.agent
    }

    /// What the model is sent: the turn's history, then its own conversation.
    pub fn conversation(&self) -> Vec<ReplayedMessage> {
        let history = self.me.history.as_ref().map_or(&[][..], |h| &h.messages);
        history
            .iter()
            .chain(&self.turn.replay.messages)
            .cloned()
            .collect()
    }

    pub fn fence(&self) -> Fence {
        self.io.holder.fence()
    }

    pub fn tool_env(&self, step: i64) -> ToolEnv {
        ToolEnv {
            run: self.me.cfg.run.clone(),
            run_uid: self.me.run.id().uid,
            fence: self.fence(),
            step,
            traceparent: crate::traces::current_traceparent(),
        }
    }

    /// The awaited append: pending events, then `events`, after everything buffered. On
    /// success the events are folded into the replay (after any older owner's slipped segments).
    pub async fn append(&mut self, events: Vec<LedgerEvent>) -> Result<(), AppendError> {
        let mut all = std::mem::take(&mut self.turn.pending);
        all.extend(events);
        let drop_deltas = std::mem::take(&mut self.turn.drop_deltas);
        let acked = self.io.appender.append(all.clone(), drop_deltas).await?;
        self.io.counters.add_awaited(acked.requests);
        for seg in &acked.slipped {
            for event in &seg.spec.events {
                self.turn.replay.apply(seg.spec.fence, event);
            }
        }
        for event in &all {
            self.turn.replay.apply(self.fence(), event);
        }
        self.publish_usage();
        Ok(())
    }

    /// Publishes the usage the replay sums (to status, via progress).
    pub fn publish_usage(&self) {
        let usage = &self.turn.replay.usage;
        self.io.progress.send_if_modified(|p| {
            let changed = p.usage != *usage;
            p.usage = usage.clone();
            changed
        });
    }

    /// Buffers an event for the next flush and folds it into the replay at once.
    pub fn buffer(&mut self, event: LedgerEvent) {
        self.turn.replay.apply(self.fence(), &event);
        self.io.appender.buffer(event);
    }

    /// Publishes the step count.
    pub fn publish_steps(&self) {
        let steps = self.turn.replay.last_step();
        self.io.progress.send_if_modified(|p| {
            let changed = p.steps != steps;
            p.steps = steps;
            changed
        });
    }

    /// What a call of the tool the model names `name` runs.
    pub fn tool(&self, name: &str) -> Option<ToolEntry> {
        self.io.toolbox.get(name).cloned()
    }

    /// `text` with every secret the worker holds scrubbed out: the model API key (a tool
    /// could read it from the worker's environment, `/proc`) and the MCP servers' header
    /// values (a server may echo them). Nothing the ledger stores may hold them: every worker
    /// of the namespace can read the ledger.
    pub fn redact(&self, text: &str) -> String {
        let headers = self.io.mcp.values().flatten().flat_map(|s| s.secrets());
        let keys = std::iter::once(self.me.cfg.api_key.clone()).chain(headers.cloned().map(Some));
        keys.fold(text.to_string(), |text, key| ApiKey::new(key).redact(&text))
    }

    /// Records an unknown effect in status (via progress) and as a Warning Event.
    pub async fn report_unknown(&self, effect: UnknownEffect) {
        self.io.metrics.unknown_effect(effect.resolution);
        let note = format!(
            "step {} ({}) of attempt {}: its worker died before the result was recorded; resolution: {}",
            effect.step, effect.tool, effect.attempt, effect.resolution
        );
        self.io.progress.send_modify(|p| {
            p.unknown_effects.retain(|e| e.step != effect.step);
            p.unknown_effects.push(effect);
        });
        self.event(EventType::Warning, "UnknownEffect", "Resume", &note)
            .await;
    }

    /// Says, in the log and a Warning Event, which events of the ledger this version passed
    /// over: a newer baton wrote them (a rollout in progress, or a worker image older than
    /// the run's ledger). Nothing when there are none.
    pub async fn report_unrecognized(&self) {
        let kinds = &self.turn.replay.unrecognized;
        if kinds.is_empty() {
            return;
        }
        let mut named: Vec<&str> = kinds.iter().map(String::as_str).collect();
        named.sort_unstable();
        named.dedup();
        let note = format!(
            "the ledger holds {} event(s) of kinds this worker does not know ({}), written by a newer baton: passed over (run a worker image as new as the ledger's writer)",
            kinds.len(),
            named.join(", ")
        );
        tracing::warn!(%note, "unrecognized ledger events");
        self.event(
            EventType::Warning,
            "UnrecognizedLedgerEvents",
            "Resume",
            &note,
        )
        .await;
    }

    /// Publishes an Event about the run (best effort: a failure is logged).
    pub async fn event(&self, type_: EventType, reason: &str, action: &str, note: &str) {
        self.io
            .holder
            .publish_event(type_, reason, action, note)
            .await;
    }
}
