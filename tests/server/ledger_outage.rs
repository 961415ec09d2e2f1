//! A run kept in PostgreSQL while the database crashes mid-run: the run waits (its lease
//! kept, the same attempt), a Warning says why, and once the database is back the run
//! finishes with every segment in place.

use std::time::Duration;

use crate::pg_runs::{ledger_server_and_controller_at, start_pg_controller, start_pg_worker};
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::events::wait_event;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use k8s_openapi::api::events::v1::Event;
use kube::Api;

#[tokio::test]
async fn a_run_kept_in_postgresql_waits_out_a_database_crash_and_loses_nothing() {
    let db = OwnPostgres::up("outage").await;
    let ns = TestNamespace::new("served-ledger-outage").await;
    let (base, _server, seal) = ledger_server_and_controller_at(&ns, &db.url).await;
    let _controller = start_pg_controller(&ns, &base, seal);
    let lease = LeaseSpec {
        duration_seconds: 6,
        renew_seconds: 2,
        startup_seconds: 60,
    };
    let script = vec![
        shell_turn("before", "sh", "echo before", 0),
        final_turn("after the outage", 4000),
    ];
    let run = scripted_run("waits", script, vec![shell_tool("sh", false)], lease);
    let runs: Api<AgentRun> = ns.api();
    let uid = create_run(&runs, &run).await;
    let mut worker = start_pg_worker(&ns, "waits", 1).await;
    let ledger = baton::ledger::postgres::PgLedger::connect(&db.url, 1)
        .await
        .unwrap()
        .for_run(&ns.name, "waits", &uid);
    wait_until(T, "the tool's result in the ledger", || async {
        ledger.list().await.is_ok_and(|rows| rows.len() >= 4)
    })
    .await;

    // The database crashes while the model answers: the answer cannot be appended.
    db.crash().await;
    let events: Api<Event> = ns.api();
    let warning = wait_event(&events, "waits", "LedgerUnavailable", T).await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = warning.note.unwrap_or_default();
    assert!(note.contains("nothing it did is lost"), "{note}");
    // Meanwhile the run is held, not given up: the same attempt, not ended.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let held = runs.get("waits").await.unwrap().status.unwrap();
    assert_eq!(
        (held.attempt, held.phase.is_terminal()),
        (1, false),
        "{held:?}"
    );

    db.start().await;
    wait_phase(&runs, "waits", Phase::Succeeded, T).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    wait_event(&events, "waits", "LedgerAvailable", T).await;
    let status = runs.get("waits").await.unwrap().status.unwrap();
    assert_eq!(status.attempt, 1, "one attempt, paused and resumed");
    assert_eq!(status.output.as_deref(), Some("after the outage"));
    let rows = ledger.list().await.unwrap();
    let replay = baton::ledger::Replay::from_segments(&rows).expect("the ledger replays");
    assert_eq!(replay.final_output.as_deref(), Some("after the outage"));
    assert_eq!(replay.attempts.len(), 1, "{:?}", replay.attempts);
    ns.cleanup().await;
}
