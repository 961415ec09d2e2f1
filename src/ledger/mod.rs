//! The run's durable, append-only ledger (DESIGN.md §3).
//!
//! `replay` and `chunk` are pure: they turn segments into a conversation, a step record and a
//! salvage, and split events too large for one segment. `store` is the only I/O: the fenced
//! append and the ordered list.

mod chunk;
mod replay;
pub mod store;

pub use chunk::{EncodeError, SEGMENT_BUDGET_BYTES, encode_events, event_bytes};
pub use replay::{
    Replay, ReplayedMessage, ReplayedStep, StepState, ToolCallRecord, UNKNOWN_EFFECT_NOTICE,
};
pub use store::{Appended, SegmentStore};

use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment};

/// Errors of the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The run was claimed by a newer owner: this writer must stop writing for good.
    #[error(
        "ledger position {seq} holds fence {theirs}, newer than ours ({ours}): the run was lost"
    )]
    Superseded { seq: i64, ours: i64, theirs: i64 },
    /// The run was closed by the controller: nothing may be appended.
    #[error("ledger is closed at position {seq} (fence {fence})")]
    Closed { seq: i64, fence: i64 },
    /// Segments are not contiguous from 1.
    #[error("ledger has a gap: expected position {expected}, found {found}")]
    Gap { expected: i64, found: i64 },
    /// A segment with our name belongs to another run (a deleted run's leftovers).
    #[error("segment {name} belongs to another run")]
    ForeignSegment { name: String },
    /// A chunked event could not be rebuilt.
    #[error("corrupt chunked event at position {seq}: {detail}")]
    CorruptChunk { seq: i64, detail: String },
    /// Events cannot be stored.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl LedgerError {
    /// True when the writer lost the run and must never write again.
    pub fn is_lost(&self) -> bool {
        matches!(
            self,
            LedgerError::Superseded { .. } | LedgerError::Closed { .. }
        )
    }

    /// Low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LedgerError::Superseded { .. } => "superseded",
            LedgerError::Closed { .. } => "closed",
            LedgerError::Gap { .. } => "gap",
            LedgerError::ForeignSegment { .. } => "foreign_segment",
            LedgerError::CorruptChunk { .. } => "corrupt_chunk",
            LedgerError::Encode(_) => "encode",
            LedgerError::Kube(_) => "kube",
        }
    }
}

/// The name of a run's segment at `seq`. Zero-padded so `kubectl get` lists them in order.
pub fn segment_name(run: &str, seq: i64) -> String {
    format!("{run}-{seq:06}")
}

/// Checks that the segments (sorted by seq) are positions 1..=n, without gaps.
pub fn check_contiguous(segments: &[LedgerSegment]) -> Result<(), LedgerError> {
    for (i, seg) in segments.iter().enumerate() {
        let expected = i as i64 + 1;
        if seg.spec.seq != expected {
            return Err(LedgerError::Gap {
                expected,
                found: seg.spec.seq,
            });
        }
    }
    Ok(())
}

/// After any re-read: refuses to go on if a segment carries a newer fence, or closes the ledger.
pub fn check_still_owner(segments: &[LedgerSegment], fence: i64) -> Result<(), LedgerError> {
    for seg in segments {
        if seg.spec.fence > fence {
            return Err(LedgerError::Superseded {
                seq: seg.spec.seq,
                ours: fence,
                theirs: seg.spec.fence,
            });
        }
        if let Some(LedgerEvent::Closed { fence: closed, .. }) = seg
            .spec
            .events
            .iter()
            .find(|e| matches!(e, LedgerEvent::Closed { .. }))
        {
            return Err(LedgerError::Closed {
                seq: seg.spec.seq,
                fence: *closed,
            });
        }
    }
    Ok(())
}

/// What happened at a position we tried to create but found taken (DESIGN.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collision {
    /// Our own earlier attempt at this write landed (a retried request): success.
    OwnRetry,
    /// An older owner's last write slipped in before ours: replay it and append after it.
    OlderOwner,
    /// A newer owner holds the run: stop for good.
    NewerOwner,
}

/// Classifies the segment found at the position we wanted.
pub fn classify_collision(
    fence: i64,
    events: &[LedgerEvent],
    existing: &LedgerSegment,
) -> Collision {
    use std::cmp::Ordering::*;
    match existing.spec.fence.cmp(&fence) {
        Greater => Collision::NewerOwner,
        Less => Collision::OlderOwner,
        // Same fence, other content: only another writer with our fence could do that, and
        // there is none (one pod per fence); treating it as lost is the safe reading.
        Equal if existing.spec.events == events => Collision::OwnRetry,
        Equal => Collision::NewerOwner,
    }
}

/// Test fixture: segment `seq` of run `r`, written under `fence`.
#[cfg(test)]
pub fn test_segment(seq: i64, fence: i64, events: Vec<LedgerEvent>) -> LedgerSegment {
    LedgerSegment::new(
        &segment_name("r", seq),
        crate::crd::v1alpha1::LedgerSegmentSpec {
            run: "r".into(),
            seq,
            fence,
            format: 1,
            events,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::test_segment as seg;
    use super::*;

    #[test]
    fn segment_names_sort_in_ledger_order() {
        assert_eq!(segment_name("run", 7), "run-000007");
        assert!(segment_name("run", 10) > segment_name("run", 9));
    }

    #[test]
    fn a_collision_is_classified_by_fence_and_content() {
        let ours = vec![LedgerEvent::Handoff];
        assert_eq!(
            classify_collision(2, &ours, &seg(5, 2, ours.clone())),
            Collision::OwnRetry
        );
        assert_eq!(
            classify_collision(2, &ours, &seg(5, 1, vec![])),
            Collision::OlderOwner
        );
        assert_eq!(
            classify_collision(2, &ours, &seg(5, 3, ours.clone())),
            Collision::NewerOwner
        );
        assert_eq!(
            classify_collision(2, &ours, &seg(5, 2, vec![LedgerEvent::Stopped])),
            Collision::NewerOwner
        );
    }

    #[test]
    fn a_newer_fence_or_a_closed_ledger_ends_ownership() {
        let older = [seg(1, 1, vec![]), seg(2, 2, vec![])];
        assert!(check_still_owner(&older, 2).is_ok());
        assert!(matches!(
            check_still_owner(&older, 1),
            Err(LedgerError::Superseded { seq: 2, .. })
        ));
        let closed = [seg(
            1,
            1,
            vec![LedgerEvent::Closed {
                fence: 1,
                reason: "x".into(),
            }],
        )];
        assert!(check_still_owner(&closed, 1).unwrap_err().is_lost());
    }

    #[test]
    fn contiguity_is_checked_from_one() {
        assert!(check_contiguous(&[seg(1, 1, vec![]), seg(2, 1, vec![])]).is_ok());
        assert!(matches!(
            check_contiguous(&[seg(2, 1, vec![])]),
            Err(LedgerError::Gap {
                expected: 1,
                found: 2
            })
        ));
    }
}
