//! The decision: a pure function of what the controller observed about one run and `now`.
//!
//! No client, no clock of its own. `decide` returns one [`Action`] (apply performs it) and
//! when to look again, at the exact next deadline (lease expiry, startup grace, stop grace,
//! TTL), never by polling.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::approval;
use crate::crd::v1alpha1::{AgentRun, Phase};
use crate::fence::{Fence, lease_reached};
use crate::lease::LeaseSighting;
use crate::rbac::{RbacError, RunRbac};

use super::validate::validate;

/// How long a Lease that names a never-renewed pod must stay unchanged before a missing pod
/// counts as gone: the time the claiming controller has to create it after moving the Lease.
pub const POD_CREATE_GRACE: Duration = Duration::from_secs(10);

/// How often a run queued behind its thread looks again (a safety net: the holder's finish
/// also wakes the next run at once).
pub const ADMISSION_RECHECK: Duration = Duration::from_secs(30);

/// How often a run waiting for a rollout slot looks again.
pub const ROLLOUT_RECHECK: Duration = Duration::from_secs(2);

/// The run Lease as observed.
#[derive(Debug, Clone)]
pub struct LeaseObs {
    pub holder: Option<String>,
    pub fence: Option<Fence>,
    /// When this version was first seen, on the controller's clock.
    pub sighting: LeaseSighting,
}

/// The worker pod of the run's current fence, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// No pod object (never created, deleted, or force-deleted).
    Missing,
    /// Created, not (yet) running: unscheduled, pulling, starting.
    Pending {
        image: String,
        /// The scheduler's word that the pod's claim is not bound (the workspace's).
        unbound_claim: Option<String>,
        /// Some container, init included, has started: the pod's volumes are mounted.
        started: bool,
    },
    Running {
        image: String,
    },
    /// Phase Succeeded or Failed: its process is gone.
    Terminated,
    /// Created, and the kubelet cannot start the worker container: its configuration names
    /// something that does not exist (a Secret, a key). The kubelet's message says what.
    Unstartable {
        message: String,
    },
    /// Deletion requested (graceful): the worker may be handing off.
    Deleting,
}

/// The run's thread admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// No threadKey: admitted at once.
    NotRequired,
    /// The thread's admission Lease names this run.
    Held,
    /// The thread is free and this is the oldest Pending run of it.
    Free,
    /// Another (live) run holds the thread, or an older Pending run is ahead.
    Busy { holder: String },
    /// The admission Lease names a run that is finished or gone: delete it (precondition).
    Stale { holder: String },
}

/// How worker image rollouts are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutPolicy {
    /// Live runs move to the new image through a graceful handoff, a few at a time.
    Handoff,
    /// Live runs keep their pod until they finish.
    Keep,
}

/// Everything `decide` looks at.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    pub run: &'a AgentRun,
    pub lease: Option<LeaseObs>,
    pub pod: PodState,
    pub admission: Admission,
    /// When the controller first saw `spec.stop` set (its own clock).
    pub stop_seen_at: Option<Instant>,
    /// The image this run's worker should run.
    pub desired_image: String,
    pub rollout: RolloutPolicy,
    /// Whether a rollout handoff may start now (fewer than the maximum in flight).
    pub rollout_slot: bool,
    /// The controller knows the ledger holds the `closed` record of the terminal claim that
    /// ended the run.
    pub close_recorded: bool,
    pub now: Instant,
    pub wall: Timestamp,
}

/// Why a run is claimed for a new worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimReason {
    Start,
    LeaseExpired,
    PodTerminated,
    PodGone,
    Handoff,
    InputReceived,
    /// `spec.approvals` holds the decision on the call the run waits on.
    ApprovalDecided,
    /// `approvalTimeoutSeconds` passed without a decision: the next worker denies the call.
    ApprovalTimedOut,
}

impl ClaimReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimReason::Start => "Start",
            ClaimReason::LeaseExpired => "LeaseExpired",
            ClaimReason::PodTerminated => "PodTerminated",
            ClaimReason::PodGone => "PodGone",
            ClaimReason::Handoff => "Handoff",
            ClaimReason::InputReceived => "InputReceived",
            ClaimReason::ApprovalDecided => "ApprovalDecided",
            ClaimReason::ApprovalTimedOut => approval::TIMED_OUT,
        }
    }

    /// True for a takeover (the previous attempt ended by dying).
    pub fn is_death(self) -> bool {
        matches!(
            self,
            ClaimReason::LeaseExpired | ClaimReason::PodTerminated | ClaimReason::PodGone
        )
    }
}

