//! The PostgreSQL ledger on the real node. The release is switched to it: a PostgreSQL of the
//! project's script in the node's network namespace (its pods reach it on the node's
//! address), its URL in a Secret only `baton server` reads, the controller and the worker
//! pods writing through the server's Service. Then scripted runs meet the real faults, one
//! after the other while they run: a worker killed with SIGKILL, a pod deleted (SIGTERM, as a
//! drain), the controller and the server rolled out, the database crashed and started again.
//! Then:
//! - every run succeeds with its answer, its ledger kept in PostgreSQL;
//! - no non-idempotent effect ran twice, and one that never ran is a reported unknown step;
//! - every ledger, read from the rows, is contiguous, with no stale-fence write after a seal;
//! - not one LedgerSegment object is left in the API server;
//! - a run that waited on the database said so (`LedgerUnavailable`);
//! - deleted, the runs take their rows along.
//!
//! The release is switched back when the test ends, whichever way it ends.

mod e2e_support;
mod node_support;

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerBackend, LedgerSegment};
use baton::ledger::postgres::PgLedger;
use e2e_support::{Effects, Recorded, Script, check_ledger, retry};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use node_support::*;

/// The Secret holding the database's URL.
const DB_SECRET: &str = "baton-node-ledger-db";

/// The release switched to the PostgreSQL ledger for as long as this lives; switched back
/// (default values) when dropped.
struct InPostgres;

impl InPostgres {
    async fn switch(client: &Client, db: &NodePostgres) -> Self {
        servers_ready(client).await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NS);
        let _ = secrets.delete(DB_SECRET, &DeleteParams::default()).await;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(DB_SECRET.into()),
                ..Default::default()
            },
            string_data: Some([("url".to_string(), db.url.clone())].into()),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("the database's Secret");
        // The node runs no cluster DNS: the server is reached at its Service's cluster IP.
        let server = format!("http://{}:80", server_cluster_ip(client).await);
        helm_upgrade(&serde_json::json!({"ledger": {
            "backend": "PostgreSQL",
            "postgres": {"urlSecret": {"name": DB_SECRET}},
            "serverURL": server,
        }}));
        let switched = Self;
        wait_rolled_out(client, SERVER, Duration::from_secs(180)).await;
        wait_controllers_ready(client, Duration::from_secs(180)).await;
        switched
    }
}

impl Drop for InPostgres {
    fn drop(&mut self) {
        helm_upgrade(&serde_json::json!({}));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_runs_kept_in_postgresql_survive_every_fault() {
    let db = NodePostgres::up();
    let env = NodeEnv::start("postgres").await;
    let _switched = InPostgres::switch(&env.client, &db).await;
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
    let started = Instant::now();
    let mut log = Vec::new();
    let mut note =
        |what: String| log.push(format!("{:6.1}s {what}", started.elapsed().as_secs_f64()));

    env.wait_effect(&names[0], 1).await;
    env.signal_worker(&workers[0], libc::SIGKILL).await;
    note(format!("SIGKILL {}", workers[0]));
    env.delete_pod(&workers[1]).await;
    note(format!("deleted pod {} (a drain)", workers[1]));
    tokio::time::sleep(Duration::from_secs(2)).await;
    restart_controllers();
    note("controller rolled out".into());
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubectl(&["-n", SYSTEM_NS, "rollout", "restart", "deployment", SERVER])
        .expect("rolling the server out");
    note("server rolled out".into());
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.crash();
    note("database crashed".into());
    tokio::time::sleep(Duration::from_secs(10)).await;
    db.start();
    note("database started again".into());
    eprintln!("postgres: faults:\n{}", log.join("\n"));

    for name in &names {
        env.wait_succeeded(name).await;
    }
    eprintln!(
        "postgres: every run succeeded after {:?}",
        started.elapsed()
    );

    let ledger = PgLedger::connect(&db.local_url, 2)
        .await
        .expect("the node's database, through the relay");
    let effects = Effects::read(&env.effects.file);
    let runs = env.runs();
    let mut uids = Vec::new();
    for name in &names {
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
    env.finish().await;
}
