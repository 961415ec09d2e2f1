//! Span ids chosen by baton where it must: the SDK draws every span's id from its id generator
//! and ignores one set on a span's builder, so this generator hands out, once, the id pinned
//! on the calling thread, and a random one otherwise. A span is built on the thread that asks
//! for its context (`OpenTelemetrySpanExt::context`) or starts it (`Tracer::build`), so
//! pinning around that call gives it the id every process computes for it (`RunTrace`).

use std::cell::Cell;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

thread_local! {
    static PINNED: Cell<Option<SpanId>> = const { Cell::new(None) };
    /// For a span with no parent (a run's root), whose trace id the generator draws too.
    static PINNED_TRACE: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// The provider's id generator: the pinned id, else a random one.
#[derive(Debug, Default)]
pub struct PinnableIds {
    random: RandomIdGenerator,
}

impl IdGenerator for PinnableIds {
    fn new_trace_id(&self) -> TraceId {
        PINNED_TRACE
            .with(Cell::take)
            .unwrap_or_else(|| self.random.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        PINNED
            .with(Cell::take)
            .unwrap_or_else(|| self.random.new_span_id())
    }
}

/// Runs `start`, which builds one span on this thread; that span gets `id`. Traces off (no
/// span built), the pin is dropped all the same.
pub fn with_span_id<T>(id: SpanId, start: impl FnOnce() -> T) -> T {
    PINNED.with(|pin| pin.set(Some(id)));
    let started = start();
    PINNED.with(|pin| pin.set(None));
    started
}

/// Runs `start`, which builds one span without a parent on this thread; that span gets `id`
/// in trace `trace`.
pub fn with_ids<T>(trace: TraceId, id: SpanId, start: impl FnOnce() -> T) -> T {
    PINNED_TRACE.with(|pin| pin.set(Some(trace)));
    let started = with_span_id(id, start);
    PINNED_TRACE.with(|pin| pin.set(None));
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_id_is_handed_out_once_then_random_ones() {
        let ids = PinnableIds::default();
        let id = SpanId::from_hex("00f067aa0ba902b7").unwrap();
        let (first, second) = with_span_id(id, || (ids.new_span_id(), ids.new_span_id()));
        assert_eq!(first, id);
        assert_ne!(second, id);
        assert_ne!(ids.new_span_id(), id);
        with_span_id(id, || ());
        assert_ne!(
            ids.new_span_id(),
            id,
            "an unused pin does not outlive its call"
        );
    }
}
