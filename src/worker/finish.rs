//! How an attempt ends: the ledger event first, then the phase by fenced CAS, then the lease
//! is released. The worker never writes a terminal phase: `Finishing` carries the outcome and
//! the controller completes it.

use std::time::Duration;

use tracing::{info, warn};

use kube::runtime::events::EventType;

use super::appender::AppendError;
use super::metrics::FenceRejection;
use super::progress::{self, Progress};
use super::session::Session;
use crate::approval;
use crate::crd::v1alpha1::{AgentRunStatus, LedgerEvent, LedgerStats, PendingApproval, Phase};
use crate::fence::EndReason;
use crate::status::StatusError;

/// Why an attempt ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Final {
        output: String,
    },
    Failed {
        reason: EndReason,
        message: String,
    },
    Stopped,
    /// An `askUser` step waits for `spec.inputs`.
    Waiting {
        step: i64,
        question: String,
    },
    /// A tool call waits for a human's decision (recorded with its intent).
    AwaitingApproval {
        pending: PendingApproval,
    },
    /// SIGTERM: the next worker continues at once.
    Handoff,
    /// The transcript cannot grow further: `Interrupted`, nothing more appended.
    TooLarge,
    /// The model kept failing with retryable errors, or the tools container's executor went
    /// away: the attempt dies without a write, so the controller claims the run again (the
    /// turn is not lost).
    GaveUp {
        message: String,
    },
    /// The run is no longer ours: write nothing.
    Lost,
}

impl Ending {
    /// The ending for an append that was refused.
    pub fn refused(err: AppendError) -> Self {
        match err {
            AppendError::TooLarge { .. } => Ending::TooLarge,
            AppendError::Lost(_) | AppendError::Gone => Ending::Lost,
        }
    }
}

/// How the process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The attempt ended as planned (Finishing, Handoff, WaitingInput).
    Done,
    /// Another worker holds the run: nothing was done.
    Superseded,
    /// The run was lost mid-attempt (a newer fence, a closed ledger, an expired lease).
    Lost,
    /// The attempt died without a decision (a fault, or a model that kept failing).
    Failed,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Done | Exit::Superseded => 0,
            Exit::Failed => 1,
            Exit::Lost => 3,
        }
    }
}

/// The event an ending appends, if any.
pub fn event_for(ending: &Ending) -> Option<LedgerEvent> {
    Some(match ending {
        Ending::Final { output } => LedgerEvent::Final {
            output: output.clone(),
        },
        Ending::Failed { reason, message } => LedgerEvent::Failed {
            reason: reason.clone(),
            message: message.clone(),
        },
        Ending::Stopped => LedgerEvent::Stopped,
        Ending::Waiting { step, question } => LedgerEvent::WaitingInput {
            step: *step,
            question: question.clone(),
        },
        Ending::Handoff => LedgerEvent::Handoff,
        Ending::AwaitingApproval { .. }
        | Ending::TooLarge
        | Ending::GaveUp { .. }
        | Ending::Lost => return None,
    })
}

/// Pure: how the run ends when `ending` ends it (a final answer, a failure, a stop, a
/// transcript too large to go on); None when the run goes on after this attempt.
pub fn outcome(ending: &Ending) -> Option<Phase> {
    match ending {
        Ending::Final { .. } => Some(Phase::Succeeded),
        Ending::Failed { .. } => Some(Phase::Failed),
        Ending::Stopped => Some(Phase::Stopped),
        Ending::TooLarge => Some(Phase::Interrupted),
        _ => None,
    }
}

