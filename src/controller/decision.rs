//! What the decision speaks of: the observation of one run (its Lease, pod, admission) and
//! the decision itself (an [`Action`] and when to look again), with the reasons a claim or an
//! end carries. Types only; `decide.rs` decides.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::approval;
use crate::crd::v1alpha1::{AgentRun, BusyPolicy, Phase};
pub use crate::fence::CloseReason;
use crate::fence::Fence;
use crate::lease::LeaseSighting;

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
    /// No thread and no threadKey: admitted at once.
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
    /// What a turn does while its thread is busy (its thread's `onBusy`).
    pub on_busy: BusyPolicy,
    /// The run that holds the thread (when it is busy) is a turn of the same thread that was
    /// asked to stop already.
    pub holder_stopping: bool,
    /// When the controller first saw `spec.stop` set (its own clock).
    pub stop_seen_at: Option<Instant>,
    /// The image this run's worker should run.
    pub desired_image: String,
    pub rollout: RolloutPolicy,
    /// Whether a rollout handoff may start now (fewer than the maximum in flight).
    pub rollout_slot: bool,
    /// The rollout deleted the pod of the run's current attempt (to move it to the desired
    /// image): that attempt's end is baton's doing, not the run's.
    pub rolled_out: bool,
    /// The controller knows the ledger holds the `closed` record of the terminal claim that
    /// ended the run.
    pub close_recorded: bool,
    /// The run's own worker identity (`baton-run-<run>`) may still exist: the run does not
    /// name its own ServiceAccount, and this controller has not removed it or found it gone.
    pub identity_left: bool,
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
    pub fn recorded(reason: CloseReason, fence: Fence) -> Self {
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

// The reason itself lives with the seal that records it (`crate::fence`); the phase it ends a
// run in is the controller's business, so that part is here.
impl CloseReason {
    /// The phase a run closed for this reason ends in.
    pub fn phase(self) -> Phase {
        match self {
            CloseReason::StopRequested | CloseReason::Interrupted => Phase::Stopped,
            CloseReason::MaxAttemptsExceeded | CloseReason::Unrecognized => Phase::Interrupted,
            CloseReason::SecretNotFound
            | CloseReason::WorkerConfigError
            | CloseReason::PodRejected
            | CloseReason::DeadlineExceeded
            | CloseReason::LeaseNotOwned
            | CloseReason::ThreadBusy => Phase::Failed,
        }
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
    /// A turn takes its thread's agent and settings, and the thread as owner.
    JoinThread,
    /// Stop the live turn `holder` of the run's thread for it (`onBusy: Interrupt`).
    Interrupt {
        holder: String,
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
    /// Terminal run whose worker pod is gone: remove its worker ServiceAccount, Role and
    /// RoleBinding (a token its worker held dies with them).
    RemoveIdentity,
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
    pub(super) fn act(action: Action) -> Self {
        Self {
            action,
            requeue: None,
        }
    }

    pub(super) fn wait(requeue: Option<Duration>) -> Self {
        Self {
            action: Action::Nothing,
            requeue,
        }
    }

    pub(super) fn wait_until(now: Instant, deadline: Instant) -> Self {
        Self::wait(Some(deadline.saturating_duration_since(now)))
    }
}

/// The sooner of two requeues (None: none wanted).
pub(super) fn min_requeue(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
