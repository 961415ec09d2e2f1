//! The fenced append, once for both ledger backends (docs/protocol.md): events split into
//! groups, each group created at `tail + 1` if the position is free; a taken position goes to
//! [`crate::fence::verdict`], which says "done", "move past it" or "lost". A backend supplies
//! only its [`Positions`]: how to create a segment at a position, or read the one in the way.

use std::future::Future;

use kube::api::ObjectMeta;

use super::{LedgerError, encode_events, is_segment_of, lost_to};
use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment, LedgerSegmentSpec};
use crate::fence::{Fence, Verdict, segment_name, verdict};
use crate::owned::run_labels;

/// Where an append landed.
#[derive(Debug, Clone, Default)]
pub struct Appended {
    /// Position of the last segment written: the new tail.
    pub tail: i64,
    /// Segments of older owners that slipped in before ours. They are legitimate history:
    /// the caller folds them into its replay.
    pub slipped: Vec<LedgerSegment>,
    /// Segments this append created (more than one when events were split).
    pub written: Vec<LedgerSegment>,
}

/// What a backend found at one position.
#[derive(Debug)]
pub(crate) enum AtPosition {
    /// The position was free: this segment is now there.
    Created(LedgerSegment),
    /// The position was taken: by this segment.
    Taken(LedgerSegment),
}

/// One run's ledger as a backend stores it: the one primitive the fence needs.
pub(crate) trait Positions {
    /// The run (name, UID) whose ledger this is.
    fn run(&self) -> (&str, &str);
    /// Serialized events per segment, at most.
    fn budget(&self) -> usize;
    /// Creates the segment `seq` of `fence` holding `events` if the position is free, else
    /// returns the segment that holds it.
    fn create_at(
        &self,
        seq: i64,
        fence: Fence,
        events: &[LedgerEvent],
    ) -> impl Future<Output = Result<AtPosition, LedgerError>> + Send;
}

/// Fenced append: writes `events` at `tail + 1` onwards under `fence`.
///
/// A position taken by our own retried write is success; one taken by an older owner is
/// history to replay and we move past it; one taken by a newer owner, or a closed ledger,
/// means the run is lost and nothing more is written. A segment in the way that is not this
/// run's by its marks ([`is_segment_of`]) stops the append.
pub(crate) async fn append_fenced<P: Positions + Sync>(
    positions: &P,
    tail: i64,
    fence: Fence,
    events: Vec<LedgerEvent>,
) -> Result<Appended, LedgerError> {
    let mut appended = Appended {
        tail,
        ..Appended::default()
    };
    for group in encode_events(events, positions.budget())? {
        loop {
            let seq = appended.tail + 1;
            let existing = match positions.create_at(seq, fence, &group).await? {
                AtPosition::Created(created) => {
                    appended.tail = seq;
                    appended.written.push(created);
                    break;
                }
                AtPosition::Taken(existing) => existing,
            };
            let (run, uid) = positions.run();
            if !is_segment_of(&existing, run, uid) {
                return Err(LedgerError::ForeignSegment {
                    name: kube::ResourceExt::name_any(&existing),
                });
            }
            if settle(&mut appended, fence, &group, existing)? == Next::Stored {
                break;
            }
        }
    }
    Ok(appended)
}

/// What an append at `existing`'s position does next.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// The group is stored (ours landed, perhaps by an earlier try of this very request).
    Stored,
    /// An older owner's segment holds the position: it is history; try the next position.
    TryNext,
}

/// Settles an append of `events` under `fence` that found `existing` at its position:
/// recorded in `appended` as ours or as history slipped in, or the run is lost.
fn settle(
    appended: &mut Appended,
    fence: Fence,
    events: &[LedgerEvent],
    existing: LedgerSegment,
) -> Result<Next, LedgerError> {
    let seq = existing.spec.seq;
    match verdict(fence, &existing, Some(events)) {
        Verdict::OwnRetry => {
            appended.tail = seq;
            appended.written.push(existing);
            Ok(Next::Stored)
        }
        Verdict::Older => {
            appended.tail = seq;
            appended.slipped.push(existing);
            Ok(Next::TryNext)
        }
        lost => Err(lost_to(&existing, lost, fence)),
    }
}

/// A segment of `run` (UID `uid`) at `seq`, with the three marks a reader checks
/// ([`super::is_segment_of`]): its name, `spec.run` and the UID label. Each backend adds
/// what its store needs (an owner reference, a namespace).
pub(crate) fn segment_of_run(
    run: &str,
    uid: &str,
    seq: i64,
    fence: Fence,
    events: Vec<LedgerEvent>,
) -> LedgerSegment {
    let mut labels = run_labels(run);
    labels.insert(RUN_UID_LABEL.to_string(), uid.to_string());
    LedgerSegment {
        metadata: ObjectMeta {
            name: Some(segment_name(run, seq)),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: LedgerSegmentSpec {
            run: run.to_string(),
            seq,
            fence,
            format: crate::crd::v1alpha1::LEDGER_FORMAT_VERSION,
            events,
        },
    }
}

#[cfg(test)]
#[path = "append_tests.rs"]
mod tests;
