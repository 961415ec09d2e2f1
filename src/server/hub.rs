//! Fan-out: one pair of API watches (LedgerSegments and AgentRuns of a namespace) per
//! credential and namespace, however many streams that caller follows there. A follower
//! subscribes to its hub, reads its replay from the ledger with its own credential, then
//! takes the live tail from the hub. Runs kept in PostgreSQL have no LedgerSegments to
//! watch: the database announces each row (LISTEN/NOTIFY, one connection per process), and a
//! follower reads the rows announced for its run, as it reads its replay.
//!
//! Why per credential and not one per namespace: a shared watch is made with somebody's
//! identity. The server's own would need the right to read every transcript, which it must
//! not hold; another caller's would read on one person's behalf for another. So streams share
//! a watch only when the API server would see the same credential for each (a person's
//! browser tabs, an application's many followers).
//!
//! The watches start at the namespace's current resourceVersion, not with a list: the
//! replay comes from each follower's own ledger read, so the hub never holds a namespace's
//! transcripts in memory. (kube-runtime's `watcher` always delivers the initial list; that is
//! why this loop is written here.)

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::TryStreamExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::caller::Caller;
use super::error::ApiError;
use super::metrics::{Counted, ServerMetrics};
use super::shared_fold::Folds;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::ledger::postgres::{Notice, PgLedger};

/// How many changes a slow follower may fall behind before it must read the ledger again.
const BACKLOG: usize = 1024;
/// The longest a watch request stays open (the API server ends it; we continue from the last
/// resourceVersion seen).
const WATCH_SECONDS: u32 = 290;
/// Pause before starting a watch again after an error.
const RETRY: Duration = Duration::from_secs(2);

/// What a hub tells its followers.
#[derive(Clone, Debug)]
pub enum Change {
    Segment(Arc<LedgerSegment>),
    /// The database announced a row at `seq` of the run with UID `run_uid` (runs kept in
    /// PostgreSQL): the announcement carries no content, the follower reads the row with
    /// its own rights.
    Appended {
        run_uid: String,
        seq: i64,
    },
    Run(Arc<AgentRun>),
    RunDeleted(Arc<AgentRun>),
    /// The watch started again from the namespace's present state: what happened meanwhile
    /// was not seen, every follower reads its ledger again.
    Resync,
}

/// The shared watches of one credential in one namespace. Dropping the last handle stops
/// them.
pub struct Hub {
    tx: broadcast::Sender<Change>,
    /// The folds its followers share (`shared_fold`): a caller's own, never another's.
    pub folds: Folds,
    task: JoinHandle<()>,
    metrics: Arc<ServerMetrics>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
        self.metrics.hubs.dec();
    }
}

impl Hub {
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.tx.subscribe()
    }
}

type HubKey = (Arc<str>, String);

/// Every live hub, found by credential and namespace.
pub struct Hubs {
    live: Mutex<HashMap<HubKey, Weak<Hub>>>,
    metrics: Arc<ServerMetrics>,
    /// The database's announcements of appended rows, when this server keeps ledgers in
    /// PostgreSQL: one listening connection for the process, each hub takes its namespace's.
    rows: Option<broadcast::Receiver<Notice>>,
    /// The most hubs live at once: each holds two watches of the API server.
    limit: usize,
}

/// The most hubs a server keeps live at once by default (`--max-hubs`): 2,000 API watches.
pub const MAX_HUBS: usize = 1000;

