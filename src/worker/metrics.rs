//! Prometheus metrics of one worker process, prefix `baton_worker`: fence rejections, unknown
//! effects, the hot path's append latency, lease renewals, ledger growth and model calls.
//!
//! Everything here is a counter or a histogram bump: cheap enough for the hot path.

use crate::crd::v1alpha1::Resolution;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::model::ModelError;
use crate::ledger::LedgerError;

/// The registry's prefix: every name starts with `baton_worker_`.
pub const PREFIX: &str = "baton_worker";

type Labels = Vec<(&'static str, &'static str)>;

/// Why a write was refused because the fence moved on (the `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceRejection {
    /// A ledger position held a newer fence.
    LedgerSuperseded,
    /// The ledger was closed by a terminal claim.
    LedgerClosed,
    /// A status CAS found another fence.
    StatusFenceMoved,
    /// The Lease no longer names this pod and fence.
    LeaseLost,
}

impl FenceRejection {
    pub fn label(self) -> &'static str {
        match self {
            FenceRejection::LedgerSuperseded => "ledger_superseded",
            FenceRejection::LedgerClosed => "ledger_closed",
            FenceRejection::StatusFenceMoved => "status_fence_moved",
            FenceRejection::LeaseLost => "lease_lost",
        }
    }

    /// The rejection a ledger error stands for, if it is one.
    pub fn of_ledger(err: &LedgerError) -> Option<Self> {
        match err {
            LedgerError::Superseded { .. } => Some(FenceRejection::LedgerSuperseded),
            LedgerError::Closed { .. } => Some(FenceRejection::LedgerClosed),
            _ => None,
        }
    }
}

/// How one lease renewal request failed (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalFailure {
    /// A transient error: retried while the lease is still valid.
    Error,
    /// The Lease names another holder or fence.
    Lost,
    /// No answer before the lease would have expired.
    Timeout,
}

impl RenewalFailure {
    pub fn label(self) -> &'static str {
        match self {
            RenewalFailure::Error => "error",
            RenewalFailure::Lost => "lost",
            RenewalFailure::Timeout => "timeout",
        }
    }
}

/// Which append wrote to the ledger (the `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendKind {
    /// Awaited by the agent (a step intent, an ending, the attempt's first segment).
    Awaited,
    /// A background flush of buffered events.
    Flush,
}

impl AppendKind {
    pub fn label(self) -> &'static str {
        match self {
            AppendKind::Awaited => "awaited",
            AppendKind::Flush => "flush",
        }
    }
}

/// Every metric the worker exports.
pub struct WorkerMetrics {
    registry: Registry,
    fence_rejections: Family<Labels, Counter>,
    unknown_effects: Family<Labels, Counter>,
    step_append_duration: Histogram,
    lease_renewal_duration: Histogram,
    lease_renewal_failures: Family<Labels, Counter>,
    ledger_appends: Family<Labels, Counter>,
    ledger_segments: Counter,
    ledger_bytes: Counter,
    model_calls: Family<Labels, Counter>,
    model_retries: Counter,
    /// By model name (a run's one model: the label's values are as many as models used).
    model_tokens: Family<Vec<(&'static str, String)>, Counter>,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for WorkerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerMetrics").finish_non_exhaustive()
    }
}

