//! A thread's next turn started ahead (`spec.warm`, docs/architecture.md "Warm turns"): the
//! thread offers its next turn a name (`status.nextTurn`), and the controller starts, under
//! that name, the pod the turn's first attempt would get, with the worker RBAC it would get,
//! both owned by the thread. The turn, once created under that name, joined and claimed as
//! every run is, adopts the pod instead of creating one: the claim protocol does not change,
//! only the pod is already running when the Lease names it.
//!
//! Why a name and not a pool of anonymous pods: a pod's ServiceAccount and Secrets are fixed
//! when it is created. Started for a named turn of one thread, the pod runs as that turn's own
//! identity (whose Role reaches only objects of that name) and with that thread's Secrets,
//! which the thread's writer was found allowed to lend (DESIGN §12); no credential is handed
//! over later, and the controller never reads a Secret. A turn adopts the pod only if its own
//! first pod would be identical (the spec digest) and it joined that thread; the worker in it
//! serves nothing else either (`worker::warm`).

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::Error;
use super::attempt_pod::attempt_pod;
use super::context::Context;
use super::writer::Wrote;
use crate::crd::v1alpha1::{AgentRun, AgentThread};
use crate::crd::{
    POD_SPEC_DIGEST_ANNOTATION, THREAD_GENERATION_ANNOTATION, WARM_THREAD_LABEL, controlled_by_run,
    controlling_run, env,
};
use crate::fence::{Fence, worker_pod_name};
use crate::rbac::{RunRbac, worker_service_account_name};

/// The fence of a run's first attempt: the one a pod started ahead is made for.
pub const FIRST: Fence = Fence::new(1);
/// How much longer than the thread's `idleSeconds` a pod started ahead waits on its own. The
/// controller removes the pod when the thread stops wanting it; this bounds its life should
/// no controller do so (and a turn that stays live longer than this gets a new one).
const SAFETY_FUSE_SECONDS: i64 = 3600;
/// How soon a thread looks again at a pod it could not remove as its cache showed it.
const CACHE_CATCH_UP: Duration = Duration::from_secs(1);
/// The characters of a name's random part (the API server's `generateName` alphabet: no
/// vowels, no look-alikes).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Pure: the name the thread offers its next turn. The one it offers now, until a run of that
/// name exists (`taken`: the turn took it, or any run did); then `fresh`. None without
/// `spec.warm`, or when the thread's name leaves no room for a turn's.
pub fn offered_name(
    thread: &AgentThread,
    taken: impl Fn(&str) -> bool,
    fresh: impl FnOnce() -> String,
) -> Option<String> {
    thread.spec.warm.as_ref()?;
    let offered = thread.status.as_ref().and_then(|s| s.next_turn.clone());
    let name = offered.filter(|n| !taken(n)).unwrap_or_else(fresh);
    RunRbac::name_fits(&name).then_some(name)
}

/// A fresh name for a turn of `thread`: `<thread>-<5 random characters>`.
pub fn fresh_name(thread: &str) -> String {
    let tail: String = (0..5)
        .map(|_| ALPHABET[rand::random::<u32>() as usize % ALPHABET.len()] as char)
        .collect();
    format!("{thread}-{tail}")
}

/// Whether a thread wants its next turn's pod started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Not now: no `spec.warm`, no turn ran yet, or idle for longer than `idleSeconds`.
    No,
    /// While a turn is live.
    WhileLive,
    /// For this much longer: the last turn ended less than `idleSeconds` ago.
    For(Duration),
}

impl Want {
    pub fn wanted(self) -> bool {
        self != Want::No
    }
}

/// Pure: whether the thread wants its next turn's pod started now: while a turn is live, and
/// for `idleSeconds` after the last one ended (its `Busy` condition turned False).
pub fn wanted(thread: &AgentThread, now: Timestamp) -> Want {
    let Some(warm) = &thread.spec.warm else {
        return Want::No;
    };
    let status = thread.status.as_ref();
    let busy = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Busy"));
    match busy {
        Some(c) if c.status == "True" => Want::WhileLive,
        Some(c) => {
            let until = c.last_transition_time.0 + SignedDuration::from_secs(warm.idle_seconds);
            let left = until.duration_since(now);
            match Duration::try_from(left) {
                Ok(left) if !left.is_zero() => Want::For(left),
                _ => Want::No,
            }
        }
        None => Want::No,
    }
}

