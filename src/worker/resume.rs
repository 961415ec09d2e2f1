//! What a new worker does with the ledger it found (docs/protocol.md, Resume): a pure decision
//! from the replay and the spec. The I/O that carries it out lives in `reconcile`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::approval::{self, Settlement};
use crate::crd::v1alpha1::{AgentRunSpec, AgentSpec, ProbeOutcome, ToolKind, ToolSpec};
use crate::ledger::{Replay, ReplayedStep, StepState};

use super::toolbox::Toolbox;
use super::tools::parse_arguments;

/// What to do about one step whose effect is not recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconcile {
    pub step: i64,
    pub tool: String,
    pub input: String,
    /// The attempt (fence) that started the step.
    pub attempt: i64,
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
    Failed { reason: String, message: String },
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
        .filter_map(|s| reconcile_step(s, toolbox.get(&s.tool).map(|t| &t.spec), &spec.agent))
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
    agent: &AgentSpec,
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
fn may_rerun(step: &ReplayedStep, tool: &ToolSpec, agent: &AgentSpec) -> bool {
    step.idempotent && tool.idempotent && (step.approved || !approval::required(agent, tool))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::{AgentRun, LedgerEvent, ProbeSpec, Role, ToolKind, ToolSpec};

    fn tool(name: &str, kind: ToolKind, idempotent: bool, probe: bool) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            kind,
            description: None,
            idempotent,
            timeout_seconds: 60,
            probe: probe.then(|| ProbeSpec {
                command: "true".into(),
                timeout_seconds: 5,
            }),
            approval: None,
            mcp: None,
        }
    }

    fn spec(inputs: Vec<&str>) -> AgentRunSpec {
        AgentRun::builder("r")
            .input("go")
            .inputs(&inputs)
            .tools(vec![
                tool("sh", ToolKind::Shell, false, false),
                tool("idem", ToolKind::Shell, true, false),
                tool("probed", ToolKind::Shell, false, true),
                tool("ask", ToolKind::AskUser, false, false),
            ])
            .spec()
    }

    fn intent(step: i64, tool: &str, idempotent: bool) -> LedgerEvent {
        LedgerEvent::StepIntent {
            step,
            tool: tool.into(),
            call_id: format!("c{step}"),
            input: r#"{"question":"why?"}"#.into(),
            idempotent,
        }
    }

    fn replay(events: &[LedgerEvent]) -> Replay {
        let mut r = Replay::default();
        r.apply(
            1,
            &LedgerEvent::Message {
                role: Role::User,
                content: "go".into(),
            },
        );
        for e in events {
            r.apply(1, e);
        }
        r
    }

    fn plan_now(replay: &Replay, spec: &AgentRunSpec) -> ResumePlan {
        plan_with(replay, spec, false)
    }

    fn plan_with(replay: &Replay, spec: &AgentRunSpec, timed_out: bool) -> ResumePlan {
        let toolbox = Toolbox::new(spec, &replay.mcp_tools);
        plan(replay, spec, &toolbox, timed_out)
    }

    fn result(step: i64) -> LedgerEvent {
        LedgerEvent::StepResult {
            step,
            output: "ok".into(),
            is_error: false,
        }
    }

    #[test]
    fn an_open_non_idempotent_step_is_marked_unknown_and_not_rerun() {
        let p = plan_now(&replay(&[intent(1, "sh", false)]), &spec(vec![]));
        assert_eq!(p.standing, Standing::Continue);
        assert_eq!(p.reconcile.len(), 1);
        assert!(p.reconcile[0].mark_unknown);
        assert_eq!(p.reconcile[0].then, Then::Nothing);
        assert_eq!(p.reconcile[0].attempt, 1);
    }

    #[test]
    fn an_open_idempotent_step_is_marked_then_rerun() {
        let p = plan_now(&replay(&[intent(1, "idem", true)]), &spec(vec![]));
        assert_eq!(
            (p.reconcile[0].mark_unknown, p.reconcile[0].then),
            (true, Then::Rerun)
        );
    }

    /// An intent is data: one that claims `idempotent` for a tool the run's spec does not
    /// declare idempotent is not run again.
    #[test]
    fn an_intent_that_claims_idempotent_for_a_tool_the_spec_does_not_is_not_rerun() {
        let p = plan_now(&replay(&[intent(1, "sh", true)]), &spec(vec![]));
        assert_eq!(
            (p.reconcile[0].mark_unknown, p.reconcile[0].then),
            (true, Then::Nothing)
        );
    }

    /// An idempotent tool that waits for approval runs again only if this very call was
    /// approved: an open intent that never waited does not pass the gate by a re-run.
    #[test]
    fn a_tool_that_waits_for_approval_is_rerun_only_after_its_approval() {
        let mut gated = spec(vec![]);
        for t in &mut gated.agent.tools {
            if t.name == "idem" {
                t.approval = Some(crate::crd::v1alpha1::ApprovalPolicy::Required);
            }
        }
        let never_waited = plan_now(&replay(&[intent(1, "idem", true)]), &gated);
        assert_eq!(never_waited.reconcile[0].then, Then::Nothing);
        let approved = replay(&[
            intent(1, "idem", true),
            LedgerEvent::ApprovalRequested {
                step: 1,
                call_id: "c1".into(),
                requested_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            },
            LedgerEvent::ApprovalDecided {
                step: 1,
                outcome: crate::crd::v1alpha1::ApprovalOutcome::Approved,
                reason: String::new(),
            },
        ]);
        assert_eq!(plan_now(&approved, &gated).reconcile[0].then, Then::Rerun);
    }

    #[test]
    fn an_open_step_with_a_probe_is_probed() {
        let p = plan_now(&replay(&[intent(1, "probed", false)]), &spec(vec![]));
        assert_eq!(
            (p.reconcile[0].mark_unknown, p.reconcile[0].then),
            (true, Then::Probe)
        );
    }

    #[test]
    fn finished_steps_need_nothing_and_unknown_ones_stay_unknown() {
        let events = [
            intent(1, "sh", false),
            result(1),
            intent(2, "sh", false),
            LedgerEvent::StepUnknown {
                step: 2,
                attempt: 1,
            },
        ];
        assert!(
            plan_now(&replay(&events), &spec(vec![]))
                .reconcile
                .is_empty()
        );
    }

    #[test]
    fn a_probe_that_found_not_applied_is_asked_again_after_a_death() {
        let events = [
            intent(1, "probed", false),
            LedgerEvent::StepUnknown {
                step: 1,
                attempt: 1,
            },
            LedgerEvent::StepProbed {
                step: 1,
                outcome: ProbeOutcome::NotApplied,
            },
        ];
        let p = plan_now(&replay(&events), &spec(vec![]));
        assert_eq!(
            (p.reconcile[0].mark_unknown, p.reconcile[0].then),
            (false, Then::Probe)
        );
    }

    #[test]
    fn a_final_ledger_goes_straight_to_finishing() {
        let events = [LedgerEvent::Final {
            output: "42".into(),
        }];
        let p = plan_now(&replay(&events), &spec(vec![]));
        assert_eq!(
            p.standing,
            Standing::Finished {
                output: "42".into()
            }
        );
    }

    #[test]
    fn a_wait_without_an_answer_waits_again() {
        let events = [
            intent(1, "ask", true),
            LedgerEvent::WaitingInput {
                step: 1,
                question: "why?".into(),
            },
        ];
        let p = plan_now(&replay(&events), &spec(vec![]));
        assert_eq!(
            p.standing,
            Standing::Waiting {
                step: 1,
                question: "why?".into(),
                record: false
            }
        );
        assert!(
            p.reconcile.is_empty(),
            "the waiting step is not an unknown effect"
        );
    }

    #[test]
    fn a_wait_with_an_answer_consumes_it() {
        let events = [
            intent(1, "ask", true),
            LedgerEvent::WaitingInput {
                step: 1,
                question: "why?".into(),
            },
        ];
        let p = plan_now(&replay(&events), &spec(vec!["because"]));
        assert!(matches!(
            p.standing,
            Standing::Answer { step: 1, index: 0, ref content, record: false, .. } if content == "because"
        ));
    }

    #[test]
    fn an_ask_whose_worker_died_before_the_wait_asks_again() {
        let p = plan_now(&replay(&[intent(1, "ask", true)]), &spec(vec![]));
        assert_eq!(
            p.standing,
            Standing::Waiting {
                step: 1,
                question: "why?".into(),
                record: true
            }
        );
        assert!(p.reconcile.is_empty());
    }

    #[test]
    fn an_answer_reaches_the_model_as_the_ask_steps_result() {
        let events = [
            intent(1, "ask", true),
            LedgerEvent::WaitingInput {
                step: 1,
                question: "why?".into(),
            },
            LedgerEvent::Input {
                index: 0,
                content: "because".into(),
            },
            LedgerEvent::StepResult {
                step: 1,
                output: "because".into(),
                is_error: false,
            },
        ];
        let r = replay(&events);
        assert_eq!(r.messages.len(), 3, "{:?}", r.messages);
        assert!(
            matches!(&r.messages[2], crate::ledger::ReplayedMessage::ToolResult { content, .. } if content == "because")
        );
        assert_eq!(r.inputs_consumed, 1);
        assert_eq!(
            plan_now(&r, &spec(vec!["because"])).standing,
            Standing::Continue
        );
    }

    fn waiting_for_approval() -> Replay {
        replay(&[
            intent(1, "sh", false),
            result(1),
            intent(2, "sh", false),
            LedgerEvent::ApprovalRequested {
                step: 2,
                call_id: "c2".into(),
                requested_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            },
        ])
    }

    #[test]
    fn a_call_that_waits_for_approval_is_settled_not_reconciled() {
        let r = waiting_for_approval();
        let p = plan_with(&r, &spec(vec![]), false);
        assert!(p.reconcile.is_empty(), "it never ran: nothing to reconcile");
        assert!(matches!(
            p.standing,
            Standing::Approval { ref call, settlement: Settlement::Wait } if call.step == 2 && call.call_id == "c2"
        ));
        let mut decided = spec(vec![]);
        decided
            .approvals
            .push(crate::crd::v1alpha1::ApprovalDecision {
                step: 2,
                call_id: "c2".into(),
                decision: crate::crd::v1alpha1::Verdict::Approve,
                reason: None,
            });
        assert!(matches!(
            plan_with(&r, &decided, false).standing,
            Standing::Approval {
                settlement: Settlement::Run { .. },
                ..
            }
        ));
        assert!(matches!(
            plan_with(&r, &spec(vec![]), true).standing,
            Standing::Approval {
                settlement: Settlement::Skip {
                    outcome: crate::crd::v1alpha1::ApprovalOutcome::TimedOut,
                    ..
                },
                ..
            }
        ));
    }
}
