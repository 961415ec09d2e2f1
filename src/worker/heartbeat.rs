//! Off the hot path: lease renewals every `renewSeconds`, and a watch on the AgentRun that
//! notices `spec.stop` and a fence that moved on. Both stop for good when the run is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::guard::{Interrupts, LostGuard};
use super::holder::Holder;
use super::metrics::{FenceRejection, RenewalFailure, WorkerMetrics};
use crate::crd::v1alpha1::{AgentRun, LeaseSpec};
use crate::fence::Fence;

/// How renewals are paced.
#[derive(Debug, Clone, Copy)]
pub struct RenewTiming {
    pub every: Duration,
    pub duration: Duration,
}

impl RenewTiming {
    pub fn from_spec(spec: &LeaseSpec) -> Self {
        Self {
            every: Duration::from_secs(spec.renew_seconds.max(1) as u64),
            duration: Duration::from_secs(spec.duration_seconds.max(1) as u64),
        }
    }
}

/// What to do next in the renewal loop, given the lease's validity on our clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewStep {
    /// Try a renewal, giving it at most this long.
    Renew { budget: Duration },
    /// The lease would have expired: stop without writing.
    Expired,
}

/// Pure: the next renewal decision at `now`.
pub fn next_step(valid_until: Instant, now: Instant) -> RenewStep {
    match valid_until.checked_duration_since(now) {
        Some(budget) if !budget.is_zero() => RenewStep::Renew { budget },
        _ => RenewStep::Expired,
    }
}

/// Renews until the run is lost or the task is aborted.
pub async fn renew_loop(
    holder: Holder,
    timing: RenewTiming,
    guard: LostGuard,
    metrics: Arc<WorkerMetrics>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(timing.every) => {}
            _ = guard.token().cancelled() => return,
        }
        if !renew_once(&holder, timing, &guard, &metrics).await {
            return;
        }
    }
}

/// One renewal, retried until it lands or the lease would expire. False once lost.
pub async fn renew_once(
    holder: &Holder,
    timing: RenewTiming,
    guard: &LostGuard,
    metrics: &WorkerMetrics,
) -> bool {
    loop {
        let budget = match next_step(guard.valid_until(), Instant::now()) {
            RenewStep::Renew { budget } => budget,
            RenewStep::Expired => {
                guard.lose("the lease expired before it could be renewed");
                return false;
            }
        };
        let sent_at = Instant::now();
        let renewal = tokio::time::timeout(budget, holder.renew_lease()).await;
        metrics.lease_renewed(sent_at.elapsed());
        match renewal {
            Ok(Ok(_)) => {
                guard.renewed(sent_at, timing.duration);
                return true;
            }
            Ok(Err(err)) if err.is_lost() => {
                metrics.lease_renewal_failed(RenewalFailure::Lost);
                metrics.fence_rejected(FenceRejection::LeaseLost);
                guard.lose(err.to_string());
                return false;
            }
            Ok(Err(err)) => {
                metrics.lease_renewal_failed(RenewalFailure::Error);
                warn!(error = %err, "lease renewal failed; retrying");
                tokio::time::sleep(Duration::from_millis(500).min(budget)).await;
            }
            Err(_) => {
                metrics.lease_renewal_failed(RenewalFailure::Timeout);
                guard.lose("the lease renewal did not land before the lease would expire");
                return false;
            }
        }
    }
}

/// Watches the run: `spec.stop` interrupts the step in flight; a newer fence means we lost it.
pub async fn watch_run(
    api: Api<AgentRun>,
    name: String,
    fence: Fence,
    guard: LostGuard,
    interrupts: Interrupts,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    loop {
        let next = tokio::select! {
            n = stream.next() => n,
            _ = guard.token().cancelled() => return,
        };
        match next {
            Some(Ok(run)) => observe(&run, fence, &guard, &interrupts),
            Some(Err(err)) => warn!(error = %err, "watching the run"),
            None => return,
        }
    }
}

fn observe(run: &AgentRun, fence: Fence, guard: &LostGuard, interrupts: &Interrupts) {
    let current = Fence::of_run(run);
    if crate::fence::superseded(current, fence) {
        guard.lose(format!("the run moved to fence {current}"));
    } else if run.spec.stop && !interrupts.stop.is_cancelled() {
        info!("stop requested");
        interrupts.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_gets_the_time_left_on_the_lease() {
        let now = Instant::now();
        assert_eq!(
            next_step(now + Duration::from_secs(3), now),
            RenewStep::Renew {
                budget: Duration::from_secs(3)
            }
        );
        assert_eq!(next_step(now, now), RenewStep::Expired);
        assert_eq!(
            next_step(now, now + Duration::from_secs(1)),
            RenewStep::Expired
        );
    }
}
