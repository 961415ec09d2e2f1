//! Carrying out the resume plan: the first append (`attemptStarted`, then a `stepUnknown` for
//! every open step, in the same segment), then probes and idempotent re-runs, each reported
//! in `status.unknownEffects` and as a Warning Event; then the ledger's standing.

use tokio_util::sync::CancellationToken;

use super::plan::{ApprovalCall, Reconcile, ResumePlan, Standing, Then};
use crate::approval::{self, Settlement};
use crate::crd::v1alpha1::{
    ApprovalOutcome, LedgerEvent, ProbeOutcome, Resolution, Role, UnknownEffect,
};
use crate::worker::agent::{ToolRun, execute, result, run_tool, summary};
use crate::worker::finish::Ending;
use crate::worker::session::Session;
use crate::worker::spans;
use crate::worker::tools::{ToolOutput, probe};

/// What a probe that confirmed the effect puts in the step's result.
const APPLIED_BY_PROBE: &str = "effect confirmed applied by probe; not re-run";

/// Where resume leaves the attempt: an ending (and whether its event must still be
/// appended), or on into the agent loop.
pub enum Resumed {
    End { ending: Ending, record: bool },
    Continue,
}

/// Carries out `plan`.
pub async fn resume(s: &mut Session, plan: ResumePlan) -> Resumed {
    let mut first = vec![LedgerEvent::AttemptStarted {
        fence: s.fence(),
        pod: s.me.cfg.pod.clone(),
    }];
    // The earlier turns a turn's model is not sent: recorded once, by the first attempt.
    if let Ok(fitted) = &s.me.history
        && !fitted.dropped.is_empty()
        && !s.turn.replay.history_dropped
    {
        first.push(LedgerEvent::HistoryDropped {
            turns: fitted.dropped.clone(),
            tokens: fitted.dropped_tokens,
        });
    }
    // The user's input opens the conversation: recorded once, by the first attempt's first
    // append (a ledger with any message already holds it, or predates this record).
    if s.turn.replay.messages.is_empty() {
        first.push(LedgerEvent::Message {
            role: Role::User,
            content: s.spec().input.clone(),
        });
    }
    first.extend(plan.reconcile.iter().filter(|r| r.mark_unknown).map(|r| {
        LedgerEvent::StepUnknown {
            step: r.step,
            attempt: r.attempt,
        }
    }));
    if let Err(err) = s.append(first).await {
        return end(Ending::refused(err), false);
    }
    // This attempt holds the run: the killed attempts' spans are its to write.
    spans::killed_attempts(&s.me.trace, s.fence(), &s.turn.replay, &plan.reconcile);
    if let Some(ending) = history_lost(s, &plan.standing) {
        return end(ending, true);
    }
    if uses_tools(&plan)
        && let Err(ending) = crate::worker::mcp_servers::connect_all(s).await
    {
        return end(ending, true);
    }
    for r in &plan.reconcile {
        let resolution = match follow_up(s, r).await {
            Ok(resolution) => resolution,
            Err(ending) => return end(ending, false),
        };
        let effect = UnknownEffect {
            step: r.step,
            tool: r.tool.clone(),
            attempt: r.attempt,
            resolution,
            summary: summary(&r.input),
        };
        s.report_unknown(effect).await;
    }
    s.publish_steps();
    standing(s, plan.standing).await
}

/// A turn whose history cannot be rebuilt fails, naming the turn that is gone, unless it has
/// ended already: it never goes on with a history other than the one its first seal fixed.
fn history_lost(s: &Session, standing: &Standing) -> Option<Ending> {
    let err = s.me.history.as_ref().err()?;
    let ended = matches!(
        standing,
        Standing::Finished { .. } | Standing::Failed { .. } | Standing::Stopped
    );
    (!ended).then(|| Ending::Failed {
        reason: err.reason(),
        message: err.to_string(),
    })
}

/// True when this attempt may call a tool: it goes on with the turn, runs a waiting call, or
/// re-runs a step. An attempt that only ends or waits again connects to no MCP server.
fn uses_tools(plan: &ResumePlan) -> bool {
    let goes_on = !matches!(
        plan.standing,
        Standing::Finished { .. }
            | Standing::Failed { .. }
            | Standing::Stopped
            | Standing::Waiting { .. }
            | Standing::Approval {
                settlement: Settlement::Wait,
                ..
            }
    );
    goes_on || plan.reconcile.iter().any(|r| r.then == Then::Rerun)
}

fn end(ending: Ending, record: bool) -> Resumed {
    Resumed::End { ending, record }
}

