//! Traces (docs/operations.md, "Traces"): off unless an OTLP endpoint is configured by the
//! standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`;
//! `OTEL_SDK_DISABLED=true` turns them off again). Then the spans baton opens under the
//! target [`TARGET`] (an attempt, each model call, each tool call) are exported over
//! OTLP/HTTP by the `opentelemetry` crates, through `tracing-opentelemetry`; the spans of
//! logging alone are not.
//!
//! A run is one trace however many attempts and processes serve it: its ids are the run's own
//! ([`RunTrace`]), computed by every process from the run, never carried from one attempt to
//! the next (a killed attempt carries nothing). The spans a killed attempt never exported are
//! written by the attempt that resumes it ([`late`]), under the same ids. What happens between
//! attempts ([`between`]): the controller's claims, and a call's wait for a human's decision;
//! the controller also writes the root of a run it ends itself.

use opentelemetry::trace::TracerProvider;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The target of the spans that are exported; every other span is logging's alone.
pub const TARGET: &str = "baton::trace";

/// A W3C `traceparent` given at a run's creation: the run's trace continues the caller's.
pub const TRACEPARENT_ANNOTATION: &str = "baton.dev/traceparent";

/// The exporter of one process, when traces are on.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// The exporter the environment configures for `service`, or None: traces are off.
    pub fn from_env(service: &'static str) -> Option<Traces> {
        if !configured(|k| std::env::var(k).ok()) {
            return None;
        }
        crate::kube_util::ensure_crypto_provider();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build();
        let exporter = match exporter {
            Ok(exporter) => exporter,
            Err(err) => {
                eprintln!("traces are off: the OTLP exporter cannot be built: {err}");
                return None;
            }
        };
        let resource = Resource::builder().with_service_name(service).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .with_id_generator(ids::PinnableIds::default())
            .build();
        // Spans written after the fact (`late`) are built with the OpenTelemetry API alone.
        opentelemetry::global::set_tracer_provider(provider.clone());
        Some(Traces { provider })
    }

    /// The layer that exports the spans of [`TARGET`].
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("baton");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Every span of TARGET is INFO (`crate::worker::spans`): the hint lets `tracing`
            // skip the callsites of DEBUG and TRACE without asking the filter.
            .with_filter(
                tracing_subscriber::filter::filter_fn(|meta| meta.target() == TARGET)
                    .with_max_level_hint(tracing::level_filters::LevelFilter::INFO),
            )
    }

    /// Exports what is still buffered (a process's last spans), then stops.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            eprintln!("traces: the last spans were not all exported: {err}");
        }
    }
}

/// The W3C `traceparent` of the current span, when it is exported (traces on, the span's
/// target [`TARGET`]): what a tool call hands its tool.
pub fn current_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = tracing::Span::current().context();
    let span = context.span();
    let ids = span.span_context();
    ids.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            ids.trace_id(),
            ids.span_id(),
            ids.trace_flags().to_u8()
        )
    })
}

/// Where a controller's worker pods export their traces: the variables it gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerTraces {
    /// The OTLP/HTTP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: String,
    /// The share of runs traced, by their trace id (`traceidratio`): the same decision in
    /// every attempt of a run.
    pub sampling: f64,
    /// Whether spans carry what was said ([`content`]): off unless the operator opts in.
    pub content: bool,
}

impl WorkerTraces {
    /// The worker container's variables.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_TRACES_SAMPLER", "traceidratio".into()),
            ("OTEL_TRACES_SAMPLER_ARG", self.sampling.to_string()),
        ];
        if self.content {
            vars.push((content::CONTENT_ENV, "true".into()));
        }
        vars
    }
}

/// Pure: whether the OTLP variables `var` reads turn traces on.
fn configured(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

pub mod between;
pub mod content;
mod ids;
pub mod late;
mod run;

pub use ids::with_span_id;
pub use run::{RunTrace, parse_traceparent};

#[cfg(test)]
mod tests {
    use super::configured;

    #[test]
    fn traces_are_on_only_with_an_endpoint_and_not_disabled() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!configured(env(&[])));
        assert!(!configured(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://c:4318"
        )])));
        assert!(configured(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces"
        )])));
        assert!(!configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
    }
}
