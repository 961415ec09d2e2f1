//! Per-run least privilege (issue 6, item 2): before a run's worker pod is created, the run's
//! own ServiceAccount, Role and RoleBinding ([`RunRbac`]) exist, owned by the run.
//!
//! These objects are not part of the claim protocol (they carry no fence); each is a plain
//! `create` where AlreadyExists counts as success when the run is the object's controlling
//! owner. They cost three writes once per run, not per claim: the controller remembers (per
//! run UID) that they exist.
//! Without that memory (a restarted controller taking over), a first claim checks with one
//! read (the RoleBinding, created last) before creating anything.
//!
//! They last as long as the run may have a worker: once it has ended and its pod is gone
//! they are removed ([`remove_run_rbac`]), so a finished run holds no identity.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Error;
use super::context::Context;
use super::leftovers;
use super::pod::workspace_claim;
use super::statuses::run_name;
use super::warm::{grants_the_same, made_ahead, made_ahead_by};
use super::writer::{Applied, Wrote};
use crate::crd::v1alpha1::AgentRun;
use crate::crd::{controlled_by_run, controlling_run};
use crate::rbac::{RbacError, RunRbac, worker_service_account_name};

/// Makes sure the run's worker ServiceAccount, Role and RoleBinding exist. Nothing to do when
/// the run names its own ServiceAccount (`spec.worker.serviceAccountName`: the user's choice,
/// not isolated by baton), or when this controller already made sure for this run.
pub async fn ensure_run_rbac(
    ctx: &Context,
    run: &AgentRun,
    first_claim: bool,
) -> Result<(), Error> {
    if run.spec.worker.service_account_name.is_some() {
        return Ok(());
    }
    let uid = run.uid();
    if uid.is_some() && ctx.memory_of(run).rbac_for == uid {
        return Ok(());
    }
    let rbac = RunRbac::for_run(run).map_err(|e| rbac_error(run, e))?;
    let ns = run.id().namespace;
    let present = !first_claim
        && ctx
            .api::<RoleBinding>(&ns)
            .get_opt(&rbac.name())
            .await?
            .is_some_and(|b| controlled_by_run(&b, &run.id().uid));
    if !present {
        // The Role must exist before a binding to it can be created by a controller without
        // `bind` (the API server resolves the Role to check for escalation); the
        // ServiceAccount is independent of both.
        let (accounts, roles) = (ctx.api::<ServiceAccount>(&ns), ctx.api::<Role>(&ns));
        futures::try_join!(
            create_owned(ctx, run, &accounts, &rbac.service_account),
            create_owned(ctx, run, &roles, &rbac.role),
        )?;
        let bindings = ctx.api::<RoleBinding>(&ns);
        create_owned(ctx, run, &bindings, &rbac.role_binding).await?;
        tracing::debug!(run = %run_name(run), name = %rbac.name(), "worker RBAC in place");
    }
    ctx.remember(run, |m| m.rbac_for = uid);
    Ok(())
}

/// Removes the run's own worker ServiceAccount, Role and RoleBinding once the run has ended
/// and no process of its attempts runs: a finished run holds no identity (an idle thread of
/// many turns keeps none of its turns'), and a token its worker held, leaked or not, dies
/// with its ServiceAccount. Each goes only if the run controls it, by UID. The RoleBinding,
/// created last, goes last: while it stands, a later pass (a restarted controller, which
/// remembers nothing) finds the identity and removes the rest; once it is gone, one read
/// says so.
pub async fn remove_run_rbac(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let (ns, uid) = (run.id().namespace, run.id().uid);
    let name = worker_service_account_name(&run.name_any());
    let bindings = ctx.api::<RoleBinding>(&ns);
    if let Some(binding) = bindings.get_opt(&name).await? {
        let accounts = ctx.api::<ServiceAccount>(&ns);
        let roles = ctx.api::<Role>(&ns);
        futures::try_join!(
            ctx.delete_if("service_account_delete", &accounts, &name, |o| {
                controlled_by_run(o, &uid)
            }),
            ctx.delete_if("role_delete", &roles, &name, |o| controlled_by_run(o, &uid)),
        )?;
        if controlled_by_run(&binding, &uid) {
            ctx.delete_of_uid("role_binding_delete", &bindings, &binding)
                .await?;
        }
        tracing::debug!(run = %run_name(run), %name, "worker identity removed");
    }
    ctx.remember(run, |m| {
        m.identity_removed = true;
        m.rbac_for = None;
    });
    Ok(Applied::Done)
}

