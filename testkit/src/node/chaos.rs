//! Random real faults on the node, for the chaos suites (`tests/node_chaos.rs`,
//! `tests/node_warm.rs`): a live worker's process killed with SIGKILL from the host, frozen
//! with SIGSTOP past its lease then thawed, its pod deleted (SIGTERM from the kubelet, as in a
//! drain); the leading controller pod deleted; the ledger's database crashed (runs kept in
//! PostgreSQL); a pod started ahead for a thread's next turn deleted before or while its turn
//! takes it. Each drawn from a seeded generator, so a seed replays the same draws.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use baton::crd::WARM_THREAD_LABEL;
use baton::crd::v1alpha1::Phase;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::{NodeEnv, NodePostgres, SYSTEM_NS, controller_pods, leader_pod};
use crate::e2e::{lease, retry};

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Pause,
    Drain,
    LeaderDeleted,
    /// The ledger's database crashed, started again 3–10 s later.
    DatabaseCrash,
    /// A pod started ahead for a thread's next turn, not yet adopted, deleted.
    AheadDeleted,
}

/// How long faults are injected: `BATON_CHAOS_WINDOW` seconds, else 60.
pub fn chaos_window() -> Duration {
    let seconds = std::env::var("BATON_CHAOS_WINDOW")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(seconds)
}

/// The seed (`BATON_CHAOS_SEED`, else a random one, printed) and the number of runs
/// (`BATON_CHAOS_RUNS`, else `default`).
pub fn seed_and_runs(default: usize) -> (u64, usize) {
    let seed: u64 = std::env::var("BATON_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let n: usize = std::env::var("BATON_CHAOS_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("chaos: seed {seed} (replay with BATON_CHAOS_SEED={seed}), {n} runs");
    (seed, n)
}

/// What the faults may touch, and for how long.
pub struct Chaos<'a> {
    pub env: &'a NodeEnv,
    pub seed: u64,
    pub window: Duration,
    /// Faults a run may take at most (a pause or a kill costs it an attempt).
    pub per_run: usize,
    /// The runs' ledgers are in this database, whose crash is among the faults.
    pub db: Option<&'a NodePostgres>,
    /// Pods started ahead for threads' next turns are among the targets.
    pub warm: bool,
    /// Stop before the window ends once every run in the namespace has ended (false while
    /// runs are still being created).
    pub stop_when_all_ended: bool,
}