/// A claim of the run for fence+1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub reason: ClaimReason,
    /// The previous attempt died: failedAttempts + 1.
    pub failed: bool,
}

/// A terminal claim: the controller ends the run itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    pub reason: CloseReason,
    pub message: String,
    /// The previous attempt died: failedAttempts + 1.
    pub failed: bool,
}

impl Close {
    /// The phase the run ends in.
    pub fn phase(&self) -> Phase {
        self.reason.phase()
    }

    /// The end a `closed` seal at `fence` records, for a claim that meets it after the
    /// controller that wrote it stopped before the terminal status (the seal holds the reason
    /// only: the message says where it came from).
    pub fn recorded(reason: &str, fence: i64) -> Self {
        let reason = CloseReason::from_seal(reason);
        Self {
            message: format!(
                "the ledger was closed at fence {fence} ({}); the run ends as its seal records",
                reason.as_str()
            ),
            failed: reason == CloseReason::MaxAttemptsExceeded,
            reason,
        }
    }
}

/// Why the controller ends a run itself. On the wire (the `closed` seal's reason, the status
/// reason, the Event reason) it is the name as written here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// `spec.stop` was set and no worker carried it out.
    StopRequested,
    /// The run's attempts ended by dying `maxAttempts` times.
    MaxAttemptsExceeded,
    /// The worker pod cannot start: a Secret it needs does not exist.
    SecretNotFound,
    /// The worker pod cannot start for another reason in its configuration.
    WorkerConfigError,
    /// The API server refuses to create the worker pod (an admission check: a RuntimeClass
    /// that does not exist, a Pod Security level the pod does not meet, an invalid field).
    PodRejected,
    /// `spec.budget.deadlineSeconds` passed while the run waited for input or an approval:
    /// no worker was there to check it.
    DeadlineExceeded,
    /// A Lease of the run's Lease name exists and the run does not control it: baton never
    /// replaces a Lease it did not make for the run.
    LeaseNotOwned,
    /// A seal whose reason this version does not know (written by another version).
    Unrecognized,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::StopRequested => "StopRequested",
            CloseReason::MaxAttemptsExceeded => "MaxAttemptsExceeded",
            CloseReason::SecretNotFound => "SecretNotFound",
            CloseReason::WorkerConfigError => "WorkerConfigError",
            CloseReason::PodRejected => "PodRejected",
            CloseReason::DeadlineExceeded => "DeadlineExceeded",
            CloseReason::LeaseNotOwned => "LeaseNotOwned",
            CloseReason::Unrecognized => "LedgerClosed",
        }
    }

    const ALL: [CloseReason; 8] = [
        CloseReason::StopRequested,
        CloseReason::MaxAttemptsExceeded,
        CloseReason::SecretNotFound,
        CloseReason::WorkerConfigError,
        CloseReason::PodRejected,
        CloseReason::DeadlineExceeded,
        CloseReason::LeaseNotOwned,
        CloseReason::Unrecognized,
    ];

    /// The reason a `closed` seal records.
    pub fn from_seal(reason: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == reason)
            .unwrap_or(CloseReason::Unrecognized)
    }

    /// True when `reason` (a status's) is one a terminal claim gives.
    pub fn names(reason: &str) -> bool {
        Self::ALL.iter().any(|r| r.as_str() == reason)
    }

    /// The phase a run closed for this reason ends in.
    pub fn phase(self) -> Phase {
        match self {
            CloseReason::StopRequested => Phase::Stopped,
            CloseReason::MaxAttemptsExceeded | CloseReason::Unrecognized => Phase::Interrupted,
            CloseReason::SecretNotFound
            | CloseReason::WorkerConfigError
            | CloseReason::PodRejected
            | CloseReason::DeadlineExceeded
            | CloseReason::LeaseNotOwned => Phase::Failed,
        }
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// The spec fails a rule the schema cannot express: `Failed`/`InvalidSpec`.
    Reject {
        message: String,
    },
    /// Create the thread's admission Lease.
    Admit,
    /// Say (condition Admitted=False) which run holds the thread.
    Queue {
        holder: String,
    },
    /// Delete an admission Lease whose holder is finished or gone.
    ClearStaleAdmission,
    /// Seal, status CAS, Lease move, pod creation (docs/protocol.md).
    Claim(Claim),
    /// The status claim landed but the Lease is behind: move it, then create the pod.
    CompleteClaim,
    /// A terminal claim: seal with `claimed`, the terminal status with the salvage, then the
    /// `closed` record.
    Close(Close),
    /// Append the `closed` record of a terminal claim whose status landed without it.
    RecordClose,
    /// `Finishing` → its outcome.
    Finish,
    /// Terminal run whose run Lease still names a holder.
    ReleaseLease,
    /// Terminal run that still holds its thread.
    ReleaseAdmission,
    /// Delete the current pod (rollout handoff, or a zombie of a finished run).
    DeletePod {
        rollout: bool,
    },
    /// ttlSecondsAfterFinished passed.
    DeleteRun,
    /// Say in condition `WorkspaceReady` whether the pod has its workspace volume.
    Workspace(WorkspaceCondition),
}

