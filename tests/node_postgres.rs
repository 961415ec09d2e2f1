//! The PostgreSQL ledger on the real node. The release is switched to it: a PostgreSQL of the
//! project's script in the node's network namespace (its pods reach it on the node's
//! address), its URL in a Secret only `baton server` reads, the controller and the worker
//! pods writing through the server's Service. Then scripted runs meet the real faults, one
//! after the other while they run: a worker killed with SIGKILL, a pod deleted (SIGTERM, as a
//! drain), the controller and the server rolled out, the database crashed and started again.
//! Then three more meet `kubectl drain` of the node, and one of them the node's loss. Then:
//! - every run succeeds with its answer, its ledger kept in PostgreSQL; a drained run
//!   consumed no attempt;
//! - no non-idempotent effect ran twice, and one that never ran is a reported unknown step;
//! - every ledger, read from the rows, is contiguous, with no stale-fence write after a seal;
//! - not one LedgerSegment object is left in the API server;
//! - a run that waited on the database said so (`LedgerUnavailable`);
//! - deleted, the runs take their rows along.
//!
//! The release is switched back when the test ends, whichever way it ends.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerBackend, LedgerSegment};
use baton::fence::Fence;
use baton::ledger::postgres::PgLedger;
use baton_testkit::e2e::{Effects, Recorded, Script, check_ledger, retry};
use baton_testkit::node::*;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_runs_kept_in_postgresql_survive_every_fault() {
    let db = NodePostgres::up();
    let env = NodeEnv::start("postgres").await;
    let switched = InPostgres::switch(&env.client, &db).await;
    let ledger = PgLedger::connect(&db.local_url, 2)
        .await
        .expect("the node's database, through the relay");
    let mut uids = one_fault_of_each_kind(&env, &db, &ledger).await;
    uids.extend(a_drain_then_the_nodes_loss(&env, &ledger).await);
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("LedgerUnavailable")),
        "no run said it waited on the database"
    );

    // Deleted, the runs take their rows along (their finalizer holds them until then).
    let runs = env.runs();
    runs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let all = ListParams::default();
    while !retry(|| runs.list(&all)).await.items.is_empty() {
        assert!(
            Instant::now() < deadline,
            "runs kept in PostgreSQL never went"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (name, uid) in &uids {
        let left = ledger.for_run(&env.ns, name, uid).list().await.unwrap();
        assert!(left.is_empty(), "{name}: {} rows left", left.len());
    }
    switched.switch_back(&env.client).await;
    env.finish().await;
}

/// Six runs meet, one after the other while they run: a worker's SIGKILL, a pod deleted, the
/// controller and the server rolled out, the database crashed for 10 s. Their names and UIDs.
async fn one_fault_of_each_kind(
    env: &NodeEnv,
    db: &NodePostgres,
    ledger: &PgLedger,
) -> Vec<(String, String)> {
    let names: Vec<String> = (0..6).map(|i| format!("pg-{i}")).collect();
    let script = Script {
        turns: 6,
        think_ms: 200,
        tool_ms: 2000,
    };
    env.create_scripted(&names, &script).await;
    let mut workers = Vec::new();
    for name in &names {
        workers.push(env.wait_worker(name, 1).await.0);
    }
    let mut log = FaultLog::new();
    env.wait_effect(&names[0], 1).await;
    env.signal_worker(&workers[0], libc::SIGKILL).await;
    log.note(format!("SIGKILL {}", workers[0]));
    env.delete_pod(&workers[1]).await;
    log.note(format!("deleted pod {} (a drain)", workers[1]));
    tokio::time::sleep(Duration::from_secs(2)).await;
    restart_controllers();
    log.note("controller rolled out");
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubectl(&["-n", SYSTEM_NS, "rollout", "restart", "deployment", SERVER])
        .expect("rolling the server out");
    log.note("server rolled out");
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.crash();
    log.note("database crashed");
    tokio::time::sleep(Duration::from_secs(10)).await;
    db.start();
    log.note("database started again");
    log.print();
    all_succeed_from_rows(env, ledger, &names, &script).await
}

/// Three runs meet `kubectl drain` of the node (the Eviction API; the PodDisruptionBudgets
/// keep a controller and a server replica, so writes go on), then one of them the node's
/// loss (kubelet stopped, worker frozen past its lease, woken as a zombie once the node is
/// back). A drain is a handoff: it consumes no attempt. Their names and UIDs.
async fn a_drain_then_the_nodes_loss(env: &NodeEnv, ledger: &PgLedger) -> Vec<(String, String)> {
    let names: Vec<String> = ["pg-drain-0", "pg-drain-1", "pg-lost"]
        .map(String::from)
        .into();
    // Long enough that the lost run is still mid-run at its second pod, after the drain.
    let script = Script::new(20, 1500);
    for name in &names {
        let mut run = env.scripted(name, &script);
        // The next pods wait, unschedulable, while the node is cordoned.
        run.spec.lease.startup_seconds = 180;
        env.create(&run).await;
    }
    let mut followed = Vec::new();
    for name in &names {
        let (pod, _) = env.wait_worker(name, 1).await;
        followed.push(LogFollower::worker(&env.ns, &pod, &env.dir));
        env.wait_effect(name, 1).await;
    }
    let mut log = FaultLog::new();
    let drained = drain_then_uncordon();
    log.note("node drained, then uncordoned");
    let refusal = drained.expect_err("a single-node drain cannot evict the last pods of a PDB");
    assert!(refusal.contains("disruption budget"), "{refusal}");

    let lost = &names[2];
    let (pod, fence) = env.wait_worker(lost, 2).await;
    env.wait_effect(lost, 2).await;
    let pid = env
        .container_pid(&pod)
        .await
        .expect("the worker's host PID");
    let loss = NodeLoss::begin(pid).await;
    log.note(format!("node lost ({pod} frozen, kubelet stopped)"));
    env.wait_run(lost, Duration::from_secs(120), "claimed again", |s| {
        s.fence > Fence::new(fence)
    })
    .await;
    log.note("claimed again without the node");
    loss.end().await;
    log.note("node back, the frozen worker woken");
    log.print();

    let uids = all_succeed_from_rows(env, ledger, &names, &script).await;
    for (name, drained) in names[..2].iter().zip(&followed) {
        let st = env.status(name).await;
        assert_eq!(
            st.failed_attempts,
            0,
            "{name}: a drain is a handoff: {st:#?}\n---- its drained worker's log ----\n{}",
            drained.tail(40)
        );
        assert!(st.fence >= Fence::new(2), "{name} moved to a new pod");
    }
    assert!(env.status(lost).await.failed_attempts >= 1);
    uids
}

/// Waits for every run of `names` to succeed with its answer, then checks each from its rows:
/// kept in PostgreSQL, contiguous, no stale-fence write after a seal, no effect twice and
/// none lost unreported, and no LedgerSegment object in the API server. Names and UIDs.
async fn all_succeed_from_rows(
    env: &NodeEnv,
    ledger: &PgLedger,
    names: &[String],
    script: &Script,
) -> Vec<(String, String)> {
    let started = Instant::now();
    for name in names {
        env.wait_succeeded(name).await;
    }
    eprintln!(
        "postgres: {names:?} succeeded after {:?}",
        started.elapsed()
    );
    let effects = Effects::read(&env.effects.file);
    let runs = env.runs();
    let mut uids = Vec::new();
    for name in names {
        let run = retry(|| runs.get(name)).await;
        let st = run.status.clone().unwrap_or_default();
        assert_eq!(st.ledger_backend, Some(LedgerBackend::PostgreSQL), "{name}");
        assert_eq!(
            st.output.as_deref(),
            Some(format!("{name}: all {} turns done", script.turns).as_str())
        );
        let uid = run.uid().unwrap();
        let rows = ledger.for_run(&env.ns, name, &uid).list().await.unwrap();
        check_ledger(name, &st, &rows, &Recorded::default());
        for turn in 1..=script.turns {
            let n = effects.count(name, turn);
            assert!(n <= 1, "{name}: the effect of turn {turn} ran {n} times");
            if n == 0 {
                assert!(
                    st.unknown_effects.iter().any(|u| u.step == turn as i64),
                    "{name} turn {turn} never ran and is not reported: {st:#?}"
                );
            }
        }
        uids.push((name.clone(), uid));
    }
    let objects = env
        .api::<LedgerSegment>()
        .list(&ListParams::default())
        .await;
    assert!(objects.unwrap().items.is_empty(), "LedgerSegment objects");
    uids
}

/// The faults injected, with their times, printed for the log.
struct FaultLog {
    started: Instant,
    lines: Vec<String>,
}

impl FaultLog {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            lines: Vec::new(),
        }
    }

    fn note(&mut self, what: impl std::fmt::Display) {
        let t = self.started.elapsed().as_secs_f64();
        self.lines.push(format!("{t:6.1}s {what}"));
    }

    fn print(&self) {
        eprintln!("postgres: faults:\n{}", self.lines.join("\n"));
    }
}
