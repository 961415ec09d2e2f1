//! The one follower's order (pure): segments read from a live watch and from the ledger arrive
//! in any order and some twice; a reader releases them only in ledger order, each once. The
//! server's streams and the CLI's `transcript -f` and `chat` follow a ledger through it.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::crd::v1alpha1::LedgerSegment;

/// The segments a reader has not released yet, released only in order: a segment that
/// arrives ahead of one still missing waits for it. `S` is how the reader holds a segment (the
/// server shares each among its streams).
#[derive(Debug)]
pub struct Contiguous<S = Arc<LedgerSegment>> {
    tail: i64,
    pending: BTreeMap<i64, S>,
}

impl<S: Borrow<LedgerSegment>> Contiguous<S> {
    /// Nothing at or before `tail` will be released.
    pub fn after(tail: i64) -> Self {
        Self {
            tail,
            pending: BTreeMap::new(),
        }
    }

    /// The last position released.
    pub fn tail(&self) -> i64 {
        self.tail
    }

    /// Takes a segment in; one at or before the tail (already released) is dropped.
    pub fn offer(&mut self, segment: S) {
        let seq = segment.borrow().spec.seq;
        if seq > self.tail {
            self.pending.insert(seq, segment);
        }
    }

    /// The segments that now follow the tail without a gap, in order; the tail moves past
    /// them.
    pub fn release(&mut self) -> Vec<S> {
        let mut out = Vec::new();
        while let Some(segment) = self.pending.remove(&(self.tail + 1)) {
            self.tail += 1;
            out.push(segment);
        }
        out
    }

    /// True when a later segment waits for a missing one: the ledger must be read again.
    pub fn has_gap(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::LedgerSegmentSpec;
    use crate::fence::Fence;

    fn seg(seq: i64) -> Arc<LedgerSegment> {
        Arc::new(LedgerSegment::new(
            &format!("r-{seq}"),
            LedgerSegmentSpec {
                run: "r".into(),
                seq,
                fence: Fence::new(1),
                format: 1,
                events: vec![],
            },
        ))
    }

    fn seqs(list: &[Arc<LedgerSegment>]) -> Vec<i64> {
        list.iter().map(|s| s.spec.seq).collect()
    }

    #[test]
    fn segments_are_released_in_order_without_gaps_or_repeats() {
        let mut c = Contiguous::after(2);
        c.offer(seg(4));
        c.offer(seg(2));
        assert!(c.release().is_empty());
        assert!(c.has_gap());
        c.offer(seg(3));
        c.offer(seg(3));
        assert_eq!(seqs(&c.release()), vec![3, 4]);
        assert!(!c.has_gap());
        c.offer(seg(4));
        assert!(c.release().is_empty());
        assert_eq!(c.tail(), 4);
    }

    #[test]
    fn a_reader_holding_segments_by_value_is_served_alike() {
        let mut c: Contiguous<LedgerSegment> = Contiguous::after(0);
        c.offer((*seg(2)).clone());
        c.offer((*seg(1)).clone());
        let released: Vec<i64> = c.release().iter().map(|s| s.spec.seq).collect();
        assert_eq!(released, vec![1, 2]);
    }
}
