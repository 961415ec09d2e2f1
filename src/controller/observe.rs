//! Observe: the watch caches and the controller's own memory, turned into an `Observation`.
//! Reads only (plus updating the in-memory sightings); no API calls.

use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::context::{Context, run_key};
use super::decide::{Admission, LeaseObs, Observation, PodState};
use super::pod::{CONTAINER_NAME, desired_image, pod_image};
use crate::crd::controlled_by_run;
use crate::crd::v1alpha1::AgentRun;
use crate::fence::{Fence, run_lease_name, worker_pod_name};
use crate::lease::{LeaseSighting, lease_fence, lease_holder, thread_lease_name};

/// Everything decide needs about `run`, as of `now`.
pub fn observe<'a>(ctx: &Context, run: &'a AgentRun, now: Instant) -> Observation<'a> {
    let ns = run.id().namespace;
    let lease = ctx
        .lease_cache()
        .get(&ObjectRef::new(&run_lease_name(&run.name_any())).within(&ns));
    let lease = lease.map(|l| sight(ctx, run, &l, now));
    let stop_seen_at = remember_stop(ctx, run, now);
    let (in_flight, rolled_out) = rollouts_in_flight(ctx, run);
    let memory = ctx.memory_of(run);
    Observation {
        run,
        lease,
        pod: pod_state(ctx, run),
        admission: admission(ctx, run),
        on_busy: super::turn::busy_policy(ctx, run),
        holder_stopping: super::turn::holder_stopping(ctx, run),
        stop_seen_at,
        desired_image: desired_image(run, &ctx.config().worker_image),
        rollout: ctx.config().rollout_policy,
        rollout_slot: in_flight < ctx.config().max_concurrent_handoffs,
        rolled_out,
        close_recorded: memory.close_recorded,
        identity_left: run.spec.worker.service_account_name.is_none() && !memory.identity_removed,
        now,
        wall: Timestamp::now(),
    }
}

/// Records a sighting of the run's Lease (keeping the first time this version was seen).
pub fn sight(ctx: &Context, run: &AgentRun, lease: &Lease, now: Instant) -> LeaseObs {
    let mut sighting = None;
    ctx.remember(run, |m| {
        let s = LeaseSighting::observe(m.sighting.as_ref(), lease, now);
        m.sighting = Some(s.clone());
        sighting = Some(s);
    });
    LeaseObs {
        holder: lease_holder(lease).map(Into::into),
        fence: lease_fence(lease),
        sighting: sighting.expect("set above"),
    }
}

fn remember_stop(ctx: &Context, run: &AgentRun, now: Instant) -> Option<Instant> {
    let mut seen = None;
    ctx.remember(run, |m| {
        m.stop_seen_at = run.spec.stop.then(|| m.stop_seen_at.unwrap_or(now));
        seen = m.stop_seen_at;
    });
    seen
}

/// The pod of the run's current fence, as the cache has it.
pub fn pod_state(ctx: &Context, run: &AgentRun) -> PodState {
    let fence = Fence::of_run(run);
    if fence.never_claimed() {
        return PodState::Missing;
    }
    let name = worker_pod_name(&run.name_any(), fence);
    let ns = run.id().namespace;
    match ctx.pod_cache().get(&ObjectRef::new(&name).within(&ns)) {
        Some(pod) if controlled_by_run(&*pod, &run.id().uid) => classify_pod(&pod),
        _ => PodState::Missing,
    }
}

/// Pending, running, terminated or being deleted.
pub fn classify_pod(pod: &Pod) -> PodState {
    let image = pod_image(pod);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    match phase {
        Some("Succeeded") | Some("Failed") => PodState::Terminated,
        _ if pod.metadata.deletion_timestamp.is_some() => PodState::Deleting,
        Some("Running") => PodState::Running { image },
        _ => match worker_unstartable(pod) {
            Some(message) => PodState::Unstartable { message },
            None => PodState::Pending {
                image,
                unbound_claim: unbound_claim(pod),
                started: any_container_started(pod),
            },
        },
    }
}

/// The kubelet's reasons for not starting a container that it will never start as it is: a
/// configuration naming something that does not exist (a Secret, a key), or an image name
/// that is not one. It keeps retrying, and the pod stays Pending for good. (A pull that
/// fails is not among them: a registry may come back; the startup allowance bounds it.)
const NEVER_STARTS: [&str; 2] = ["CreateContainerConfigError", "InvalidImageName"];

/// The kubelet's message when a container of the pod cannot be started, e.g.
/// `secret "key" not found`; for another container than the worker's, named with it.
pub fn unstartable(status: &ContainerStatus) -> Option<String> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !NEVER_STARTS.contains(&reason) {
        return None;
    }
    let message = waiting.message.as_deref().unwrap_or(reason);
    Some(if status.name == CONTAINER_NAME {
        message.to_string()
    } else {
        format!("container {}: {message}", status.name)
    })
}

