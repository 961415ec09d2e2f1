//! Replay: a pure fold of the ledger into the conversation, the step record and the run's
//! standing (finished, waiting, stopped...). Workers resume from it; the controller salvages
//! from it. Transcript history is never edited: replay only reads.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::chunk::Unchunker;
use super::journal::{Journal, RecordedCall};
use crate::crd::v1alpha1::{
    ApprovalOutcome, LedgerEvent, LedgerSegment, McpToolRecord, ProbeOutcome, Role, RunUsage,
};
use crate::fence::{EndReason, Fence};
use crate::ledger::LedgerError;

/// What the model is told about a step whose worker died while it ran.
pub const UNKNOWN_EFFECT_NOTICE: &str = "The worker running this step died before its result was recorded. \
Its effects are unknown, and it was NOT re-run. Check its effects before repeating it.";

/// One item of the conversation, in the order the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayedMessage {
    System(String),
    User(String),
    /// The model's turn: its text and the tool calls it made (one per recorded step).
    Assistant {
        text: String,
        tool_calls: Vec<ToolCallRecord>,
    },
    /// A tool's answer to the call `call_id`.
    ToolResult {
        step: i64,
        call_id: String,
        tool: String,
        content: String,
        is_error: bool,
    },
}

impl ReplayedMessage {
    /// Bytes of its text: what a token estimate counts.
    pub fn text_bytes(&self) -> usize {
        match self {
            ReplayedMessage::System(t) | ReplayedMessage::User(t) => t.len(),
            ReplayedMessage::Assistant { text, tool_calls } => {
                text.len() + tool_calls.iter().map(|c| c.input.len()).sum::<usize>()
            }
            ReplayedMessage::ToolResult { content, .. } => content.len(),
        }
    }
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRecord {
    pub step: i64,
    pub call_id: String,
    pub tool: String,
    pub input: String,
}

/// Where a recorded step stands.
#[derive(Debug, Clone, PartialEq)]
pub enum StepState {
    /// Intent recorded, no result: the effect is unknown until reconciled.
    Open,
    /// Its worker died; a probe, if any, found `probe`.
    Unknown { probe: Option<ProbeOutcome> },
    /// The tool's result is recorded.
    Done { output: String, is_error: bool },
    /// Recorded and not run: it waits for a human's decision (recorded `at`). Not an unknown
    /// effect: nothing ran. Approved, it becomes `Open` (it may run from then on).
    AwaitingApproval { requested_at: Time },
}

/// A recorded step.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayedStep {
    pub step: i64,
    pub tool: String,
    pub call_id: String,
    pub input: String,
    pub idempotent: bool,
    /// The fence of the attempt that recorded the intent.
    pub attempt: Fence,
    /// True once a `stepUnknown` was recorded, even if a later result resolved it.
    pub was_unknown: bool,
    /// True once a human's approval of this very call was recorded (it waited, and was let
    /// through its gate).
    pub approved: bool,
    pub state: StepState,
}

/// The ledger, folded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replay {
    pub messages: Vec<ReplayedMessage>,
    pub steps: BTreeMap<i64, ReplayedStep>,
    /// Position of the last segment (0 for an empty ledger).
    pub tail: i64,
    /// Number of events, chunks counted once per piece.
    pub events: i64,
    /// The fences of the attempts that started, in order.
    pub attempts: Vec<Fence>,
    pub final_output: Option<String>,
    pub failure: Option<(EndReason, String)>,
    pub stopped: bool,
    /// The step and question of an `askUser` still waiting for its answer.
    pub waiting: Option<(i64, String)>,
    /// Number of `spec.inputs` entries consumed.
    pub inputs_consumed: i64,
    pub handoffs: i64,
    /// Model text streamed since the last recorded assistant message (a dead attempt's
    /// partial answer: never promoted to a message, only salvaged).
    pub streamed_tail: String,
    tool_result_index: BTreeMap<i64, usize>,
    chunks: Unchunker,
    /// What the run spent, as recorded.
    pub usage: RunUsage,
    /// A turn's first attempt recorded which earlier turns its model is not sent.
    pub history_dropped: bool,
    /// The tools each MCP server (by the spec's tool name) offered when first listed.
    pub mcp_tools: BTreeMap<String, Vec<McpToolRecord>>,
    /// An agent container's model calls, as recorded.
    pub journal: Journal,
    /// The kinds of the events this version does not know (a newer one wrote them), in
    /// order: passed over by the fold, reported by its reader.
    pub unrecognized: Vec<String>,
}

