//! The decision: a pure function of what the controller observed about one run and `now`.
//!
//! No client, no clock of its own. `decide` returns one [`Action`] (apply performs it) and
//! when to look again, at the exact next deadline (lease expiry, startup grace, stop grace,
//! TTL), never by polling.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::approval;
use kube::ResourceExt;

use crate::crd::INTERRUPTED_BY_ANNOTATION;
use crate::crd::v1alpha1::{AgentRun, BusyPolicy, Phase};
use crate::fence::{Fence, lease_reached};
use crate::rbac::{RbacError, RunRbac};

pub use super::decision::*;
use super::validate::{join_problem, validate};

/// How long a Lease that names a never-renewed pod must stay unchanged before a missing pod
/// counts as gone: the time the claiming controller has to create it after moving the Lease.
pub const POD_CREATE_GRACE: Duration = Duration::from_secs(10);

/// How often a run queued behind its thread looks again (a safety net: the holder's finish
/// also wakes the next run at once).
pub const ADMISSION_RECHECK: Duration = Duration::from_secs(30);

/// How often a run waiting for a rollout slot looks again.
pub const ROLLOUT_RECHECK: Duration = Duration::from_secs(2);

/// The decision for one run.
pub fn decide(obs: &Observation<'_>) -> Decision {
    let status = obs.run.status.clone().unwrap_or_default();
    match status.phase {
        Phase::Pending => decide_pending(obs),
        Phase::Running => decide_running(obs),
        Phase::Handoff if obs.run.spec.stop => Decision::act(stop_now(obs.run)),
        Phase::Handoff => claim(obs, ClaimReason::Handoff),
        Phase::WaitingInput => decide_waiting(obs),
        Phase::WaitingApproval => decide_approval(obs),
        Phase::Finishing => Decision::act(Action::Finish),
        _ => decide_terminal(obs),
    }
}

fn decide_pending(obs: &Observation<'_>) -> Decision {
    if obs.run.spec.thread.is_some() && !obs.run.has_joined() {
        return Decision::act(match join_problem(&obs.run.spec) {
            Some(message) => Action::Reject { message },
            None => Action::JoinThread,
        });
    }
    if let Err(message) = validate(&obs.run.spec) {
        return Decision::act(Action::Reject { message });
    }
    if let Some(message) = worker_account_problem(obs.run) {
        return Decision::act(Action::Reject { message });
    }
    if obs.run.spec.stop {
        return Decision::act(stop_now(obs.run));
    }
    match &obs.admission {
        Admission::NotRequired | Admission::Held => claim(obs, ClaimReason::Start),
        Admission::Free => Decision::act(Action::Admit),
        Admission::Stale { .. } => Decision::act(Action::ClearStaleAdmission),
        Admission::Busy { holder } if obs.on_busy == BusyPolicy::Reject => {
            Decision::act(Action::Close(Close {
                reason: CloseReason::ThreadBusy,
                message: format!(
                    "thread {} is busy with turn {holder}, and its onBusy is Reject",
                    obs.run.spec.admission_key().unwrap_or_default()
                ),
                failed: false,
            }))
        }
        Admission::Busy { holder }
            if obs.on_busy == BusyPolicy::Interrupt && !obs.holder_stopping =>
        {
            Decision {
                action: Action::Interrupt {
                    holder: holder.clone(),
                },
                requeue: Some(ADMISSION_RECHECK),
            }
        }
        Admission::Busy { holder } => {
            let queued = admitted_condition_says(obs.run, holder);
            Decision {
                action: if queued {
                    Action::Nothing
                } else {
                    Action::Queue {
                        holder: holder.clone(),
                    }
                },
                requeue: Some(ADMISSION_RECHECK),
            }
        }
    }
}

/// A run whose own worker ServiceAccount (`baton-run-<run>`) could never exist: its name is
/// too long. Such a run names its ServiceAccount itself or is rejected before any claim.
fn worker_account_problem(run: &AgentRun) -> Option<String> {
    if run.spec.worker.service_account_name.is_some() {
        return None;
    }
    match RunRbac::for_run(run) {
        Err(err @ RbacError::NameTooLong { .. }) => Some(err.to_string()),
        _ => None,
    }
}

/// True when the Admitted=False condition already names `holder` (nothing to write).
fn admitted_condition_says(run: &AgentRun, holder: &str) -> bool {
    run.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == crate::status::condition::ADMITTED
                && c.status == "False"
                && c.message.contains(holder)
        })
    })
}

fn decide_waiting(obs: &Observation<'_>) -> Decision {
    if obs.run.spec.stop {
        return Decision::act(stop_now(obs.run));
    }
    let consumed = obs.run.status.as_ref().map_or(0, |s| s.inputs_consumed);
    if obs.run.spec.inputs.len() as i64 > consumed {
        return claim(obs, ClaimReason::InputReceived);
    }
    within_deadline(obs, "input", Decision::wait(None))
}

