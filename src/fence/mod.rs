//! The fence (docs/protocol.md): who holds a run, and the one rule that says whether a writer
//! still does. Pure: no I/O.
//!
//! Every claim hands out the run's next fence; a worker writes only under the fence its pod
//! was created for. Ownership ends when a writer meets a segment of a newer fence or the
//! controller's `closed` seal. That rule is decided here and nowhere else: the worker's
//! append and re-reads, the segment store's collisions, and the controller's walk to the end
//! of the ledger all ask [`verdict`] (or [`ledger_verdict`] over a whole ledger).
//!
//! The fence has two more carriers, and their rules live here too: the run Lease's fence
//! annotation ([`lease_reached`], [`lease_held`]) and the run's `status.fence`
//! ([`status_names`], [`superseded`]); so do "first claim" ([`Fence::is_first`]), which claim
//! follows which attempt ([`follows`]) and who may append at which fence
//! ([`may_append_at`]). No other file compares fences (`make lint` checks it:
//! hack/lint-fence.sh).

mod reason;
pub mod value;

pub use reason::{CloseReason, EndReason};
pub use value::Fence;

use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};

impl Fence {
    /// The fence a run's status is at.
    pub fn of_run(run: &AgentRun) -> Self {
        run.status.as_ref().map_or(Fence::default(), |s| s.fence)
    }

    /// The fence a segment was written under.
    pub fn of_segment(seg: &LedgerSegment) -> Self {
        seg.spec.fence
    }
}

/// The Lease's rule: a Lease carrying `carried` has been moved for the claim of `claim` or a
/// later one, so the claim must not move it (again).
pub fn lease_reached(carried: Option<Fence>, claim: Fence) -> bool {
    carried.is_some_and(|c| c >= claim)
}

/// The Lease's rule for a holder: the Lease names `holder` under exactly `fence`.
pub fn lease_held(
    seen_holder: Option<&str>,
    carried: Option<Fence>,
    holder: &str,
    fence: Fence,
) -> bool {
    seen_holder == Some(holder) && carried == Some(fence)
}

/// The Lease's rule at a run's end: the released Lease keeps the higher of the fence it
/// carries and the run's, so a fence on it never goes back.
pub fn lease_released_at(carried: Option<Fence>, status: Fence) -> Fence {
    carried.unwrap_or_default().max(status)
}

/// The status's rule: the run's `status.fence` still names the attempt at `ours` (a newer
/// claim would have moved it; nothing moves it back).
pub fn status_names(status: Fence, ours: Fence) -> bool {
    status == ours
}

/// The status's rule, seen from a running attempt: the run was claimed past `ours`.
pub fn superseded(status: Fence, ours: Fence) -> bool {
    status > ours
}

/// Who may append at which fence (the webhook's rule, docs/protocol.md "Who may write a
/// segment"): the run's worker at most at the run's `status.fence`; the controller one
/// above it, because a claim's seal is written before its status moves.
pub fn may_append_at(segment: Fence, status: Fence, by_controller: bool) -> bool {
    segment <= append_ceiling(status, by_controller)
}

/// The highest fence [`may_append_at`] admits.
pub fn append_ceiling(status: Fence, by_controller: bool) -> Fence {
    if by_controller { status.next() } else { status }
}

/// True when the claim of `claim` directly follows the attempt at `attempt` (a seal the
/// controller remembers writing for `attempt` is where this claim's ledger walk starts).
pub fn follows(claim: Fence, attempt: Fence) -> bool {
    claim.previous() == Some(attempt)
}

/// True when `seg` was written by an attempt before the claim of `ours`.
pub fn written_before(seg: &LedgerSegment, ours: Fence) -> bool {
    Fence::of_segment(seg) < ours
}

/// Who holds a run: the run (by namespace, name and UID: a run re-created under the same
/// name is another run), the pod of the attempt and its fence. The worker's every fenced
/// write carries it; the controller derives the objects of an attempt from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHolder {
    pub namespace: String,
    pub run: String,
    pub uid: String,
    pub pod: String,
    pub fence: Fence,
}

impl RunHolder {
    /// The holder of `run` (as read from the API server: it needs its UID) at `fence`.
    pub fn of(run: &AgentRun, fence: Fence) -> Self {
        let id = run.id();
        Self {
            pod: worker_pod_name(&id.name, fence),
            namespace: id.namespace,
            uid: id.uid,
            run: id.name,
            fence,
        }
    }

    /// The run's Lease.
    pub fn lease_name(&self) -> String {
        run_lease_name(&self.run)
    }
}

/// What a writer holding fence `ours` makes of a ledger segment it met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Written by an older holder: legitimate history; go on after it.
    Older,
    /// Written under our own fence: our own earlier write landed (a retried request, or the
    /// seal an earlier pass of the claim left).
    OwnRetry,
    /// Written by a newer holder: the run is lost; never write again.
    Newer,
    /// The controller closed the ledger: the run ended at `fence` for `reason`, and nothing
    /// may be appended. A worker has lost the run. The record follows the terminal status;
    /// a claim that meets one completes the end it records (a no-op unless an earlier
    /// version wrote it before that status: docs/protocol.md, "The terminal claim").
    Closed { fence: Fence, reason: CloseReason },
}

