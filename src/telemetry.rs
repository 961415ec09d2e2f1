//! Logging shared by baton's processes: `tracing` to stderr, filtered by `RUST_LOG`
//! (default `info,kube=warn`), as human-readable text or as one JSON object per line.

use tracing_subscriber::EnvFilter;

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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// `RUST_LOG` if set and valid, else the default.
fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER))
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
}