/// A waiting run (no worker to check its budget) past `spec.budget.deadlineSeconds` since
/// `status.startTime` ends `Failed`/`DeadlineExceeded`; before it, `decision` is woken at the
/// deadline too.
fn within_deadline(obs: &Observation<'_>, waiting_for: &str, decision: Decision) -> Decision {
    let deadline = obs
        .run
        .spec
        .budget
        .as_ref()
        .and_then(|b| b.deadline_seconds);
    let started = obs.run.status.as_ref().and_then(|s| s.start_time.as_ref());
    let (Some(seconds), Some(started)) = (deadline, started) else {
        return decision;
    };
    let Ok(at) = started.0.checked_add(SignedDuration::from_secs(seconds)) else {
        return decision;
    };
    if obs.wall >= at {
        return Decision::act(Action::Close(Close {
            reason: CloseReason::DeadlineExceeded,
            message: format!(
                "the run started {seconds}s or more ago while it waited for {waiting_for}; its deadline is {seconds}s (spec.budget.deadlineSeconds)"
            ),
            failed: false,
        }));
    }
    Decision {
        requeue: min_requeue(decision.requeue, Some(until_wall(obs, at))),
        ..decision
    }
}

/// How long until the wall-clock instant `at`, and a little more, so that the wake-up finds
/// it passed.
fn until_wall(obs: &Observation<'_>, at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(obs.wall)).unwrap_or_default() + Duration::from_millis(50)
}

/// A call waits for approval: its decision, or the end of its timeout (on the controller's
/// clock), claims the run for a worker that carries it out; the run's deadline still holds.
fn decide_approval(obs: &Observation<'_>) -> Decision {
    if obs.run.spec.stop {
        return Decision::act(stop_now(obs.run));
    }
    let spec = &obs.run.spec;
    let pending = obs
        .run
        .status
        .as_ref()
        .and_then(|s| s.pending_approval.as_ref());
    let timeout = match pending {
        Some(p) if approval::decision_for(spec, p.step, &p.call_id).is_some() => {
            return claim(obs, ClaimReason::ApprovalDecided);
        }
        Some(p) => approval::deadline(spec, &p.requested_at),
        None => None,
    };
    let waiting = match timeout {
        Some(at) if obs.wall >= at => return claim(obs, ClaimReason::ApprovalTimedOut),
        Some(at) => Decision::wait(Some(until_wall(obs, at))),
        None => Decision::wait(None),
    };
    within_deadline(obs, "an approval", waiting)
}

fn decide_running(obs: &Observation<'_>) -> Decision {
    let fence = Fence::of_run(obs.run);
    let Some(lease) = obs.lease.as_ref().filter(|l| lease_reached(l.fence, fence)) else {
        // The status claim landed; the Lease (and so the pod) is behind.
        return Decision::act(Action::CompleteClaim);
    };
    let decision = match &obs.pod {
        // A pod the rollout deleted that did not hand off in its grace period (its appends
        // failing, say): not counted against `maxAttempts`, an upgrade spends no attempts.
        PodState::Terminated if obs.rolled_out => {
            claim_with(obs, ClaimReason::PodTerminated, false)
        }
        PodState::Missing if obs.rolled_out => claim_with(obs, ClaimReason::PodGone, false),
        PodState::Terminated => claim(obs, ClaimReason::PodTerminated),
        PodState::Unstartable { message } => decide_unstartable(obs, lease, message),
        PodState::Missing => decide_missing_pod(obs, lease),
        PodState::Running { image } if rollout_wanted(obs, image, lease) => {
            decide_rollout(obs, lease)
        }
        _ => with_workspace_condition(obs, lease, decide_expiry(obs, lease)),
    };
    with_stop_deadline(obs, decision)
}

/// When nothing else is to be done, the `WorkspaceReady` condition is brought up to date.
fn with_workspace_condition(
    obs: &Observation<'_>,
    lease: &LeaseObs,
    decision: Decision,
) -> Decision {
    if decision.action != Action::Nothing {
        return decision;
    }
    let waited = obs.now.saturating_duration_since(lease.sighting.seen_at);
    let wanted = workspace_condition(obs.run, &obs.pod, waited);
    let patience = match &obs.pod {
        PodState::Pending { started: false, .. } if waited < VOLUME_PATIENCE => {
            Some(VOLUME_PATIENCE - waited)
        }
        _ => None,
    };
    let requeue = min_requeue(decision.requeue, patience);
    match wanted.filter(|w| !shown(obs.run, w)) {
        Some(condition) => Decision {
            action: Action::Workspace(condition),
            requeue,
        },
        None => Decision {
            requeue,
            ..decision
        },
    }
}