async fn standing(s: &mut Session, standing: Standing) -> Resumed {
    match standing {
        Standing::Finished { output } => end(Ending::Final { output }, false),
        Standing::Failed { reason, message } => end(Ending::Failed { reason, message }, false),
        Standing::Stopped => end(Ending::Stopped, false),
        Standing::Waiting {
            step,
            question,
            record,
        } => end(Ending::Waiting { step, question }, record),
        Standing::Answer {
            step,
            question,
            record,
            index,
            content,
        } => {
            let mut events = Vec::new();
            if record {
                events.push(LedgerEvent::WaitingInput { step, question });
            }
            events.push(LedgerEvent::Input {
                index,
                content: content.clone(),
            });
            events.push(result(
                step,
                ToolOutput {
                    output: content,
                    is_error: false,
                },
            ));
            if let Err(err) = s.append(events).await {
                return end(Ending::refused(err), false);
            }
            s.io.progress.send_modify(|p| p.inputs_consumed = index + 1);
            Resumed::Continue
        }
        Standing::Approval { call, settlement } => settle_approval(s, call, settlement).await,
        Standing::Continue => Resumed::Continue,
    }
}

/// Carries out what the decision on a waiting call (or its absence) means.
async fn settle_approval(s: &mut Session, call: ApprovalCall, settlement: Settlement) -> Resumed {
    match settlement {
        Settlement::Wait => {
            let pending = approval::pending(
                call.step,
                &call.call_id,
                &call.tool,
                &call.input,
                call.requested_at,
            );
            end(Ending::AwaitingApproval { pending }, false)
        }
        Settlement::Run { reason } => run_approved(s, &call, reason).await,
        Settlement::Skip { outcome, reason } => {
            let told = approval::skipped_result(outcome, &reason);
            let step = call.step;
            let events = vec![
                LedgerEvent::ApprovalDecided {
                    step,
                    outcome,
                    reason,
                },
                result(step, ToolOutput::error(told)),
            ];
            match s.append(events).await {
                Ok(()) => {
                    spans::approval_waited(&s.me.trace, &call, outcome);
                    Resumed::Continue
                }
                Err(err) => end(Ending::refused(err), false),
            }
        }
    }
}

/// Records the approval, durably before the call runs (a death from here leaves the step
/// open: its effect unknown, reported, not re-run; the decision is applied once), then runs it.
async fn run_approved(s: &mut Session, call: &ApprovalCall, reason: String) -> Resumed {
    let decided = LedgerEvent::ApprovalDecided {
        step: call.step,
        outcome: ApprovalOutcome::Approved,
        reason,
    };
    if let Err(err) = s.append(vec![decided]).await {
        return end(Ending::refused(err), false);
    }
    spans::approval_waited(&s.me.trace, call, ApprovalOutcome::Approved);
    let tool = s.tool(&call.tool);
    match execute(s, call.step, tool, &call.tool, &call.input).await {
        Some(ending) => end(ending, true),
        None => Resumed::Continue,
    }
}

/// Probes or re-runs a step; returns the resolution reported in status.
async fn follow_up(s: &mut Session, r: &Reconcile) -> Result<Resolution, Ending> {
    match r.then {
        Then::Nothing => Ok(Resolution::Unknown),
        Then::Rerun => rerun(s, r).await.map(|_| Resolution::Rerun),
        Then::Probe => match run_probe(s, r).await {
            ProbeOutcome::Applied => {
                s.buffer(LedgerEvent::StepProbed {
                    step: r.step,
                    outcome: ProbeOutcome::Applied,
                });
                s.buffer(result(
                    r.step,
                    ToolOutput {
                        output: APPLIED_BY_PROBE.into(),
                        is_error: false,
                    },
                ));
                Ok(Resolution::Applied)
            }
            ProbeOutcome::NotApplied => {
                // Durable before the re-run: a death during it makes the next owner probe again.
                let probed = LedgerEvent::StepProbed {
                    step: r.step,
                    outcome: ProbeOutcome::NotApplied,
                };
                s.append(vec![probed]).await.map_err(Ending::refused)?;
                rerun(s, r).await.map(|_| Resolution::NotApplied)
            }
            ProbeOutcome::Unknown => {
                s.buffer(LedgerEvent::StepProbed {
                    step: r.step,
                    outcome: ProbeOutcome::Unknown,
                });
                Ok(Resolution::Unknown)
            }
        },
    }
}

async fn run_probe(s: &Session, r: &Reconcile) -> ProbeOutcome {
    let Some(spec) = s.tool(&r.tool).and_then(|t| t.spec.probe) else {
        return ProbeOutcome::Unknown;
    };
    let cancel = CancellationToken::new();
    let lost = s.io.guard.token().clone();
    let tool_env = s.tool_env(r.step);
    tokio::select! {
        outcome = probe::run(&s.io.tools, &spec, &r.input, &tool_env, &cancel) => outcome,
        _ = lost.cancelled() => { cancel.cancel(); ProbeOutcome::Unknown }
    }
}

async fn rerun(s: &mut Session, r: &Reconcile) -> Result<(), Ending> {
    let Some(tool) = s.tool(&r.tool) else {
        return Ok(());
    };
    match run_tool(s, &tool, &r.input, r.step).await {
        ToolRun::Done(output) => {
            s.buffer(result(r.step, output));
            Ok(())
        }
        // Killed again: it stays unknown (already recorded); the next owner decides anew.
        ToolRun::Killed => Err(crate::worker::agent::interrupted(s).unwrap_or(Ending::Lost)),
        ToolRun::Lost => Err(Ending::Lost),
        ToolRun::ToolsLost => Err(crate::worker::agent::tools_lost(r.step)),
    }
}
