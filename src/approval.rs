//! Approvals, their rules in one place (docs/protocol.md, Approvals): which tool calls wait
//! for a human, which decision answers a waiting call, when a wait times out, and what the
//! model is told. Pure; the worker, the controller and the CLI all decide through it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::crd::v1alpha1::{
    AgentRun, AgentRunSpec, AgentSpec, ApprovalDecision, ApprovalOutcome, ApprovalPolicy,
    LedgerEvent, LedgerSegment, PendingApproval, Phase, ToolKind, ToolSpec, Verdict,
};
use crate::fence::Fence;

/// The claim reason (in the run's status) of a claim made because a wait timed out: the
/// worker it starts denies the call by default.
pub const TIMED_OUT: &str = "ApprovalTimedOut";

/// True when the controller claimed `run` for `fence` because its wait timed out (the status
/// of the claim says so; the worker reads the run after the claim).
pub fn claimed_for_timeout(run: &AgentRun, fence: Fence) -> bool {
    run.status.as_ref().is_some_and(|s| {
        crate::fence::status_names(s.fence, fence) && s.reason.as_deref() == Some(TIMED_OUT)
    })
}

/// Longest `arguments` kept in `status.pendingApproval` (the ledger holds all of them).
const ARGUMENTS_SHOWN: usize = 4096;

/// True when calls of `tool` wait for a decision before they run. `askUser` never does: it
/// is a human gate already.
pub fn required(agent: Option<&AgentSpec>, tool: &ToolSpec) -> bool {
    tool.kind != ToolKind::AskUser
        && tool
            .approval
            .or(agent.and_then(|a| a.approval))
            .unwrap_or_default()
            == ApprovalPolicy::Required
}

/// The decision in the spec for the call `call_id` at `step`, if any. The first one wins: a
/// second decision for the same call is never applied.
pub fn decision_for<'a>(
    spec: &'a AgentRunSpec,
    step: i64,
    call_id: &str,
) -> Option<&'a ApprovalDecision> {
    spec.approvals
        .iter()
        .find(|d| d.step == step && d.call_id == call_id)
}

/// When a call recorded at `requested_at` is denied by default (None: it waits forever).
pub fn deadline(spec: &AgentRunSpec, requested_at: &Time) -> Option<Timestamp> {
    let seconds = spec.approval_timeout_seconds?;
    requested_at
        .0
        .checked_add(SignedDuration::from_secs(seconds))
        .ok()
}

/// The waiting call as status shows it.
pub fn pending(
    step: i64,
    call_id: &str,
    tool: &str,
    arguments: &str,
    requested_at: Time,
) -> PendingApproval {
    PendingApproval {
        step,
        call_id: call_id.into(),
        tool: tool.into(),
        arguments: cut(arguments, ARGUMENTS_SHOWN),
        requested_at,
    }
}

/// The note of the `ApprovalRequested` Event: what waits, and how to decide it.
pub fn announcement(run: &str, p: &PendingApproval) -> String {
    format!(
        "step {step} ({tool}) waits for approval: `baton approve {run} --step {step}` or `baton deny {run} --step {step} --reason TEXT`; arguments: {args}",
        step = p.step,
        tool = p.tool,
        args = cut(&p.arguments, 300),
    )
}

fn cut(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    format!("{}…", &text[..crate::cut::char_floor(text, max_bytes)])
}

/// What the worker does about a waiting call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// No decision yet: wait again.
    Wait,
    /// Approved: record that, then run the call.
    Run { reason: String },
    /// Denied (by a human or by the timeout): record that with the call's result, never run.
    Skip {
        outcome: ApprovalOutcome,
        reason: String,
    },
}

/// Settles the call `call_id` at `step`: a human's decision wins over the timeout, which
/// applies only when the controller claimed the run because the wait timed out (its clock
/// decides, not the worker's).
pub fn settle(spec: &AgentRunSpec, step: i64, call_id: &str, timed_out: bool) -> Settlement {
    match decision_for(spec, step, call_id) {
        Some(d) if d.decision == Verdict::Approve => Settlement::Run {
            reason: d.reason.clone().unwrap_or_default(),
        },
        Some(d) => Settlement::Skip {
            outcome: ApprovalOutcome::Denied,
            reason: d.reason.clone().unwrap_or_default(),
        },
        None if timed_out => Settlement::Skip {
            outcome: ApprovalOutcome::TimedOut,
            reason: format!(
                "no decision within approvalTimeoutSeconds ({}s)",
                spec.approval_timeout_seconds.unwrap_or_default()
            ),
        },
        None => Settlement::Wait,
    }
}

