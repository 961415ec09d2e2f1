//! What the CLI and the web console show alike: text from models, tools and users with what
//! a terminal would obey or that reorders it made visible (`neutral.rs`), and kubectl-style
//! ages.

mod neutral;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

pub use neutral::{Neutral, neutralize, reorders_or_controls};

/// A kubectl-style age: `45s`, `12m`, `3h`, `2d`.
pub fn age(since: Option<&Time>, now: Timestamp) -> String {
    let Some(since) = since else {
        return "<unknown>".into();
    };
    let secs = now.as_second().saturating_sub(since.0.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}
