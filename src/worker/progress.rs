//! Progress in status, off the hot path: steps, unknown effects, ledger size and the Resumed
//! condition, written by fenced CAS at most every `interval` and only when something changed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::warn;

use super::guard::LostGuard;
use super::holder::Holder;
use super::metrics::{FenceRejection, WorkerMetrics};
use crate::crd::v1alpha1::{AgentRunStatus, LedgerStats, RunUsage, UnknownEffect};
use crate::status::{condition, set_condition};

/// What the worker reports while it runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub steps: i64,
    pub unknown_effects: Vec<UnknownEffect>,
    pub inputs_consumed: i64,
    /// Set when this attempt resumed a ledger: the Resumed condition's message.
    pub resumed: Option<String>,
    pub generation: Option<i64>,
    /// What the run spent, summed from the ledger as this attempt replayed and extended it.
    pub usage: RunUsage,
    /// Set when an MCP server offers other tools than the ledger recorded: the
    /// `McpToolsChanged` condition's message.
    pub mcp_tools_changed: Option<String>,
}

/// Pure: folds progress and ledger size into a status.
pub fn apply(status: &mut AgentRunStatus, p: &Progress, ledger: &LedgerStats) {
    status.steps = status.steps.max(p.steps);
    for effect in &p.unknown_effects {
        match status
            .unknown_effects
            .iter_mut()
            .find(|e| e.step == effect.step)
        {
            Some(existing) => *existing = effect.clone(),
            None => status.unknown_effects.push(effect.clone()),
        }
    }
    status.unknown_effects.sort_by_key(|e| e.step);
    status.unknown_effect_count = status.unknown_effects.len() as i64;
    status.ledger = Some(ledger.clone());
    status.inputs_consumed = status.inputs_consumed.max(p.inputs_consumed);
    status.usage = Some(p.usage.clone());
    if let Some(message) = &p.mcp_tools_changed {
        set_condition(
            &mut status.conditions,
            condition::MCP_TOOLS_CHANGED,
            true,
            "ServerListChanged",
            message,
            p.generation,
        );
    }
    if let Some(message) = &p.resumed {
        set_condition(
            &mut status.conditions,
            condition::RESUMED,
            true,
            "ResumedFromLedger",
            message,
            p.generation,
        );
    }
}

/// Writes progress whenever it changes, at most every `interval`, until aborted or lost.
pub async fn progress_loop(
    holder: Holder,
    mut progress: watch::Receiver<Progress>,
    mut ledger: watch::Receiver<LedgerStats>,
    interval: Duration,
    guard: LostGuard,
    metrics: Arc<WorkerMetrics>,
) {
    loop {
        tokio::select! {
            r = progress.changed() => if r.is_err() { return },
            r = ledger.changed() => if r.is_err() { return },
            _ = guard.token().cancelled() => return,
        }
        let p = progress.borrow_and_update().clone();
        let l = ledger.borrow_and_update().clone();
        let write = holder.update_status(|s| apply(s, &p, &l));
        match write.await {
            Ok(_) => {}
            Err(err) if err.is_lost() => {
                metrics.fence_rejected(FenceRejection::StatusFenceMoved);
                guard.lose(err.to_string());
                return;
            }
            Err(err) => warn!(error = %err, "writing progress"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = guard.token().cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::Resolution;
    use crate::fence::Fence;

    fn effect(step: i64, resolution: Resolution) -> UnknownEffect {
        UnknownEffect {
            step,
            tool: "sh".into(),
            attempt: Fence::new(1),
            resolution,
            summary: String::new(),
        }
    }

    #[test]
    fn unknown_effects_are_upserted_by_step_and_counted() {
        let mut status = AgentRunStatus {
            unknown_effects: vec![effect(2, Resolution::Unknown)],
            ..Default::default()
        };
        let p = Progress {
            steps: 5,
            unknown_effects: vec![
                effect(2, Resolution::Applied),
                effect(4, Resolution::Unknown),
            ],
            resumed: Some("resumed at 3".into()),
            ..Default::default()
        };
        let ledger = LedgerStats {
            segments: 3,
            events: 9,
            bytes: 100,
        };
        apply(&mut status, &p, &ledger);
        assert_eq!(status.unknown_effect_count, 2);
        assert_eq!(status.unknown_effects[0].resolution, Resolution::Applied);
        assert_eq!(status.steps, 5);
        assert_eq!(status.ledger, Some(ledger));
        assert_eq!(status.conditions[0].type_, "Resumed");
    }
}
