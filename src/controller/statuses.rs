//! The statuses the controller writes (pure): each is the whole status for one CAS.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::decide::{Claim, ClaimReason, Close, CloseReason, WorkspaceCondition};
use super::validate::INVALID_SPEC;
use crate::crd::INTERRUPTED_BY_ANNOTATION;
use crate::crd::v1alpha1::Resolution;
use crate::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerStats, Phase, UnknownEffect};
use crate::fence::Fence;
use crate::ledger::Replay;
use crate::status::{condition, set_condition};

/// Longest summary of a step kept in `unknownEffects`.
const SUMMARY_CHARS: usize = 120;

fn base(run: &AgentRun) -> (AgentRunStatus, Option<i64>) {
    (
        run.status.clone().unwrap_or_default(),
        run.metadata.generation,
    )
}

/// The status of a claim for `fence` (docs/protocol.md): Running, the new fence and pod.
pub fn claimed(run: &AgentRun, claim: Claim, fence: Fence, pod: &str) -> AgentRunStatus {
    let (mut s, generation) = base(run);
    s.phase = Phase::Running;
    s.fence = fence;
    s.attempt = fence.get();
    s.failed_attempts += i32::from(claim.failed);
    s.worker = Some(pod.into());
    // A waiting call is decided (or its wait timed out) by the worker this claim starts: it
    // is not waiting any more, and a decision given now would come too late.
    s.pending_approval = None;
    s.start_time.get_or_insert_with(|| Time(Timestamp::now()));
    s.observed_generation = generation;
    s.reason = Some(claim.reason.as_str().into());
    s.message = Some(format!("attempt {fence} claimed for pod {pod}"));
    let c = &mut s.conditions;
    set_condition(
        c,
        condition::ADMITTED,
        true,
        "Admitted",
        "the run was admitted",
        generation,
    );
    let held = format!("lease moved to {pod} at fence {fence}");
    set_condition(c, condition::LEASE_HELD, true, "Claimed", &held, generation);
    if claim.reason != ClaimReason::Start {
        let why = format!("resumed at attempt {fence} after {}", claim.reason.as_str());
        set_condition(
            c,
            condition::RESUMED,
            true,
            claim.reason.as_str(),
            &why,
            generation,
        );
    }
    s
}

/// Segments that claim the run without being its own, as a condition on the claim's status
/// (set when a claim that lists the ledger meets them; it stays as the record that they were
/// seen). Nothing when there are none.
pub fn note_claimants(s: &mut AgentRunStatus, claimants: &[String]) {
    if claimants.is_empty() {
        return;
    }
    let note = super::ledger_end::claimants_note(claimants);
    let generation = s.observed_generation;
    let (c, reason) = (&mut s.conditions, super::ledger_end::FOREIGN_SEGMENT);
    set_condition(
        c,
        condition::FOREIGN_SEGMENTS,
        true,
        reason,
        &note,
        generation,
    );
}

/// The status of a terminal claim: the terminal phase at `fence`, the salvage up to the seal.
pub fn closed(run: &AgentRun, close: &Close, fence: Fence, replay: &Replay) -> AgentRunStatus {
    let (mut s, generation) = base(run);
    s.usage = Some(replay.usage.clone());
    s.fence = fence;
    s.attempt = fence.get();
    s.failed_attempts += i32::from(close.failed);
    s.worker = None;
    let salvage = replay.salvage();
    crate::status::set_output(&mut s, (!salvage.is_empty()).then_some(salvage));
    s.output_partial = replay.final_output.is_none();
    s.steps = s.steps.max(replay.last_step());
    record_unknown(&mut s, replay);
    s.ledger = Some(LedgerStats {
        segments: replay.tail,
        events: replay.events,
        bytes: s.ledger.as_ref().map_or(0, |l| l.bytes),
    });
    terminal(
        &mut s,
        close.phase(),
        close.reason.as_str(),
        &close.message,
        generation,
    );
    s
}

