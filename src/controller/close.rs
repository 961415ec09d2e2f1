//! The end of a terminal claim (docs/protocol.md, "The terminal claim"), a claim that ends the
//! run. It is sealed like every claim, `claimed{F+1}` at tail+1 (`claim::terminal_claim`, the
//! claim's own first two stages); then ONE status CAS writes the terminal phase at F+1 with
//! the salvage of the ledger up to that seal; only once that CAS has landed is `closed{F+1}`
//! appended, as the record (by a later pass, [`record_closed`], if this one stopped first).
//!
//! Why this order: the decision to end the run was made on a view that may be behind the
//! ledger (a worker that handed off while its Lease looked expired), and a seal lands after
//! whatever the ledger holds by then. A `claimed` seal whose CAS lost binds nothing: the next
//! pass decides again from what is true, and a claim of the same fence reuses the seal. A
//! `closed` seal written first could not be taken back: the run ended Interrupted though no
//! attempt had died.
//!
//! Also here: what every end does after its status (the Lease released, the old pod deleted).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use tracing::Instrument;

use super::Error;
use super::admission;
use super::context::Context;
use super::decide::{Close, CloseReason};
use super::ledger_end::cached_segment;
use super::statuses::{self, run_name};
use super::writer::Applied;
use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};
use crate::fence::{Fence, Verdict, ledger_verdict, salvage_end, verdict, worker_pod_name};
use crate::ledger::{Replay, RunLedger};
use crate::traces::RunTrace;
use crate::traces::late::{self, RunEnded};

/// Stage 3 of a terminal claim, after the claim's prepare and seal for `fence`: ONE status
/// CAS, the end at the seal's fence with the salvage of the ledger up to the seal, then the
/// record, the Lease released, the thread freed, the old pod deleted.
pub async fn end(
    ctx: &Context,
    run: &AgentRun,
    fence: Fence,
    close: &Close,
) -> Result<Applied, Error> {
    let span = crate::run_span!("end", run);
    end_at_seal(ctx, run, fence, close).instrument(span).await
}

async fn end_at_seal(
    ctx: &Context,
    run: &AgentRun,
    fence: Fence,
    close: &Close,
) -> Result<Applied, Error> {
    let store = ctx.ledger(run)?;
    let Some(mut replay) = up_to_seal(&store, fence).await? else {
        // Taken by a newer claim, or ended and recorded meanwhile: the CAS would be lost too.
        return Ok(Applied::Conflict);
    };
    let record = record_events(&replay, fence, close.reason);
    for event in &record {
        replay.apply(fence, event);
    }
    let desired = statuses::closed(run, close, fence, &replay);
    let Some(updated) = ctx.write_status(run, desired).await? else {
        return Ok(Applied::Conflict);
    };
    announce(ctx, run, close, fence);
    append_record(ctx, run, &store, replay.tail, fence, record).await?;
    let previous = Fence::of_run(run);
    after_end(ctx, run, &updated, previous).await
}

/// The ledger up to and including the terminal claim's seal of `fence`, listed from the API
/// server (the seal's position and all before it) and folded. None: there is no such seal,
/// or the ledger went on past it (a newer claim, or the record already there).
async fn up_to_seal(store: &RunLedger, fence: Fence) -> Result<Option<Replay>, Error> {
    let segments = store.list().await?;
    salvage_end(fence, &segments)
        .map(|seal| fold(&segments[..=seal]))
        .transpose()
}

/// What a terminal claim records after its seal: `stepUnknown` for every step still open (its
/// worker may have run it), then `closed{fence}`.
fn record_events(replay: &Replay, fence: Fence, reason: CloseReason) -> Vec<LedgerEvent> {
    let unknown = replay
        .open_steps()
        .into_iter()
        .map(|s| LedgerEvent::StepUnknown {
            step: s.step,
            attempt: s.attempt,
        });
    let closed = LedgerEvent::Closed { fence, reason };
    unknown.chain(std::iter::once(closed)).collect()
}

/// Appends the record right after the seal at `seal`. One already there (another pass's,
/// with the same content) ends the append as lost: recorded all the same.
async fn append_record(
    ctx: &Context,
    run: &AgentRun,
    store: &RunLedger,
    seal: i64,
    fence: Fence,
    record: Vec<LedgerEvent>,
) -> Result<(), Error> {
    let appended = ctx
        .write_fenced("seal", store.append(seal, fence, record))
        .await?;
    match appended {
        Err(err) if !err.is_lost() => return Err(err.into()),
        _ => ctx.remember(run, |m| m.close_recorded = true),
    }
    Ok(())
}

/// The rest of an end, once its status landed: the run Lease released, the thread freed, the
/// pod of the attempt that was current deleted.
async fn after_end(
    ctx: &Context,
    run: &AgentRun,
    updated: &AgentRun,
    previous: Fence,
) -> Result<Applied, Error> {
    release_run_lease(ctx, updated).await?;
    admission::release(ctx, updated).await?;
    delete_pod(ctx, run, previous).await?;
    Ok(Applied::Done)
}

