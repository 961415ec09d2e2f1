//! What every reconcile shares: the client, the watch caches, the controller's own memory of
//! lease sightings, leadership, metrics and the Event queue.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};

use super::Config;
use super::election::Leadership;
use super::events::{self, Queued};
use super::metrics::Metrics;
use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, AgentThread, LedgerBackend, LedgerSegment};
use crate::fence::Fence;
use crate::lease::{LeaseClient, LeaseSighting};
use crate::ledger::{LedgerError, Ledgers, RunLedger};

/// What the controller remembers about one run, on its own clock.
#[derive(Debug, Clone, Default)]
pub struct RunMemory {
    /// The UID of the run this is about: a run re-created under the same name starts afresh.
    pub uid: Option<String>,
    pub sighting: Option<LeaseSighting>,
    pub stop_seen_at: Option<Instant>,
    /// UID of the run whose worker ServiceAccount, Role and RoleBinding are known to exist.
    pub rbac_for: Option<String>,
    /// The resourceVersion this controller's last status write replaced: a cached run still
    /// at it is behind the API server (deciding on it would only end in a conflict).
    pub replaced_version: Option<String>,
    /// The last seal this controller appended (or found) for the run.
    pub seal: Option<SealMemory>,
    /// Reconciles of the run that failed in a row (their backoff doubles).
    pub failures: u32,
    /// The ledger holds the `closed` record of the terminal claim that ended the run (this
    /// controller appended it, or found it).
    pub close_recorded: bool,
    /// The run ended and its own worker ServiceAccount, Role and RoleBinding are gone (this
    /// controller removed them, or found them gone).
    pub identity_removed: bool,
}

impl RunMemory {
    /// True when this memory is about `run`, not about an earlier run of its name (a memory
    /// not yet tied to a UID is about whichever run has the name).
    fn is_about(&self, run: &AgentRun) -> bool {
        self.uid.is_none() || self.uid == run.uid()
    }
}

/// Where this controller's seal for one fence of a run is in its ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealMemory {
    pub uid: String,
    pub fence: Fence,
    pub seq: i64,
}

/// The memory of the run at `key` with `uid`, started afresh if it was about another run of
/// that name (a deleted one).
pub fn memory_for<'a>(
    memory: &'a mut HashMap<RunKey, RunMemory>,
    key: RunKey,
    uid: Option<&str>,
) -> &'a mut RunMemory {
    let m = memory.entry(key).or_default();
    if let Some(uid) = uid {
        if m.uid.as_deref().is_some_and(|known| known != uid) {
            *m = RunMemory::default();
        }
        m.uid = Some(uid.into());
    }
    m
}

/// Key of a run in memory: namespace and name.
pub type RunKey = (String, String);

pub fn run_key(run: &AgentRun) -> RunKey {
    (run.id().namespace, run.name_any())
}

/// The watch caches the controller reads instead of the API server.
pub struct Caches {
    pub runs: Store<AgentRun>,
    pub pods: Store<Pod>,
    pub leases: Store<Lease>,
    /// AgentThreads: their policies, and where their status is.
    pub threads: Store<AgentThread>,
}

/// Shared by every reconcile. Its fields are private: the client is reached only through
/// the writers (`Context::write*`, the [`RunLedger`] and [`LeaseClient`] it hands out), the
/// rest through read accessors.
pub struct Context {
    client: Client,
    /// Where runs' ledgers are kept.
    ledgers: Ledgers,
    config: Config,
    caches: Caches,
    memory: Mutex<HashMap<RunKey, RunMemory>>,
    /// Runs whose pod was deleted for a rollout, with the fence it was deleted at.
    rollouts: Mutex<HashSet<(RunKey, Fence)>>,
    leadership: Arc<Leadership>,
    metrics: Arc<Metrics>,
    /// Events waiting to be published (None: Events are off).
    events: Option<tokio::sync::mpsc::Sender<Queued>>,
    /// Set once the run, pod and Lease caches have synced (one waiter: kube's
    /// `Store::wait_until_ready` wakes only the last of several concurrent waiters).
    synced: Arc<std::sync::atomic::AtomicBool>,
    /// Wakes a run at once (the next run of a thread, when the thread is released).
    wake: UnboundedSender<ObjectRef<AgentRun>>,
}