/// The result the model gets for a call that was not run.
pub fn skipped_result(outcome: ApprovalOutcome, reason: &str) -> String {
    let who = match outcome {
        ApprovalOutcome::TimedOut => "nobody decided in time, so it was denied by default",
        _ => "a human denied it",
    };
    let why = if reason.is_empty() {
        String::new()
    } else {
        format!(" Reason: {reason}")
    };
    format!("This call was NOT run: {who}.{why}")
}

/// Why a decision cannot be recorded for a run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    #[error("run {run} is not waiting for approval (phase {phase})")]
    NotWaiting { run: String, phase: Phase },
    #[error(
        "step {asked} of run {run} is not waiting for approval; step {pending} ({tool}) is: decide that one, or leave out --step"
    )]
    OtherStep {
        run: String,
        asked: i64,
        pending: i64,
        tool: String,
    },
    #[error("step {step} of run {run} already has a decision in spec.approvals ({verdict:?})")]
    AlreadyDecided {
        run: String,
        step: i64,
        verdict: Verdict,
    },
}

/// The decision to append to `spec.approvals` for the call `run` waits on, checked against
/// what the run shows now (`step`: the one the person means, if they said).
pub fn decision(
    run: &AgentRun,
    step: Option<i64>,
    verdict: Verdict,
    reason: Option<String>,
) -> Result<ApprovalDecision, DecisionError> {
    let name = kube::ResourceExt::name_any(run);
    let status = run.status.clone().unwrap_or_default();
    let pending = match status.pending_approval {
        Some(p) if status.phase == Phase::WaitingApproval => p,
        _ => {
            return Err(DecisionError::NotWaiting {
                run: name,
                phase: status.phase,
            });
        }
    };
    if let Some(asked) = step.filter(|s| *s != pending.step) {
        return Err(DecisionError::OtherStep {
            run: name,
            asked,
            pending: pending.step,
            tool: pending.tool,
        });
    }
    if let Some(d) = decision_for(&run.spec, pending.step, &pending.call_id) {
        return Err(DecisionError::AlreadyDecided {
            run: name,
            step: pending.step,
            verdict: d.decision,
        });
    }
    Ok(ApprovalDecision {
        step: pending.step,
        call_id: pending.call_id,
        decision: verdict,
        reason,
    })
}