/// The scheduler's message when the pod cannot be placed because a claim is not bound.
pub fn unbound_claim(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone())
        .filter(|m| m.contains("PersistentVolumeClaim"))
}

/// Some container, init included, is running or has run: the pod's volumes were mounted.
pub fn any_container_started(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let init = status.init_container_statuses.iter().flatten();
    init.chain(status.container_statuses.iter().flatten())
        .any(has_started)
}

pub fn has_started(status: &ContainerStatus) -> bool {
    status
        .state
        .as_ref()
        .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
}

fn worker_unstartable(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let containers = status.container_statuses.iter().flatten();
    let init = status.init_container_statuses.iter().flatten();
    init.chain(containers).find_map(unstartable)
}

/// The run's thread admission as the caches have it.
pub fn admission(ctx: &Context, run: &AgentRun) -> Admission {
    let Some(key) = run.spec.admission_key() else {
        return Admission::NotRequired;
    };
    let ns = run.id().namespace;
    let lease_ref = ObjectRef::new(&thread_lease_name(key)).within(&ns);
    match ctx.lease_cache().get(&lease_ref) {
        Some(lease) => held_admission(ctx, run, &lease),
        None => match oldest_pending(ctx, &ns, key) {
            Some(first) if first != run.name_any() => Admission::Busy { holder: first },
            _ => Admission::Free,
        },
    }
}

fn held_admission(ctx: &Context, run: &AgentRun, lease: &Lease) -> Admission {
    let holder = lease_holder(lease).unwrap_or_default().to_string();
    let holder_uid = lease.owner_references().first().map(|o| o.uid.clone());
    if holder == run.name_any() && holder_uid == run.uid() {
        return Admission::Held;
    }
    let ns = run.id().namespace;
    let live = ctx
        .run_cache()
        .get(&ObjectRef::new(&holder).within(&ns))
        .filter(|h| h.uid() == holder_uid)
        .is_some_and(|h| !h.status.as_ref().is_some_and(|s| s.phase.is_terminal()));
    if live {
        Admission::Busy { holder }
    } else {
        Admission::Stale { holder }
    }
}

/// The oldest Pending run of a thread (creation time, then name).
pub fn oldest_pending(ctx: &Context, ns: &str, key: &str) -> Option<String> {
    ctx.run_cache()
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns))
        .filter(|r| r.spec.admission_key() == Some(key))
        .filter(|r| {
            r.status
                .as_ref()
                .is_none_or(|s| s.phase == crate::crd::v1alpha1::Phase::Pending)
        })
        .min_by_key(|r| r.turn_order())
        .map(|r| r.name_any())
}

/// Rollout handoffs still in flight, and whether `run`'s current attempt is one of them;
/// finished ones (the run moved past that fence) are dropped.
fn rollouts_in_flight(ctx: &Context, run: &AgentRun) -> (usize, bool) {
    let mut rollouts = ctx.rollouts().lock().expect("rollouts lock");
    rollouts.retain(|((ns, name), fence)| {
        ctx.run_cache()
            .get(&ObjectRef::new(name).within(ns))
            .and_then(|r| r.status.clone())
            .is_some_and(|s| crate::fence::status_names(s.fence, *fence) && !s.phase.is_terminal())
    });
    let this_one = rollouts.contains(&(run_key(run), Fence::of_run(run)));
    (rollouts.len(), this_one)
}

/// Marks a rollout handoff in flight for the run at its current fence.
pub fn start_rollout(ctx: &Context, run: &AgentRun) {
    let fence = Fence::of_run(run);
    ctx.rollouts()
        .lock()
        .expect("rollouts lock")
        .insert((run_key(run), fence));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "r-w1"},
            "spec": {"containers": [{"name": "tools", "image": "t"}, {"name": "worker", "image": "w"}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_tools_container_that_will_never_start_is_named_in_the_message() {
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": "tools", "image": "bad image", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "InvalidImageName", "message": "couldn't parse image reference \"bad image\""}},
            }],
        }));
        let PodState::Unstartable { message } = classify_pod(&p) else {
            panic!("expected unstartable: {:?}", classify_pod(&p));
        };
        assert!(
            message.starts_with("container tools: couldn't parse"),
            "{message}"
        );
    }

    #[test]
    fn a_pending_pod_tells_an_unbound_claim_and_whether_anything_started() {
        let unscheduled = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims."}],
        }));
        let PodState::Pending {
            unbound_claim,
            started,
            ..
        } = classify_pod(&unscheduled)
        else {
            panic!("expected pending");
        };
        assert!(unbound_claim.is_some_and(|m| m.contains("unbound immediate")));
        assert!(!started);
        let initializing = pod(serde_json::json!({
            "phase": "Pending",
            "initContainerStatuses": [{
                "name": "install-executor", "image": "b", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"running": {}},
            }],
        }));
        let PodState::Pending {
            unbound_claim,
            started,
            ..
        } = classify_pod(&initializing)
        else {
            panic!("expected pending");
        };
        assert_eq!((unbound_claim, started), (None, true));
    }
}
