//! Why a run ended, as its ledger records it: the reason the controller's `closed` seal
//! records (which the terminal status carries and a later claim completes), and the reason a
//! worker's `failed` event records. Apart from the rules (`super`) so the wire types can carry
//! them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
    /// A turn arrived while another turn of its thread was live, and the thread's `onBusy`
    /// is `Reject`.
    ThreadBusy,
    /// A turn stopped for a newer turn of its thread (`onBusy: Interrupt`) before a worker
    /// carried the stop out.
    Interrupted,
    /// A seal whose reason this version does not know (written by another version). It reads
    /// as `LedgerClosed`; the seal itself is never rewritten, so nothing is lost.
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
            CloseReason::ThreadBusy => "ThreadBusy",
            CloseReason::Interrupted => "Interrupted",
            CloseReason::Unrecognized => "LedgerClosed",
        }
    }

    const ALL: [CloseReason; 10] = [
        CloseReason::StopRequested,
        CloseReason::MaxAttemptsExceeded,
        CloseReason::SecretNotFound,
        CloseReason::WorkerConfigError,
        CloseReason::PodRejected,
        CloseReason::DeadlineExceeded,
        CloseReason::LeaseNotOwned,
        CloseReason::ThreadBusy,
        CloseReason::Interrupted,
        CloseReason::Unrecognized,
    ];

    /// The reason a name on the wire stands for (`Unrecognized` for one this version does not
    /// know).
    pub fn named(reason: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == reason)
            .unwrap_or(CloseReason::Unrecognized)
    }

    /// True when `reason` (a status's) is one a terminal claim gives.
    pub fn names(reason: &str) -> bool {
        Self::ALL.iter().any(|r| r.as_str() == reason)
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// By hand rather than derived: an unknown name must read as `Unrecognized`, not fail the whole
// segment (a newer version's seal still ends the run for this one).
impl Serialize for CloseReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CloseReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::named(&String::deserialize(d)?))
    }
}

/// Why a worker ended a turn `failed`: the `failed` event's reason, then the run's
/// `status.reason`. On the wire it is the name as written here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// The model provider refused the request for good (4xx other than 408/429), or the
    /// model could not be built from the spec.
    ProviderError,
    /// The turn reached `spec.maxSteps` tool calls.
    MaxStepsExceeded,
    /// A `spec.budget` limit on tokens, model calls or tool calls was reached.
    BudgetExceeded,
    /// `spec.budget.deadlineSeconds` passed.
    DeadlineExceeded,
    /// An MCP server the run names could not be reached or listed.
    McpServerUnavailable,
    /// A turn's history cannot be rebuilt as its first seal fixed it: an earlier turn of its
    /// thread (or part of its ledger) was deleted while this turn was in flight.
    HistoryUnavailable,
    /// A turn's history is larger than its thread's `context.maxHistoryTokens`, whose
    /// `onOverflow` is `Fail`.
    ContextExceeded,
    /// The run's own agent container (`agent.container`) exited with a non-zero code.
    AgentExited,
    /// A resumed agent container's model call differed from the one recorded at its place,
    /// and `agent.container.onDivergence` is `Fail`.
    ResumeDiverged,
    /// A reason this version does not know (written by another version), kept as written:
    /// it is what the run's status shows.
    Unrecognized(String),
}

impl EndReason {
    const KNOWN: [EndReason; 9] = [
        EndReason::ProviderError,
        EndReason::MaxStepsExceeded,
        EndReason::BudgetExceeded,
        EndReason::DeadlineExceeded,
        EndReason::McpServerUnavailable,
        EndReason::HistoryUnavailable,
        EndReason::ContextExceeded,
        EndReason::AgentExited,
        EndReason::ResumeDiverged,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            EndReason::ProviderError => "ProviderError",
            EndReason::MaxStepsExceeded => "MaxStepsExceeded",
            EndReason::BudgetExceeded => "BudgetExceeded",
            EndReason::DeadlineExceeded => "DeadlineExceeded",
            EndReason::McpServerUnavailable => "McpServerUnavailable",
            EndReason::HistoryUnavailable => "HistoryUnavailable",
            EndReason::ContextExceeded => "ContextExceeded",
            EndReason::AgentExited => "AgentExited",
            EndReason::ResumeDiverged => "ResumeDiverged",
            EndReason::Unrecognized(reason) => reason,
        }
    }

    /// The reason a name on the wire stands for.
    pub fn named(reason: &str) -> Self {
        Self::KNOWN
            .into_iter()
            .find(|r| r.as_str() == reason)
            .unwrap_or_else(|| EndReason::Unrecognized(reason.to_string()))
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// By hand, as for `CloseReason`: an unknown name is kept, not refused.
impl Serialize for EndReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EndReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::named(&String::deserialize(d)?))
    }
}
