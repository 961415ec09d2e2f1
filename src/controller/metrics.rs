//! Prometheus metrics, prefix `baton`: runs by phase, claims and takeovers by reason,
//! give-ups, reconcile duration, errors, API writes by kind, takeover lateness and how much
//! of it the claim's own API round trips took, Events queued and dropped.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::crd::v1alpha1::{AgentRun, Phase};

type Labels = Vec<(&'static str, String)>;

/// Bucket bounds (seconds) of the takeover histograms: fine around the 1 s design target, so
/// an alert on "p99 above 1 s" reads a bucket bound, not an interpolation across 0.64–1.28 s.
pub const TAKEOVER_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
];

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    runs: Family<Labels, Gauge>,
    claims: Family<Labels, Counter>,
    takeovers: Family<Labels, Counter>,
    give_ups: Counter,
    reconciles: Counter,
    reconcile_duration: Histogram,
    errors: Family<Labels, Counter>,
    api_writes: Family<Labels, Counter>,
    takeover_lateness: Histogram,
    claim_api: Histogram,
    events_dropped: Counter,
    events_queued: Gauge,
    remembered_runs: Gauge,
    writes_total: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("baton"),
            runs: Family::default(),
            claims: Family::default(),
            takeovers: Family::default(),
            give_ups: Counter::default(),
            reconciles: Counter::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            errors: Family::default(),
            api_writes: Family::default(),
            takeover_lateness: Histogram::new(TAKEOVER_BUCKETS.iter().copied()),
            claim_api: Histogram::new(TAKEOVER_BUCKETS.iter().copied()),
            events_dropped: Counter::default(),
            events_queued: Gauge::default(),
            remembered_runs: Gauge::default(),
            writes_total: AtomicU64::new(0),
        };
        m.register();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register("runs", "AgentRuns by phase", self.runs.clone());
        r.register("claims", "Claims by reason", self.claims.clone());
        r.register(
            "events_dropped",
            "Kubernetes Events not published because too many were queued",
            self.events_dropped.clone(),
        );
        r.register(
            "events_queued",
            "Kubernetes Events waiting to be published",
            self.events_queued.clone(),
        );
        r.register(
            "takeovers",
            "Takeovers (claims after a death) by reason",
            self.takeovers.clone(),
        );
        r.register(
            "give_ups",
            "Runs ended Interrupted after maxAttempts",
            self.give_ups.clone(),
        );
        r.register("reconciles", "Reconciles", self.reconciles.clone());
        r.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            self.reconcile_duration.clone(),
        );
        r.register("errors", "Reconcile errors by kind", self.errors.clone());
        r.register(
            "remembered_runs",
            "Runs the controller keeps memory of (lease sightings, seals)",
            self.remembered_runs.clone(),
        );
        r.register("api_writes", "API writes by kind", self.api_writes.clone());
        r.register(
            "takeover_lateness_seconds",
            "Time from lease expiry (controller clock) to the claim",
            self.takeover_lateness.clone(),
        );
        r.register(
            "claim_api_seconds",
            "Time from the start of a claim to its status write (API round trips: the trigger \
             confirmed, the ledger sealed, the status compare-and-swap)",
            self.claim_api.clone(),
        );
    }

    pub fn claim(&self, reason: &str, takeover: bool) {
        let labels = vec![("reason", reason.to_string())];
        self.claims.get_or_create(&labels).inc();
        if takeover {
            self.takeovers.get_or_create(&labels).inc();
        }
    }

    pub fn give_up(&self) {
        self.give_ups.inc();
    }

    pub fn reconciled(&self, seconds: f64) {
        self.reconciles.inc();
        self.reconcile_duration.observe(seconds);
    }

    pub fn error(&self, label: &'static str) {
        self.errors
            .get_or_create(&vec![("kind", label.to_string())])
            .inc();
    }

    pub fn api_write(&self, kind: &str) {
        self.api_writes
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
        self.writes_total.fetch_add(1, Ordering::Relaxed);
    }

    /// How many runs the controller's memory holds (set at each scrape).
    pub fn remembered_runs(&self, n: usize) {
        self.remembered_runs.set(n as i64);
    }

    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    pub fn event_queued(&self) {
        self.events_queued.inc();
    }

    pub fn event_dequeued(&self) {
        self.events_queued.dec();
    }

    pub fn takeover_lateness(&self, seconds: f64) {
        self.takeover_lateness.observe(seconds);
    }

    pub fn claim_api(&self, seconds: f64) {
        self.claim_api.observe(seconds);
    }

    /// All API writes so far (for the benchmark).
    pub fn writes_total(&self) -> u64 {
        self.writes_total.load(Ordering::Relaxed)
    }

    /// Reconciles so far (for the benchmark).
    pub fn reconciles_total(&self) -> u64 {
        self.reconciles.get()
    }

    /// The Prometheus text exposition, with runs by phase counted from `runs`.
    pub fn render<'a>(&self, runs: impl Iterator<Item = &'a AgentRun>) -> String {
        self.count_phases(runs);
        crate::serving::admin::openmetrics_text(&self.registry)
    }

    fn count_phases<'a>(&self, runs: impl Iterator<Item = &'a AgentRun>) {
        let mut counts = std::collections::HashMap::<Phase, i64>::new();
        for run in runs {
            let phase = run.status.as_ref().map(|s| s.phase).unwrap_or_default();
            *counts.entry(phase).or_default() += 1;
        }
        for phase in ALL_PHASES {
            let n = counts.get(&phase).copied().unwrap_or(0);
            self.runs
                .get_or_create(&vec![("phase", phase.to_string())])
                .set(n);
        }
    }
}

const ALL_PHASES: [Phase; 10] = [
    Phase::Pending,
    Phase::Running,
    Phase::Handoff,
    Phase::WaitingInput,
    Phase::WaitingApproval,
    Phase::Finishing,
    Phase::Succeeded,
    Phase::Failed,
    Phase::Interrupted,
    Phase::Stopped,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_takeover_histograms_have_a_bucket_at_the_one_second_target() {
        let m = Metrics::new();
        m.takeover_lateness(0.9);
        m.claim_api(0.9);
        let text = m.render(std::iter::empty());
        for name in ["baton_takeover_lateness_seconds", "baton_claim_api_seconds"] {
            let bucket = |le: &str| format!("{name}_bucket{{le=\"{le}\"}} ");
            assert!(text.contains(&format!("{}0", bucket("0.75"))), "{text}");
            assert!(text.contains(&format!("{}1", bucket("1.0"))), "{text}");
        }
    }
}
