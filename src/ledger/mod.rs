//! The run's durable, append-only ledger (docs/protocol.md), in layers, each using only the
//! ones above it:
//!
//! 1. `model`: pure folds of segments (the conversation, the step record, the salvage; chunked
//!    events put back together; a turn's history);
//! 2. `append`: the fenced append every backend makes, written once;
//! 3. `backends`: LedgerSegments in the API server (`SegmentStore`) and rows in PostgreSQL;
//! 4. `served`: the ledger `baton server` serves for runs kept in PostgreSQL, its wire and its
//!    client (`LedgerClient`);
//!
//! and one door, `RunLedger` (`run_ledger`), which callers use, choosing the backend a run's
//! status records; a turn's history is read through it (`thread_history`). What every layer
//! reads by (this module): the errors, whether a segment is the run's own by all three of its
//! marks (`is_segment_of`), and contiguity.

mod append;
mod backends;
mod model;
mod run_ledger;
pub mod served;
mod thread_history;

pub use append::Appended;
pub(crate) use append::segment_of_run;
pub use backends::postgres;
pub use backends::store::SegmentStore;
pub use model::chunk::{EncodeError, SEGMENT_BUDGET_BYTES, Unchunker, encode_events, event_bytes};
pub use model::contiguous::Contiguous;
pub use model::history::{
    ENDED_WITHOUT_RESULT, Fitted, FixedHistory, HistoryError, estimated_tokens, fit,
    recorded_history, turn_conversation, turns_in_listing,
};
pub use model::journal;
pub use model::model_api;
pub use model::replay::{
    Replay, ReplayedMessage, ReplayedStep, StepState, ToolCallRecord, UNKNOWN_EFFECT_NOTICE,
};
pub use run_ledger::{Ledgers, RunLedger};
pub use served::{LedgerClient, LedgerToken, ServedLedger};
pub use thread_history::EarlierTurns;

use crate::crd::v1alpha1::LedgerSegment;
#[cfg(test)]
use crate::fence::CloseReason;
use crate::fence::{Fence, Verdict, verdict};

/// Errors of the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The run was claimed by a newer owner: this writer must stop writing for good.
    #[error(
        "ledger position {seq} holds fence {theirs}, newer than ours ({ours}): the run was lost"
    )]
    Superseded {
        seq: i64,
        ours: Fence,
        theirs: Fence,
    },
    /// The run was closed by the controller: nothing may be appended.
    #[error("ledger is closed at position {seq} (fence {fence})")]
    Closed { seq: i64, fence: Fence },
    /// The run was deleted and its ledger with it (a run kept in PostgreSQL: its rows are
    /// deleted behind a tombstone that refuses every later append): nothing may be appended.
    #[error("the run was deleted: its ledger takes no segment (position {seq})")]
    Deleted { seq: i64 },
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
    #[error(transparent)]
    Postgres(#[from] postgres::PgError),
    /// `baton server`, serving the run's ledger, refused or failed the request (its code,
    /// if it answered, and its message).
    #[error("ledger server: {message}")]
    Served { code: Option<u16>, message: String },
    /// This process cannot make its request to the ledger server at all: its token file, the
    /// server's CA or its address. Not an answer of the server, and no retry gets past it
    /// (the kubelet swaps a projected token's file whole, so a read does not fail midway).
    #[error("ledger server client: {message}")]
    Client { message: String },
    /// The run's ledger is kept where this process cannot reach.
    #[error("the run's ledger is kept in {backend:?}, which this process cannot reach")]
    BackendUnavailable {
        backend: crate::crd::v1alpha1::LedgerBackend,
    },
}

impl LedgerError {
    /// True when the writer lost the run and must never write again.
    pub fn is_lost(&self) -> bool {
        matches!(
            self,
            LedgerError::Superseded { .. }
                | LedgerError::Closed { .. }
                | LedgerError::Deleted { .. }
        )
    }

    /// A failure a retry may get past: the ledger server, its database or the API server
    /// unreachable or overloaded. Not a refusal, a lost run or a broken ledger (the ledger
    /// server answers those 4xx and 500).
    pub fn is_transient(&self) -> bool {
        match self {
            LedgerError::Served { code, .. } => code.is_none_or(|c| matches!(c, 429 | 502..=504)),
            LedgerError::Kube(e) => kube_is_transient(e),
            LedgerError::Postgres(e) => e.is_connection(),
            _ => false,
        }
    }

    /// Low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LedgerError::Superseded { .. } => "superseded",
            LedgerError::Closed { .. } => "closed",
            LedgerError::Deleted { .. } => "deleted",
            LedgerError::Gap { .. } => "gap",
            LedgerError::ForeignSegment { .. } => "foreign_segment",
            LedgerError::CorruptChunk { .. } => "corrupt_chunk",
            LedgerError::Encode(_) => "encode",
            LedgerError::Kube(_) => "kube",
            LedgerError::Postgres(_) => "postgres",
            LedgerError::BackendUnavailable { .. } => "backend_unavailable",
            LedgerError::Served { .. } => "served",
            LedgerError::Client { .. } => "client",
        }
    }
}

/// A failed request to the API server a retry may get past: it was overloaded (429), failed
/// (5xx), or the connection broke (refused, reset, cut mid-body).
pub fn kube_is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        e => matches!(
            e,
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_)
        ),
    }
}

