//! The worker's two stop signals. `LostGuard`: the run is no longer ours (a newer fence, a
//! closed ledger, a lease we could not renew in time): cancel everything and write nothing
//! more. `Interrupts`: SIGTERM (hand off) and `spec.stop` (stop): cancel the step in flight,
//! then write the graceful ending.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Shared "we lost the run" state, with the lease validity on the worker's own clock.
#[derive(Clone)]
pub struct LostGuard {
    token: CancellationToken,
    why: Arc<OnceLock<String>>,
    valid_until: Arc<Mutex<Instant>>,
}

impl LostGuard {
    /// A guard whose lease is valid for `duration` from `renewed_at`.
    pub fn new(renewed_at: Instant, duration: Duration) -> Self {
        Self {
            token: CancellationToken::new(),
            why: Arc::default(),
            valid_until: Arc::new(Mutex::new(renewed_at + duration)),
        }
    }

    /// Records a successful renewal sent at `sent_at`.
    pub fn renewed(&self, sent_at: Instant, duration: Duration) {
        let mut until = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        *until = (*until).max(sent_at + duration);
    }

    /// When the lease expires unless renewed, on our clock.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run is lost: every task stops and nothing more is written.
    pub fn lose(&self, why: impl Into<String>) {
        let why = why.into();
        if self.why.set(why.clone()).is_ok() {
            tracing::warn!(reason = %why, "the run was lost: writing nothing more");
        }
        self.token.cancel();
    }

    /// True once lost, or once the lease expired on our clock (which also marks it lost).
    pub fn is_lost(&self) -> bool {
        if !self.token.is_cancelled() && Instant::now() >= self.valid_until() {
            self.lose("the lease expired before it could be renewed");
        }
        self.token.is_cancelled()
    }

    pub fn reason(&self) -> String {
        self.why.get().cloned().unwrap_or_default()
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Waits `backoff` before a failed ledger request is tried again, or until the run is
    /// lost (true then); the next wait is twice as long, up to [`RETRY_MAX`].
    pub async fn pause_before_retry(&self, backoff: &mut Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(*backoff) => {}
            _ = self.token.cancelled() => {}
        }
        *backoff = (*backoff * 2).min(RETRY_MAX);
        self.is_lost()
    }
}

/// The first wait before a failed ledger request (an append, the first read) is tried
/// again, and the longest.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(2);

/// Graceful interruptions.
#[derive(Clone, Default)]
pub struct Interrupts {
    /// SIGTERM: hand the run off to the next worker.
    pub handoff: CancellationToken,
    /// `spec.stop`: end the run `Stopped`.
    pub stop: CancellationToken,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_lease_counts_as_lost() {
        let t0 = Instant::now() - Duration::from_secs(10);
        let guard = LostGuard::new(t0, Duration::from_secs(5));
        assert!(guard.is_lost());
        assert!(guard.reason().contains("expired"));
    }

    #[test]
    fn a_renewal_extends_validity() {
        let t0 = Instant::now() - Duration::from_secs(4);
        let guard = LostGuard::new(t0, Duration::from_secs(5));
        guard.renewed(Instant::now(), Duration::from_secs(5));
        assert!(!guard.is_lost());
        assert!(guard.valid_until() > Instant::now() + Duration::from_secs(4));
    }
}