/// The call a decision is about, as the ledger records it (its `stepIntent`): the tool and
/// the whole arguments, which is what runs if it is approved (the status shows them cut at
/// 4 KiB). None when the ledger does not hold it.
pub fn recorded_call<'a>(
    segments: &'a [LedgerSegment],
    decision: &ApprovalDecision,
) -> Option<(&'a str, &'a str)> {
    segments
        .iter()
        .flat_map(|s| &s.spec.events)
        .find_map(|e| match e {
            LedgerEvent::StepIntent {
                step,
                tool,
                call_id,
                input,
                ..
            } if *step == decision.step && *call_id == decision.call_id => {
                Some((tool.as_str(), input.as_str()))
            }
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::AgentRunStatus;

    #[test]
    fn the_call_to_approve_is_read_whole_from_the_ledger() {
        let intent = |step, call_id: &str, input: &str| LedgerEvent::StepIntent {
            step,
            tool: "deploy".into(),
            call_id: call_id.into(),
            input: input.into(),
            idempotent: false,
        };
        let long = format!("{}; rm -rf /important", " ".repeat(5000));
        let ledger = [
            crate::fence::test_segment(1, 1, vec![intent(3, "c3", "other step")]),
            crate::fence::test_segment(2, 1, vec![intent(4, "c9", "other call")]),
            crate::fence::test_segment(3, 2, vec![intent(4, "c4", &long)]),
        ];
        let decided = |step, call_id: &str| ApprovalDecision {
            step,
            call_id: call_id.into(),
            decision: Verdict::Approve,
            reason: None,
        };
        assert_eq!(
            recorded_call(&ledger, &decided(4, "c4")),
            Some(("deploy", long.as_str()))
        );
        assert_eq!(recorded_call(&ledger, &decided(5, "c5")), None);
    }

    fn tool(kind: ToolKind, approval: Option<ApprovalPolicy>) -> ToolSpec {
        let mut t: ToolSpec = serde_json::from_value(serde_json::json!({
            "name": "t", "kind": "shell"
        }))
        .unwrap();
        t.kind = kind;
        t.approval = approval;
        t
    }

    fn waiting(decisions: Vec<ApprovalDecision>) -> AgentRun {
        let mut run = AgentRun::builder("r").build();
        run.spec.approvals = decisions;
        run.spec.approval_timeout_seconds = Some(60);
        run.status = Some(AgentRunStatus {
            phase: Phase::WaitingApproval,
            pending_approval: Some(pending(
                3,
                "c3",
                "deploy",
                "{}",
                Time(Timestamp::from_second(1000).unwrap()),
            )),
            ..Default::default()
        });
        run
    }

    fn said(step: i64, call_id: &str, decision: Verdict) -> ApprovalDecision {
        ApprovalDecision {
            step,
            call_id: call_id.into(),
            decision,
            reason: Some("because".into()),
        }
    }

    #[test]
    fn a_tools_own_policy_wins_over_the_runs_and_ask_user_never_waits() {
        let mut agent = AgentSpec::default();
        assert!(!required(Some(&agent), &tool(ToolKind::Shell, None)));
        agent.approval = Some(ApprovalPolicy::Required);
        assert!(required(Some(&agent), &tool(ToolKind::Shell, None)));
        assert!(!required(
            Some(&agent),
            &tool(ToolKind::Shell, Some(ApprovalPolicy::NotRequired))
        ));
        assert!(!required(Some(&agent), &tool(ToolKind::AskUser, None)));
        agent.approval = None;
        assert!(required(
            Some(&agent),
            &tool(ToolKind::Http, Some(ApprovalPolicy::Required))
        ));
    }

    #[test]
    fn a_decision_matches_its_step_and_call_only_and_the_first_wins() {
        let run = waiting(vec![
            said(3, "other-call", Verdict::Approve),
            said(2, "c3", Verdict::Approve),
            said(3, "c3", Verdict::Deny),
            said(3, "c3", Verdict::Approve),
        ]);
        assert_eq!(
            settle(&run.spec, 3, "c3", false),
            Settlement::Skip {
                outcome: ApprovalOutcome::Denied,
                reason: "because".into()
            }
        );
        assert_eq!(settle(&run.spec, 4, "c4", false), Settlement::Wait);
    }

    #[test]
    fn a_timeout_denies_only_without_a_decision() {
        let run = waiting(vec![]);
        assert!(matches!(
            settle(&run.spec, 3, "c3", true),
            Settlement::Skip { outcome: ApprovalOutcome::TimedOut, ref reason } if reason.contains("60s")
        ));
        let run = waiting(vec![said(3, "c3", Verdict::Approve)]);
        assert!(matches!(
            settle(&run.spec, 3, "c3", true),
            Settlement::Run { .. }
        ));
    }

    #[test]
    fn the_deadline_counts_from_the_request() {
        let run = waiting(vec![]);
        let at = Time(Timestamp::from_second(1000).unwrap());
        assert_eq!(
            deadline(&run.spec, &at),
            Some(Timestamp::from_second(1060).unwrap())
        );
        let mut spec = run.spec.clone();
        spec.approval_timeout_seconds = None;
        assert_eq!(deadline(&spec, &at), None);
    }

    #[test]
    fn a_decision_is_refused_for_another_step_twice_or_when_nothing_waits() {
        let run = waiting(vec![]);
        let d = decision(&run, None, Verdict::Approve, None).unwrap();
        assert_eq!((d.step, d.call_id.as_str()), (3, "c3"));
        assert!(decision(&run, Some(3), Verdict::Deny, None).is_ok());
        let err = decision(&run, Some(2), Verdict::Approve, None).unwrap_err();
        assert!(
            err.to_string().contains("step 2 of run r is not waiting"),
            "{err}"
        );
        assert!(err.to_string().contains("step 3 (deploy) is"), "{err}");
        let decided = waiting(vec![said(3, "c3", Verdict::Approve)]);
        assert!(matches!(
            decision(&decided, None, Verdict::Deny, None),
            Err(DecisionError::AlreadyDecided { step: 3, .. })
        ));
        let mut moved_on = waiting(vec![]);
        moved_on.status.as_mut().unwrap().phase = Phase::Running;
        assert!(matches!(
            decision(&moved_on, Some(3), Verdict::Approve, None),
            Err(DecisionError::NotWaiting {
                phase: Phase::Running,
                ..
            })
        ));
    }

    #[test]
    fn long_arguments_are_cut_on_a_char_boundary() {
        let args = "é".repeat(3000);
        let p = pending(1, "c", "t", &args, Time(Timestamp::UNIX_EPOCH));
        assert!(p.arguments.len() <= ARGUMENTS_SHOWN + '…'.len_utf8());
        assert!(p.arguments.ends_with('…'));
    }

    #[test]
    fn the_model_is_told_who_denied_and_why() {
        let text = skipped_result(ApprovalOutcome::Denied, "too risky");
        assert!(text.contains("NOT run") && text.contains("too risky"));
        assert!(skipped_result(ApprovalOutcome::TimedOut, "").contains("by default"));
    }
}
