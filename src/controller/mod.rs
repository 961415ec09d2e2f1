//! The controller (`baton controller`): admission, claims with a fence, takeover on expiry or
//! pod death, give-up, finish, rollouts (docs/protocol.md).
//!
//! observe → decide → apply: `observe` turns the watch caches and the controller's own
//! sightings into an [`decide::Observation`]; `decide` is pure; `apply` does the I/O, checking
//! that this replica still leads before every write. Safety never depends on the election:
//! every write is a compare-and-swap on what was read.

mod access;
mod admin;
mod admission;
mod apply;
mod attempt_pod;
mod backoff;
mod bounds;
mod claim;
pub mod cli;
mod close;
mod context;
pub mod decide;
mod decision;
mod election;
mod events;
mod ledger_end;
pub mod ledger_rows;
mod leftovers;
mod metrics;
mod observe;
pub mod pod;
pub mod pod_agent;
mod reconcile;
mod statuses;
#[doc(hidden)]
pub mod testing;
mod turn;
pub mod validate;
mod warm;
mod watches;
mod writer;

use std::net::SocketAddr;
use std::time::Duration;

pub use context::{Caches, Context};
pub use decide::RolloutPolicy;
pub use reconcile::{run, run_until};

/// Name of the Lease the controller replicas elect a leader with.
pub const LEADER_LEASE_NAME: &str = "baton-controller-leader";
/// The worker image used when neither the run nor the flag names one.
pub const DEFAULT_WORKER_IMAGE: &str = "baton:dev";
pub use crate::events::CONTROLLER_NAME;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker image for runs that do not name one.
    pub worker_image: String,
    /// Watch only this namespace (None: all namespaces).
    pub namespace: Option<String>,
    /// Elect a leader; without it every replica writes (safe, only wasteful).
    pub leader_election: bool,
    /// Namespace of the leader Lease.
    pub leader_namespace: String,
    /// This replica's identity in the leader Lease.
    pub identity: String,
    /// Leader Lease duration; it is renewed every third of it.
    pub leader_lease: Duration,
    /// Admin HTTP server (metrics, health); None: not served.
    pub admin_addr: Option<SocketAddr>,
    /// How many runs may be in a rollout handoff at once.
    pub max_concurrent_handoffs: usize,
    pub rollout_policy: RolloutPolicy,
    /// Publish Kubernetes Events.
    pub events: bool,
    /// Reconciles running at once (0: unbounded).
    pub concurrency: u16,
    /// The admission webhook this replica serves (every replica, leader or not); None: none.
    pub webhook: Option<crate::webhook::WebhookConfig>,
    /// `baton server`, serving the ledgers of runs kept in PostgreSQL (the controller's seals
    /// go there, and worker pods of such runs are given its address); None: no such runs.
    pub ledger_server: Option<crate::ledger::LedgerClient>,
    /// Where the ledgers of new runs are kept.
    pub new_runs_ledger: crate::crd::v1alpha1::LedgerBackend,
    /// Where worker pods export their traces (`crate::traces`); None: they export none.
    pub worker_traces: Option<crate::traces::WorkerTraces>,
}

/// Reconciles running at once by default. A claim holds its slot for about 5 API round trips
/// (confirm, seal, status, Lease, pod), so while the API server is slow the slots bound the
/// claim rate: at 5,000 runs with 50 expiries a second, 64 slots let claims queue for seconds
/// behind a garbage-collection stall of the API server (one benchmark run: p99 5.1 s, the
/// controller's own lateness far above its API calls'); 128 kept the claims' lateness equal
/// to their API calls' (p99 1.15 s) for ~10 MiB more memory (a connection per request).
pub const DEFAULT_CONCURRENCY: u16 = 128;

impl Default for Config {
    fn default() -> Self {
        Self {
            worker_image: DEFAULT_WORKER_IMAGE.into(),
            namespace: None,
            leader_election: true,
            leader_namespace: "default".into(),
            identity: default_identity(),
            leader_lease: Duration::from_secs(15),
            admin_addr: None,
            max_concurrent_handoffs: 1,
            rollout_policy: RolloutPolicy::Handoff,
            events: true,
            concurrency: DEFAULT_CONCURRENCY,
            webhook: None,
            ledger_server: None,
            worker_traces: None,
            new_runs_ledger: Default::default(),
        }
    }
}

/// `$POD_NAME`, else the host name, plus a random suffix: unique per process.
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "baton-controller".into());
    format!("{base}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// Errors of the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("lease: {0}")]
    Lease(#[from] crate::lease::LeaseError),
    #[error("status: {0}")]
    Status(#[from] crate::status::StatusError),
    /// This replica is not (or no longer) the leader: it must not write.
    #[error("not the leader")]
    NotLeader,
    #[error("leader election failed: {0}")]
    Election(String),
    #[error("{0}")]
    Webhook(#[from] crate::webhook::WebhookError),
    #[error("admin server: {0}")]
    Admin(#[from] std::io::Error),
    /// The run's worker ServiceAccount, Role or RoleBinding could not be put in place.
    #[error("worker RBAC: {0}")]
    Rbac(String),
    /// An object of an earlier run of the same name stood in the way and was just removed:
    /// the next try goes through.
    #[error("{0}")]
    LeftoverRemoved(String),
}

impl Error {
    /// Low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Ledger(e) => e.label(),
            Error::Lease(e) => e.label(),
            Error::Status(e) => e.label(),
            Error::NotLeader => "not_leader",
            Error::Election(_) => "election",
            Error::Admin(_) => "admin",
            Error::Webhook(_) => "webhook",
            Error::Rbac(_) => "rbac",
            Error::LeftoverRemoved(_) => "leftover_removed",
        }
    }
}