/// Pure: the status an ending writes. `salvage` is the best output the ledger holds.
pub fn phase_change(
    status: &mut AgentRunStatus,
    ending: &Ending,
    salvage: &str,
    p: &Progress,
    ledger: &LedgerStats,
) {
    progress::apply(status, p, ledger);
    let partial = (!salvage.is_empty()).then(|| salvage.to_string());
    let (phase, output, reason, message) = match ending {
        Ending::Final { output } => (
            Phase::Finishing,
            Some(output.clone()),
            "Completed".to_string(),
            "the agent gave its final answer".to_string(),
        ),
        Ending::Failed { reason, message } => (
            Phase::Finishing,
            partial,
            reason.to_string(),
            message.clone(),
        ),
        Ending::Stopped => (
            Phase::Finishing,
            partial,
            "StopRequested".into(),
            "the run was stopped on request".into(),
        ),
        Ending::TooLarge => (
            Phase::Finishing,
            partial,
            "TranscriptTooLarge".into(),
            "the transcript reached the ledger's size cap; nothing was trimmed".into(),
        ),
        Ending::Waiting { question, .. } => (
            Phase::WaitingInput,
            None,
            "WaitingForInput".into(),
            question.clone(),
        ),
        Ending::AwaitingApproval { pending } => (
            Phase::WaitingApproval,
            None,
            "WaitingForApproval".into(),
            format!(
                "step {} ({}) waits for approval: baton approve|deny RUN --step {}",
                pending.step, pending.tool, pending.step
            ),
        ),
        Ending::Handoff => (
            Phase::Handoff,
            None,
            "HandedOff".into(),
            "the worker was asked to stop and handed the run off".into(),
        ),
        Ending::GaveUp { .. } | Ending::Lost => return,
    };
    let outcome = outcome(ending);
    status.pending_approval = match ending {
        Ending::AwaitingApproval { pending } => Some(pending.clone()),
        _ => None,
    };
    status.output_partial = output.is_some() && outcome != Some(Phase::Succeeded);
    status.phase = phase;
    status.outcome = outcome;
    if output.is_some() {
        crate::status::set_output(status, output);
    }
    status.reason = Some(reason);
    status.message = Some(message);
}

/// Ends the attempt: appends the ending's event (unless the ledger already holds it), writes
/// the phase, releases the lease.
pub async fn conclude(s: &mut Session, ending: Ending, record: bool) -> Exit {
    let mut ending = ending;
    if let Some(event) = event_for(&ending).filter(|_| record)
        && let Err(err) = s.append(vec![event]).await
    {
        ending = Ending::refused(err);
    }
    match &ending {
        Ending::Lost => return Exit::Lost,
        Ending::GaveUp { message } => {
            warn!(%message, "ending this attempt without a decision");
            // Nothing is written to the run: the Event is where `kubectl describe` shows why
            // its attempt ended (the next one may get through).
            s.event(EventType::Warning, "AttemptGaveUp", "Conclude", message)
                .await;
            return Exit::Failed;
        }
        _ => {}
    }
    s.stop_progress();
    match write_phase(s, &ending).await {
        Ok(()) => {}
        Err(err) if err.is_lost() => return Exit::Lost,
        Err(err) => {
            warn!(error = %err, "writing the phase failed");
            return Exit::Failed;
        }
    }
    release(s).await;
    if let Ending::AwaitingApproval { pending } = &ending {
        let note = approval::announcement(&s.me.cfg.run, pending);
        s.event(EventType::Normal, "ApprovalRequested", "Wait", &note)
            .await;
    }
    info!(ending = ?ending_label(&ending), "attempt ended");
    Exit::Done
}

fn ending_label(ending: &Ending) -> &'static str {
    match ending {
        Ending::Final { .. } => "final",
        Ending::Failed { .. } => "failed",
        Ending::Stopped => "stopped",
        Ending::Waiting { .. } => "waitingInput",
        Ending::AwaitingApproval { .. } => "waitingApproval",
        Ending::Handoff => "handoff",
        Ending::TooLarge => "transcriptTooLarge",
        Ending::GaveUp { .. } => "gaveUp",
        Ending::Lost => "lost",
    }
}