/// Pure: the turn `name` of `thread` as it will be once it joined, for the pod it will need
/// (it has no UID yet: nothing is owned by it).
pub fn prospective_turn(thread: &AgentThread, name: &str) -> AgentRun {
    let mut turn = thread.new_turn("");
    turn.metadata.generate_name = None;
    turn.metadata.name = Some(name.to_string());
    turn.metadata.namespace = thread.namespace();
    thread.lend_to(&mut turn, 0);
    turn
}

/// Pure: the digest of what a pod runs (its spec): a turn adopts a pod started ahead only if
/// the pod its first attempt would get has the same.
pub fn spec_digest(pod: &Pod) -> String {
    let spec = serde_json::to_vec(&pod.spec).unwrap_or_default();
    let digest = Sha256::digest(&spec);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Pure: `pod` (the first attempt's pod of the prospective turn) as started ahead for
/// `thread`: owned by the thread, labelled and annotated so a turn can tell it is its own, its
/// worker told to wait for the turn.
pub fn ahead(mut pod: Pod, thread: &AgentThread) -> Pod {
    let digest = spec_digest(&pod);
    let idle = thread.spec.warm.as_ref().map_or(0, |w| w.idle_seconds) + SAFETY_FUSE_SECONDS;
    let uid = thread.uid().unwrap_or_default();
    let generation = thread.metadata.generation.unwrap_or_default();
    let meta = &mut pod.metadata;
    meta.owner_references = thread.controller_owner_ref(&()).map(|o| vec![o]);
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(WARM_THREAD_LABEL.into(), uid.clone());
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(POD_SPEC_DIGEST_ANNOTATION.into(), digest);
    annotations.insert(THREAD_GENERATION_ANNOTATION.into(), generation.to_string());
    if let Some(vars) = super::attempt_pod::worker_env_mut(&mut pod) {
        vars.push(var(env::WARM_THREAD_UID, uid));
        vars.push(var(env::WARM_THREAD_GENERATION, generation.to_string()));
        vars.push(var(env::WARM_IDLE_SECONDS, idle.to_string()));
        vars.push(own_uid());
    }
    pod
}

/// The pod's own UID, from the downward API: its worker starts only once its run has adopted
/// the pod of that UID (`worker::warm::adopted`).
fn own_uid() -> EnvVar {
    EnvVar {
        name: env::WARM_POD_UID.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.uid".into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn var(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

/// Pure: whether `existing` (a pod of the name `run`'s attempt needs) is one started ahead
/// that `run` may adopt as `desired`: made for the thread `run` joined, at the thread's
/// generation the turn was admitted at (the worker in it serves no other), from the same spec,
/// and still able to serve (not ended, not being deleted).
pub fn adoptable(existing: &Pod, run: &AgentRun, desired: &Pod) -> bool {
    let Some(thread) = run.thread_owner().filter(|_| run.has_joined()) else {
        return false;
    };
    let admitted_at = run.annotations().get(THREAD_GENERATION_ANNOTATION);
    made_ahead_by(existing, &thread.uid)
        && (admitted_at.is_none() || admitted_at == made_at(existing))
        && pod_digest(existing) == Some(&spec_digest(desired))
        && !has_ended(existing)
        && existing.metadata.deletion_timestamp.is_none()
}

/// Whether the pod's containers have all exited.
fn has_ended(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// `run`'s attempt found a pod of its pod's name (`desired`): its own earlier create, or a
/// pod started ahead that it adopts (one write: the run becomes its controller). Another pod
/// started ahead is deleted, anything else left alone, and either way the attempt fails as if
/// its pod had died: a pod is never created twice for one fence, and the next claim's pod has
/// a name of its own. (The worker in a pod started ahead
/// serves only the turn it was made for; one that started meanwhile is that turn's attempt,
/// ended as any attempt whose pod is deleted.)
pub async fn take_over(ctx: &Context, run: &AgentRun, desired: &Pod) -> Result<(), Error> {
    let api = ctx.api::<Pod>(&run.id().namespace);
    let name = desired.name_any();
    let Some(existing) = api.get_opt(&name).await? else {
        return Err(not_taken(&name, "it was deleted meanwhile"));
    };
    if controlled_by_run(&existing, &run.id().uid) {
        return Ok(());
    }
    if adoptable(&existing, run, desired) {
        let owners = desired
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default();
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": existing.resource_version(),
                "ownerReferences": owners,
            }
        });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        let request = api.patch(&name, &params, &patch);
        if let Wrote::Written(_) = ctx.write("pod_adopt", request).await? {
            tracing::info!(run = %run.name_any(), pod = %name, "adopted the pod started ahead");
            return Ok(());
        }
    }
    if !made_ahead(&existing) {
        // Not baton's to remove: left alone; the next claim's pod has another name.
        return Err(not_taken(&name, "it is not baton's: left it alone"));
    }
    tracing::info!(run = %run.name_any(), pod = %name, "removing a pod started ahead that is not this attempt's");
    ctx.write("pod_delete", api.delete(&name, &as_seen(&existing)))
        .await?;
    Err(not_taken(
        &name,
        "it was not made for this attempt: removed it",
    ))
}

fn not_taken(pod: &str, why: &str) -> Error {
    Error::LeftoverRemoved(format!(
        "pod {pod} stood where the attempt's pod goes; {why}"
    ))
}

/// Starts the next turn's pod of `thread` when it wants one and has none, and removes one it
/// no longer wants (idle too long, ended, or made from settings the thread no longer has). A
/// pod some turn adopted is that turn's, and left alone. Returns when to look again: when the
/// idle thread stops wanting its pod (None: at the next change).
pub async fn ensure(ctx: &Context, thread: &AgentThread) -> Result<Option<Duration>, Error> {
    let Some(turn) = thread.offered_turn_name() else {
        return Ok(None);
    };
    let ns = thread.namespace().unwrap_or_default();
    let name = worker_pod_name(turn, FIRST);
    let cached = ctx.pod_cache().get(&ObjectRef::new(&name).within(&ns));
    let want = wanted(thread, Timestamp::now());
    let desired = || {
        ahead(
            attempt_pod(ctx, &prospective_turn(thread, turn), FIRST),
            thread,
        )
    };
    let api = ctx.api::<Pod>(&ns);
    let uid = thread.uid().unwrap_or_default();
    match cached {
        // Adopted by a turn (its own now), or not made ahead for this thread: not ours here.
        Some(pod) if controlling_run(&*pod).is_some() || !made_ahead_by(&*pod, &uid) => {}
        Some(pod) => {
            let stale = !want.wanted() || has_ended(&pod) || {
                let desired = desired();
                pod_digest(&pod) != pod_digest(&desired) || made_at(&pod) != made_at(&desired)
            };
            if stale && pod.metadata.deletion_timestamp.is_none() {
                tracing::info!(thread = %thread.name_any(), pod = %name, "removing the pod started ahead");
                // At the version the cache shows: a pod adopted since (the cache behind) is
                // the turn's, and the delete is refused. Refused for a mere change of its
                // status: look again once the cache has the pod as it is.
                let params = as_seen(&pod);
                let delete = api.delete(&name, &params);
                if let Wrote::Conflict = ctx.write("pod_delete", delete).await? {
                    return Ok(Some(CACHE_CATCH_UP));
                }
            }
            if !want.wanted() {
                // Idle: the thread keeps nothing for its next turn.
                remove_rbac_ahead(ctx, thread, turn).await?;
            }
        }
        None if want.wanted() => {
            if thread.spec.worker.service_account_name.is_none() {
                ensure_rbac_ahead(ctx, thread, turn).await?;
            }
            let (params, desired) = (PostParams::default(), desired());
            let create = api.create(&params, &desired);
            if let Wrote::Written(_) = ctx.write("pod", create).await? {
                tracing::info!(thread = %thread.name_any(), pod = %name, "started the next turn's pod ahead");
            }
        }
        None => {}
    }
    Ok(match want {
        Want::For(left) => Some(left + Duration::from_secs(1)),
        _ => None,
    })
}

/// Whether `obj` was made ahead of a thread's next turn: labelled with the thread's UID and
/// controlled by that thread. Only such objects are ever removed or taken here.
pub fn made_ahead<K: Resource>(obj: &K) -> bool {
    warm_label(obj).is_some_and(|uid| made_ahead_by(obj, uid))
}

/// [`made_ahead`] by the thread of UID `thread_uid`.
pub fn made_ahead_by<K: Resource>(obj: &K, thread_uid: &str) -> bool {
    let controlled = obj
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "AgentThread" && o.uid == thread_uid);
    controlled && warm_label(obj) == Some(thread_uid)
}

fn warm_label<K: Resource>(obj: &K) -> Option<&str> {
    let labels = obj.meta().labels.as_ref()?;
    labels.get(WARM_THREAD_LABEL).map(String::as_str)
}

/// Pure: whether `existing` grants what `desired` (the run's own worker RBAC object) grants:
/// a Role's rules, a RoleBinding's role and subjects (a ServiceAccount grants nothing itself).
/// Objects made ahead are taken as the run's only then: anyone could have made one so
/// labelled.
pub fn grants_the_same<K: Serialize>(existing: &K, desired: &K) -> bool {
    let grant = |obj: &K| {
        let v = serde_json::to_value(obj).unwrap_or_default();
        let named = |x: &serde_json::Value| {
            serde_json::json!([x.get("kind"), x.get("name"), x.get("namespace")])
        };
        let subjects = v
            .get("subjects")
            .and_then(|s| s.as_array())
            .map(|all| all.iter().map(named).collect::<Vec<_>>());
        serde_json::json!({
            "rules": v.get("rules"),
            "roleRef": v.get("roleRef").map(named),
            "subjects": subjects,
        })
    };
    grant(existing) == grant(desired)
}

/// The thread generation a pod started ahead was made from.
fn made_at(pod: &Pod) -> Option<&String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(THREAD_GENERATION_ANNOTATION))
}