impl WorkerMetrics {
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix(PREFIX),
            fence_rejections: Family::default(),
            unknown_effects: Family::default(),
            // 1 ms .. ~16 s: one API round trip, retries included.
            step_append_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            lease_renewal_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            lease_renewal_failures: Family::default(),
            ledger_appends: Family::default(),
            ledger_segments: Counter::default(),
            ledger_bytes: Counter::default(),
            model_calls: Family::default(),
            model_retries: Counter::default(),
            model_tokens: Family::default(),
        };
        m.register();
        m.zero_known_labels();
        m
    }

    /// Creates every known label set at zero, so each series exists from the start (a
    /// family is only exported once it has one) and `rate()` sees the first increment.
    fn zero_known_labels(&self) {
        let zero = |family: &Family<Labels, Counter>, name: &'static str, value: &'static str| {
            family.get_or_create(&vec![(name, value)]).inc_by(0);
        };
        for kind in [
            FenceRejection::LedgerSuperseded,
            FenceRejection::LedgerClosed,
            FenceRejection::StatusFenceMoved,
            FenceRejection::LeaseLost,
        ] {
            zero(&self.fence_rejections, "kind", kind.label());
        }
        for resolution in Resolution::ALL {
            zero(&self.unknown_effects, "resolution", resolution.as_str());
        }
        for reason in [
            RenewalFailure::Error,
            RenewalFailure::Lost,
            RenewalFailure::Timeout,
        ] {
            zero(&self.lease_renewal_failures, "reason", reason.label());
        }
        for kind in [AppendKind::Awaited, AppendKind::Flush] {
            zero(&self.ledger_appends, "kind", kind.label());
        }
        for outcome in MODEL_OUTCOMES {
            zero(&self.model_calls, "outcome", outcome);
        }
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "fence_rejections",
            "Writes refused because the fence moved on, by kind",
            self.fence_rejections.clone(),
        );
        r.register(
            "unknown_effects",
            "Steps found with an unknown effect at resume or when killed, by resolution",
            self.unknown_effects.clone(),
        );
        r.register(
            "step_append_duration_seconds",
            "Time of the awaited stepIntent append (the one round trip of a step)",
            self.step_append_duration.clone(),
        );
        r.register(
            "lease_renewal_duration_seconds",
            "Time of one lease renewal request",
            self.lease_renewal_duration.clone(),
        );
        r.register(
            "lease_renewal_failures",
            "Lease renewal requests that failed, by reason",
            self.lease_renewal_failures.clone(),
        );
        r.register(
            "ledger_appends",
            "Successful ledger appends, by kind (awaited or background flush)",
            self.ledger_appends.clone(),
        );
        r.register(
            "ledger_segments",
            "LedgerSegments this worker created",
            self.ledger_segments.clone(),
        );
        r.register(
            "ledger_bytes",
            "Serialized event bytes this worker appended to the ledger",
            self.ledger_bytes.clone(),
        );
        r.register(
            "model_calls",
            "Model requests, by outcome (ok, retryable, permanent)",
            self.model_calls.clone(),
        );
        r.register(
            "model_retries",
            "Model requests made again after a retryable failure",
            self.model_retries.clone(),
        );
        r.register(
            "model_tokens",
            "Tokens the model calls used, as providers reported them, by model and kind (input, output)",
            self.model_tokens.clone(),
        );
    }

    /// A model call's tokens (none: the provider reported none).
    pub fn model_tokens(&self, model: Option<&str>, usage: Option<super::model::Usage>) {
        let Some(usage) = usage else { return };
        let model = model.unwrap_or("scripted").to_string();
        for (kind, tokens) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
        ] {
            self.model_tokens
                .get_or_create(&vec![("model", model.clone()), ("kind", kind.to_string())])
                .inc_by(tokens.max(0) as u64);
        }
    }

    pub fn fence_rejected(&self, kind: FenceRejection) {
        self.fence_rejections
            .get_or_create(&vec![("kind", kind.label())])
            .inc();
    }

    /// `resolution` is what `status.unknownEffects` reports.
    pub fn unknown_effect(&self, resolution: Resolution) {
        self.unknown_effects
            .get_or_create(&vec![("resolution", resolution.as_str())])
            .inc();
    }

    pub fn step_appended(&self, took: Duration) {
        self.step_append_duration.observe(took.as_secs_f64());
    }

    pub fn lease_renewed(&self, took: Duration) {
        self.lease_renewal_duration.observe(took.as_secs_f64());
    }

    pub fn lease_renewal_failed(&self, reason: RenewalFailure) {
        self.lease_renewal_failures
            .get_or_create(&vec![("reason", reason.label())])
            .inc();
    }

    pub fn ledger_appended(&self, kind: AppendKind, segments: u64, bytes: u64) {
        self.ledger_appends
            .get_or_create(&vec![("kind", kind.label())])
            .inc();
        self.ledger_segments.inc_by(segments);
        self.ledger_bytes.inc_by(bytes);
    }

    /// One model request ended with `result`; `retry` when it was not the turn's first.
    pub fn model_called<T>(&self, result: &Result<T, ModelError>, retry: bool) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(ModelError::Retryable { .. }) => "retryable",
            Err(ModelError::Permanent { .. }) => "permanent",
        };
        self.model_calls
            .get_or_create(&vec![("outcome", outcome)])
            .inc();
        if retry {
            self.model_retries.inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        crate::serving::admin::openmetrics_text(&self.registry)
    }
}

