//! Spans of what happens around a run's attempts, under its root: each claim that landed,
//! written by the controller, from when the claim began to when its status landed; each wait
//! for a human's decision on a call, written by the attempt that applies the decision, from
//! the request to then (both at ids every process computes); and each stream a client
//! followed, written by `baton server` when it ends. (The root of a run the
//! controller ends itself is `super::late::run_ended`, as a worker's.) Traces off, the global
//! tracer builds nothing.

use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::{Span, Tracer};

use super::RunTrace;
use super::late::start;
use crate::crd::v1alpha1::{AgentRun, ApprovalOutcome};
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

/// A call that waited for a decision: step `step`, asked at `requested`, decided `outcome`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalWaited<'a> {
    pub step: i64,
    pub tool: &'a str,
    pub call_id: &'a str,
    pub outcome: ApprovalOutcome,
    pub requested: SystemTime,
}

/// Writes the span of the wait `waited`, ending now (the decision recorded).
pub fn approval_waited(trace: &RunTrace, waited: &ApprovalWaited) {
    let outcome = match waited.outcome {
        ApprovalOutcome::Approved => "approved",
        ApprovalOutcome::Denied => "denied",
        ApprovalOutcome::TimedOut => "timedOut",
    };
    let mut span = start(
        trace,
        trace.context(),
        trace.approval_wait(waited.step),
        "wait approval".into(),
        waited.requested,
        vec![
            KeyValue::new("baton.step", waited.step),
            KeyValue::new("gen_ai.tool.name", waited.tool.to_string()),
            KeyValue::new("gen_ai.tool.call.id", waited.call_id.to_string()),
            KeyValue::new("baton.decision", outcome),
        ],
    );
    span.end_with_timestamp(SystemTime::now());
}

/// A stream of a run a client follows, from after position `after`: its span is written
/// when it ends ([`StreamSpan::end`]).
#[derive(Debug, Clone)]
pub struct StreamSpan {
    trace: RunTrace,
    run: String,
    namespace: String,
    after: i64,
    began: SystemTime,
}

impl StreamSpan {
    /// A stream of `run` begins now.
    pub fn begin(run: &AgentRun, after: i64) -> Self {
        Self {
            trace: RunTrace::of(run),
            run: run.metadata.name.clone().unwrap_or_default(),
            namespace: run.metadata.namespace.clone().unwrap_or_default(),
            after,
            began: SystemTime::now(),
        }
    }

    /// Writes the stream's span, ended now as `ended` (`run`, `deleted`, `client_gone`,
    /// `failed`). Streams are many and none is written by another process, so its id is
    /// drawn, not computed.
    pub fn end(self, ended: &'static str) {
        let tracer = opentelemetry::global::tracer("baton");
        let builder = tracer
            .span_builder("stream")
            .with_start_time(self.began)
            .with_attributes(vec![
                KeyValue::new("baton.run", self.run),
                KeyValue::new("baton.namespace", self.namespace),
                KeyValue::new("baton.after", self.after),
                KeyValue::new("baton.ended", ended),
            ]);
        let mut span = tracer.build_with_context(builder, &self.trace.context());
        span.end_with_timestamp(SystemTime::now());
    }
}
