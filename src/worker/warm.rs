//! A pod started ahead for a thread's next turn (`spec.warm` on the thread): the worker starts
//! as far as it can without a run (its client, its executor), then waits for the turn it was
//! made for to be claimed for it. The claim is the one every attempt has (seal, status CAS,
//! Lease); the pod only learns of it sooner than a new pod would start. It serves only a turn
//! that joined its thread at the generation it was made from, and exits when none comes.
//!
//! It acts only once the run has adopted it (the claim's last write: the pod's controller is
//! the run, by this pod's UID), not when the status first names its pod: until then the
//! thread may remove it (idle, or made from settings the turn did not get) and the claim may
//! then create a pod of the same name, and a worker that had acted in the removed one would be
//! a second worker at the fence (found by the claim protocol's model).

use std::pin::pin;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::info;

use super::{WorkerConfig, may_start};
use crate::crd::THREAD_GENERATION_ANNOTATION;
use crate::crd::v1alpha1::AgentRun;
use crate::fence::Fence;

/// What a pod started ahead waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warm {
    /// The UID of the thread whose next turn it is for.
    pub thread_uid: String,
    /// The thread's generation the pod was made from (None: unknown, not checked).
    pub thread_generation: Option<i64>,
    /// This pod's UID.
    pub pod_uid: String,
    /// How long it waits before it exits.
    pub idle: Duration,
}

/// What the waiting pod makes of its run as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sighting {
    /// Not yet: no such run, a turn not yet joined or not yet claimed.
    Wait,
    /// Claimed for this pod: the attempt starts.
    Start,
    /// Not for this pod, ever: the reason.
    Refuse(String),
}

/// Pure: what run `run` (None: there is none) means to the pod `pod` made for its attempt
/// `fence` as a turn of `warm`'s thread.
pub fn sighting(run: Option<&AgentRun>, warm: &Warm, fence: Fence, pod: &str) -> Sighting {
    let Some(run) = run else {
        return Sighting::Wait;
    };
    if run.spec.thread.is_none() {
        return Sighting::Refuse("a run of this name is no turn of a thread".into());
    }
    if !run.has_joined() {
        return Sighting::Wait;
    }
    match run.thread_owner() {
        Some(owner) if owner.uid == warm.thread_uid => {}
        _ => return Sighting::Refuse("the run is a turn of another thread".into()),
    }
    let stamped = run
        .annotations()
        .get(THREAD_GENERATION_ANNOTATION)
        .and_then(|g| g.parse::<i64>().ok());
    if let (Some(made), Some(stamped)) = (warm.thread_generation, stamped)
        && made != stamped
    {
        return Sighting::Refuse(format!(
            "the turn was admitted at thread generation {stamped}; this pod was made from \
             generation {made}"
        ));
    }
    let status = run.status.as_ref();
    if may_start(status, fence, pod) {
        return Sighting::Start;
    }
    match status {
        Some(s) if !s.fence.never_claimed() => Sighting::Refuse(format!(
            "the run was claimed at fence {}, not for this pod",
            s.fence
        )),
        _ => Sighting::Wait,
    }
}

/// Pure: what this pod (`pod`, None: there is none of its name), once the status names it,
/// means for the pod of UID `own` made ahead for run `run_uid`: Start once the run controls it
/// (adopted), Wait while the thread still does (the claim adopts it right after it moves the
/// Lease), Refuse when it is another pod of the name, being deleted, or anyone else's.
pub fn adoption(pod: Option<&Pod>, own: &str, run_uid: &str) -> Sighting {
    let Some(pod) = pod.filter(|p| p.uid().as_deref() == Some(own)) else {
        return Sighting::Refuse("this pod is gone: another of its name stands".into());
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Sighting::Refuse("this pod is being deleted".into());
    }
    match controlling_owner(pod) {
        Some(o) if o.kind == "AgentRun" && o.uid == run_uid => Sighting::Start,
        Some(o) if o.kind == "AgentThread" => Sighting::Wait,
        _ => Sighting::Refuse("this pod was taken by no turn of its thread".into()),
    }
}