/// True when `seg` is a segment of the run named `run` with UID `uid` by all three of its
/// marks: its name (`<run>-<seq>`), `spec.run` and its UID label. Whoever may create segments
/// chooses all three; a reader takes for the run's only a segment whose marks agree, so a
/// segment named for another run cannot slip into this run's ledger by its label.
pub fn is_segment_of(seg: &LedgerSegment, run: &str, uid: &str) -> bool {
    use kube::ResourceExt;
    seg.spec.run == run
        && seg.name_any() == crate::fence::segment_name(run, seg.spec.seq)
        && seg
            .labels()
            .get(crate::crd::RUN_UID_LABEL)
            .map(String::as_str)
            == Some(uid)
}

/// The segments of run `run` (UID `uid`) among `segments` (as a server answered), ordered
/// and checked contiguous after position `after`.
pub fn own_segments_after(
    mut segments: Vec<LedgerSegment>,
    run: &str,
    uid: &str,
    after: i64,
) -> Result<Vec<LedgerSegment>, LedgerError> {
    segments.retain(|s| is_segment_of(s, run, uid));
    segments.sort_by_key(|s| s.spec.seq);
    check_contiguous_after(after, &segments)?;
    Ok(segments)
}

/// Checks that the segments (sorted by seq) are positions 1..=n, without gaps.
pub fn check_contiguous(segments: &[LedgerSegment]) -> Result<(), LedgerError> {
    check_contiguous_after(0, segments)
}

/// Checks that the segments (sorted by seq) are positions `after + 1`.., without gaps.
pub fn check_contiguous_after(after: i64, segments: &[LedgerSegment]) -> Result<(), LedgerError> {
    for (i, seg) in segments.iter().enumerate() {
        let expected = after + i as i64 + 1;
        if seg.spec.seq != expected {
            return Err(LedgerError::Gap {
                expected,
                found: seg.spec.seq,
            });
        }
    }
    Ok(())
}

/// After any re-read: refuses to go on if the segments end this writer's ownership (the
/// verdict of [`crate::fence`]: a newer fence or a `closed` seal).
pub fn check_still_owner(segments: &[LedgerSegment], fence: Fence) -> Result<(), LedgerError> {
    for seg in segments {
        let verdict = verdict(fence, seg, None);
        if verdict.ends_ownership() {
            return Err(lost_to(seg, verdict, fence));
        }
    }
    Ok(())
}

/// The error for a verdict that ended ownership at `seg`: a `closed` seal, else a newer owner.
pub(crate) fn lost_to(seg: &LedgerSegment, verdict: Verdict, ours: Fence) -> LedgerError {
    match verdict {
        Verdict::Closed { fence, .. } => LedgerError::Closed {
            seq: seg.spec.seq,
            fence,
        },
        _ => LedgerError::Superseded {
            seq: seg.spec.seq,
            ours,
            theirs: seg.spec.fence,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::LedgerEvent;

    use crate::fence::test_segment as seg;

    #[test]
    fn an_unreachable_or_overloaded_server_is_transient_a_refusal_or_broken_ledger_is_not() {
        let served = |code| LedgerError::Served {
            code,
            message: String::new(),
        };
        for transient in [None, Some(429), Some(503), Some(502)] {
            assert!(served(transient).is_transient(), "{transient:?}");
        }
        for lasting in [Some(400), Some(401), Some(403), Some(404), Some(500)] {
            assert!(!served(lasting).is_transient(), "{lasting:?}");
        }
        assert!(
            !LedgerError::Gap {
                expected: 2,
                found: 3
            }
            .is_transient()
        );
        assert!(
            !LedgerError::Closed {
                seq: 1,
                fence: Fence::new(1)
            }
            .is_transient()
        );
    }

    #[test]
    fn a_segment_is_the_runs_only_when_name_run_and_label_agree() {
        use kube::ResourceExt;
        let labelled = |mut s: LedgerSegment, uid: &str| {
            s.labels_mut()
                .insert(crate::crd::RUN_UID_LABEL.into(), uid.into());
            s
        };
        let ours = labelled(seg(3, 1, vec![]), "u");
        assert!(is_segment_of(&ours, "r", "u"));
        assert!(!is_segment_of(&ours, "r", "other-uid"));
        assert!(!is_segment_of(&seg(3, 1, vec![]), "r", "u"), "no label");
        let mut renamed = ours.clone();
        renamed.metadata.name = Some("x-000003".into());
        assert!(!is_segment_of(&renamed, "r", "u"), "named for another run");
        let mut claims_other = ours.clone();
        claims_other.spec.run = "x".into();
        assert!(
            !is_segment_of(&claims_other, "r", "u"),
            "spec.run of another run"
        );
        let mut moved = ours;
        moved.spec.seq = 4;
        assert!(
            !is_segment_of(&moved, "r", "u"),
            "its name is not its position"
        );
    }

    #[test]
    fn a_newer_fence_or_a_closed_ledger_ends_ownership() {
        let older = [seg(1, 1, vec![]), seg(2, 2, vec![])];
        assert!(check_still_owner(&older, Fence::new(2)).is_ok());
        assert!(matches!(
            check_still_owner(&older, Fence::new(1)),
            Err(LedgerError::Superseded { seq: 2, .. })
        ));
        let closed = [seg(
            1,
            1,
            vec![LedgerEvent::Closed {
                fence: Fence::new(1),
                reason: CloseReason::StopRequested,
            }],
        )];
        assert!(
            check_still_owner(&closed, Fence::new(1))
                .unwrap_err()
                .is_lost()
        );
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
