//! Thread admission (docs/architecture.md): a Lease per thread key is the UNIQUE constraint. Created
//! with `create` (AlreadyExists = busy), holder = the run, owned by it; deleted with a
//! precondition (uid + resourceVersion) when that run ends; then the oldest Pending run of
//! the thread is woken.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;

use super::Error;
use super::context::Context;
use super::observe::oldest_pending;
use super::statuses::run_name;
use super::writer::{Applied, Wrote};
use crate::crd::THREAD_KEY_ANNOTATION;
use crate::crd::v1alpha1::AgentRun;
use crate::lease::{lease_holder, thread_lease_name};
use crate::owned::{Ownership, managed_labels, owner_reference};

/// Creates the thread's admission Lease naming `run`.
pub async fn admit(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let Some(key) = run.spec.admission_key() else {
        return Ok(Applied::Done);
    };
    let ns = run.id().namespace;
    let api = ctx.api::<Lease>(&ns);
    let lease = thread_lease(run, key);
    let params = PostParams::default();
    let created = ctx.write("admission", api.create(&params, &lease));
    // Exists: another run holds the thread (or an earlier pass admitted this one): look again.
    if let Wrote::Written(_) = created.await? {
        tracing::info!(run = %run_name(run), thread = key, "admitted");
        ctx.event(run, false, "Admitted", format!("admitted on thread {key}"));
    }
    Ok(Applied::Requeue)
}

fn thread_lease(run: &AgentRun, key: &str) -> Lease {
    let owner = owner_reference(run, Ownership::Reference).map(|o| vec![o]);
    Lease {
        metadata: ObjectMeta {
            name: Some(thread_lease_name(key)),
            labels: Some(managed_labels()),
            annotations: Some(BTreeMap::from([(THREAD_KEY_ANNOTATION.into(), key.into())])),
            owner_references: owner,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(run.name_any()),
            acquire_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// Releases the thread `run` holds (if it holds it) and wakes the next Pending run of it.
pub async fn release(ctx: &Context, run: &AgentRun) -> Result<(), Error> {
    let Some(key) = run.spec.admission_key() else {
        return Ok(());
    };
    let held = |lease: &Lease| {
        lease_holder(lease) == Some(run.name_any().as_str())
            && lease.owner_references().first().map(|o| o.uid.clone()) == run.uid()
    };
    delete_thread_lease(ctx, run, key, held).await?;
    wake_next(ctx, run, key);
    Ok(())
}

/// Deletes an admission Lease whose holder is finished or gone, then looks again.
pub async fn clear_stale(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let Some(key) = run.spec.admission_key() else {
        return Ok(Applied::Done);
    };
    let stale = |lease: &Lease| lease_holder(lease) != Some(run.name_any().as_str());
    delete_thread_lease(ctx, run, key, stale).await?;
    Ok(Applied::Requeue)
}

/// Reads the thread Lease; if `should` holds, deletes it with a uid+resourceVersion precondition.
async fn delete_thread_lease(
    ctx: &Context,
    run: &AgentRun,
    key: &str,
    should: impl Fn(&Lease) -> bool,
) -> Result<(), Error> {
    let api = ctx.api::<Lease>(&run.id().namespace);
    let name = thread_lease_name(key);
    let Some(lease) = api.get_opt(&name).await? else {
        return Ok(());
    };
    if !should(&lease) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.uid(),
            resource_version: lease.resource_version(),
        }),
        ..DeleteParams::default()
    };
    // Conflict: the Lease changed since it was read (it is someone else's now); Gone: released.
    ctx.write("admission", api.delete(&name, &params)).await?;
    Ok(())
}

fn wake_next(ctx: &Context, run: &AgentRun, key: &str) {
    let ns = run.id().namespace;
    if let Some(next) = oldest_pending(ctx, &ns, key) {
        let _ = ctx.wake().unbounded_send(ObjectRef::new(&next).within(&ns));
    }
}