/// Pure: what `WorkspaceReady` should say for a run with `spec.workspace`, given its pod and
/// how long the pod has been the run's.
pub fn workspace_condition(
    run: &AgentRun,
    pod: &PodState,
    waited: Duration,
) -> Option<WorkspaceCondition> {
    let workspace = run.spec.workspace.as_ref()?;
    let claim = crate::fence::workspace_claim_name(&kube::ResourceExt::name_any(run));
    let condition = |ready, reason, message| {
        Some(WorkspaceCondition {
            ready,
            reason,
            message,
        })
    };
    match pod {
        PodState::Pending {
            unbound_claim: Some(said),
            ..
        } => {
            let class = workspace
                .storage_class_name
                .as_deref()
                .unwrap_or("(the default)");
            condition(
                false,
                "ClaimPending",
                format!(
                    "the workspace claim {claim} is not bound to a volume: no PersistentVolume of storage class {class} matches it and no provisioner made one (the scheduler: {said})"
                ),
            )
        }
        PodState::Pending { started: false, .. } if waited >= VOLUME_PATIENCE => condition(
            false,
            "VolumeNotReady",
            format!(
                "the worker pod has waited {}s for its volumes (or images): a ReadWriteOnce workspace volume still attached to a lost node is released only once it is detached from that node (minutes, or when the node object is deleted); ReadWriteMany storage avoids that wait",
                waited.as_secs()
            ),
        ),
        PodState::Running { .. } | PodState::Pending { started: true, .. } => condition(
            true,
            "Mounted",
            format!("the workspace claim {claim} is mounted"),
        ),
        _ => None,
    }
}

/// True when the run's status already says what `wanted` says.
fn shown(run: &AgentRun, wanted: &WorkspaceCondition) -> bool {
    let status = if wanted.ready { "True" } else { "False" };
    run.status.iter().flat_map(|s| &s.conditions).any(|c| {
        c.type_ == crate::status::condition::WORKSPACE_READY
            && c.status == status
            && c.reason == wanted.reason
    })
}

/// A stop the worker did not carry out within `durationSeconds` becomes a terminal claim.
fn with_stop_deadline(obs: &Observation<'_>, decision: Decision) -> Decision {
    if !obs.run.spec.stop || decision.action != Action::Nothing {
        return decision;
    }
    let grace = Duration::from_secs(obs.run.spec.lease.duration_seconds.max(0) as u64);
    let deadline = obs.stop_seen_at.unwrap_or(obs.now) + grace;
    if obs.now >= deadline {
        return Decision::act(stop_now(obs.run));
    }
    let until_stop = deadline.saturating_duration_since(obs.now);
    Decision {
        requeue: min_requeue(decision.requeue, Some(until_stop)),
        ..decision
    }
}

/// How long the worker container may stay unstartable before the run fails: a Secret applied
/// together with the run may reach the kubelet a moment after the pod.
pub const UNSTARTABLE_GRACE: Duration = Duration::from_secs(15);

/// The worker cannot start (a Secret that does not exist): once that has lasted
/// [`UNSTARTABLE_GRACE`] since the Lease moved to this pod, the run fails, saying what is
/// missing, instead of staying `Running` until its startup allowance runs out, attempt after
/// attempt.
fn decide_unstartable(obs: &Observation<'_>, lease: &LeaseObs, message: &str) -> Decision {
    let deadline = lease.sighting.seen_at + UNSTARTABLE_GRACE;
    if obs.now < deadline {
        let expiry = decide_expiry(obs, lease);
        let until_failed = deadline.saturating_duration_since(obs.now);
        return Decision {
            requeue: min_requeue(expiry.requeue, Some(until_failed)),
            ..expiry
        };
    }
    let reason = if message.starts_with("secret ") && message.ends_with(" not found") {
        CloseReason::SecretNotFound
    } else {
        CloseReason::WorkerConfigError
    };
    Decision::act(Action::Close(Close {
        reason,
        message: format!("the worker pod cannot start: {message}"),
        failed: false,
    }))
}

fn decide_rollout(obs: &Observation<'_>, lease: &LeaseObs) -> Decision {
    if obs.rollout_slot {
        return Decision::act(Action::DeletePod { rollout: true });
    }
    let expiry = decide_expiry(obs, lease);
    Decision {
        requeue: min_requeue(expiry.requeue, Some(ROLLOUT_RECHECK)),
        ..expiry
    }
}

fn decide_expiry(obs: &Observation<'_>, lease: &LeaseObs) -> Decision {
    let spec = &obs.run.spec.lease;
    if lease.sighting.expired(spec, obs.now) {
        return claim(obs, ClaimReason::LeaseExpired);
    }
    Decision::wait_until(obs.now, lease.sighting.deadline(spec))
}

