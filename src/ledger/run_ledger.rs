//! One run's ledger, whichever backend holds it: the interface every reader and writer of a
//! ledger goes through (the worker's holder, the controller's seals and salvage reads, the
//! CLI, `baton server`). The backend a run uses is its status's `ledgerBackend`, recorded by
//! the controller's first status write; a process chooses by that record, never by its own
//! configuration, so a run's ledger never moves under it.

use kube::Client;

use super::postgres::PgLedger;
use super::served::RunRef;
use super::{Appended, LedgerClient, LedgerError, SegmentStore, ServedLedger};
use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, LedgerBackend, LedgerEvent, LedgerSegment};
use crate::fence::Fence;

/// The ledger backends one process can reach: the API server always; PostgreSQL directly
/// when the process holds the database's credential (only `baton server` does), or through
/// `baton server` (workers and the controller).
#[derive(Clone)]
pub struct Ledgers {
    client: Client,
    postgres: Option<PgLedger>,
    served: Option<LedgerClient>,
    /// What a run not yet recorded gets.
    new_runs: LedgerBackend,
}

impl Ledgers {
    /// LedgerSegments in the API server, for every run.
    pub fn api_server(client: Client) -> Self {
        Self {
            client,
            postgres: None,
            served: None,
            new_runs: LedgerBackend::LedgerSegments,
        }
    }

    /// Runs kept in PostgreSQL reached through `server`; new runs given `new_runs`.
    pub fn with_server(client: Client, server: LedgerClient, new_runs: LedgerBackend) -> Self {
        Self {
            served: Some(server),
            new_runs,
            ..Self::api_server(client)
        }
    }

    /// Runs kept in PostgreSQL reached directly with `db`: the process holding the
    /// database's credential (`baton server`), reading for a person. A run whose status does
    /// not record a backend yet has no ledger anywhere (its first status write comes before
    /// its first pod), so it is read where nothing is read out of RBAC's sight: the API server.
    pub fn with_postgres(client: Client, db: PgLedger) -> Self {
        Self {
            postgres: Some(db),
            ..Self::api_server(client)
        }
    }

    /// The backend a run that has none recorded yet is given.
    pub fn for_new_runs(&self) -> LedgerBackend {
        self.new_runs
    }

    /// Where `run`'s ledger is kept: as its status records, else where new runs go.
    pub fn backend_of(&self, run: &AgentRun) -> LedgerBackend {
        run.status
            .as_ref()
            .and_then(|s| s.ledger_backend)
            .unwrap_or(self.new_runs)
    }

    /// The ledger of `run` (read from the API server: it needs its UID), in the backend its
    /// status records (a run not yet recorded: the one new runs get).
    pub fn for_run(&self, run: &AgentRun) -> Result<RunLedger, LedgerError> {
        match self.backend_of(run) {
            LedgerBackend::LedgerSegments => Ok(RunLedger::Segments(SegmentStore::for_run(
                self.client.clone(),
                run,
            ))),
            LedgerBackend::PostgreSQL => {
                let RunId {
                    namespace,
                    name,
                    uid,
                } = run.id();
                self.in_postgres(&namespace, &name, &uid)
            }
        }
    }

    /// The PostgreSQL ledger of a run: directly, else through the server.
    fn in_postgres(&self, namespace: &str, run: &str, uid: &str) -> Result<RunLedger, LedgerError> {
        if let Some(db) = &self.postgres {
            return Ok(RunLedger::Postgres(db.for_run(namespace, run, uid)));
        }
        if let Some(server) = &self.served {
            return Ok(RunLedger::Served(server.for_run(namespace, run, uid)));
        }
        Err(LedgerError::BackendUnavailable {
            backend: LedgerBackend::PostgreSQL,
        })
    }

    /// Reads (never writes) the whole ledgers of `runs` of `namespace`, kept in PostgreSQL,
    /// in their order: one query directly, or one request to `baton server` for every
    /// [`MAX_RUNS_PER_READ`](super::served::MAX_RUNS_PER_READ) runs.
    pub async fn read_runs_in_postgres(
        &self,
        namespace: &str,
        runs: &[RunRef],
    ) -> Result<Vec<Vec<LedgerSegment>>, LedgerError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        match (&self.postgres, &self.served) {
            (Some(db), _) => db.list_runs(namespace, runs).await,
            (None, Some(server)) => server.read_runs(namespace, runs).await,
            (None, None) => Err(LedgerError::BackendUnavailable {
                backend: LedgerBackend::PostgreSQL,
            }),
        }
    }

    /// Reads (never writes) the ledger of `run` (UID `uid`) of `namespace`, kept in
    /// `backend`: a turn reads its thread's earlier turns so.
    pub async fn read_run(
        &self,
        backend: LedgerBackend,
        namespace: &str,
        run: &str,
        uid: &str,
    ) -> Result<Vec<LedgerSegment>, LedgerError> {
        match backend {
            LedgerBackend::LedgerSegments => {
                SegmentStore::list_run(self.client.clone(), namespace, run, uid).await
            }
            LedgerBackend::PostgreSQL => self.in_postgres(namespace, run, uid)?.list().await,
        }
    }

    /// Reads (never writes) every LedgerSegment of `namespace` labelled for the thread of UID
    /// `thread_uid`: a turn's history is built from them.
    pub(super) async fn list_thread(
        &self,
        namespace: &str,
        thread_uid: &str,
    ) -> Result<Vec<LedgerSegment>, kube::Error> {
        SegmentStore::list_thread(self.client.clone(), namespace, thread_uid).await
    }
}