/// The `WorkspaceReady` condition as the pod shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceCondition {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

/// How long a pod of a run with a workspace may stay without any container started before
/// the run says it waits for its volume: a ReadWriteOnce volume still attached to a lost node
/// keeps the next pod in ContainerCreating for minutes, and that must not look like a hang.
pub const VOLUME_PATIENCE: Duration = Duration::from_secs(60);

/// An action and when to look again (None: only on a change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub requeue: Option<Duration>,
}

impl Decision {
    fn act(action: Action) -> Self {
        Self {
            action,
            requeue: None,
        }
    }

    fn wait(requeue: Option<Duration>) -> Self {
        Self {
            action: Action::Nothing,
            requeue,
        }
    }

    fn wait_until(now: Instant, deadline: Instant) -> Self {
        Self::wait(Some(deadline.saturating_duration_since(now)))
    }
}

/// The decision for one run.
pub fn decide(obs: &Observation<'_>) -> Decision {
    let status = obs.run.status.clone().unwrap_or_default();
    match status.phase {
        Phase::Pending => decide_pending(obs),
        Phase::Running => decide_running(obs),
        Phase::Handoff if obs.run.spec.stop => Decision::act(stop_now()),
        Phase::Handoff => claim(obs, ClaimReason::Handoff),
        Phase::WaitingInput => decide_waiting(obs),
        Phase::WaitingApproval => decide_approval(obs),
        Phase::Finishing => Decision::act(Action::Finish),
        _ => decide_terminal(obs),
    }
}

fn decide_pending(obs: &Observation<'_>) -> Decision {
    if let Err(message) = validate(&obs.run.spec) {
        return Decision::act(Action::Reject { message });
    }
    if let Some(message) = worker_account_problem(obs.run) {
        return Decision::act(Action::Reject { message });
    }
    if obs.run.spec.stop {
        return Decision::act(stop_now());
    }
    match &obs.admission {
        Admission::NotRequired | Admission::Held => claim(obs, ClaimReason::Start),
        Admission::Free => Decision::act(Action::Admit),
        Admission::Stale { .. } => Decision::act(Action::ClearStaleAdmission),
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
        return Decision::act(stop_now());
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
        return Decision::act(stop_now());
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
        return Decision::act(stop_now());
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

fn min_requeue(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn stop_now() -> Action {
    Action::Close(Close {
        reason: CloseReason::StopRequested,
        message: "spec.stop was set and no worker carried it out".into(),
        failed: false,
    })
}

fn claim(obs: &Observation<'_>, reason: ClaimReason) -> Decision {
    claim_with(obs, reason, reason.is_death())
}

/// A claim, or the end of the run: a death with the budget spent gives up, and a stop
/// requested while nobody runs the run ends it.
fn claim_with(obs: &Observation<'_>, reason: ClaimReason, failed: bool) -> Decision {
    let status = obs.run.status.clone().unwrap_or_default();
    if obs.run.spec.stop && reason != ClaimReason::Start {
        return Decision::act(stop_now());
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
    ttl_decision(obs)
}

/// True when the controller's terminal claim ended the run: a terminal phase at a claimed
/// fence with no worker, for a reason only a terminal claim gives. (A worker's own end names
/// its pod; an invalid spec ends at fence 0.)
fn ended_by_terminal_claim(run: &AgentRun) -> bool {
    run.status.as_ref().is_some_and(|s| {
        s.phase.is_terminal()
            && !Fence::new(s.fence).never_claimed()
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
