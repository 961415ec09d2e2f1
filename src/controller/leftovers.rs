//! Leftovers of a deleted run of the same name: its Lease `run.<name>`, its ledger segments
//! `<name>-NNNNNN` and its worker pods `<name>-w<fence>` stay until the garbage collector
//! removes them (in a real cluster soon; the local control plane has none). A new run of that
//! name would collide with them: its seal with the old ledger, its Lease move with the old
//! fence, its pod with the old pod, which it would take for its own and then count as dead.
//!
//! So before a claim creates anything, the objects it is about to use are checked against the
//! run's UID, and those of another run are deleted, each with a UID precondition (so nothing
//! but that leftover can be deleted), and the claim waits for the next pass. They are garbage
//! either way: their owner is gone, as a run has one UID per name at a time.
//!
//! Nothing is deleted on a guess: a segment's UID label is written by whoever created it (any
//! worker may create segments), so segments are deleted only when named for the run being
//! claimed and only when no AgentRun of the namespace has their UID. A planted
//! `<name>-000001` carrying a live run's UID deletes nothing of that run; it blocks the new
//! run's first claim, loudly, until a person removes it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::Error;
use super::context::Context;
use super::ledger_end::{cached_segment_at, cached_segments_of};
use super::statuses::run_name;
use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::crd::{RUN_UID_LABEL, controlling_run};
use crate::fence::{Fence, run_lease_name, segment_name, worker_pod_name};

/// True when nothing of another run stands where the claim of `run` for `fence` will write;
/// false when leftovers were found (and are being deleted): look again shortly.
pub async fn cleared(ctx: &Context, run: &AgentRun, fence: Fence) -> Result<bool, Error> {
    let RunId {
        namespace: ns, uid, ..
    } = run.id();
    let mut found = Vec::new();
    if let Some(pod) = foreign_pod(ctx, run, &uid, fence) {
        delete_leftover(ctx, &ctx.api::<Pod>(&ns), &pod).await?;
        found.push(format!("pod {}", pod.name_any()));
    }
    if fence.is_first() {
        if let Some(lease) = foreign_lease(ctx, run, &uid) {
            delete_leftover(ctx, &ctx.api::<Lease>(&ns), &lease).await?;
            found.push(format!("Lease {}", lease.name_any()));
        }
        match first_segment(ctx, run, &uid).await? {
            FirstSegment::FreeOrOurs => {}
            FirstSegment::OfLiveRun(owner) => not_a_leftover(ctx, run, &owner),
            FirstSegment::Leftover(segments) => {
                let api = ctx.api::<LedgerSegment>(&ns);
                for segment in &segments {
                    delete_leftover(ctx, &api, segment).await?;
                }
                found.push(format!("{} ledger segments", segments.len()));
            }
        }
    }
    if found.is_empty() {
        return Ok(true);
    }
    let note = format!(
        "removing what an earlier run named {} left behind ({}) before claiming fence {fence}",
        run.name_any(),
        found.join(", ")
    );
    tracing::info!(run = %run_name(run), %fence, leftovers = %found.join(", "), "leftovers");
    ctx.event(run, false, "RemovingLeftovers", note);
    Ok(false)
}

/// The pod the claim for `fence` will create, if the cache has one owned by another run.
fn foreign_pod(ctx: &Context, run: &AgentRun, uid: &str, fence: Fence) -> Option<Pod> {
    let name = worker_pod_name(&run.name_any(), fence);
    let ns = run.id().namespace;
    let pod = ctx.pod_cache().get(&ObjectRef::new(&name).within(&ns))?;
    let other = controlling_run(&*pod).is_some_and(|owner| owner.uid != uid);
    other.then(|| (*pod).clone())
}

/// The run Lease, if the cache has one controlled by another run.
fn foreign_lease(ctx: &Context, run: &AgentRun, uid: &str) -> Option<Lease> {
    let ns = run.id().namespace;
    let name = run_lease_name(&run.name_any());
    let lease = ctx.lease_cache().get(&ObjectRef::new(&name).within(&ns))?;
    let other = controlling_run(&*lease).is_some_and(|owner| owner.uid != uid);
    other.then(|| (*lease).clone())
}

/// What holds the first position of `run`'s ledger. The first position tells: every ledger
/// starts there.
enum FirstSegment {
    /// Nothing, or a segment of this run.
    FreeOrOurs,
    /// A segment carrying the UID of an AgentRun that exists: not a leftover, not deleted.
    OfLiveRun(String),
    /// A deleted namesake's: its segments named for the run, to delete.
    Leftover(Vec<LedgerSegment>),
}

/// Reads the first position (the API server's watch cache) and, if another run's UID is there,
/// whether a run with that UID exists.
async fn first_segment(ctx: &Context, run: &AgentRun, uid: &str) -> Result<FirstSegment, Error> {
    let api = ctx.api::<LedgerSegment>(&run.id().namespace);
    let Some(first) = cached_segment_at(&api, run, 1).await? else {
        return Ok(FirstSegment::FreeOrOurs);
    };
    let Some(other) = first.labels().get(RUN_UID_LABEL).filter(|o| *o != uid) else {
        return Ok(FirstSegment::FreeOrOurs);
    };
    if run_with_uid_exists(ctx, run, other).await? {
        return Ok(FirstSegment::OfLiveRun(other.clone()));
    }
    let mut segments = cached_segments_of(&api, &run.name_any(), other).await?;
    if segments.is_empty() {
        // The cache may not list what it just returned by name: delete that one at least.
        segments.push(first);
    }
    Ok(FirstSegment::Leftover(segments))
}

/// Says, loudly, that the first position holds a live run's UID. Nothing is deleted: the
/// claim's seal collides with it, is refused (`ForeignSegment`) and backs off until someone
/// removes it.
fn not_a_leftover(ctx: &Context, run: &AgentRun, owner: &str) {
    let note = format!(
        "ledger segment {} carries the UID {owner} of an AgentRun that exists: it is not this run's and is not removed; the first claim waits until someone deletes it",
        segment_name(&run.name_any(), 1)
    );
    tracing::warn!(run = %run_name(run), %owner, "a live run's UID on this run's first segment");
    ctx.event(run, true, super::ledger_end::FOREIGN_SEGMENT, note);
}

/// True when an AgentRun of `run`'s namespace has the UID `uid` (read from the API server: a
/// cache that lags must not make a live run's ledger look abandoned).
async fn run_with_uid_exists(ctx: &Context, run: &AgentRun, uid: &str) -> Result<bool, Error> {
    let runs = ctx.runs_api(run).list_metadata(&Default::default()).await?;
    Ok(runs.items.iter().any(|r| r.uid().as_deref() == Some(uid)))
}

/// Deletes `obj` only if it is still that very object (its UID); gone already is fine.
pub async fn delete_leftover<K>(ctx: &Context, api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    ctx.delete_of_uid("leftover_delete", api, obj).await
}
