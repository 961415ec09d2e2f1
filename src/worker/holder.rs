//! The worker's hold on its run (docs/protocol.md, "Owner writes"): who it is (a
//! [`RunHolder`]: run, UID, pod, fence) and its three fenced writes. The appender, the
//! heartbeat and the progress writer are handed a `Holder` and nothing else that writes, so
//! no worker write can leave out the fence.
//!
//! - `append`: the ledger at tail+1 under the fence (the segment store classifies a taken
//!   position by [`crate::fence::verdict`]);
//! - `renew_lease` / `release_lease`: a CAS on the Lease that checks holder and fence;
//! - `update_status`: re-reads the run and writes only while it is the same run (UID) at the
//!   same fence.
//!
//! Its one unfenced write is an Event about the run (`publish_event`, best effort): Events are
//! notes for people, never read back.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client, Resource};
use tracing::warn;

use crate::crd::v1alpha1::{AgentRun, AgentRunStatus, HistoryTurn, LedgerEvent, LedgerSegment};
use crate::events::{Publisher, WORKER_REPORTER};
use crate::fence::{Fence, RunHolder};
use crate::lease::{LeaseError, WorkerLease};
use crate::ledger::{Appended, EarlierTurns, LedgerError, Ledgers, RunLedger, check_still_owner};
use crate::status::{StatusError, fenced_update};

/// One attempt's hold on its run.
#[derive(Clone)]
pub struct Holder {
    id: RunHolder,
    runs: Api<AgentRun>,
    store: RunLedger,
    lease: WorkerLease,
    events: Publisher,
    /// The run, as Events refer to it.
    regarding: ObjectReference,
    /// Reads the thread's earlier turns (a turn's history), never writes.
    ledgers: Ledgers,
}

impl Holder {
    /// The hold of pod `pod` at `fence` on `run` (as read from the API server: its UID tells
    /// it from a namesake), its segments at most `segment_budget` bytes; refused when the
    /// run's ledger is kept where this worker cannot reach.
    pub fn new(
        client: Client,
        run: &AgentRun,
        pod: &str,
        fence: Fence,
        segment_budget: usize,
        ledger_server: Option<&crate::ledger::LedgerClient>,
    ) -> Result<Self, LedgerError> {
        let id = RunHolder {
            pod: pod.to_string(),
            ..RunHolder::of(run, fence)
        };
        let lease =
            WorkerLease::new(client.clone(), &id.namespace, &id.run, pod, fence).of_run(&id.uid);
        let reporter = Reporter {
            controller: WORKER_REPORTER.into(),
            instance: Some(pod.into()),
        };
        // A worker's run is recorded by its claim: the backend for new runs never applies.
        let ledgers = match ledger_server {
            Some(server) => {
                Ledgers::with_server(client.clone(), server.clone(), Default::default())
            }
            None => Ledgers::api_server(client.clone()),
        };
        Ok(Self {
            runs: Api::namespaced(client.clone(), &id.namespace),
            events: Publisher::new(client.clone(), reporter),
            regarding: run.object_ref(&()),
            store: ledgers.for_run(run)?.with_budget(segment_budget),
            ledgers,
            lease,
            id,
        })
    }

    pub fn id(&self) -> &RunHolder {
        &self.id
    }

    pub fn fence(&self) -> Fence {
        self.id.fence
    }

    /// The ledger as it stands, refused (lost) if it shows a newer owner or a close.
    pub async fn read_ledger(&self) -> Result<Vec<LedgerSegment>, LedgerError> {
        let segments = self.store.list().await?;
        check_still_owner(&segments, self.fence())?;
        Ok(segments)
    }

    /// The conversation of each earlier turn of `turns` (a turn's history, as its first seal
    /// fixed it), in order; or why it cannot be rebuilt. Reads only. The outer error is the
    /// API server's (a retry may pass); the inner one is the history's own (none will).
    pub async fn read_history(
        &self,
        thread_uid: Option<&str>,
        turns: &[HistoryTurn],
    ) -> Result<EarlierTurns, kube::Error> {
        let ns = &self.id.namespace;
        self.ledgers.read_history(ns, thread_uid, turns).await
    }

    /// Fenced write 1: `events` at `tail + 1` onwards under this attempt's fence.
    pub async fn append(
        &self,
        tail: i64,
        events: Vec<LedgerEvent>,
    ) -> Result<Appended, LedgerError> {
        self.store.append(tail, self.fence(), events).await
    }

    /// Checks that the Lease names this holder at its fence (before the first write).
    pub async fn verify_lease(&self) -> Result<Lease, LeaseError> {
        self.lease.verify().await
    }

    /// Fenced write 2: the heartbeat, a CAS refused once the Lease names another holder.
    pub async fn renew_lease(&self) -> Result<Lease, LeaseError> {
        self.lease.renew().await
    }

    /// Fenced write 2, at the end: frees the Lease for the next claim.
    pub async fn release_lease(&self) -> Result<Lease, LeaseError> {
        self.lease.release().await
    }

    /// Fenced write 3: `change` applied to the run's status, while the run is still ours.
    pub async fn update_status(
        &self,
        change: impl Fn(&mut AgentRunStatus),
    ) -> Result<AgentRun, StatusError> {
        fenced_update(&self.runs, &self.id, change).await
    }

    /// An Event about the run (best effort: a failure is logged). `note` is cut to 1,000
    /// characters, the API server's limit.
    pub async fn publish_event(&self, type_: EventType, reason: &str, action: &str, note: &str) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(err) = self.events.publish(&event, &self.regarding).await {
            warn!(error = %err, reason, "publishing an Event");
        }
    }
}