impl Verdict {
    /// True when the writer that met the segment must not write after it.
    pub fn ends_ownership(&self) -> bool {
        matches!(self, Verdict::Newer | Verdict::Closed { .. })
    }
}

/// THE ownership rule, over one segment `seen` by a writer holding `ours`.
///
/// `wrote` is what the writer tried to put at that position, when it met the segment by
/// colliding with it: then a segment of our fence is our own retry only if it holds exactly
/// what we wrote. Another content under our fence can only come from another writer holding
/// it, and there is none (one pod per fence): reading it as lost is the safe side.
pub fn verdict(ours: Fence, seen: &LedgerSegment, wrote: Option<&[LedgerEvent]>) -> Verdict {
    if let Some((fence, reason)) = closed_seal(seen) {
        return Verdict::Closed { fence, reason };
    }
    let theirs = Fence::of_segment(seen);
    match theirs.cmp(&ours) {
        std::cmp::Ordering::Greater => Verdict::Newer,
        std::cmp::Ordering::Less => Verdict::Older,
        std::cmp::Ordering::Equal => match wrote {
            Some(events) if seen.spec.events.as_slice() != events => Verdict::Newer,
            _ => Verdict::OwnRetry,
        },
    }
}

/// The verdict over a whole ledger (or the part of it read): a `closed` seal anywhere
/// decides, then any newer fence, then any segment of our own; otherwise it is all history.
/// (Every writer appends at its tail+1 and stops at a newer fence or `closed`, so those lie
/// after every older segment: the order of the checks only matters for a torn read.)
pub fn ledger_verdict<'a>(
    ours: Fence,
    segments: impl IntoIterator<Item = &'a LedgerSegment>,
) -> Verdict {
    let mut found = Verdict::Older;
    for seg in segments {
        match verdict(ours, seg, None) {
            closed @ Verdict::Closed { .. } => return closed,
            Verdict::Newer => found = Verdict::Newer,
            Verdict::OwnRetry if found == Verdict::Older => found = Verdict::OwnRetry,
            _ => {}
        }
    }
    found
}

/// How much of the ledger a terminal claim for `ours` salvages: everything up to and
/// including its own seal, the first segment of `ours` (docs/protocol.md, "The terminal
/// claim"). Nothing after the seal can belong to the run's history: an older owner that meets
/// it stops. None when there is no such seal, or when the ledger was taken by a newer fence or
/// closed meanwhile: then the claim's status CAS would be lost too.
pub fn salvage_end<'a>(
    ours: Fence,
    segments: impl IntoIterator<Item = &'a LedgerSegment> + Clone,
) -> Option<usize> {
    if ledger_verdict(ours, segments.clone()).ends_ownership() {
        return None;
    }
    segments
        .into_iter()
        .position(|s| Fence::of_segment(s) == ours)
}

/// The `closed` seal a segment holds: its fence and reason.
fn closed_seal(seg: &LedgerSegment) -> Option<(Fence, CloseReason)> {
    seg.spec.events.iter().find_map(|e| match e {
        LedgerEvent::Closed { fence, reason } => Some((*fence, *reason)),
        _ => None,
    })
}

/// The name of a run's segment at `seq`. Zero-padded so `kubectl get` lists them in order.
pub fn segment_name(run: &str, seq: i64) -> String {
    format!("{run}-{seq:06}")
}

/// Name of a run's Lease. The prefix keeps run and thread Leases apart in one namespace.
pub fn run_lease_name(run: &str) -> String {
    format!("{RUN_LEASE_PREFIX}{run}")
}

const RUN_LEASE_PREFIX: &str = "run.";

/// The run a Lease is for, by its name (the one thing about a run Lease its holder cannot
/// change: a worker may update its Lease, ownerReferences included).
pub fn run_of_lease(lease_name: &str) -> Option<&str> {
    lease_name
        .strip_prefix(RUN_LEASE_PREFIX)
        .filter(|run| !run.is_empty())
}

/// The worker pod of attempt `fence`: one name per fence, so a fence never has two pods.
pub fn worker_pod_name(run: &str, fence: Fence) -> String {
    format!("{run}-w{fence}")
}

/// The run's workspace claim (`spec.workspace`): one per run, for every attempt.
pub fn workspace_claim_name(run: &str) -> String {
    format!("{run}-workspace")
}

/// A label value is at most 63 characters; longer run names are cut (the UID label is exact).
pub fn label_value(name: &str) -> String {
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.', '_']).to_string()
}

/// Test fixture: segment `seq` of run `r`, written under `fence`.
#[cfg(test)]
pub fn test_segment(
    seq: i64,
    fence: i64,
    events: Vec<crate::crd::v1alpha1::LedgerEvent>,
) -> LedgerSegment {
    LedgerSegment::new(
        &segment_name("r", seq),
        crate::crd::v1alpha1::LedgerSegmentSpec {
            run: "r".into(),
            seq,
            fence: Fence::new(fence),
            format: 1,
            events,
        },
    )
}

#[cfg(test)]
mod tests;