impl Chaos<'_> {
    /// Injects faults every 0.3–1 s for the window; returns what it did, one line each.
    pub async fn run(&self) -> Vec<String> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let started = Instant::now();
        let mut faults: BTreeMap<String, usize> = BTreeMap::new();
        let mut log = Vec::new();
        let mut resumers = Vec::new();
        let (mut paused, mut drained) = (BTreeSet::new(), BTreeSet::new());
        let mut db_back_at: Option<Instant> = None;
        let pause_for = Duration::from_secs(lease().duration_seconds as u64 + 3);
        while started.elapsed() < self.window {
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..=1000))).await;
            let fault = self.draw(&mut rng);
            let t = started.elapsed().as_secs_f64();
            if let (Some(db), Some(at)) = (self.db, db_back_at)
                && Instant::now() >= at
            {
                db.start();
                db_back_at = None;
                log.push(format!("{t:6.1}s database started again"));
            }
            match fault {
                Fault::LeaderDeleted => {
                    if let Some(leader) = self.delete_leader().await {
                        log.push(format!("{t:6.1}s leader controller pod {leader} deleted"));
                    }
                    continue;
                }
                Fault::DatabaseCrash => {
                    if let Some(db) = self.db
                        && db_back_at.is_none()
                    {
                        db.crash();
                        let down = Duration::from_secs(rng.random_range(3..=10));
                        db_back_at = Some(Instant::now() + down);
                        log.push(format!("{t:6.1}s database crashed for {down:?}"));
                    }
                    continue;
                }
                Fault::AheadDeleted => {
                    // One per thread: its other turns show a pod started ahead taken.
                    let ahead: Vec<(String, String)> = self
                        .pods_started_ahead()
                        .await
                        .into_iter()
                        .filter(|(_, thread)| !faults.contains_key(thread))
                        .collect();
                    if !ahead.is_empty() {
                        let (pod, thread) = &ahead[rng.random_range(0..ahead.len())];
                        self.env.delete_pod(pod).await;
                        faults.insert(thread.clone(), 1);
                        log.push(format!("{t:6.1}s {fault:?} {pod}"));
                    }
                    continue;
                }
                _ => {}
            }
            let Some(live) = self.live_workers(&faults, &paused, &drained, fault).await else {
                break;
            };
            if live.is_empty() {
                continue;
            }
            let (name, pod, pid) = live[rng.random_range(0..live.len())].clone();
            // SAFETY: kill(2) on the host PID of this test's own worker container.
            let signal = |sig| unsafe { libc::kill(pid as i32, sig) } == 0;
            let ok = match fault {
                Fault::Kill => signal(libc::SIGKILL),
                Fault::Pause => {
                    let ok = signal(libc::SIGSTOP);
                    paused.insert(pod.clone());
                    resumers.push(tokio::spawn(async move {
                        tokio::time::sleep(pause_for).await;
                        // SAFETY: as above; the process may be gone meanwhile (ESRCH is fine).
                        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                    }));
                    ok
                }
                Fault::Drain => {
                    self.env.delete_pod(&pod).await;
                    drained.insert(pod.clone());
                    true
                }
                _ => unreachable!("handled above"),
            };
            if ok {
                *faults.entry(name.clone()).or_default() += 1;
                log.push(format!("{t:6.1}s {fault:?} {pod}"));
            }
        }
        if let (Some(db), Some(_)) = (self.db, db_back_at) {
            db.start();
            log.push("database started again after the window".into());
        }
        for r in resumers {
            let _ = r.await;
        }
        log
    }

    fn draw(&self, rng: &mut StdRng) -> Fault {
        let kinds = 10 + usize::from(self.db.is_some()) + usize::from(self.warm);
        match rng.random_range(0..kinds) {
            0..=2 => Fault::Kill,
            3..=4 => Fault::Pause,
            5..=8 => Fault::Drain,
            9 => Fault::LeaderDeleted,
            10 if self.db.is_some() => Fault::DatabaseCrash,
            _ => Fault::AheadDeleted,
        }
    }

    async fn delete_leader(&self) -> Option<String> {
        let (pods, holder) = controller_pods(&self.env.client).await;
        let leader = holder.as_deref().and_then(|h| leader_pod(&pods, h))?;
        let api: Api<Pod> = Api::namespaced(self.env.client.clone(), SYSTEM_NS);
        let _ = api.delete(&leader, &DeleteParams::default()).await;
        Some(leader)
    }

    /// Pods started ahead that no run has adopted yet, not being deleted, each with its
    /// thread's UID.
    async fn pods_started_ahead(&self) -> Vec<(String, String)> {
        let pods = self.env.pods();
        let params = ListParams::default().labels(WARM_THREAD_LABEL);
        let listed = retry(|| pods.list(&params)).await.items;
        listed
            .iter()
            .filter(|p| p.owner_references().iter().all(|o| o.kind == "AgentThread"))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| (p.name_any(), p.labels()[WARM_THREAD_LABEL].clone()))
            .collect()
    }

    /// The runs with a running, unpaused worker and fault budget left: (run, pod, host PID).
    /// None: stop (every run ended, or none has budget left).
    async fn live_workers(
        &self,
        faults: &BTreeMap<String, usize>,
        paused: &BTreeSet<String>,
        drained: &BTreeSet<String>,
        fault: Fault,
    ) -> Option<Vec<(String, String, u32)>> {
        let api = self.env.runs();
        let params = Default::default();
        let runs = retry(|| api.list(&params)).await.items;
        let ended = |r: &baton::crd::v1alpha1::AgentRun| {
            r.status.as_ref().is_some_and(|s| s.phase.is_terminal())
        };
        if self.stop_when_all_ended && runs.iter().all(ended) {
            return None;
        }
        let spent = |name: &str| faults.get(name).copied().unwrap_or(0) >= self.per_run;
        if self.stop_when_all_ended && runs.iter().all(|r| spent(&r.name_any())) {
            return None;
        }
        let mut live = Vec::new();
        for run in runs {
            let name = run.name_any();
            let st = run.status.unwrap_or_default();
            if spent(&name) || st.phase != Phase::Running {
                continue;
            }
            let Some(pod) = st.worker.clone() else {
                continue;
            };
            if paused.contains(&pod) || (matches!(fault, Fault::Drain) && drained.contains(&pod)) {
                continue;
            }
            if let Some(pid) = self.env.container_pid(&pod).await {
                live.push((name, pod, pid));
            }
        }
        Some(live)
    }
}
