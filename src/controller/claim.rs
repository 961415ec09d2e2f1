//! The claim protocol's I/O (DESIGN.md §3): seal → ONE status CAS → Lease move → pod creation,
//! and the terminal claim (seal with `closed`, then the terminal status with the salvage).
//!
//! Pod rule: a pod is created only right after this pass moved the Lease to it (or found the
//! Lease behind and moved it). A Lease already naming the pod of the current fence means its
//! pod was (or was about to be) created; if that pod is missing, `decide` ends the attempt
//! and claims fence+1 once the worker renewed or `POD_CREATE_GRACE` passed. So no fence ever
//! gets two pods, even across controller restarts or a force-deleted pod.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Resource, ResourceExt};

use super::Error;
use super::apply::{Applied, release_admission, release_run_lease};
use super::context::Context;
use super::decide::{Claim, ClaimReason, Close};
use super::observe::sight;
use super::pod::{desired_image, worker_pod};
use super::statuses::{self, run_name};
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};
use crate::crd::worker_pod_name;
use crate::kube_util::{is_already_exists, is_not_found};
use crate::lease::{LeaseClient, lease_fence};
use crate::ledger::{Replay, SegmentStore};
use crate::status::{StatusError, cas_status};

/// A claim of `run` for fence+1.
pub async fn claim(ctx: &Context, run: &AgentRun, claim: Claim) -> Result<Applied, Error> {
    if !confirm_trigger(ctx, run, claim.reason).await? {
        return Ok(Applied::Requeue);
    }
    let status = run.status.clone().unwrap_or_default();
    let fence = status.fence + 1;
    let pod = worker_pod_name(&run.name_any(), fence);
    let store = SegmentStore::for_run(ctx.client.clone(), run);
    let replay = read_ledger(&store).await?;
    if replay.closed.is_some() {
        // A terminal claim was sealed and its status write lost: that decision stands.
        return Ok(Applied::Conflict);
    }
    if replay.max_fence < fence {
        let seal = vec![LedgerEvent::Claimed {
            fence,
            pod: pod.clone(),
        }];
        ctx.check_leader()?;
        match store.append(replay.tail, fence, seal).await {
            Err(err) if err.is_lost() => return Ok(Applied::Conflict),
            other => other?,
        };
        ctx.wrote("seal");
    }
    let desired = statuses::claimed(run, claim, fence, &pod);
    ctx.check_leader()?;
    let updated = match cas_status(&ctx.runs_api(run), run, desired).await {
        Err(StatusError::Conflict { .. }) => return Ok(Applied::Conflict),
        other => other?,
    };
    ctx.wrote("status");
    record_claim(ctx, run, claim, fence, &pod);
    move_lease_and_create_pod(ctx, &updated).await?;
    delete_pod(ctx, run, status.fence).await?;
    Ok(Applied::Done)
}

/// Before a takeover, the cache's view is checked against the API server: the Lease is
/// re-read (a renewal the cache missed cancels the expiry), a missing pod is confirmed gone.
async fn confirm_trigger(
    ctx: &Context,
    run: &AgentRun,
    reason: ClaimReason,
) -> Result<bool, Error> {
    let ns = run.namespace().unwrap_or_default();
    match reason {
        ClaimReason::LeaseExpired => {
            let fresh = LeaseClient::new(ctx.client.clone(), &ns)
                .get(&run.name_any())
                .await?;
            let before = ctx.memory_of(run).sighting.map(|s| s.version);
            let Some(fresh) = fresh else { return Ok(true) };
            let changed = fresh.resource_version() != before;
            sight(ctx, run, &fresh, Instant::now());
            Ok(!changed)
        }
        ClaimReason::PodGone => {
            let fence = run.status.as_ref().map_or(0, |s| s.fence);
            let name = worker_pod_name(&run.name_any(), fence);
            let pod = ctx.api::<Pod>(&ns).get_opt(&name).await?;
            Ok(pod.is_none())
        }
        _ => Ok(true),
    }
}

fn record_claim(ctx: &Context, run: &AgentRun, claim: Claim, fence: i64, pod: &str) {
    let reason = claim.reason.as_str();
    ctx.metrics.claim(reason, claim.reason.is_death());
    if claim.reason == ClaimReason::LeaseExpired
        && let Some(s) = ctx.memory_of(run).sighting
    {
        let late = Instant::now().saturating_duration_since(s.deadline(&run.spec.lease));
        ctx.metrics.takeover_lateness(late.as_secs_f64());
    }
    tracing::info!(run = %run_name(run), fence, pod, reason, "claimed");
    let note = format!("attempt {fence} claimed for pod {pod} ({reason})");
    ctx.event(
        run,
        claim.reason.is_death(),
        &format!("Claimed{reason}"),
        note,
    );
}

/// The ledger folded. `extend` (not `from_segments`): a chunked event still being written by
/// an older owner must not stop a claim; it only ever needs positions, fences and seals.
async fn read_ledger(store: &SegmentStore) -> Result<Replay, Error> {
    let segments = store.list().await?;
    let mut replay = Replay::default();
    replay.extend(&segments)?;
    Ok(replay)
}