/// Creates `obj` (counted by kind). An existing object owned by the run is success; one owned by an earlier run of the same name (that the garbage collector has not
/// removed yet) is deleted and the error retried later; one no run owns is left alone.
async fn create_owned<K>(ctx: &Context, run: &AgentRun, api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    <K as Resource>::DynamicType: Default,
{
    let kind = match K::kind(&Default::default()).as_ref() {
        "ServiceAccount" => "service_account",
        "Role" => "role",
        "PersistentVolumeClaim" => "workspace_claim",
        _ => "role_binding",
    };
    match ctx
        .write(kind, api.create(&PostParams::default(), obj))
        .await?
    {
        Wrote::Exists => {
            let existing = api.get(&obj.name_any()).await?;
            if controlled_by_run(&existing, &run.id().uid) || made_ahead_for(&existing, run, obj) {
                return Ok(());
            }
            if made_ahead(&existing) {
                // For a turn of another thread, or of this thread's past self: removed, and
                // made again as this run's.
                leftovers::delete_leftover(ctx, api, &existing).await?;
                return Err(Error::LeftoverRemoved(format!(
                    "{} {} was made ahead for a thread's next turn, not run {}: removed it",
                    K::kind(&Default::default()),
                    obj.name_any(),
                    run_name(run),
                )));
            }
            let what = format!(
                "{} {} exists but is not owned by run {}",
                K::kind(&Default::default()),
                obj.name_any(),
                run_name(run),
            );
            if controlling_run(&existing).is_some() {
                leftovers::delete_leftover(ctx, api, &existing).await?;
                return Err(Error::LeftoverRemoved(format!(
                    "{what} (an earlier run's of the same name: removed it)"
                )));
            }
            let remedy = match kind {
                "workspace_claim" => "remove it, or rename the run",
                _ => "remove it or name a ServiceAccount in spec.worker",
            };
            Err(Error::Rbac(format!("{what} (not a run's: {remedy})")))
        }
        // Gone: the namespace is going away, and the run with it.
        Wrote::Written(_) | Wrote::Gone | Wrote::Conflict => Ok(()),
    }
}

/// Makes sure the run's workspace claim (`spec.workspace`) exists, owned by the run, before
/// a pod that mounts it is created: one create per attempt, AlreadyExists being the usual
/// answer. Kept by the run for all its attempts; deleted with it by the garbage collector.
pub async fn ensure_workspace(ctx: &Context, run: &AgentRun) -> Result<(), Error> {
    let Some(claim) = workspace_claim(run) else {
        return Ok(());
    };
    let ns = run.id().namespace;
    create_owned(ctx, run, &ctx.api::<PersistentVolumeClaim>(&ns), &claim).await
}

fn rbac_error(run: &AgentRun, err: RbacError) -> Error {
    Error::Rbac(format!("run {}: {err}", run_name(run)))
}

/// Whether `obj` was made ahead for `run` (`controller::warm`): a turn that joined the thread
/// it was made for (its name is the run's: the objects' name gives it), granting what the
/// run's own would (`desired`).
fn made_ahead_for<K: Resource + Serialize>(obj: &K, run: &AgentRun, desired: &K) -> bool {
    let thread = run.thread_owner().filter(|_| run.has_joined());
    thread.is_some_and(|t| made_ahead_by(obj, &t.uid)) && grants_the_same(obj, desired)
}
