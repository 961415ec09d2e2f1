//! The controller's spans in a run's trace: each claim that landed, under the run's root at the
//! id every process computes (`RunTrace::claim`), from when the claim began to when its status
//! landed. (The root of a run the controller ends itself is `super::late::run_ended`, as a
//! worker's.) Traces off, the global tracer builds nothing.

use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::Span;

use super::RunTrace;
use super::late::start;
use crate::fence::Fence;

/// A claim that landed: attempt `fence` of run `run`, for pod `pod`, because of `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed<'a> {
    pub run: &'a str,
    pub namespace: &'a str,
    pub fence: Fence,
    pub pod: &'a str,
    /// Why (`ClaimReason`: `First`, `LeaseExpired`, `PodGone`, `Handoff`...).
    pub reason: &'static str,
    /// Whether the attempt before died (a takeover) rather than ended.
    pub takeover: bool,
    pub began: SystemTime,
}

/// Writes the span of `claim`, ending now.
pub fn claimed(trace: &RunTrace, claim: &Claimed) {
    let mut span = start(
        trace,
        trace.context(),
        trace.claim(claim.fence),
        format!("claim {}", claim.fence),
        claim.began,
        vec![
            KeyValue::new("baton.run", claim.run.to_string()),
            KeyValue::new("baton.namespace", claim.namespace.to_string()),
            KeyValue::new("baton.fence", claim.fence.get()),
            KeyValue::new("baton.pod", claim.pod.to_string()),
            KeyValue::new("baton.reason", claim.reason),
            KeyValue::new("baton.takeover", claim.takeover),
        ],
    );
    span.end_with_timestamp(SystemTime::now());
}