/// Status ahead of the Lease: move the Lease (CAS), then create the pod. A Lease already at
/// the fence means the pod was handled by whoever moved it: nothing is created here.
pub async fn move_lease_and_create_pod(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let ns = run.namespace().unwrap_or_default();
    let fence = run.status.as_ref().map_or(0, |s| s.fence);
    let pod_name = worker_pod_name(&run.name_any(), fence);
    let leases = LeaseClient::new(ctx.client.clone(), &ns);
    let current = leases.get(&run.name_any()).await?;
    if current
        .as_ref()
        .and_then(lease_fence)
        .is_some_and(|f| f >= fence)
    {
        return Ok(Applied::Requeue);
    }
    let owner = run.controller_owner_ref(&()).unwrap_or_default();
    let duration = run.spec.lease.duration_seconds;
    ctx.check_leader()?;
    leases
        .move_to(&run.name_any(), owner, &pod_name, fence, duration)
        .await?;
    ctx.wrote("lease");
    let image = desired_image(run, &ctx.config.worker_image);
    ctx.check_leader()?;
    match ctx
        .api::<Pod>(&ns)
        .create(&PostParams::default(), &worker_pod(run, fence, &image))
        .await
    {
        Ok(_) => ctx.wrote("pod"),
        Err(err) if is_already_exists(&err) => {}
        Err(err) => return Err(err.into()),
    }
    Ok(Applied::Done)
}

/// Deletes the worker pod of `fence` if the cache has it (404 is fine).
pub async fn delete_pod(ctx: &Context, run: &AgentRun, fence: i64) -> Result<(), Error> {
    if fence == 0 {
        return Ok(());
    }
    let ns = run.namespace().unwrap_or_default();
    let name = worker_pod_name(&run.name_any(), fence);
    let cached = kube::runtime::reflector::ObjectRef::<Pod>::new(&name).within(&ns);
    if ctx
        .pods
        .get(&cached)
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    {
        return Ok(());
    }
    ctx.check_leader()?;
    match ctx
        .api::<Pod>(&ns)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => ctx.wrote("pod_delete"),
        Err(err) if is_not_found(&err) => {}
        Err(err) => return Err(err.into()),
    }
    Ok(())
}

/// A terminal claim: `stepUnknown` for open intents and `closed{fence+1}` appended first,
/// then the terminal status at fence+1 with the salvage up to the seal.
pub async fn close(ctx: &Context, run: &AgentRun, close: &Close) -> Result<Applied, Error> {
    let status = run.status.clone().unwrap_or_default();
    let fence = status.fence + 1;
    let store = SegmentStore::for_run(ctx.client.clone(), run);
    let mut replay = read_ledger(&store).await?;
    if replay.max_fence > fence {
        return Ok(Applied::Conflict);
    }
    if replay.closed.is_none() {
        match seal_closed(ctx, &store, &replay, fence, &close.reason).await {
            Err(Error::Ledger(err)) if err.is_lost() => return Ok(Applied::Conflict),
            Err(err) => return Err(err),
            Ok(new) => replay.extend(&new)?,
        }
    }
    let desired = statuses::closed(run, close, fence, &replay);
    ctx.check_leader()?;
    let updated = match cas_status(&ctx.runs_api(run), run, desired).await {
        Err(StatusError::Conflict { .. }) => return Ok(Applied::Conflict),
        other => other?,
    };
    ctx.wrote("status");
    record_close(ctx, run, close, fence);
    release_run_lease(ctx, &updated).await?;
    release_admission(ctx, &updated).await?;
    delete_pod(ctx, run, status.fence).await?;
    Ok(Applied::Done)
}

/// Appends the terminal seal; returns the new segments (slipped history and ours) in order.
async fn seal_closed(
    ctx: &Context,
    store: &SegmentStore,
    replay: &Replay,
    fence: i64,
    reason: &str,
) -> Result<Vec<LedgerSegment>, Error> {
    let mut events: Vec<LedgerEvent> = replay
        .open_steps()
        .iter()
        .map(|s| LedgerEvent::StepUnknown {
            step: s.step,
            attempt: s.attempt,
        })
        .collect();
    events.push(LedgerEvent::Closed {
        fence,
        reason: reason.into(),
    });
    ctx.check_leader()?;
    let appended = store.append(replay.tail, fence, events).await?;
    ctx.wrote("seal");
    let mut new: Vec<LedgerSegment> = appended
        .slipped
        .into_iter()
        .chain(appended.written)
        .collect();
    new.sort_by_key(|s| s.spec.seq);
    Ok(new)
}

fn record_close(ctx: &Context, run: &AgentRun, close: &Close, fence: i64) {
    if close.reason == "MaxAttemptsExceeded" {
        ctx.metrics.give_up();
    }
    tracing::info!(run = %run_name(run), fence, phase = %close.phase, reason = %close.reason, "ended");
    let note = format!("{} at fence {fence}: {}", close.phase, close.message);
    ctx.event(run, true, &close.reason, note);
}
