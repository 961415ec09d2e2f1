//! Where a claim finds the end of a run's ledger (docs/protocol.md), cheaply: from the seal this
//! controller remembers, or the size the worker reported, probing the positions after it in
//! the API server's watch cache; listing the run's segments only as a last resort.

use kube::api::{GetParams, ListParams};
use kube::{Api, ResourceExt};

use super::Error;
use super::context::Context;
use crate::crd::RUN_UID_LABEL;
use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::fence::{
    CloseReason, Fence, Verdict, follows, ledger_verdict, segment_name, verdict, written_before,
};
use crate::kube_util::is_not_found;
use crate::ledger::{RunLedger, is_segment_of};

/// Where a claim for `fence` finds the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerEnd {
    /// Append the seal after this position.
    Tail(i64),
    /// A segment of this very fence (its seal) is already at this position (0: not known).
    Sealed(i64),
    /// A newer fence: the claim is lost.
    Lost,
    /// A `closed` seal: the run ended at `fence` for `reason`, perhaps without its terminal
    /// status (the controller that sealed it stopped first): the claim completes that end.
    Closed { fence: Fence, reason: CloseReason },
}

/// The end of a run's ledger, and the names of the segments met that claim the run (its UID
/// label) without being its own. Only the listing path meets those; the probes read positions
/// by the run's own segment names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub end: LedgerEnd,
    pub claimants: Vec<String>,
}

impl From<LedgerEnd> for Found {
    fn from(end: LedgerEnd) -> Found {
        Found {
            end,
            claimants: Vec::new(),
        }
    }
}

/// How a claim for `fence` reads one segment met on its way to the end of the ledger
/// (None: older history, walk on), by the one ownership rule, [`verdict`].
pub fn classify_seen(segment: &LedgerSegment, fence: Fence) -> Option<LedgerEnd> {
    LedgerEnd::ending(verdict(fence, segment, None), segment.spec.seq)
}

impl LedgerEnd {
    /// Where a verdict leaves the claim, our own fence's segment being at `sealed_at` (None:
    /// older history only, so the end is further on).
    fn ending(verdict: Verdict, sealed_at: i64) -> Option<Self> {
        match verdict {
            Verdict::Older => None,
            Verdict::OwnRetry => Some(LedgerEnd::Sealed(sealed_at)),
            Verdict::Newer => Some(LedgerEnd::Lost),
            Verdict::Closed { fence, reason } => Some(LedgerEnd::Closed { fence, reason }),
        }
    }
}

/// At most this many positions are probed past a tail hint before listing instead.
const MAX_PROBES: i64 = 8;

/// Where the ledger ends, for a claim of the run (as read, at fence `fence - 1`) for `fence`,
/// without an expensive read. The invariant that makes this safe: every writer appends at
/// its tail+1 and stops at any segment of a higher fence or `closed`, so every segment of a
/// fence above F, and every `closed`, lies AFTER every segment of fence <= F. Hence:
/// - First claim (F = 0): the tail is 0. If the ledger is not empty, position 1 is taken and
///   the `create` there collides: with our own seal (an earlier pass sealed and lost its
///   status write: success) or with anything else (a newer owner, `closed`): lost. Exactly
///   what a list would have told.
/// - Later claims start from a known position of a segment of fence <= F: the seal this
///   controller wrote for F (remembered), or, verified to exist, the ledger size the worker
///   of F reported in status; the positions after it are probed one by one with GETs served
///   from the API server's watch cache (resourceVersion 0). Probing every position after the
///   hint sees every segment that matters. A probe that misses a just-created segment
///   (the cache lags) only makes the `create` collide and classify it.
/// - Otherwise (a restarted controller, a hint too far behind): the run's segments are listed
///   from the watch cache: a contiguous prefix of the ledger (segments are only ever created,
///   each after the one before it), caught up with by the `create` the same way. (A list
///   filters every segment the API server caches, the costly path: profiled at about a third
///   of a 1.20 API server's CPU when done once per takeover.)
pub async fn ledger_end(ctx: &Context, run: &AgentRun, fence: Fence) -> Result<Found, Error> {
    if fence.is_first() {
        return Ok(LedgerEnd::Tail(0).into());
    }
    let RunId { namespace, uid, .. } = run.id();
    let remembered = ctx
        .memory_of(run)
        .seal
        .filter(|s| s.uid == uid && follows(fence, s.fence))
        .map(|s| s.seq);
    let reported = run
        .status
        .as_ref()
        .and_then(|s| s.ledger.as_ref())
        .map_or(0, |l| l.segments);
    let store = ctx.ledger(run)?;
    if !store.in_api_server() {
        return database_end(&store, fence, remembered.unwrap_or(reported)).await;
    }
    let api = ctx.api::<LedgerSegment>(&namespace);
    let start = match remembered {
        Some(seq) => Some(seq),
        None if reported > 0 => match cached_segment(&api, run, reported).await? {
            Some(seg) if written_before(&seg, fence) => match classify_seen(&seg, fence) {
                None => Some(reported),
                Some(end) => return Ok(end.into()),
            },
            _ => None,
        },
        None => None,
    };
    if let Some(start) = start
        && let Some(end) = probe_after(&api, run, fence, start).await?
    {
        return Ok(end.into());
    }
    let (mut segments, claimants) = cached_claimants_of(&api, &run.name_any(), &uid).await?;
    segments.sort_by_key(|s| s.spec.seq);
    // Our own seal's position is not needed (0): nothing is appended.
    let tail = segments.last().map_or(0, |s| s.spec.seq);
    let end =
        LedgerEnd::ending(ledger_verdict(fence, &segments), 0).unwrap_or(LedgerEnd::Tail(tail));
    Ok(Found { end, claimants })
}

