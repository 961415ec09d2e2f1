//! What a new worker does with the ledger it found (docs/protocol.md, Resume): a pure decision
//! from the replay and the spec. The I/O that carries it out lives in `carry_out`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::approval::{self, Settlement};
use crate::crd::v1alpha1::{AgentRunSpec, AgentSpec, ProbeOutcome, ToolKind, ToolSpec};
use crate::fence::{EndReason, Fence};
use crate::ledger::{Replay, ReplayedStep, StepState};

use crate::worker::toolbox::Toolbox;
use crate::worker::tools::parse_arguments;

/// What to do about one step whose effect is not recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconcile {
    pub step: i64,
    pub tool: String,
    pub input: String,
    /// The attempt (fence) that started the step.
    pub attempt: Fence,
    /// Append `stepUnknown` first (the step was open: intent without result).
    pub mark_unknown: bool,
    pub then: Then,
}

/// The follow-up after marking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// It stays unknown: the model is told, nothing is re-run.
    Nothing,
    /// The tool is idempotent: run it again.
    Rerun,
    /// The tool has a probe: ask it whether the effect landed.
    Probe,
}

/// Where the turn stands according to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// The ledger ends in `final`: go straight to `Finishing`.
    Finished { output: String },
    /// The ledger ends in `failed`.
    Failed { reason: EndReason, message: String },
    /// The ledger ends in `stopped`.
    Stopped,
    /// An `askUser` step waits and its answer is not in `spec.inputs` yet.
    /// `record`: the `waitingInput` event is not in the ledger yet (its worker died first).
    Waiting {
        step: i64,
        question: String,
        record: bool,
    },
    /// An `askUser` step waits and `spec.inputs[index]` answers it.
    Answer {
        step: i64,
        question: String,
        record: bool,
        index: i64,
        content: String,
    },
    /// A tool call waits for approval; `settlement` says what its decision (or its absence)
    /// means now.
    Approval {
        call: ApprovalCall,
        settlement: Settlement,
    },
    /// Carry on with the agent loop.
    Continue,
}

/// The call a run waits on for approval, as its ledger records it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalCall {
    pub step: i64,
    pub call_id: String,
    pub tool: String,
    pub input: String,
    pub requested_at: Time,
}

/// The whole decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePlan {
    pub reconcile: Vec<Reconcile>,
    pub standing: Standing,
}

/// Decides what to do at resume. `timed_out`: the controller claimed the run because its
/// approval wait timed out.
pub fn plan(
    replay: &Replay,
    spec: &AgentRunSpec,
    toolbox: &Toolbox,
    timed_out: bool,
) -> ResumePlan {
    if let Some(standing) = terminal_standing(replay) {
        return ResumePlan {
            reconcile: Vec::new(),
            standing,
        };
    }
    let waiting = waiting_step(replay, toolbox);
    // A step that waits for approval is not open (it never ran), so it needs no reconcile.
    let reconcile = replay
        .steps
        .values()
        .filter(|s| waiting.as_ref().is_none_or(|(step, _, _)| *step != s.step))
        .filter_map(|s| reconcile_step(s, toolbox.get(&s.tool).map(|t| &t.spec), spec.agent()))
        .collect();
    let standing = match (approval_call(replay), waiting) {
        (Some(call), _) => {
            let settlement = approval::settle(spec, call.step, &call.call_id, timed_out);
            Standing::Approval { call, settlement }
        }
        (None, None) => Standing::Continue,
        (None, Some((step, question, record))) => {
            answer_standing(replay, spec, step, question, record)
        }
    };
    ResumePlan {
        reconcile,
        standing,
    }
}

/// An `askUser` step waits: answered by the next unconsumed `spec.inputs` entry, if any.
fn answer_standing(
    replay: &Replay,
    spec: &AgentRunSpec,
    step: i64,
    question: String,
    record: bool,
) -> Standing {
    let index = replay.inputs_consumed;
    match spec.inputs.get(index as usize) {
        Some(content) => Standing::Answer {
            step,
            question,
            record,
            index,
            content: content.clone(),
        },
        None => Standing::Waiting {
            step,
            question,
            record,
        },
    }
}

fn terminal_standing(replay: &Replay) -> Option<Standing> {
    if let Some(output) = &replay.final_output {
        return Some(Standing::Finished {
            output: output.clone(),
        });
    }
    if let Some((reason, message)) = &replay.failure {
        return Some(Standing::Failed {
            reason: reason.clone(),
            message: message.clone(),
        });
    }
    replay.stopped.then_some(Standing::Stopped)
}

/// The `askUser` step the turn waits on: recorded as waiting, or an open `askUser` step whose
/// worker died before recording the wait (asking again has no effect outside the ledger).
fn waiting_step(replay: &Replay, toolbox: &Toolbox) -> Option<(i64, String, bool)> {
    if let Some((step, question)) = &replay.waiting {
        return Some((*step, question.clone(), false));
    }
    replay
        .steps
        .values()
        .filter(|s| s.state == StepState::Open)
        .find(|s| {
            toolbox
                .get(&s.tool)
                .is_some_and(|t| t.spec.kind == ToolKind::AskUser)
        })
        .map(|s| (s.step, question_of(&s.input), true))
}

fn approval_call(replay: &Replay) -> Option<ApprovalCall> {
    let step = replay.awaiting_approval()?;
    let StepState::AwaitingApproval { requested_at } = &step.state else {
        return None;
    };
    Some(ApprovalCall {
        step: step.step,
        call_id: step.call_id.clone(),
        tool: step.tool.clone(),
        input: step.input.clone(),
        requested_at: requested_at.clone(),
    })
}

/// The `question` argument of an askUser call.
pub fn question_of(input: &str) -> String {
    parse_arguments(input)
        .ok()
        .and_then(|a| a.get("question").cloned())
        .unwrap_or_default()
}

/// The action for one step, if it needs any. The probe is the tool's current one.
fn reconcile_step(
    step: &ReplayedStep,
    tool: Option<&ToolSpec>,
    agent: Option<&AgentSpec>,
) -> Option<Reconcile> {
    let has_probe = tool.is_some_and(|t| t.probe.is_some());
    let can_rerun = tool.is_some_and(|t| may_rerun(step, t, agent));
    let (mark_unknown, then) = match &step.state {
        StepState::Open if can_rerun => (true, Then::Rerun),
        StepState::Open if has_probe => (true, Then::Probe),
        StepState::Open => (true, Then::Nothing),
        // A resume that marked it died before finishing the follow-up: do it again.
        StepState::Unknown { probe: None } if can_rerun => (false, Then::Rerun),
        StepState::Unknown { probe: None } if has_probe => (false, Then::Probe),
        // Probed "not applied", then the re-run's worker died: probe again.
        StepState::Unknown {
            probe: Some(ProbeOutcome::NotApplied),
        } if has_probe => (false, Then::Probe),
        _ => return None,
    };
    Some(Reconcile {
        step: step.step,
        tool: step.tool.clone(),
        input: step.input.clone(),
        attempt: step.attempt,
        mark_unknown,
        then,
    })
}

/// Whether a step whose effect is unknown may run again. Its intent must have recorded it
/// idempotent when it ran, and the run's own spec must say so now (an intent is data: anyone
/// who could create a segment could have written one). A tool that waits for approval must
/// also have been approved for this very step, so that no re-run passes its gate.
fn may_rerun(step: &ReplayedStep, tool: &ToolSpec, agent: Option<&AgentSpec>) -> bool {
    step.idempotent && tool.idempotent && (step.approved || !approval::required(agent, tool))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
