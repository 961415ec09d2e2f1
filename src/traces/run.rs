//! A run's ids in its trace, computed alike by every process from the run itself: the trace,
//! the root span (the run), each attempt's span and each of its tool calls' spans. A span
//! whose id anyone can compute can be written by whoever outlives its process: the attempt
//! that resumes a killed one ends the killed one's spans (`super::late`).

use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use sha2::{Digest, Sha256};

use super::TRACEPARENT_ANNOTATION;
use crate::crd::v1alpha1::AgentRun;
use crate::fence::Fence;

/// A run's place in a trace: its trace id, the id of its root span (the run) and the span the
/// run continues, if a caller's `traceparent` named one. Given a valid `traceparent`
/// annotation, the caller's trace id; else one of the run's UID. Every span id is the UID's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: TraceId,
    pub root: SpanId,
    /// The caller's span the run's root is a child of.
    pub parent: Option<SpanId>,
    /// What every span id of the run is derived from: a digest of its UID.
    seed: [u8; 32],
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
        RunTrace::from_parts(uid, given)
    }

    /// Pure: the trace of the run of UID `uid`, continuing the caller's span `given` if any.
    pub fn from_parts(uid: &str, given: Option<(TraceId, SpanId)>) -> RunTrace {
        let seed: [u8; 32] = Sha256::digest(format!("baton.dev/run/{uid}").as_bytes()).into();
        let mut trace = [0u8; 16];
        trace.copy_from_slice(&seed[..16]);
        let mut root = [0u8; 8];
        root.copy_from_slice(&seed[16..24]);
        RunTrace {
            trace_id: given.map_or(TraceId::from_bytes(trace), |(trace, _)| trace),
            root: SpanId::from_bytes(root),
            parent: given.map(|(_, span)| span),
            seed,
        }
    }

    /// The span of the attempt of fence `fence`.
    pub fn attempt(&self, fence: Fence) -> SpanId {
        self.derived(&format!("attempt/{}", fence.get()))
    }

    /// The span of tool call `step` as the attempt of fence `fence` ran it (a step re-run by a
    /// later attempt, after a probe found it safe to, is another span).
    pub fn tool(&self, fence: Fence, step: i64) -> SpanId {
        self.derived(&format!("tool/{}/{step}", fence.get()))
    }

    /// The span of the controller's claim of fence `fence` (the claim that made that attempt).
    pub fn claim(&self, fence: Fence) -> SpanId {
        self.derived(&format!("claim/{}", fence.get()))
    }

    /// The span of the run's wait for a decision on step `step` (between its attempts).
    pub fn approval_wait(&self, step: i64) -> SpanId {
        self.derived(&format!("wait/approval/{step}"))
    }

    /// The context whose (remote) span is the run's root: what an attempt's span is a child of.
    pub fn context(&self) -> Context {
        self.context_of(self.root)
    }

    /// The context whose (remote) span is `span` of this trace: what its children are under.
    pub fn context_of(&self, span: SpanId) -> Context {
        let remote = SpanContext::new(
            self.trace_id,
            span,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        Context::new().with_remote_span_context(remote)
    }

    /// The context of the caller's span the root continues, or none (the root is a root).
    pub fn parent_context(&self) -> Context {
        self.parent
            .map_or_else(Context::new, |span| self.context_of(span))
    }

    /// Pure: a span id of this run's, named `label`; never the invalid all-zero id.
    fn derived(&self, label: &str) -> SpanId {
        let mut hasher = Sha256::new();
        hasher.update(self.seed);
        hasher.update(label.as_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        if id == [0; 8] {
            id[7] = 1;
        }
        SpanId::from_bytes(id)
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
#[path = "run_tests.rs"]
mod tests;