/// A later pass's share of a terminal claim whose own pass stopped after the terminal status:
/// the record appended, unless the ledger holds one. It is looked for first where it would be:
/// right after the seal, whose position the terminal status gives, or at it (a version before
/// this rule sealed with `closed`).
pub async fn record_closed(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let fence = Fence::of_run(run);
    let status = run.status.as_ref();
    let at = status
        .and_then(|s| s.ledger.as_ref())
        .map_or(0, |l| l.segments);
    let store = ctx.ledger(run)?;
    if recorded_at(ctx, &store, run, fence, at).await? {
        ctx.remember(run, |m| m.close_recorded = true);
        return Ok(Applied::Done);
    }
    let Some(replay) = up_to_seal(&store, fence).await? else {
        // Recorded already (or, from an older version, nothing of this fence to record).
        ctx.remember(run, |m| m.close_recorded = true);
        return Ok(Applied::Done);
    };
    let reason = CloseReason::named(status.and_then(|s| s.reason.as_deref()).unwrap_or_default());
    let record = record_events(&replay, fence, reason);
    tracing::info!(run = %run_name(run), %fence, "recording the end in the ledger");
    append_record(ctx, run, &store, replay.tail, fence, record).await?;
    Ok(Applied::Done)
}

/// True when the ledger shows a `closed` record at `at + 1` or `at`: in the API server's watch
/// cache for LedgerSegments, in the rows from `at` on for a ledger kept in a database.
async fn recorded_at(
    ctx: &Context,
    store: &RunLedger,
    run: &AgentRun,
    fence: Fence,
    at: i64,
) -> Result<bool, Error> {
    let near = [at + 1, at].into_iter().filter(|seq| *seq > 0);
    let mut seen = Vec::new();
    if store.in_api_server() {
        let api = ctx.api::<LedgerSegment>(&run.id().namespace);
        for seq in near {
            seen.extend(cached_segment(&api, run, seq).await?);
        }
    } else if at > 0 {
        seen.extend(store.list_page(at - 1, 2).await?);
    }
    let closed = |seg: &LedgerSegment| matches!(verdict(fence, seg, None), Verdict::Closed { .. });
    Ok(seen.iter().any(closed))
}

/// A claim met a `closed` record. One this version wrote follows the terminal status, so the
/// CAS below, on a copy of the run from before it, is lost: re-read. One an earlier version
/// wrote (it sealed with `closed` before the status) may stand without its status: the run
/// ends as it records, whatever decided the claim, or every later claim would meet it.
pub async fn complete_recorded(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let store = ctx.ledger(run)?;
    let segments = store.list().await?;
    let Verdict::Closed { fence, reason } = ledger_verdict(Fence::of_run(run).next(), &segments)
    else {
        // The cache showed a record the API server does not have: look again.
        return Ok(Applied::Requeue);
    };
    let close = Close::recorded(reason, fence);
    let replay = fold(&segments)?;
    let desired = statuses::closed(run, &close, fence, &replay);
    let Some(updated) = ctx.write_status(run, desired).await? else {
        return Ok(Applied::Conflict);
    };
    announce(ctx, run, &close, fence);
    ctx.remember(run, |m| m.close_recorded = true);
    after_end(ctx, run, &updated, Fence::of_run(run)).await
}

/// The ledger folded. `extend` (not `from_segments`): a chunked event still being written by
/// an older owner must not stop a terminal claim; it only needs positions, steps and seals.
fn fold(segments: &[LedgerSegment]) -> Result<Replay, Error> {
    let mut replay = Replay::default();
    replay.extend(segments)?;
    Ok(replay)
}

fn announce(ctx: &Context, run: &AgentRun, close: &Close, fence: Fence) {
    if close.reason == CloseReason::MaxAttemptsExceeded {
        ctx.metrics().give_up();
    }
    let phase = close.phase();
    tracing::info!(run = %run_name(run), %fence, %phase, reason = %close.reason, "ended");
    let note = format!("{phase} at fence {fence}: {}", close.message);
    ctx.event(run, true, close.reason.as_str(), note);
    // No worker ends this run, so no worker writes its root span: the controller does.
    late::run_ended(&RunTrace::of(run), &RunEnded::of(run, phase));
}

/// Deletes the worker pod of `fence` unless the cache shows it already being deleted (404 is
/// fine). A pod missing from the cache is deleted all the same: the cache may lag, and a
/// skipped deletion would leave an old worker pod behind for good.
pub async fn delete_pod(ctx: &Context, run: &AgentRun, fence: Fence) -> Result<(), Error> {
    if fence.never_claimed() {
        return Ok(());
    }
    let ns = run.id().namespace;
    let name = worker_pod_name(&run.name_any(), fence);
    let cached = kube::runtime::reflector::ObjectRef::<Pod>::new(&name).within(&ns);
    if ctx
        .pod_cache()
        .get(&cached)
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    {
        return Ok(());
    }
    let api = ctx.api::<Pod>(&ns);
    // Gone is fine: the pod was deleted already.
    ctx.write("pod_delete", api.delete(&name, &DeleteParams::default()))
        .await?;
    Ok(())
}

/// Clears the run Lease's holder (CAS), keeping the higher of its fence and the run's. A
/// Lease moved meanwhile (Conflict) is someone else's now; a Lease gone needs no release; a
/// Lease this run does not control is not touched.
pub async fn release_run_lease(ctx: &Context, run: &AgentRun) -> Result<(), Error> {
    let RunId { namespace, uid, .. } = run.id();
    let leases = ctx.lease_edge(&namespace);
    let name = run.name_any();
    let Some(lease) = leases.released(&name, &uid, Fence::of_run(run)).await? else {
        return Ok(());
    };
    // Moved meanwhile (Conflict): someone else's now. Gone: nothing to release.
    ctx.write("lease", leases.put(&lease)).await?;
    Ok(())
}