impl Replay {
    /// Folds contiguous segments (sorted by seq) into a replay.
    pub fn from_segments(segments: &[LedgerSegment]) -> Result<Self, LedgerError> {
        let mut replay = Replay::default();
        replay.extend(segments)?;
        if replay.chunks.in_progress() {
            return Err(LedgerError::CorruptChunk {
                seq: replay.tail,
                detail: "incomplete chunked event".into(),
            });
        }
        Ok(replay)
    }

    /// Chunked events whose writer stopped before their last chunk (dropped).
    pub fn abandoned_chunks(&self) -> usize {
        self.chunks.abandoned()
    }

    /// Folds more segments (the next positions) into this replay.
    pub fn extend(&mut self, segments: &[LedgerSegment]) -> Result<(), LedgerError> {
        for seg in segments {
            if seg.spec.seq != self.tail + 1 {
                return Err(LedgerError::Gap {
                    expected: self.tail + 1,
                    found: seg.spec.seq,
                });
            }
            self.tail = seg.spec.seq;
            for event in &seg.spec.events {
                self.events += 1;
                // A chunked event abandoned by a writer that lost the run is dropped (a
                // result lost this way leaves its step open, so it is reported unknown): a
                // resumed run must not be stopped by it.
                let whole =
                    self.chunks
                        .feed(event)
                        .map_err(|detail| LedgerError::CorruptChunk {
                            seq: seg.spec.seq,
                            detail,
                        })?;
                if let Some(event) = whole {
                    self.apply(seg.spec.fence, &event);
                }
            }
        }
        Ok(())
    }

    /// Folds one event written under `fence`.
    pub fn apply(&mut self, fence: Fence, event: &LedgerEvent) {
        match event {
            LedgerEvent::AttemptStarted { fence, .. } => {
                self.attempts.push(*fence);
                self.count_cut_call();
                self.streamed_tail.clear();
            }
            LedgerEvent::Message { role, content } => self.apply_message(*role, content),
            LedgerEvent::ModelDelta { text } => self.streamed_tail.push_str(text),
            LedgerEvent::ModelCall {
                input_tokens,
                output_tokens,
            } => self.usage.add_model_call(*input_tokens, *output_tokens),
            LedgerEvent::StepIntent {
                step,
                tool,
                call_id,
                input,
                idempotent,
            } => self.apply_intent(fence, *step, tool, call_id, input, *idempotent),
            LedgerEvent::StepResult {
                step,
                output,
                is_error,
            } => self.apply_result(*step, output, *is_error),
            LedgerEvent::ApprovalRequested {
                step, requested_at, ..
            } => self.apply_approval_requested(*step, requested_at),
            LedgerEvent::ApprovalDecided { step, outcome, .. } => {
                self.apply_approval_decided(*step, *outcome)
            }
            // The first list recorded is the one: a resumed run offers the same tools.
            LedgerEvent::McpTools { tool, tools } => {
                self.mcp_tools
                    .entry(tool.clone())
                    .or_insert_with(|| tools.clone());
            }
            LedgerEvent::StepUnknown { step, .. } => self.apply_unknown(*step),
            LedgerEvent::StepProbed { step, outcome } => self.apply_probe(*step, *outcome),
            LedgerEvent::Input { index, content } => self.apply_input(*index, content),
            LedgerEvent::WaitingInput { step, question } => {
                self.waiting = Some((*step, question.clone()))
            }
            LedgerEvent::Handoff => self.handoffs += 1,
            LedgerEvent::Final { output } => self.final_output = Some(output.clone()),
            LedgerEvent::Failed { reason, message } => {
                self.failure = Some((reason.clone(), message.clone()))
            }
            LedgerEvent::Stopped => self.stopped = true,
            LedgerEvent::Claimed { .. } | LedgerEvent::History { .. } => {}
            LedgerEvent::HistoryDropped { .. } => self.history_dropped = true,
            LedgerEvent::Closed { .. } => self.count_cut_call(),
            LedgerEvent::Chunk { .. } => {}
            LedgerEvent::GatewayCall {
                call,
                api,
                request,
                response,
            } => self
                .journal
                .record(*call, RecordedCall::new(api, request, response)),
            LedgerEvent::GatewayDiverged { call, field } => self.journal.diverge(*call, field),
            LedgerEvent::Unrecognized(event) => self.unrecognized.push(event.kind().to_string()),
        }
    }

