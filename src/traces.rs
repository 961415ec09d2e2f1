//! Traces (docs/operations.md, "Traces"): off unless an OTLP endpoint is configured by the
//! standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`;
//! `OTEL_SDK_DISABLED=true` turns them off again). Then the spans baton opens under the
//! target [`TARGET`] (an attempt, each model call, each tool call) are exported over
//! OTLP/HTTP by the `opentelemetry` crates, through `tracing-opentelemetry`; the spans of
//! logging alone are not.
//!
//! A run is one trace however many attempts and processes serve it: its ids are the run's own
//! ([`RunTrace`]), computed by every process from the run, never carried from one attempt to
//! the next (a killed attempt carries nothing).

use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sha2::{Digest, Sha256};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::crd::v1alpha1::AgentRun;

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
            .build();
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
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target() == TARGET
            }))
    }

    /// Exports what is still buffered (a process's last spans), then stops.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            eprintln!("traces: the last spans were not all exported: {err}");
        }
    }
}

/// Where a controller's worker pods export their traces: the variables it gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerTraces {
    /// The OTLP/HTTP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: String,
    /// The share of runs traced, by their trace id (`traceidratio`): the same decision in
    /// every attempt of a run.
    pub sampling: f64,
}

impl WorkerTraces {
    /// The worker container's variables.
    pub fn env(&self) -> [(&'static str, String); 3] {
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_TRACES_SAMPLER", "traceidratio".into()),
            ("OTEL_TRACES_SAMPLER_ARG", self.sampling.to_string()),
        ]
    }
}

/// Pure: whether the OTLP variables `var` reads turn traces on.
fn configured(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// A run's place in a trace: its trace id and the id of its root span (the run), the same in
/// every process that computes them. Given a valid `traceparent` annotation, the caller's trace
/// id; else one of the run's UID. The root span's id is always the UID's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: TraceId,
    pub root: SpanId,
}

impl RunTrace {
    /// The trace of `run` (read from the API server: it has a UID).
    pub fn of(run: &AgentRun) -> RunTrace {
        let uid = run.metadata.uid.as_deref().unwrap_or_default();
        let given = run
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRACEPARENT_ANNOTATION))
            .and_then(|t| parse_traceparent(t));
        RunTrace::from_parts(uid, given.map(|(trace, _)| trace))
    }

    /// Pure: the trace of the run of UID `uid`, in the caller's trace `given` if any.
    pub fn from_parts(uid: &str, given: Option<TraceId>) -> RunTrace {
        let digest = Sha256::digest(format!("baton.dev/run/{uid}").as_bytes());
        let mut trace = [0u8; 16];
        trace.copy_from_slice(&digest[..16]);
        let mut root = [0u8; 8];
        root.copy_from_slice(&digest[16..24]);
        RunTrace {
            trace_id: given.unwrap_or(TraceId::from_bytes(trace)),
            root: SpanId::from_bytes(root),
        }
    }

    /// The context whose (remote) span is the run's root: what an attempt's span is a child of.
    pub fn context(&self) -> Context {
        let root = SpanContext::new(
            self.trace_id,
            self.root,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        Context::new().with_remote_span_context(root)
    }
}

/// Pure: the trace and parent span ids of a W3C `traceparent` (version 00), or None when it
/// is not one (all-zero ids are invalid).
pub fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId)> {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let [version, trace, span, flags] = parts.as_slice() else {
        return None;
    };
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if *version != "00" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    (trace != TraceId::INVALID && span != SpanId::INVALID).then_some((trace, span))
}

#[cfg(test)]
#[path = "traces_tests.rs"]
mod tests;
