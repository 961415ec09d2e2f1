//! A turn's history (docs/protocol.md, "Threads"): the conversation of its thread's earlier
//! turns, rebuilt from their ledgers up to the positions its first seal fixed. Pure: the
//! segments are read by the caller.

use std::collections::HashMap;

use kube::ResourceExt;

use super::replay::{Replay, ReplayedMessage, StepState};
use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::{ContextPolicy, HistoryTurn, LedgerEvent, LedgerSegment, Overflow};
use crate::fence::EndReason;
use crate::ledger::{LedgerError, is_segment_of};

/// What the model is told about a call its turn ended without a result for (the turn was
/// stopped, failed or interrupted while the call waited or ran).
pub const ENDED_WITHOUT_RESULT: &str = "This call's turn ended before its result was recorded. \
Its effects are unknown. Check them before repeating it.";

/// A turn's history as its first seal fixed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedHistory {
    pub thread: String,
    pub turns: Vec<HistoryTurn>,
    pub context: Option<ContextPolicy>,
}

/// The history a turn's ledger fixes: the `history` event of its first seal (position 1, the
/// controller's `claimed` for fence 1). One anywhere else is not the controller's and is not
/// read. None: the run is not a turn, or its ledger predates its first seal.
pub fn recorded_history(segments: &[LedgerSegment]) -> Option<FixedHistory> {
    let first = segments.iter().find(|s| s.spec.seq == 1)?;
    let events = &first.spec.events;
    let sealed =
        matches!(events.first(), Some(LedgerEvent::Claimed { fence, .. }) if fence.is_first());
    if !sealed {
        return None;
    }
    events.iter().find_map(|e| match e {
        LedgerEvent::History {
            thread,
            turns,
            context,
        } => Some(FixedHistory {
            thread: thread.clone(),
            turns: turns.clone(),
            context: context.clone(),
        }),
        _ => None,
    })
}

/// Why an earlier turn's conversation cannot be rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// Its run, or a segment of its ledger up to the fixed position, is gone (or is another
    /// run's under the same name).
    #[error(
        "turn {run} of the history is gone: its ledger holds {found} of the {up_to} position(s) \
         this turn's history was fixed at (deleted, or re-created under its name)"
    )]
    Missing { run: String, up_to: i64, found: i64 },
    #[error("turn {run} of the history: {detail}")]
    Unreadable { run: String, detail: String },
    /// The history is larger than the thread's `maxHistoryTokens`, and its `onOverflow` is
    /// `Fail`.
    #[error(
        "the history ({turns} earlier turn(s)) is {tokens} tokens (estimated: one per 4 bytes), \
         over the thread's context.maxHistoryTokens ({max}); its onOverflow is Fail \
         (DropOldestTurns leaves the oldest turns out)"
    )]
    TooLong { turns: usize, tokens: i64, max: i64 },
}

impl HistoryError {
    /// The reason the turn ends with.
    pub fn reason(&self) -> EndReason {
        match self {
            HistoryError::TooLong { .. } => EndReason::ContextExceeded,
            _ => EndReason::HistoryUnavailable,
        }
    }
}

/// The history a turn's model is sent: the earlier turns that fit its context policy, and the
/// turns left out (oldest first) with their estimated tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fitted {
    pub messages: Vec<ReplayedMessage>,
    pub dropped: Vec<String>,
    pub dropped_tokens: i64,
}

/// Fits the earlier turns' conversations (in order, with their turns) to `policy`. Whole turns
/// only: a tool call is never sent without its result. Deterministic, so every attempt of a
/// turn sends the same history.
pub fn fit(
    turns: Vec<(HistoryTurn, Vec<ReplayedMessage>)>,
    policy: Option<&ContextPolicy>,
) -> Result<Fitted, HistoryError> {
    let sized: Vec<(HistoryTurn, Vec<ReplayedMessage>, i64)> = turns
        .into_iter()
        .map(|(turn, messages)| {
            let tokens = estimated_tokens(&messages);
            (turn, messages, tokens)
        })
        .collect();
    let total: i64 = sized.iter().map(|(_, _, t)| t).sum();
    let mut fitted = Fitted::default();
    let Some(policy) = policy.filter(|p| total > p.max_history_tokens) else {
        fitted.messages = sized.into_iter().flat_map(|(_, m, _)| m).collect();
        return Ok(fitted);
    };
    if policy.on_overflow == Overflow::Fail {
        return Err(HistoryError::TooLong {
            turns: sized.len(),
            tokens: total,
            max: policy.max_history_tokens,
        });
    }
    let mut kept = total;
    for (turn, messages, tokens) in sized {
        if kept > policy.max_history_tokens {
            kept -= tokens;
            fitted.dropped.push(turn.run);
            fitted.dropped_tokens += tokens;
        } else {
            fitted.messages.extend(messages);
        }
    }
    Ok(fitted)
}