/// Outcomes of one model request.
const MODEL_OUTCOMES: [&str; 3] = ["ok", "retryable", "permanent"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::Fence;

    fn exercised() -> WorkerMetrics {
        let m = WorkerMetrics::new();
        m.fence_rejected(FenceRejection::LedgerSuperseded);
        m.fence_rejected(FenceRejection::StatusFenceMoved);
        m.unknown_effect(Resolution::Applied);
        m.unknown_effect(Resolution::Rerun);
        m.step_appended(Duration::from_millis(3));
        m.lease_renewed(Duration::from_millis(2));
        m.lease_renewal_failed(RenewalFailure::Timeout);
        m.ledger_appended(AppendKind::Awaited, 2, 1500);
        m.ledger_appended(AppendKind::Flush, 1, 100);
        m.model_called::<()>(&Ok(()), false);
        let busy = ModelError::Retryable {
            message: "busy".into(),
            retry_after: None,
        };
        m.model_called::<()>(&Err(busy), true);
        m
    }

    #[test]
    fn every_metric_is_exported_with_the_prefix() {
        let text = exercised().render();
        for name in [
            "baton_worker_fence_rejections_total{kind=\"ledger_superseded\"} 1",
            "baton_worker_fence_rejections_total{kind=\"status_fence_moved\"} 1",
            "baton_worker_unknown_effects_total{resolution=\"applied\"} 1",
            "baton_worker_unknown_effects_total{resolution=\"rerun\"} 1",
            "baton_worker_step_append_duration_seconds_count 1",
            "baton_worker_lease_renewal_duration_seconds_count 1",
            "baton_worker_lease_renewal_failures_total{reason=\"timeout\"} 1",
            "baton_worker_ledger_appends_total{kind=\"awaited\"} 1",
            "baton_worker_ledger_appends_total{kind=\"flush\"} 1",
            "baton_worker_ledger_segments_total 3",
            "baton_worker_ledger_bytes_total 1600",
            "baton_worker_model_calls_total{outcome=\"ok\"} 1",
            "baton_worker_model_calls_total{outcome=\"retryable\"} 1",
            "baton_worker_model_retries_total 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    #[test]
    fn a_fresh_registry_exports_every_series_at_zero() {
        let text = WorkerMetrics::new().render();
        for name in [
            "baton_worker_fence_rejections_total{kind=\"ledger_superseded\"} 0",
            "baton_worker_fence_rejections_total{kind=\"ledger_closed\"} 0",
            "baton_worker_fence_rejections_total{kind=\"status_fence_moved\"} 0",
            "baton_worker_fence_rejections_total{kind=\"lease_lost\"} 0",
            "baton_worker_unknown_effects_total{resolution=\"unknown\"} 0",
            "baton_worker_lease_renewal_failures_total{reason=\"error\"} 0",
            "baton_worker_ledger_appends_total{kind=\"flush\"} 0",
            "baton_worker_model_calls_total{outcome=\"permanent\"} 0",
            "# TYPE baton_worker_step_append_duration_seconds histogram",
            "# TYPE baton_worker_lease_renewal_duration_seconds histogram",
            "baton_worker_ledger_segments_total 0",
            "baton_worker_ledger_bytes_total 0",
            "baton_worker_model_retries_total 0",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn ledger_errors_map_to_fence_rejections() {
        let superseded = LedgerError::Superseded {
            seq: 3,
            ours: Fence::new(1),
            theirs: Fence::new(2),
        };
        assert_eq!(
            FenceRejection::of_ledger(&superseded),
            Some(FenceRejection::LedgerSuperseded)
        );
        let closed = LedgerError::Closed {
            seq: 3,
            fence: Fence::new(2),
        };
        assert_eq!(
            FenceRejection::of_ledger(&closed),
            Some(FenceRejection::LedgerClosed)
        );
        let gap = LedgerError::Gap {
            expected: 1,
            found: 2,
        };
        assert_eq!(FenceRejection::of_ledger(&gap), None);
    }
}