async fn write_phase(s: &Session, ending: &Ending) -> Result<(), StatusError> {
    let salvage = s.turn.replay.salvage();
    let p = s.io.progress.borrow().clone();
    let ledger = s.io.ledger_stats.borrow().clone();
    let name = s.me.cfg.run.clone();
    let mut last = None;
    for delay_ms in [0u64, 200, 1000, 3000] {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        if s.io.guard.is_lost() {
            return Err(StatusError::LeaseLost {
                run: name,
                ours: s.fence(),
            });
        }
        let change = |st: &mut AgentRunStatus| phase_change(st, ending, &salvage, &p, &ledger);
        match s.io.holder.update_status(change).await {
            Ok(_) => return Ok(()),
            Err(err) if err.is_lost() => {
                s.io.metrics
                    .fence_rejected(FenceRejection::StatusFenceMoved);
                return Err(err);
            }
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or(StatusError::Conflict { run: name }))
}

/// Stops renewing and releases the lease (best effort: the phase already tells the controller).
async fn release(s: &mut Session) {
    s.stop_heartbeat();
    if let Err(err) = s.io.holder.release_lease().await {
        warn!(error = %err, "releasing the lease");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::Fence;

    fn change(ending: Ending, salvage: &str) -> AgentRunStatus {
        let mut st = AgentRunStatus {
            phase: Phase::Running,
            fence: Fence::new(2),
            ..Default::default()
        };
        phase_change(
            &mut st,
            &ending,
            salvage,
            &Progress::default(),
            &LedgerStats::default(),
        );
        st
    }

    #[test]
    fn a_final_answer_moves_to_finishing_succeeded() {
        let st = change(
            Ending::Final {
                output: "42".into(),
            },
            "42",
        );
        assert_eq!(st.phase, Phase::Finishing);
        assert_eq!(st.outcome, Some(Phase::Succeeded));
        assert_eq!(st.output.as_deref(), Some("42"));
        assert!(!st.output_partial);
    }

    #[test]
    fn a_too_large_transcript_is_interrupted_with_the_salvage() {
        let st = change(Ending::TooLarge, "partial text");
        assert_eq!(st.outcome, Some(Phase::Interrupted));
        assert_eq!(st.reason.as_deref(), Some("TranscriptTooLarge"));
        assert_eq!(st.output.as_deref(), Some("partial text"));
        assert!(st.output_partial);
    }

    #[test]
    fn handoff_and_waiting_are_not_terminal() {
        assert_eq!(change(Ending::Handoff, "").phase, Phase::Handoff);
        let st = change(
            Ending::Waiting {
                step: 3,
                question: "why?".into(),
            },
            "",
        );
        assert_eq!(st.phase, Phase::WaitingInput);
        assert_eq!(st.outcome, None);
    }

    #[test]
    fn a_call_that_waits_for_approval_shows_in_status_until_the_run_moves_on() {
        let pending = crate::approval::pending(
            4,
            "c4",
            "deploy",
            r#"{"command":"make deploy"}"#,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        let st = change(
            Ending::AwaitingApproval {
                pending: pending.clone(),
            },
            "",
        );
        assert_eq!((st.phase, st.outcome), (Phase::WaitingApproval, None));
        assert_eq!(st.pending_approval.as_ref(), Some(&pending));
        assert!(st.message.unwrap().contains("step 4 (deploy)"));
        let waits = Ending::AwaitingApproval { pending };
        assert_eq!(event_for(&waits), None, "recorded with the intent");
        let mut waiting = AgentRunStatus {
            pending_approval: st.pending_approval.clone(),
            ..Default::default()
        };
        phase_change(
            &mut waiting,
            &Ending::Final {
                output: "ok".into(),
            },
            "ok",
            &Progress::default(),
            &LedgerStats::default(),
        );
        assert_eq!(waiting.pending_approval, None);
    }

    #[test]
    fn lost_writes_nothing() {
        assert_eq!(change(Ending::Lost, "x").phase, Phase::Running);
        assert_eq!(event_for(&Ending::Lost), None);
        assert_eq!(event_for(&Ending::TooLarge), None);
    }

    #[test]
    fn stopped_appends_stopped_and_ends_stopped() {
        assert_eq!(event_for(&Ending::Stopped), Some(LedgerEvent::Stopped));
        assert_eq!(change(Ending::Stopped, "").outcome, Some(Phase::Stopped));
    }
}