fn controlling_owner(pod: &Pod) -> Option<&OwnerReference> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
}

/// How soon a pod the status names asks again whether it was adopted (the claim's next
/// write, normally within milliseconds), doubling up to `ADOPTION_POLL_MAX` should the
/// claimer have stopped (the run is then claimed again for another pod, and this one exits).
const ADOPTION_POLL: Duration = Duration::from_millis(20);
const ADOPTION_POLL_MAX: Duration = Duration::from_secs(2);

/// Waits, watching the run by name, until its turn is claimed for this pod and the run has
/// adopted the pod (true), or it never will be, or `warm.idle` passes (false: the pod exits,
/// and holds nothing).
pub async fn wait_for_turn(client: &Client, cfg: &WorkerConfig, warm: &Warm) -> bool {
    let idle = tokio::time::sleep(warm.idle);
    let mut idle = pin!(idle);
    let waited = async {
        let Some(run_uid) = claimed_for_this_pod(client, cfg, warm).await else {
            return false;
        };
        adopted(client, cfg, warm, &run_uid).await
    };
    tokio::select! {
        started = waited => started,
        () = &mut idle => {
            info!("no turn came while the pod waited: exiting");
            false
        }
    }
}

/// Polls this pod until the run `run_uid` has adopted it (true) or it never will (false: the
/// pod is replaced, deleted or someone else's, or the run is no longer claimed for it).
async fn adopted(client: &Client, cfg: &WorkerConfig, warm: &Warm, run_uid: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &cfg.namespace);
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut pause = ADOPTION_POLL;
    loop {
        let seen = match pods.get_opt(&cfg.pod).await {
            Ok(pod) => adoption(pod.as_ref(), &warm.pod_uid, run_uid),
            Err(err) => {
                tracing::warn!(error = %err, "reading this pod failed; reading it again");
                Sighting::Wait
            }
        };
        let seen = match seen {
            Sighting::Wait => match runs.get_opt(&cfg.run).await {
                Ok(run) => match sighting(run.as_ref(), warm, cfg.fence, &cfg.pod) {
                    Sighting::Start => Sighting::Wait,
                    Sighting::Wait => Sighting::Refuse("the run is not claimed for it".into()),
                    refused => refused,
                },
                Err(_) => Sighting::Wait,
            },
            other => other,
        };
        match seen {
            Sighting::Wait => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ADOPTION_POLL_MAX);
            }
            Sighting::Start => {
                info!(run_uid, "the turn adopted this pod: starting");
                return true;
            }
            Sighting::Refuse(why) => {
                info!(why, "not serving this run: exiting");
                return false;
            }
        }
    }
}

/// Watches the run by name until its turn is claimed for this pod (the run's UID) or it will
/// never be (None).
async fn claimed_for_this_pod(client: &Client, cfg: &WorkerConfig, warm: &Warm) -> Option<String> {
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &cfg.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", cfg.run));
    let events = watcher(runs, config).default_backoff();
    let mut events = pin!(events);
    info!(thread_uid = %warm.thread_uid, idle = ?warm.idle, "started ahead: waiting for the turn");
    loop {
        let seen = match events.try_next().await {
            Ok(Some(watcher::Event::Apply(run) | watcher::Event::InitApply(run))) => Some(run),
            Ok(Some(watcher::Event::Delete(_))) => None,
            Ok(Some(_)) => continue,
            Ok(None) => return None,
            Err(err) => {
                tracing::warn!(error = %err, "watching the run failed; watching again");
                continue;
            }
        };
        match sighting(seen.as_ref(), warm, cfg.fence, &cfg.pod) {
            Sighting::Wait => {}
            Sighting::Start => {
                let uid = seen.as_ref().and_then(|r| r.meta().uid.clone());
                info!(uid = ?uid, "the turn is claimed for this pod: waiting to be adopted");
                return uid;
            }
            Sighting::Refuse(why) => {
                info!(why, "not serving this run: exiting");
                return None;
            }
        }
    }
}

#[cfg(test)]
#[path = "warm_tests.rs"]
mod tests;
