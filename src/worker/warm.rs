//! A pod started ahead for a thread's next turn (`spec.warm` on the thread): the worker starts
//! as far as it can without a run (its client, its executor), then waits for the turn it was
//! made for to be claimed for it. The claim is the one every attempt has (seal, status CAS,
//! Lease); the pod only learns of it sooner than a new pod would start. It serves only a turn
//! that joined its thread at the generation it was made from, and exits when none comes.

use std::pin::pin;
use std::time::Duration;

use futures::TryStreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
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

/// Waits, watching the run by name, until its turn is claimed for this pod (true) or it will
/// never be, or `warm.idle` passes (false: the pod exits, and holds nothing).
pub async fn wait_for_turn(runs: &Api<AgentRun>, cfg: &WorkerConfig, warm: &Warm) -> bool {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", cfg.run));
    let events = watcher(runs.clone(), config).default_backoff();
    let mut events = pin!(events);
    let idle = tokio::time::sleep(warm.idle);
    let mut idle = pin!(idle);
    info!(thread_uid = %warm.thread_uid, idle = ?warm.idle, "started ahead: waiting for the turn");
    loop {
        let event = tokio::select! {
            event = events.try_next() => event,
            () = &mut idle => {
                info!("no turn came while the pod waited: exiting");
                return false;
            }
        };
        let seen = match event {
            Ok(Some(watcher::Event::Apply(run) | watcher::Event::InitApply(run))) => Some(run),
            Ok(Some(watcher::Event::Delete(_))) => None,
            Ok(Some(_)) => continue,
            Ok(None) => return false,
            Err(err) => {
                tracing::warn!(error = %err, "watching the run failed; watching again");
                continue;
            }
        };
        match sighting(seen.as_ref(), warm, cfg.fence, &cfg.pod) {
            Sighting::Wait => {}
            Sighting::Start => {
                let uid = seen.as_ref().and_then(|r| r.meta().uid.clone());
                info!(uid = ?uid, "the turn is claimed for this pod: starting");
                return true;
            }
            Sighting::Refuse(why) => {
                info!(why, "not serving this run: exiting");
                return false;
            }
        }
    }
}

#[cfg(test)]
#[path = "warm_tests.rs"]
mod tests;
