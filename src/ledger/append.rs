//! What both ledger backends do when an append meets a taken position: the one place that
//! turns [`crate::fence::verdict`] into "done", "move past it" or "lost". The backends differ
//! only in how they create a segment and read the one in the way.

use kube::api::ObjectMeta;

use super::{LedgerError, lost_to};
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

/// What an append at `existing`'s position does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The group is stored (ours landed, perhaps by an earlier try of this very request).
    Stored,
    /// An older owner's segment holds the position: it is history; try the next position.
    TryNext,
}

/// Settles an append of `events` under `fence` that found `existing` at its position:
/// recorded in `appended` as ours or as history slipped in, or the run is lost.
pub(crate) fn settle(
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