fn record_unknown(s: &mut AgentRunStatus, replay: &Replay) {
    for step in replay.unknown_steps() {
        if s.unknown_effects.iter().any(|u| u.step == step.step) {
            continue;
        }
        let summary: String = format!("{} {}", step.tool, step.input)
            .chars()
            .take(SUMMARY_CHARS)
            .collect();
        s.unknown_effects.push(UnknownEffect {
            step: step.step,
            tool: step.tool.clone(),
            attempt: step.attempt,
            resolution: Resolution::Unknown,
            summary,
        });
    }
    s.unknown_effect_count = s.unknown_effects.len() as i64;
}

/// `Finishing` → its outcome (Succeeded, Failed, Stopped or Interrupted).
pub fn finished(run: &AgentRun) -> AgentRunStatus {
    let (mut s, generation) = base(run);
    let phase = s
        .outcome
        .filter(|p| p.is_terminal())
        .unwrap_or(Phase::Failed);
    let mut reason = s.reason.clone().unwrap_or_else(|| phase.to_string());
    let mut message = s
        .message
        .clone()
        .unwrap_or_else(|| format!("the run {phase}"));
    if let Some(by) = run.annotations().get(INTERRUPTED_BY_ANNOTATION)
        && phase == Phase::Stopped
    {
        reason = CloseReason::Interrupted.to_string();
        message = format!("stopped for turn {by} of its thread (onBusy: Interrupt)");
    }
    terminal(&mut s, phase, &reason, &message, generation);
    s
}

/// A spec that breaks a rule the schema cannot express.
pub fn rejected(run: &AgentRun, message: &str) -> AgentRunStatus {
    let (mut s, generation) = base(run);
    terminal(&mut s, Phase::Failed, INVALID_SPEC, message, generation);
    let c = &mut s.conditions;
    set_condition(
        c,
        condition::ADMITTED,
        false,
        INVALID_SPEC,
        message,
        generation,
    );
    s
}

/// Pending behind another run of the thread.
pub fn queued(run: &AgentRun, holder: &str) -> AgentRunStatus {
    let (mut s, generation) = base(run);
    let key = run.spec.admission_key().unwrap_or_default().to_string();
    let message = format!("thread {key} is held by run {holder}");
    s.observed_generation = generation;
    s.reason = Some("ThreadBusy".into());
    s.message = Some(message.clone());
    set_condition(
        &mut s.conditions,
        condition::ADMITTED,
        false,
        "ThreadBusy",
        &message,
        generation,
    );
    s
}

/// The `WorkspaceReady` condition as the pod shows it; nothing else changes.
pub fn workspace(run: &AgentRun, condition: &WorkspaceCondition) -> AgentRunStatus {
    let (mut s, generation) = base(run);
    set_condition(
        &mut s.conditions,
        condition::WORKSPACE_READY,
        condition.ready,
        condition.reason,
        &condition.message,
        generation,
    );
    s
}

fn terminal(
    s: &mut AgentRunStatus,
    phase: Phase,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    s.phase = phase;
    s.pending_approval = None;
    s.reason = Some(reason.into());
    s.message = Some(message.into());
    s.completion_time = Some(Time(Timestamp::now()));
    s.observed_generation = generation;
    let c = &mut s.conditions;
    set_condition(c, condition::COMPLETE, true, reason, message, generation);
    let succeeded = phase == Phase::Succeeded;
    set_condition(
        c,
        condition::SUCCEEDED,
        succeeded,
        reason,
        message,
        generation,
    );
    set_condition(
        c,
        condition::LEASE_HELD,
        false,
        "Released",
        "the run is finished",
        generation,
    );
}

/// The run's display name for logs: `namespace/name`.
pub fn run_name(run: &AgentRun) -> String {
    format!("{}/{}", run.id().namespace, run.name_any())
}