    fn apply_approval_requested(&mut self, step: i64, requested_at: &Time) {
        let waits = StepState::AwaitingApproval {
            requested_at: requested_at.clone(),
        };
        self.move_step(step, |s| *s == StepState::Open, waits);
    }

    /// Approved, the waiting step is open (it runs); denied, its result comes with the
    /// decision, in the same append.
    fn apply_approval_decided(&mut self, step: i64, outcome: ApprovalOutcome) {
        if outcome != ApprovalOutcome::Approved {
            return;
        }
        let waiting = |s: &StepState| matches!(s, StepState::AwaitingApproval { .. });
        if self.move_step(step, waiting, StepState::Open)
            && let Some(s) = self.steps.get_mut(&step)
        {
            s.approved = true;
        }
    }

    fn apply_probe(&mut self, step: i64, outcome: ProbeOutcome) {
        if let Some(s) = self.steps.get_mut(&step)
            && let StepState::Unknown { probe } = &mut s.state
        {
            *probe = Some(outcome);
        }
    }

    fn apply_input(&mut self, index: i64, content: &str) {
        self.inputs_consumed = self.inputs_consumed.max(index + 1);
        // An answer to an `askUser` step reaches the model as that step's result (the
        // `stepResult` that follows); a user message in between would split the call from its
        // result, which providers refuse.
        if self.waiting.take().is_none() {
            self.messages
                .push(ReplayedMessage::User(content.to_string()));
        }
    }

    /// A model call whose text was streaming when its attempt ended (a new attempt starts, or
    /// the ledger is closed, with that text never made a message): its tokens are unknown.
    fn count_cut_call(&mut self) {
        if !self.streamed_tail.is_empty() {
            self.usage.model_calls += 1;
            self.usage.unknown_model_calls += 1;
        }
    }

    fn apply_message(&mut self, role: Role, content: &str) {
        let message = match role {
            Role::System => ReplayedMessage::System(content.to_string()),
            Role::User => ReplayedMessage::User(content.to_string()),
            Role::Assistant => {
                self.streamed_tail.clear();
                ReplayedMessage::Assistant {
                    text: content.to_string(),
                    tool_calls: Vec::new(),
                }
            }
        };
        self.messages.push(message);
    }

    fn apply_intent(
        &mut self,
        fence: Fence,
        step: i64,
        tool: &str,
        call_id: &str,
        input: &str,
        idempotent: bool,
    ) {
        let call = ToolCallRecord {
            step,
            call_id: call_id.into(),
            tool: tool.into(),
            input: input.into(),
        };
        // A tool call belongs to the assistant turn that made it, even when results of
        // earlier calls of that turn came in between.
        match self.last_assistant_mut() {
            Some(ReplayedMessage::Assistant { tool_calls, .. }) => tool_calls.push(call),
            _ => self.messages.push(ReplayedMessage::Assistant {
                text: String::new(),
                tool_calls: vec![call],
            }),
        }
        if !self.steps.contains_key(&step) {
            self.usage.tool_calls += 1;
        }
        self.steps.insert(
            step,
            ReplayedStep {
                step,
                tool: tool.into(),
                call_id: call_id.into(),
                input: input.into(),
                idempotent,
                attempt: fence,
                was_unknown: false,
                approved: false,
                state: StepState::Open,
            },
        );
    }

