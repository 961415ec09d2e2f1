//! The server's Prometheus metrics, prefix `baton_server`: streams open, shared hubs and the
//! API watches they hold (the figure that must not grow with the number of followers), and
//! requests answered by status code.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Every metric the server exports.
pub struct ServerMetrics {
    registry: Registry,
    /// Streams (run or thread) open now.
    pub followers: Gauge,
    /// Hubs live now: one per credential and namespace followed.
    pub hubs: Gauge,
    /// Watch requests open against the API server now.
    pub api_watches: Gauge,
    /// Bytes of events the streams hold for their clients now (`held`'s budget in use).
    pub stream_bytes: Gauge,
    /// Streams reading their ledger now: a replay, or a read again after a gap or a resync
    /// (the rest wait on their hub's live tail).
    pub replaying: Gauge,
    /// Requests answered, by HTTP status code.
    pub responses: Family<Vec<(&'static str, String)>, Counter>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("baton_server"),
            followers: Gauge::default(),
            hubs: Gauge::default(),
            api_watches: Gauge::default(),
            stream_bytes: Gauge::default(),
            replaying: Gauge::default(),
            responses: Family::default(),
        };
        m.registry
            .register("followers", "Streams open now", m.followers.clone());
        m.registry.register(
            "hubs",
            "Shared watch hubs live now (one per credential and namespace followed)",
            m.hubs.clone(),
        );
        m.registry.register(
            "api_watches",
            "Watch requests open against the Kubernetes API server now",
            m.api_watches.clone(),
        );
        m.registry.register(
            "stream_bytes_held",
            "Bytes of events the streams hold for their clients now, all together",
            m.stream_bytes.clone(),
        );
        m.registry.register(
            "streams_replaying",
            "Streams reading their ledger now (a replay, or again after a gap); the rest follow the live tail",
            m.replaying.clone(),
        );
        m.registry.register(
            "responses",
            "HTTP responses by status code",
            m.responses.clone(),
        );
        m
    }
}

impl ServerMetrics {
    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        crate::serving::admin::openmetrics_text(&self.registry)
    }
}

/// Counts one thing in a gauge for as long as it lives: a task aborted mid-await drops it, so
/// the count never depends on code after the await running.
pub struct Counted(Gauge);

impl Counted {
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}