/// The end of a ledger kept in a database (through [`RunLedger`]: no watch cache to probe, and
/// its rows are keyed by the run's UID, so no other run's segment is met): the segments from
/// the hint on, the hint's own included (it must be of an older fence, as a probe's start is),
/// classified as the probes classify them. A hint past the ledger's end (none should be: it is
/// this controller's seal or the size the worker reported) reads the whole ledger instead.
async fn database_end(store: &RunLedger, fence: Fence, hint: i64) -> Result<Found, Error> {
    let mut from = (hint - 1).max(0);
    let mut segments = store.list_after(from).await?;
    if segments.is_empty() && from > 0 {
        from = 0;
        segments = store.list_after(from).await?;
    }
    Ok(end_of_rows(&segments, fence, from).into())
}

/// Where `segments` (a ledger read in order from position `from` on) leave a claim for
/// `fence`: the first newer segment or `closed` ends it; else our own seal, walked past
/// (a `closed` of our fence may follow it); else the tail.
fn end_of_rows(segments: &[LedgerSegment], fence: Fence, from: i64) -> LedgerEnd {
    let mut sealed = None;
    for segment in segments {
        match classify_seen(segment, fence) {
            None => {}
            Some(own @ LedgerEnd::Sealed(_)) => sealed = sealed.or(Some(own)),
            Some(end) => return end,
        }
    }
    let tail = segments.last().map_or(from, |s| s.spec.seq);
    sealed.unwrap_or(LedgerEnd::Tail(tail))
}

/// The positions after `start` (a known segment of an older fence), probed one by one in the
/// watch cache up to the first free one. None: the hint was too far behind (list instead).
/// A segment of our own fence is walked past: a `closed` of that fence may follow it.
async fn probe_after(
    api: &Api<LedgerSegment>,
    run: &AgentRun,
    fence: Fence,
    start: i64,
) -> Result<Option<LedgerEnd>, Error> {
    let mut sealed = None;
    for seq in start + 1..=start + MAX_PROBES {
        match cached_segment(api, run, seq).await? {
            None => return Ok(Some(sealed.unwrap_or(LedgerEnd::Tail(seq - 1)))),
            Some(seg) => match classify_seen(&seg, fence) {
                None => {}
                Some(own @ LedgerEnd::Sealed(_)) => sealed = sealed.or(Some(own)),
                Some(end) => return Ok(Some(end)),
            },
        }
    }
    Ok(None)
}

/// Segment `seq` of the run as the API server's watch cache has it (None: not there, or a
/// segment of an earlier run of the same name, which a `create` would collide with anyway).
pub async fn cached_segment(
    api: &Api<LedgerSegment>,
    run: &AgentRun,
    seq: i64,
) -> Result<Option<LedgerSegment>, Error> {
    let seg = cached_segment_at(api, run, seq).await?;
    Ok(seg.filter(|s| s.labels().get(RUN_UID_LABEL) == run.uid().as_ref()))
}

