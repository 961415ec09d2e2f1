//! Apply: performs one decided action. Every write is a CAS (or a create / a delete with a
//! precondition) and is preceded by a leadership check.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams, Preconditions};

use super::Error;
use super::admission;
use super::claim::{self, delete_pod};
use super::context::Context;
use super::decide::Action;
use super::observe::start_rollout;
use super::statuses::{self, run_name};
use crate::crd::FENCE_ANNOTATION;
use crate::crd::v1alpha1::{AgentRun, AgentRunStatus};
use crate::fence::run_lease_name;
use crate::kube_util::{is_conflict, is_not_found};
use crate::lease::{lease_fence, lease_holder};
use crate::status::{self, StatusError};

/// What applying an action came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Nothing to do, or done: look again when something changes (or at the decided time).
    Done,
    /// The caches were behind the API server: look again soon.
    Requeue,
    /// The run changed under a CAS: re-read it and re-decide.
    Conflict,
}

/// Performs `action` on `run`.
pub async fn apply(ctx: &Context, run: &AgentRun, action: &Action) -> Result<Applied, Error> {
    match action {
        Action::Nothing => Ok(Applied::Done),
        Action::Reject { message } => {
            write_status(ctx, run, statuses::rejected(run, message)).await
        }
        Action::Admit => admission::admit(ctx, run).await,
        Action::Queue { holder } => write_status(ctx, run, statuses::queued(run, holder)).await,
        Action::ClearStaleAdmission => admission::clear_stale(ctx, run).await,
        Action::Claim(c) => claim::claim(ctx, run, *c).await,
        Action::CompleteClaim => {
            claim::move_lease_and_create_pod(ctx, run, claim::LeaseBase::Fresh).await
        }
        Action::Close(c) => claim::close(ctx, run, c).await,
        Action::Finish => finish(ctx, run).await,
        Action::ReleaseLease => release_run_lease(ctx, run).await.map(|_| Applied::Done),
        Action::ReleaseAdmission => release_admission(ctx, run).await.map(|_| Applied::Done),
        Action::DeletePod { rollout } => rollout_or_cleanup(ctx, run, *rollout).await,
        Action::DeleteRun => delete_run(ctx, run).await,
    }
}

/// The controller's status write: one CAS on the run as read (after a leadership check).
/// None: the run changed since it was read (re-read and re-decide). On success, the version
/// it replaced is remembered: until the watch cache moves past it, the cache is behind.
pub async fn cas_status(
    ctx: &Context,
    run: &AgentRun,
    status: AgentRunStatus,
) -> Result<Option<AgentRun>, Error> {
    ctx.check_leader()?;
    let updated = match status::cas_status(&ctx.runs_api(run), run, status).await {
        Err(StatusError::Conflict { .. }) => return Ok(None),
        other => other?,
    };
    ctx.wrote("status");
    let replaced = run.resource_version();
    ctx.remember(run, |m| m.replaced_version = replaced);
    Ok(Some(updated))
}

async fn write_status(
    ctx: &Context,
    run: &AgentRun,
    status: AgentRunStatus,
) -> Result<Applied, Error> {
    let phase = status.phase;
    if cas_status(ctx, run, status).await?.is_none() {
        return Ok(Applied::Conflict);
    }
    if phase.is_terminal() {
        let reason = run.status.as_ref().and_then(|s| s.reason.clone());
        ctx.event(
            run,
            true,
            "InvalidSpec",
            reason.unwrap_or_else(|| phase.to_string()),
        );
    }
    Ok(Applied::Done)
}

/// `Finishing` → outcome, then the run Lease and the thread are released.
async fn finish(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let desired = statuses::finished(run);
    let phase = desired.phase;
    let Some(updated) = cas_status(ctx, run, desired).await? else {
        return Ok(Applied::Conflict);
    };
    tracing::info!(run = %run_name(run), %phase, "finished");
    ctx.event(run, false, "Finished", format!("the run ended {phase}"));
    release_run_lease(ctx, &updated).await?;
    release_admission(ctx, &updated).await?;
    Ok(Applied::Done)
}

/// Clears the run Lease's holder (CAS), keeping the higher of its fence and the run's.
pub async fn release_run_lease(ctx: &Context, run: &AgentRun) -> Result<(), Error> {
    let ns = run.namespace().unwrap_or_default();
    let api = ctx.api::<Lease>(&ns);
    let name = run_lease_name(&run.name_any());
    let Some(mut lease) = api.get_opt(&name).await? else {
        return Ok(());
    };
    if lease_holder(&lease).is_none() {
        return Ok(());
    }
    let fence = run.status.as_ref().map_or(0, |s| s.fence);
    let fence = lease_fence(&lease).unwrap_or(0).max(fence);
    lease
        .annotations_mut()
        .insert(FENCE_ANNOTATION.into(), fence.to_string());
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    ctx.check_leader()?;
    match api.replace(&name, &PostParams::default(), &lease).await {
        Ok(_) => ctx.wrote("lease"),
        Err(err) if is_conflict(&err) || is_not_found(&err) => {}
        Err(err) => return Err(err.into()),
    }
    Ok(())
}

/// Releases the run's thread (delete with a precondition) and wakes the next run of it.
pub async fn release_admission(ctx: &Context, run: &AgentRun) -> Result<(), Error> {
    admission::release(ctx, run).await
}

async fn rollout_or_cleanup(
    ctx: &Context,
    run: &AgentRun,
    rollout: bool,
) -> Result<Applied, Error> {
    let fence = run.status.as_ref().map_or(0, |s| s.fence);
    if rollout {
        start_rollout(ctx, run);
        tracing::info!(run = %run_name(run), fence, "rollout: deleting the worker pod for a handoff");
        ctx.event(
            run,
            false,
            "RolloutHandoff",
            format!("worker pod of attempt {fence} deleted to move to the new image"),
        );
    }
    delete_pod(ctx, run, fence).await?;
    Ok(Applied::Done)
}

/// ttlSecondsAfterFinished passed: delete the run (its Lease, pods and ledger are owned).
async fn delete_run(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: run.uid(),
            resource_version: run.resource_version(),
        }),
        ..DeleteParams::background()
    };
    ctx.check_leader()?;
    match ctx.runs_api(run).delete(&run.name_any(), &params).await {
        Ok(_) => ctx.wrote("run_delete"),
        Err(err) if is_conflict(&err) => return Ok(Applied::Conflict),
        Err(err) if is_not_found(&err) => {}
        Err(err) => return Err(err.into()),
    }
    ctx.forget(run);
    Ok(Applied::Done)
}