fn pod_digest(pod: &Pod) -> Option<&String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_SPEC_DIGEST_ANNOTATION))
}

/// The worker RBAC of turn `turn`, owned by `thread` and labelled for it, before the pod that
/// runs as it. The turn's claim finds them in place and takes them as its own
/// (`access::made_ahead_for`).
async fn ensure_rbac_ahead(ctx: &Context, thread: &AgentThread, turn: &str) -> Result<(), Error> {
    let ns = thread.namespace().unwrap_or_default();
    let mut meta = kube::api::ObjectMeta {
        name: Some(worker_service_account_name(turn)),
        namespace: Some(ns.clone()),
        labels: Some(crate::owned::run_labels(turn)),
        owner_references: thread.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    };
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(WARM_THREAD_LABEL.into(), thread.uid().unwrap_or_default());
    let rbac = RunRbac::with_meta(turn, meta);
    futures::try_join!(
        create(ctx, ctx.api::<ServiceAccount>(&ns), &rbac.service_account),
        create(ctx, ctx.api::<Role>(&ns), &rbac.role),
    )?;
    create(ctx, ctx.api::<RoleBinding>(&ns), &rbac.role_binding).await
}

/// Removes the worker RBAC made ahead for turn `turn` of `thread` (each object only if that
/// thread made it ahead: labelled for it and controlled by it; by UID).
async fn remove_rbac_ahead(ctx: &Context, thread: &AgentThread, turn: &str) -> Result<(), Error> {
    let ns = thread.namespace().unwrap_or_default();
    let name = worker_service_account_name(turn);
    futures::try_join!(
        remove(ctx, ctx.api::<RoleBinding>(&ns), &name, thread),
        remove(ctx, ctx.api::<Role>(&ns), &name, thread),
        remove(ctx, ctx.api::<ServiceAccount>(&ns), &name, thread),
    )?;
    Ok(())
}

async fn remove<K>(
    ctx: &Context,
    api: kube::Api<K>,
    name: &str,
    thread: &AgentThread,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let uid = thread.uid().unwrap_or_default();
    ctx.delete_if("warm_rbac_delete", &api, name, |obj| {
        made_ahead_by(obj, &uid)
    })
    .await?;
    Ok(())
}

/// Delete parameters that remove `pod` only as it was seen: that UID (not a namesake made
/// since) at that version (not once adopted since).
fn as_seen(pod: &Pod) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: pod.resource_version(),
        }),
        ..DeleteParams::default()
    }
}

/// Creates `obj`; one that exists is left as it is (the claim of the turn checks whose it is).
async fn create<K>(ctx: &Context, api: kube::Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    ctx.write("warm_rbac", api.create(&PostParams::default(), obj))
        .await?;
    Ok(())
}

#[cfg(test)]
#[path = "warm_tests.rs"]
mod tests;