impl Hubs {
    pub fn new(metrics: Arc<ServerMetrics>) -> Self {
        Self {
            live: Mutex::new(HashMap::new()),
            metrics,
            rows: None,
            limit: MAX_HUBS,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Keeps at most `limit` hubs live at once.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Hubs that also pass on the rows the database announces (`db`'s LISTEN).
    pub fn with_rows(mut self, db: &PgLedger) -> Self {
        self.rows = Some(db.listen(RETRY));
        self
    }

    /// The hub of `caller` in `namespace`, started if none is live; refused when the server
    /// keeps as many hubs as it may (the caller may try another replica, or later).
    pub fn join(&self, caller: &Caller, namespace: &str) -> Result<Arc<Hub>, ApiError> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, hub| hub.strong_count() > 0);
        let key = (caller.token().clone(), namespace.to_string());
        if let Some(hub) = live.get(&key).and_then(Weak::upgrade) {
            return Ok(hub);
        }
        if live.len() >= self.limit {
            return Err(ApiError::TooManyHubs { limit: self.limit });
        }
        let (tx, _) = broadcast::channel(BACKLOG);
        let segments: Api<LedgerSegment> = Api::namespaced(caller.client().clone(), namespace);
        let runs: Api<AgentRun> = Api::namespaced(caller.client().clone(), namespace);
        let metrics = self.metrics.clone();
        let sender = tx.clone();
        let rows = self.rows.as_ref().map(broadcast::Receiver::resubscribe);
        let namespace = namespace.to_string();
        let task = tokio::spawn(async move {
            tokio::join!(
                tail(segments, sender.clone(), &metrics, segment_change),
                tail(runs, sender.clone(), &metrics, run_change),
                announced(rows, &namespace, sender),
            );
        });
        self.metrics.hubs.inc();
        let hub = Arc::new(Hub {
            tx,
            folds: Folds::default(),
            task,
            metrics: self.metrics.clone(),
        });
        live.insert(key, Arc::downgrade(&hub));
        Ok(hub)
    }
}

/// Passes on the rows the database announces in `namespace`, for ever (none when this
/// server keeps no ledger in PostgreSQL). A lost announcement (the listening connection made
/// again, or this hub fallen behind) is a resync: every follower reads again.
async fn announced(
    rows: Option<broadcast::Receiver<Notice>>,
    namespace: &str,
    tx: broadcast::Sender<Change>,
) {
    let Some(mut rows) = rows else {
        return;
    };
    loop {
        let change = match rows.recv().await {
            Ok(Notice::Appended {
                namespace: ns,
                run_uid,
                seq,
            }) if ns == namespace => Change::Appended { run_uid, seq },
            Ok(Notice::Appended { .. }) => continue,
            Ok(Notice::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let _ = tx.send(change);
    }
}

fn segment_change(event: WatchEvent<LedgerSegment>) -> Option<Change> {
    match event {
        WatchEvent::Added(s) | WatchEvent::Modified(s) => Some(Change::Segment(Arc::new(s))),
        _ => None,
    }
}

fn run_change(event: WatchEvent<AgentRun>) -> Option<Change> {
    match event {
        WatchEvent::Added(r) | WatchEvent::Modified(r) => Some(Change::Run(Arc::new(r))),
        WatchEvent::Deleted(r) => Some(Change::RunDeleted(Arc::new(r))),
        _ => None,
    }
}

/// Watches `api` from the present on, for ever: each start from a fresh resourceVersion
/// tells followers to read again (`Resync`); a watch that merely timed out continues from
/// the last version seen, and so misses nothing.
async fn tail<K>(
    api: Api<K>,
    tx: broadcast::Sender<Change>,
    metrics: &ServerMetrics,
    change: fn(WatchEvent<K>) -> Option<Change>,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(list) => {
                let version = list.metadata.resource_version.unwrap_or_default();
                let _ = tx.send(Change::Resync);
                let _open = Counted::new(&metrics.api_watches);
                let why = follow(&api, version, &tx, change).await;
                tracing::debug!(%why, "a shared watch starts again");
            }
            Err(err) => tracing::debug!(%err, "a shared watch cannot start"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Follows watch requests from `version` on; returns why it must start afresh.
async fn follow<K>(
    api: &Api<K>,
    mut version: String,
    tx: &broadcast::Sender<Change>,
    change: fn(WatchEvent<K>) -> Option<Change>,
) -> String
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let params = WatchParams::default().timeout(WATCH_SECONDS);
    loop {
        let stream = match api.watch(&params, &version).await {
            Ok(stream) => stream,
            Err(err) => return err.to_string(),
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Bookmark(b))) => version = b.metadata.resource_version,
                Ok(Some(WatchEvent::Error(status))) => return status.message,
                Ok(Some(event)) => {
                    if let Some(v) = resource_version(&event) {
                        version = v;
                    }
                    if let Some(c) = change(event) {
                        let _ = tx.send(c);
                    }
                }
                Ok(None) => break,
                Err(err) => return err.to_string(),
            }
        }
    }
}

fn resource_version<K: kube::Resource>(event: &WatchEvent<K>) -> Option<String> {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
            o.resource_version()
        }
        _ => None,
    }
}
