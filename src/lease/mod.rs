//! Run leases (docs/architecture.md, docs/protocol.md): who holds a run, under which fence, and whether it is alive.
//!
//! `rules` is pure (names, fences, expiry on the controller's own clock); `client` is the
//! Lease I/O edge with the fenced renew, release and move.

mod client;
mod rules;

pub use client::{LeaseClient, WorkerLease};
pub use rules::*;

use crate::fence::Fence;

/// Errors of the lease edge.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The Lease no longer names this holder and fence: the run was lost.
    #[error("lease {name} is held by {holder:?} with fence {fence:?}, not by us (fence {ours})")]
    Lost {
        name: String,
        holder: Option<String>,
        fence: Option<Fence>,
        ours: Fence,
    },
    /// The Lease does not exist.
    #[error("lease {name} not found")]
    Missing { name: String },
    /// A Lease of the run's Lease name that this run does not control: never replaced.
    /// `leftover`: another AgentRun (a deleted namesake) controls it; else something else
    /// made it (`owner`).
    #[error("lease {name} exists and is not this run's ({owner}); baton does not replace it")]
    NotTheRuns {
        name: String,
        owner: String,
        leftover: bool,
    },
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl LeaseError {
    /// Low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LeaseError::Lost { .. } => "lost",
            LeaseError::Missing { .. } => "missing",
            LeaseError::NotTheRuns { .. } => "not_the_runs",
            LeaseError::Kube(_) => "kube",
        }
    }

    /// True when the writer lost the run and must stop writing.
    pub fn is_lost(&self) -> bool {
        matches!(self, LeaseError::Lost { .. } | LeaseError::Missing { .. })
    }
}