impl Context {
    /// A context with nothing remembered yet; `synced` says whether the caches count as
    /// synced from the start (a detached test controller's empty ones do).
    pub fn new(
        client: Client,
        config: Config,
        caches: Caches,
        leadership: Leadership,
        events: Option<tokio::sync::mpsc::Sender<Queued>>,
        wake: UnboundedSender<ObjectRef<AgentRun>>,
        synced: bool,
    ) -> Self {
        Self {
            ledgers: match &config.ledger_server {
                Some(server) => {
                    Ledgers::with_server(client.clone(), server.clone(), config.new_runs_ledger)
                }
                None => Ledgers::api_server(client.clone()),
            },
            client,
            config,
            caches,
            memory: Default::default(),
            rollouts: Default::default(),
            leadership: Arc::new(leadership),
            metrics: Arc::new(Metrics::new()),
            events,
            synced: Arc::new(std::sync::atomic::AtomicBool::new(synced)),
            wake,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn run_cache(&self) -> &Store<AgentRun> {
        &self.caches.runs
    }

    pub fn pod_cache(&self) -> &Store<Pod> {
        &self.caches.pods
    }

    pub fn lease_cache(&self) -> &Store<Lease> {
        &self.caches.leases
    }

    pub fn thread_cache(&self) -> &Store<AgentThread> {
        &self.caches.threads
    }

    pub fn ledgers(&self) -> &Ledgers {
        &self.ledgers
    }

    pub fn leadership(&self) -> &Arc<Leadership> {
        &self.leadership
    }

    pub fn synced(&self) -> &Arc<std::sync::atomic::AtomicBool> {
        &self.synced
    }

    pub fn rollouts(&self) -> &Mutex<HashSet<(RunKey, Fence)>> {
        &self.rollouts
    }

    pub fn wake(&self) -> &UnboundedSender<ObjectRef<AgentRun>> {
        &self.wake
    }

    /// The run's ledger, for the controller's seals and salvage reads: in the backend its
    /// status records.
    pub fn ledger(&self, run: &AgentRun) -> Result<RunLedger, LedgerError> {
        self.ledgers.for_run(run)
    }

    /// The ledger of another run, `run`, read only: the turn before a turn that is first
    /// claimed, whose history it carries on.
    pub async fn ledger_of(&self, run: &AgentRun) -> Result<Vec<LedgerSegment>, LedgerError> {
        let backend = LedgerBackend::of(run.status.as_ref());
        let RunId {
            namespace: ns, uid, ..
        } = run.id();
        self.ledgers
            .read_run(backend, &ns, &run.name_any(), &uid)
            .await
    }

    /// The Lease edge in `namespace`: the claim's moves and reads of run Leases.
    pub fn lease_edge(&self, namespace: &str) -> LeaseClient {
        LeaseClient::new(self.client.clone(), namespace)
    }

    /// Records a sighting of the run Lease `lease` of the run at `key` with `uid`.
    pub fn sight(&self, key: RunKey, uid: &str, lease: &Lease, now: Instant) {
        let mut memory = self.memory.lock().expect("memory lock");
        let m = memory_for(&mut memory, key, Some(uid));
        m.sighting = Some(LeaseSighting::observe(m.sighting.as_ref(), lease, now));
    }

    pub fn runs_api(&self, run: &AgentRun) -> Api<AgentRun> {
        Api::namespaced(self.client.clone(), &run.id().namespace)
    }

    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// A copy of what the controller remembers about `run` (nothing, if that was about an
    /// earlier run of the same name).
    pub fn memory_of(&self, run: &AgentRun) -> RunMemory {
        let memory = self.memory.lock().expect("memory lock");
        memory
            .get(&run_key(run))
            .filter(|m| m.is_about(run))
            .cloned()
            .unwrap_or_default()
    }

    pub fn remember(&self, run: &AgentRun, change: impl FnOnce(&mut RunMemory)) {
        let mut memory = self.memory.lock().expect("memory lock");
        let uid = run.uid();
        change(memory_for(&mut memory, run_key(run), uid.as_deref()));
    }

    pub fn forget(&self, run: &AgentRun) {
        self.memory
            .lock()
            .expect("memory lock")
            .remove(&run_key(run));
    }

    /// Drops the memory of a run the watch saw deleted (whoever deleted it), unless it is
    /// about a newer run of the same name by now.
    pub fn forget_deleted(&self, run: &AgentRun) {
        let mut memory = self.memory.lock().expect("memory lock");
        let key = run_key(run);
        if memory.get(&key).is_some_and(|m| m.is_about(run)) {
            memory.remove(&key);
        }
    }

    /// After the run watch re-listed (deletions during a disconnect come as no event), keeps
    /// the memory of the runs the cache still has only.
    pub fn forget_uncached(&self) {
        let mut memory = self.memory.lock().expect("memory lock");
        memory.retain(|(ns, name), m| self.caches_run(ns, name, m.uid.as_deref()));
    }

    /// True when the run cache holds the run `ns/name` (with UID `uid`, when one is given).
    pub fn caches_run(&self, ns: &str, name: &str, uid: Option<&str>) -> bool {
        self.caches
            .runs
            .get(&ObjectRef::new(name).within(ns))
            .is_some_and(|run| uid.is_none() || run.uid().as_deref() == uid)
    }

    /// Counts a failed reconcile of `run`: how many failed in a row now.
    pub fn reconcile_failed(&self, run: &AgentRun) -> u32 {
        let mut failures = 0;
        self.remember(run, |m| {
            m.failures = m.failures.saturating_add(1);
            failures = m.failures;
        });
        failures
    }

    /// A reconcile of `run` passed: the next failure starts a new series.
    pub fn reconcile_passed(&self, run: &AgentRun) {
        let mut memory = self.memory.lock().expect("memory lock");
        if let Some(m) = memory.get_mut(&run_key(run)) {
            m.failures = 0;
        }
    }

    /// How many runs the controller keeps memory of (a gauge: it must fall as runs go).
    pub fn remembered(&self) -> usize {
        self.memory.lock().expect("memory lock").len()
    }

    /// Queues an Event about `run` (see [`events`]: best effort, never on the claim's path).
    pub fn event(&self, run: &AgentRun, warning: bool, reason: &str, note: String) {
        let Some(queue) = &self.events else {
            return;
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        events::enqueue(queue, &self.metrics, (event, run.object_ref(&())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_recreated_under_the_same_name_starts_with_a_fresh_memory() {
        let mut memory = HashMap::new();
        let key = || ("ns".to_string(), "r".to_string());
        memory_for(&mut memory, key(), Some("u-old")).rbac_for = Some("u-old".into());
        assert_eq!(
            memory_for(&mut memory, key(), Some("u-old"))
                .rbac_for
                .as_deref(),
            Some("u-old")
        );
        let fresh = memory_for(&mut memory, key(), Some("u-new"));
        assert_eq!(fresh.rbac_for, None);
        assert_eq!(fresh.uid.as_deref(), Some("u-new"));
        // Without a UID to tell (a run not read from the API server), the memory is kept.
        assert_eq!(
            memory_for(&mut memory, key(), None).uid.as_deref(),
            Some("u-new")
        );
    }
}