/// Tokens of `messages`, one per 4 bytes, as the scripted provider estimates usage.
pub fn estimated_tokens(messages: &[ReplayedMessage]) -> i64 {
    let bytes: usize = messages.iter().map(ReplayedMessage::text_bytes).sum();
    bytes.div_ceil(4) as i64
}

/// Each turn's own segments among `listed` (one list of its thread's segments), up to its fixed
/// position, when they are all there; None for a turn they do not hold whole (its ledger
/// predates the thread label, or is kept elsewhere), which is read on its own. A segment is a
/// turn's only by all three of its marks (`is_segment_of`), never by the label that found it.
pub fn turns_in_listing(
    listed: Vec<LedgerSegment>,
    turns: &[HistoryTurn],
) -> Vec<Option<Vec<LedgerSegment>>> {
    let mut by_run: HashMap<(String, String), Vec<LedgerSegment>> = HashMap::new();
    for segment in listed {
        let uid = segment
            .labels()
            .get(RUN_UID_LABEL)
            .cloned()
            .unwrap_or_default();
        let key = (segment.spec.run.clone(), uid);
        by_run.entry(key).or_default().push(segment);
    }
    let mut take = |turn: &HistoryTurn| {
        let key = (turn.run.clone(), turn.uid.clone());
        let mut own: Vec<LedgerSegment> = by_run
            .remove(&key)?
            .into_iter()
            .filter(|s| s.spec.seq <= turn.up_to && is_segment_of(s, &turn.run, &turn.uid))
            .collect();
        own.sort_by_key(|s| s.spec.seq);
        let whole = own.len() as i64 == turn.up_to
            && own
                .iter()
                .enumerate()
                .all(|(i, s)| s.spec.seq == i as i64 + 1);
        whole.then_some(own)
    };
    turns.iter().map(&mut take).collect()
}

/// The conversation of one earlier turn: its ledger's segments up to `turn.up_to` (exactly
/// those, in order, all of them present), folded. Every tool call keeps a result: a call the
/// turn ended without one gets [`ENDED_WITHOUT_RESULT`].
pub fn turn_conversation(
    turn: &HistoryTurn,
    segments: &[LedgerSegment],
) -> Result<Vec<ReplayedMessage>, HistoryError> {
    let upto: Vec<LedgerSegment> = segments
        .iter()
        .filter(|s| s.spec.seq <= turn.up_to)
        .cloned()
        .collect();
    let complete = upto
        .iter()
        .enumerate()
        .all(|(i, s)| s.spec.seq == i as i64 + 1);
    if !complete || upto.len() as i64 != turn.up_to {
        return Err(HistoryError::Missing {
            run: turn.run.clone(),
            up_to: turn.up_to,
            found: upto.len() as i64,
        });
    }
    let replay =
        Replay::from_segments(&upto).map_err(|e: LedgerError| HistoryError::Unreadable {
            run: turn.run.clone(),
            detail: e.to_string(),
        })?;
    Ok(with_every_result(replay))
}

fn with_every_result(replay: Replay) -> Vec<ReplayedMessage> {
    let final_output = replay.final_output.clone();
    let mut messages = answered(replay);
    with_its_answer(&mut messages, final_output);
    messages
}

/// Closes a conversation with the turn's final answer when no assistant message says it: a
/// turn whose agent is its own container records its model calls as `gatewayCall`s and its
/// answer as `final` only, and a later turn's model must still see what it answered.
fn with_its_answer(messages: &mut Vec<ReplayedMessage>, final_output: Option<String>) {
    let Some(output) = final_output else {
        return;
    };
    let said =
        matches!(messages.last(), Some(ReplayedMessage::Assistant { text, .. }) if *text == output);
    if !said {
        messages.push(ReplayedMessage::Assistant {
            text: output,
            tool_calls: Vec::new(),
        });
    }
}

fn answered(replay: Replay) -> Vec<ReplayedMessage> {
    let mut messages = replay.messages;
    let unanswered = replay.steps.values().filter(|s| {
        matches!(
            s.state,
            StepState::Open | StepState::AwaitingApproval { .. }
        )
    });
    for step in unanswered {
        let answered = messages
            .iter()
            .any(|m| matches!(m, ReplayedMessage::ToolResult { step: s, .. } if *s == step.step));
        if !answered {
            messages.push(ReplayedMessage::ToolResult {
                step: step.step,
                call_id: step.call_id.clone(),
                tool: step.tool.clone(),
                content: ENDED_WITHOUT_RESULT.into(),
                is_error: true,
            });
        }
    }
    messages
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