    fn last_assistant_mut(&mut self) -> Option<&mut ReplayedMessage> {
        let last_user_or_assistant = self.messages.iter().rposition(|m| {
            matches!(
                m,
                ReplayedMessage::Assistant { .. } | ReplayedMessage::User(_)
            )
        })?;
        let m = &mut self.messages[last_user_or_assistant];
        matches!(m, ReplayedMessage::Assistant { .. }).then_some(m)
    }

    fn apply_result(&mut self, step: i64, output: &str, is_error: bool) {
        if let Some(s) = self.steps.get_mut(&step) {
            s.state = StepState::Done {
                output: output.into(),
                is_error,
            };
        }
        self.set_tool_result(step, output, is_error);
    }

    /// Moves `step` to state `to` if its state is one `from` accepts.
    /// Moves `step` to `to` if its state is one `from` accepts; true when it moved.
    fn move_step(&mut self, step: i64, from: impl Fn(&StepState) -> bool, to: StepState) -> bool {
        match self.steps.get_mut(&step) {
            Some(s) if from(&s.state) => {
                s.state = to;
                true
            }
            _ => false,
        }
    }

    fn apply_unknown(&mut self, step: i64) {
        if let Some(s) = self.steps.get_mut(&step) {
            s.was_unknown = true;
            if s.state == StepState::Open {
                s.state = StepState::Unknown { probe: None };
            }
        }
        self.set_tool_result(step, UNKNOWN_EFFECT_NOTICE, true);
    }

    /// A call has one result in the conversation: a later result (a probe's, a re-run's)
    /// replaces the unknown notice in place, so the history the model sees stays well formed.
    fn set_tool_result(&mut self, step: i64, content: &str, is_error: bool) {
        if let Some(&i) = self.tool_result_index.get(&step) {
            if let ReplayedMessage::ToolResult {
                content: c,
                is_error: e,
                ..
            } = &mut self.messages[i]
            {
                *c = content.into();
                *e = is_error;
            }
            return;
        }
        let Some(s) = self.steps.get(&step) else {
            return;
        };
        self.tool_result_index.insert(step, self.messages.len());
        self.messages.push(ReplayedMessage::ToolResult {
            step,
            call_id: s.call_id.clone(),
            tool: s.tool.clone(),
            content: content.into(),
            is_error,
        });
    }

    /// Steps with an intent and no result and no unknown record: their worker died mid-step.
    pub fn open_steps(&self) -> Vec<&ReplayedStep> {
        self.steps
            .values()
            .filter(|s| s.state == StepState::Open)
            .collect()
    }

    /// The step that waits for a decision, if any (a run waits on one at a time).
    pub fn awaiting_approval(&self) -> Option<&ReplayedStep> {
        self.steps
            .values()
            .find(|s| matches!(s.state, StepState::AwaitingApproval { .. }))
    }

    /// Steps whose effect is still unknown after reconciliation.
    pub fn unknown_steps(&self) -> Vec<&ReplayedStep> {
        self.steps
            .values()
            .filter(|s| matches!(s.state, StepState::Unknown { .. }))
            .collect()
    }

    /// The highest step number recorded (0 if none).
    pub fn last_step(&self) -> i64 {
        self.steps.keys().next_back().copied().unwrap_or(0)
    }

    /// Number of assistant turns recorded: the scripted model's position.
    pub fn assistant_turns(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| matches!(m, ReplayedMessage::Assistant { .. }))
            .count()
    }

    /// The best output the ledger holds: the final answer, else the assistant's text so far
    /// plus what a dead attempt streamed (marked partial by the caller).
    pub fn salvage(&self) -> String {
        if let Some(out) = &self.final_output {
            return out.clone();
        }
        let mut parts: Vec<&str> = self
            .messages
            .iter()
            .filter_map(|m| match m {
                ReplayedMessage::Assistant { text, .. } if !text.trim().is_empty() => {
                    Some(text.as_str())
                }
                _ => None,
            })
            .collect();
        if !self.streamed_tail.trim().is_empty() {
            parts.push(&self.streamed_tail);
        }
        parts.join("\n\n")
    }
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "format_tests.rs"]
mod format_tests;