/// Whatever segment holds position `seq` of the run's name in the API server's watch cache,
/// whichever run (by UID) wrote it.
pub async fn cached_segment_at(
    api: &Api<LedgerSegment>,
    run: &AgentRun,
    seq: i64,
) -> Result<Option<LedgerSegment>, Error> {
    let name = segment_name(&run.name_any(), seq);
    match api.get_with(&name, &GetParams::any()).await {
        Ok(seg) => Ok(Some(seg)),
        Err(err) if is_not_found(&err) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// Every segment of the run named `run` with UID `uid`, as the API server's watch cache lists
/// them (unordered; possibly a little behind): those whose name, `spec.run` and label agree.
pub async fn cached_segments_of(
    api: &Api<LedgerSegment>,
    run: &str,
    uid: &str,
) -> Result<Vec<LedgerSegment>, Error> {
    Ok(cached_claimants_of(api, run, uid).await?.0)
}

/// The segments that carry the run's UID label: the run's own, and the names of the others
/// (named for another run, or claiming another in `spec.run`), which no reader folds in.
async fn cached_claimants_of(
    api: &Api<LedgerSegment>,
    run: &str,
    uid: &str,
) -> Result<(Vec<LedgerSegment>, Vec<String>), Error> {
    let selector = format!("{RUN_UID_LABEL}={uid}");
    let params = ListParams::default().labels(&selector).match_any();
    let (ours, foreign): (Vec<_>, Vec<_>) = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .partition(|s| is_segment_of(s, run, uid));
    Ok((ours, foreign.iter().map(|s| s.name_any()).collect()))
}

/// A Warning Event naming the segments that claim the run without being its own: someone
/// wrote them (without the admission webhook, any worker of the namespace can). The claim's
/// status carries the same as a condition (`statuses::claimed`).
pub fn report_claimants(ctx: &Context, run: &AgentRun, claimants: &[String]) {
    if claimants.is_empty() {
        return;
    }
    tracing::warn!(run = %run.name_any(), ?claimants, "segments claim this run");
    ctx.event(run, true, FOREIGN_SEGMENT, claimants_note(claimants));
}

/// The reason of the Event and of the condition.
pub const FOREIGN_SEGMENT: &str = "ForeignLedgerSegment";

/// What the Event and the condition say.
pub fn claimants_note(claimants: &[String]) -> String {
    format!(
        "ledger segments {} carry this run's UID but are not its own (their name or spec.run \
         names another run): ignored by every reader",
        claimants.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::crd::v1alpha1::LedgerEvent;
    use crate::fence::test_segment as seg;

    #[test]
    fn a_claim_walks_past_older_fences_and_stops_at_its_own_a_newer_or_a_close() {
        let step = LedgerEvent::ModelDelta { text: "x".into() };
        assert_eq!(
            classify_seen(&seg(4, 2, vec![step.clone()]), Fence::new(3)),
            None
        );
        let own = LedgerEvent::Claimed {
            fence: Fence::new(3),
            pod: "r-w3".into(),
        };
        assert_eq!(
            classify_seen(&seg(5, 3, vec![own]), Fence::new(3)),
            Some(LedgerEnd::Sealed(5))
        );
        assert_eq!(
            classify_seen(&seg(5, 4, vec![step]), Fence::new(3)),
            Some(LedgerEnd::Lost)
        );
        let closed = LedgerEvent::Closed {
            fence: Fence::new(3),
            reason: CloseReason::StopRequested,
        };
        let ended = |fence| {
            Some(LedgerEnd::Closed {
                fence: Fence::new(fence),
                reason: CloseReason::StopRequested,
            })
        };
        let closed_at = |fence| LedgerEvent::Closed {
            fence: Fence::new(fence),
            reason: CloseReason::StopRequested,
        };
        assert_eq!(
            classify_seen(&seg(5, 3, vec![closed]), Fence::new(3)),
            ended(3)
        );
        // Even a `closed` of an older fence ends the walk: nothing is appended after it.
        assert_eq!(
            classify_seen(&seg(5, 2, vec![closed_at(2)]), Fence::new(3)),
            ended(2)
        );
    }

    #[test]
    fn a_database_ledger_read_from_a_hint_ends_where_the_probes_would() {
        let step = |seq, fence| {
            seg(
                seq,
                fence,
                vec![LedgerEvent::ModelDelta { text: "x".into() }],
            )
        };
        let own = seg(
            4,
            3,
            vec![LedgerEvent::Claimed {
                fence: Fence::new(3),
                pod: "r-w3".into(),
            }],
        );
        let closed = seg(
            5,
            3,
            vec![LedgerEvent::Closed {
                fence: Fence::new(3),
                reason: CloseReason::StopRequested,
            }],
        );
        let f3 = Fence::new(3);
        assert_eq!(end_of_rows(&[], f3, 2), LedgerEnd::Tail(2));
        assert_eq!(
            end_of_rows(&[step(2, 1), step(3, 2)], f3, 1),
            LedgerEnd::Tail(3)
        );
        assert_eq!(
            end_of_rows(&[step(3, 2), own.clone()], f3, 2),
            LedgerEnd::Sealed(4)
        );
        assert_eq!(
            end_of_rows(&[step(3, 2), own.clone(), closed], f3, 2),
            LedgerEnd::Closed {
                fence: f3,
                reason: CloseReason::StopRequested
            }
        );
        assert_eq!(end_of_rows(&[own, step(5, 4)], f3, 3), LedgerEnd::Lost);
    }
}
