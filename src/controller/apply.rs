//! Apply: performs one decided action. Every write is a CAS (or a create / a delete with a
//! precondition) and goes through the controller's writer ([`super::writer`]).

use kube::ResourceExt;
use kube::api::{DeleteParams, Preconditions};

use super::Error;
use super::access;
use super::admission;
use super::claim;
use super::close::{self, delete_pod, release_run_lease};
use super::context::Context;
use super::decide::{Action, WorkspaceCondition};
use super::observe::start_rollout;
use super::statuses::{self, run_name};
use super::turn;
use super::writer::{Applied, Wrote};
use crate::crd::v1alpha1::{AgentRun, AgentRunStatus};
use crate::fence::Fence;

/// Performs `action` on `run`.
pub async fn apply(ctx: &Context, run: &AgentRun, action: &Action) -> Result<Applied, Error> {
    match action {
        Action::Nothing => Ok(Applied::Done),
        Action::Reject { message } => set_status(ctx, run, statuses::rejected(run, message)).await,
        Action::JoinThread => turn::join(ctx, run).await,
        Action::Interrupt { holder } => turn::interrupt(ctx, run, holder).await,
        Action::Admit => admission::admit(ctx, run).await,
        Action::Queue { holder } => set_status(ctx, run, statuses::queued(run, holder)).await,
        Action::ClearStaleAdmission => admission::clear_stale(ctx, run).await,
        Action::Claim(c) => claim::claim(ctx, run, *c).await,
        Action::CompleteClaim => claim::complete(ctx, claim::StatusWritten::shown_by(run)).await,
        Action::Close(c) => claim::terminal_claim(ctx, run, c).await,
        Action::RecordClose => close::record_closed(ctx, run).await,
        Action::Finish => finish(ctx, run).await,
        Action::ReleaseLease => release_run_lease(ctx, run).await.map(|_| Applied::Done),
        Action::ReleaseAdmission => admission::release(ctx, run).await.map(|_| Applied::Done),
        Action::DeletePod { rollout } => rollout_or_cleanup(ctx, run, *rollout).await,
        Action::RemoveIdentity => access::remove_run_rbac(ctx, run).await,
        Action::DeleteRun => delete_run(ctx, run).await,
        Action::Workspace(c) => workspace(ctx, run, c).await,
    }
}

/// The workspace condition, and a Warning Event when the pod waits for its volume.
async fn workspace(
    ctx: &Context,
    run: &AgentRun,
    c: &WorkspaceCondition,
) -> Result<Applied, Error> {
    let applied = set_status(ctx, run, statuses::workspace(run, c)).await?;
    if !c.ready && applied != Applied::Conflict {
        ctx.event(run, true, c.reason, c.message.clone());
    }
    Ok(applied)
}

async fn set_status(
    ctx: &Context,
    run: &AgentRun,
    status: AgentRunStatus,
) -> Result<Applied, Error> {
    let phase = status.phase;
    if ctx.write_status(run, status).await?.is_none() {
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
    let Some(updated) = ctx.write_status(run, desired).await? else {
        return Ok(Applied::Conflict);
    };
    tracing::info!(run = %run_name(run), %phase, "finished");
    ctx.event(run, false, "Finished", format!("the run ended {phase}"));
    release_run_lease(ctx, &updated).await?;
    admission::release(ctx, &updated).await?;
    Ok(Applied::Done)
}

async fn rollout_or_cleanup(
    ctx: &Context,
    run: &AgentRun,
    rollout: bool,
) -> Result<Applied, Error> {
    let fence = Fence::of_run(run);
    if rollout {
        start_rollout(ctx, run);
        tracing::info!(run = %run_name(run), %fence, "rollout: deleting the worker pod for a handoff");
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
    let api = ctx.runs_api(run);
    if let Wrote::Conflict = ctx
        .write("run_delete", api.delete(&run.name_any(), &params))
        .await?
    {
        return Ok(Applied::Conflict);
    }
    ctx.forget(run);
    Ok(Applied::Done)
}