/// The pod of the current fence is missing. If the Lease already names it and either the
/// worker renewed (the pod certainly existed) or the claimer had `POD_CREATE_GRACE` to create
/// it, that attempt is over: claim again with fence+1 (a pod is never re-created).
fn decide_missing_pod(obs: &Observation<'_>, lease: &LeaseObs) -> Decision {
    if lease.sighting.renewed {
        return claim(obs, ClaimReason::PodGone);
    }
    let deadline = lease.sighting.seen_at + POD_CREATE_GRACE;
    if obs.now >= deadline {
        return claim_with(obs, ClaimReason::PodGone, false);
    }
    Decision::wait_until(obs.now, deadline)
}

fn rollout_wanted(obs: &Observation<'_>, image: &str, lease: &LeaseObs) -> bool {
    obs.rollout == RolloutPolicy::Handoff
        && !obs.run.spec.stop
        && image != obs.desired_image
        && lease.sighting.renewed
        && lease.holder.is_some()
}

fn stop_now(run: &AgentRun) -> Action {
    let close = match run.annotations().get(INTERRUPTED_BY_ANNOTATION) {
        Some(by) => Close {
            reason: CloseReason::Interrupted,
            message: format!("stopped for turn {by} of its thread (onBusy: Interrupt)"),
            failed: false,
        },
        None => Close {
            reason: CloseReason::StopRequested,
            message: "spec.stop was set and no worker carried it out".into(),
            failed: false,
        },
    };
    Action::Close(close)
}

fn claim(obs: &Observation<'_>, reason: ClaimReason) -> Decision {
    claim_with(obs, reason, reason.is_death())
}

/// A claim, or the end of the run: a death with the budget spent gives up, and a stop
/// requested while nobody runs the run ends it.
fn claim_with(obs: &Observation<'_>, reason: ClaimReason, failed: bool) -> Decision {
    let status = obs.run.status.clone().unwrap_or_default();
    if obs.run.spec.stop && reason != ClaimReason::Start {
        return Decision::act(stop_now(obs.run));
    }
    let failed_after = status.failed_attempts + i32::from(failed);
    if failed && failed_after >= obs.run.spec.max_attempts {
        return Decision::act(Action::Close(Close {
            reason: CloseReason::MaxAttemptsExceeded,
            message: format!(
                "{failed_after} attempts ended by dying (last: {}); maxAttempts is {}",
                reason.as_str(),
                obs.run.spec.max_attempts
            ),
            failed,
        }));
    }
    Decision::act(Action::Claim(Claim { reason, failed }))
}

fn decide_terminal(obs: &Observation<'_>) -> Decision {
    if ended_by_terminal_claim(obs.run) && !obs.close_recorded {
        return Decision::act(Action::RecordClose);
    }
    if obs.lease.as_ref().is_some_and(|l| l.holder.is_some()) {
        return Decision::act(Action::ReleaseLease);
    }
    if obs.admission == Admission::Held {
        return Decision::act(Action::ReleaseAdmission);
    }
    if matches!(obs.pod, PodState::Pending { .. } | PodState::Running { .. }) {
        return Decision::act(Action::DeletePod { rollout: false });
    }
    // Only once no process of the run's last attempt can still run: a worker that is
    // stopping may still release its Lease with the identity.
    if obs.identity_left && !matches!(obs.pod, PodState::Deleting) {
        return Decision::act(Action::RemoveIdentity);
    }
    ttl_decision(obs)
}

/// True when the controller's terminal claim ended the run: a terminal phase at a claimed
/// fence with no worker, for a reason only a terminal claim gives. (A worker's own end names
/// its pod; an invalid spec ends at fence 0.)
fn ended_by_terminal_claim(run: &AgentRun) -> bool {
    run.status.as_ref().is_some_and(|s| {
        s.phase.is_terminal()
            && !s.fence.never_claimed()
            && s.worker.is_none()
            && s.reason.as_deref().is_some_and(CloseReason::names)
    })
}

fn ttl_decision(obs: &Observation<'_>) -> Decision {
    let (Some(ttl), Some(done)) = (
        obs.run.spec.ttl_seconds_after_finished,
        obs.run
            .status
            .as_ref()
            .and_then(|s| s.completion_time.as_ref()),
    ) else {
        return Decision::wait(None);
    };
    let expires = done.0.as_second().saturating_add(ttl);
    let now = obs.wall.as_second();
    if now >= expires {
        return Decision::act(Action::DeleteRun);
    }
    Decision::wait(Some(Duration::from_secs((expires - now) as u64)))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