/// One run's ledger, in one backend.
#[derive(Clone)]
pub enum RunLedger {
    Segments(SegmentStore),
    Postgres(super::postgres::PgRunLedger),
    Served(ServedLedger),
}

impl RunLedger {
    /// Overrides the per-segment budget (tests use a small one to exercise splitting). A
    /// served ledger is split by the server, with its own.
    pub fn with_budget(self, budget: usize) -> Self {
        match self {
            RunLedger::Segments(s) => RunLedger::Segments(s.with_budget(budget)),
            RunLedger::Postgres(p) => RunLedger::Postgres(p.with_budget(budget)),
            served @ RunLedger::Served(_) => served,
        }
    }

    /// All segments of the run, ordered by position and checked contiguous.
    pub async fn list(&self) -> Result<Vec<LedgerSegment>, LedgerError> {
        match self {
            RunLedger::Segments(s) => s.list().await,
            RunLedger::Postgres(p) => p.list().await,
            RunLedger::Served(r) => r.list().await,
        }
    }

    /// The segments after position `after`, ordered and checked contiguous from there (a
    /// follower's read: the API server lists the whole run, a database only what follows).
    pub async fn list_after(&self, after: i64) -> Result<Vec<LedgerSegment>, LedgerError> {
        match self {
            RunLedger::Segments(s) => {
                let mut segments = s.list().await?;
                segments.retain(|s| s.spec.seq > after);
                Ok(segments)
            }
            RunLedger::Postgres(p) => p.list_after(after).await,
            RunLedger::Served(r) => r.list_after(after).await,
        }
    }

    /// At most `limit` segments after position `after`, ordered and checked contiguous from
    /// there: a page of a reader that serves others (baton server's streams and `segments`),
    /// which must not hold a whole ledger per caller. A served ledger is read by workers and
    /// the controller only, which read whole ledgers anyway: it reads what follows `after`
    /// and keeps the page.
    pub async fn list_page(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LedgerSegment>, LedgerError> {
        match self {
            RunLedger::Segments(s) => s.list_page(after, limit).await,
            RunLedger::Postgres(p) => p.list_page(after, limit).await,
            RunLedger::Served(r) => {
                let mut segments = r.list_after(after).await?;
                segments.truncate(limit);
                Ok(segments)
            }
        }
    }

    /// True when the ledger is LedgerSegments in the API server, whose watch cache a reader can
    /// probe position by position; a database is read from a position on instead.
    pub fn in_api_server(&self) -> bool {
        matches!(self, RunLedger::Segments(_))
    }

    /// True when reading this ledger does not pass through the reader's own rights (rows
    /// read with the database credential of the process): the reader's right to read it must
    /// be asked of Kubernetes first.
    pub fn read_bypasses_rbac(&self) -> bool {
        matches!(self, RunLedger::Postgres(_))
    }

    /// Deletes the run's ledger for good, once the run is being deleted; returns how many
    /// segments there were. LedgerSegments go with their run by themselves (owner
    /// references, the garbage collector): nothing to do here for them.
    pub async fn delete(&self) -> Result<i64, LedgerError> {
        match self {
            RunLedger::Segments(_) => Ok(0),
            RunLedger::Postgres(p) => p.delete().await,
            RunLedger::Served(r) => r.delete().await,
        }
    }

    /// Fenced append (docs/protocol.md): `events` at `tail + 1` onwards under `fence`.
    #[tracing::instrument(name = "append", skip_all, fields(%fence, tail, events = events.len()))]
    pub async fn append(
        &self,
        tail: i64,
        fence: Fence,
        events: Vec<LedgerEvent>,
    ) -> Result<Appended, LedgerError> {
        match self {
            RunLedger::Segments(s) => s.append(tail, fence, events).await,
            RunLedger::Postgres(p) => p.append(tail, fence, events).await,
            RunLedger::Served(r) => r.append(tail, fence, events).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::AgentRunStatus;

    fn run_kept_in(backend: Option<LedgerBackend>) -> AgentRun {
        let mut run: AgentRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u"},
            "spec": {"thread": "t", "input": "hi"}
        }))
        .expect("a run");
        run.status = Some(AgentRunStatus {
            ledger_backend: backend,
            ..AgentRunStatus::default()
        });
        run
    }

    fn unreachable_api_server() -> Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        Client::try_from(config).expect("a client (it never connects here)")
    }

    #[tokio::test]
    async fn a_run_is_read_where_its_status_says_its_ledger_is_kept() {
        let ledgers = Ledgers::api_server(unreachable_api_server());
        for recorded in [None, Some(LedgerBackend::LedgerSegments)] {
            let ledger = ledgers.for_run(&run_kept_in(recorded));
            assert!(matches!(ledger, Ok(RunLedger::Segments(_))), "{recorded:?}");
        }
        let elsewhere = ledgers.for_run(&run_kept_in(Some(LedgerBackend::PostgreSQL)));
        assert!(matches!(
            elsewhere,
            Err(LedgerError::BackendUnavailable {
                backend: LedgerBackend::PostgreSQL
            })
        ));
        let read = ledgers
            .read_run(LedgerBackend::PostgreSQL, "ns", "r", "u")
            .await;
        assert!(matches!(read, Err(LedgerError::BackendUnavailable { .. })));
    }
}
