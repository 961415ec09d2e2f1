//! Tests of `worker/resume.rs`.
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
        Fence::new(1),
        &LedgerEvent::Message {
            role: Role::User,
            content: "go".into(),
        },
    );
    for e in events {
        r.apply(Fence::new(1), e);
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
    assert_eq!(p.reconcile[0].attempt, Fence::new(1));
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
    for t in &mut gated.agent_mut().tools {
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
            attempt: Fence::new(1),
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
            attempt: Fence::new(1),
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
