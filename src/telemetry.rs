//! Logging shared by baton's processes: `tracing` to stderr, filtered by `RUST_LOG`
//! (default `info,kube=warn`), as human-readable text or as one JSON object per line.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::traces::Traces;

/// A span named `$name` about one run, with the fields every run span carries (docs/operations.md,
/// "Logs"): `run`, `namespace`, `fence` and `attempt` as the run's status has them. A macro
/// because a span's name is part of its static metadata.
#[macro_export]
macro_rules! run_span {
    ($name:literal, $run:expr) => {{
        let run: &$crate::crd::v1alpha1::AgentRun = $run;
        let status = run.status.as_ref();
        tracing::info_span!(
            $name,
            run = run.metadata.name.as_deref().unwrap_or_default(),
            namespace = run.metadata.namespace.as_deref().unwrap_or_default(),
            fence = %$crate::fence::Fence::of_run(run),
            attempt = status.map_or(0, |s| s.attempt),
        )
    }};
}

/// The filter used when `RUST_LOG` is unset or invalid.
pub const DEFAULT_LOG_FILTER: &str = "info,kube=warn";

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line, with the event's fields and its spans' fields.
    Json,
}

/// Installs the global subscriber. Later calls (tests, a second init) are no-ops.
pub fn init_logging(format: LogFormat) {
    init(format, None);
}

/// [`init_logging`], and traces exported as `service` when the environment configures an
/// OTLP endpoint (`crate::traces`): the exporter, to be shut down as the process ends.
pub fn init_logging_and_traces(format: LogFormat, service: &'static str) -> Option<Traces> {
    init(format, Some(service))
}

fn init(format: LogFormat, service: Option<&'static str>) -> Option<Traces> {
    let traces = service.and_then(Traces::from_env);
    let exported = traces.as_ref().map(|t| t.layer());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => lines.json().boxed(),
    };
    // `RUST_LOG` filters the lines alone: the exported spans have their own filter (their
    // target), so `RUST_LOG=warn` quiets a worker's log without emptying its traces.
    let installed = tracing_subscriber::registry()
        .with(lines.with_filter(filter()))
        .with(exported)
        .try_init();
    installed.ok().and(traces)
}

/// `RUST_LOG` if set and valid, else the default.
fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER))
}

/// What a test logs, as text, caught by a subscriber of its own (set for the test's thread).
#[cfg(test)]
pub(crate) mod caught {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    pub struct Caught(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Caught {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Caught {
        /// Catches everything logged on this thread until the guard is dropped.
        pub fn on_this_thread(&self) -> tracing::subscriber::DefaultGuard {
            let writer = self.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_default(subscriber)
        }

        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    #[test]
    fn formats_parse_from_their_flag_values() {
        assert_eq!(LogFormat::from_str("text", false), Ok(LogFormat::Text));
        assert_eq!(LogFormat::from_str("json", false), Ok(LogFormat::Json));
        assert!(LogFormat::from_str("yaml", false).is_err());
        assert_eq!(LogFormat::default(), LogFormat::Text);
    }

    #[test]
    fn the_default_filter_parses() {
        assert!(EnvFilter::try_new(DEFAULT_LOG_FILTER).is_ok());
    }

    #[test]
    fn a_run_span_names_the_run_its_namespace_fence_and_attempt() {
        let caught = caught::Caught::default();
        let _guard = caught.on_this_thread();
        let run: crate::crd::v1alpha1::AgentRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": "r1", "namespace": "team-a"},
            "spec": {"input": "hi"},
            "status": {"fence": 3, "attempt": 3}
        }))
        .expect("a run");
        crate::run_span!("claim", &run).in_scope(|| tracing::info!("claimed"));
        let text = caught.text();
        assert!(
            text.contains("claim{run=\"r1\" namespace=\"team-a\" fence=3 attempt=3}: "),
            "{text}"
        );
    }
}
