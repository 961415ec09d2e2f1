//! The randomized chaos test on the real node: N scripted runs (default 20; `BATON_CHAOS_RUNS`),
//! random real faults (the worker container's process killed with SIGKILL from the host, frozen
//! with SIGSTOP past its lease then thawed, its pod deleted — SIGTERM from the kubelet, as in a
//! drain — and the leading controller pod deleted) from a seed it prints (`BATON_CHAOS_SEED`
//! replays one), then the invariants:
//! - every run reaches a terminal phase (Succeeded, or Interrupted after maxAttempts deaths);
//! - no non-idempotent tool effect ran twice, and a Succeeded run lost no effect except an
//!   in-flight step it reports as unknown;
//! - no write from a stale fence was accepted: no segment after a `claimed{F}` seal has a
//!   fence below F, nothing follows `closed`, and the status fence equals the last seal;
//! - every transcript is contiguous, and no segment changed after it was first seen.
//!
//! `node_chaos_in_postgresql` does the same to runs kept in PostgreSQL (default 10 runs), the
//! database's crash among its faults.
//!
//! And `examples/thread.yaml` with a worker killed in its second turn, then deleted whole.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::Phase;
use baton_testkit::e2e::{Effects, Script, retry};
use baton_testkit::node::*;
use kube::Api;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_chaos() {
    let (seed, n) = seed_and_runs(20);
    let env = NodeEnv::start("chaos").await;
    chaos(&env, seed, n, None).await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    env.finish().await;
}

/// The same on runs kept in PostgreSQL (the release switched to it, the database in the
/// node's network namespace), the database's crash among the faults; ledgers read from its
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_chaos_in_postgresql() {
    let (seed, n) = seed_and_runs(10);
    let db = NodePostgres::up();
    let rows = baton::ledger::postgres::PgLedger::connect(&db.local_url, 2)
        .await
        .expect("the node's database, through the relay");
    let env = NodeEnv::start("chaos-pg").await.with_rows(rows);
    // Declared after `env`, so a failure drops it (switching back) before the lock goes.
    let switched = InPostgres::switch(&env.client, &db).await;
    chaos(&env, seed, n, Some(&db)).await;
    switched.switch_back(&env.client).await;
    env.finish().await;
}

/// `n` scripted runs under random faults from `seed` for a window, at most 3 per run (the
/// database's crash too when `db` is given), then the invariants and every run's outcome.
async fn chaos(env: &NodeEnv, seed: u64, n: usize, db: Option<&NodePostgres>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let names: Vec<String> = (0..n).map(|i| format!("chaos-{i:03}")).collect();
    for name in &names {
        let script = Script {
            turns: rng.random_range(5..=8),
            think_ms: rng.random_range(100..=400),
            tool_ms: rng.random_range(1500..=3000),
        };
        env.create(&env.scripted(name, &script)).await;
    }

    let started = Instant::now();
    let log = Chaos {
        env,
        seed,
        window: chaos_window(),
        per_run: 3,
        db,
        warm: false,
        stop_when_all_ended: true,
    }
    .run()
    .await;
    eprintln!("chaos: {} faults injected:\n{}", log.len(), log.join("\n"));

    // Every run ends.
    for name in &names {
        env.wait_run(name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
            .await;
    }
    eprintln!("chaos: all runs terminal after {:?}", started.elapsed());
    env.check_invariants(&names).await;
    check_outcomes(env, &names, seed).await;
}

/// Every run Succeeded with its answer (an effect that never landed reported as unknown), or
/// Interrupted after maxAttempts deaths.
async fn check_outcomes(env: &NodeEnv, names: &[String], seed: u64) {
    let effects = Effects::read(&env.effects.file);
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    for name in names {
        let runs = env.runs();
        let run = retry(|| runs.get(name)).await;
        let st = run.status.clone().unwrap_or_default();
        *tally.entry(st.phase.as_str()).or_default() += 1;
        let turns = run.spec.agent().unwrap().model.script.len() - 1;
        match st.phase {
            Phase::Succeeded => {
                assert_eq!(
                    st.output.as_deref(),
                    Some(format!("{name}: all {turns} turns done").as_str()),
                    "seed {seed}"
                );
                // An effect that never landed must be a reported unknown (in-flight) step.
                for turn in 1..=turns {
                    if effects.count(name, turn) == 0 {
                        assert!(
                            st.unknown_effects.iter().any(|u| u.step == turn as i64),
                            "seed {seed}: {name} turn {turn} never ran and is not reported: {:#?}",
                            st.unknown_effects
                        );
                    }
                }
            }
            Phase::Interrupted => {
                assert_eq!(
                    st.reason.as_deref(),
                    Some("MaxAttemptsExceeded"),
                    "seed {seed}: {name}: {st:#?}"
                );
                assert!(st.failed_attempts >= run.spec.max_attempts, "{st:#?}");
            }
            other => panic!("seed {seed}: {name} ended {other}: {st:#?}"),
        }
    }
    eprintln!("chaos: seed {seed}: outcomes {tally:?}");
}

/// `examples/thread.yaml` as a user applies it: three turns, one after the other; the worker
/// of turn 2 killed with SIGKILL mid-answer; every turn succeeds, turn 3's history holds the
/// first two; then the thread deleted leaves nothing behind (turns, ledgers, pods, Leases,
/// worker accounts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_thread_example_survives_a_kill_and_its_deletion_leaves_nothing() {
    use baton::crd::v1alpha1::{AgentRun, AgentThread, LedgerEvent, LedgerSegment, ThreadPhase};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::ServiceAccount;

    let env = NodeEnv::start("example-thread").await;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/thread.yaml");
    kubectl(&["-n", &env.ns, "apply", "-f", path]).expect("kubectl apply -f the example");
    let turns = ["support-4711-1", "support-4711-2", "support-4711-3"];
    env.wait_succeeded(turns[0]).await;
    // Turn 2 answers after 8 s: its worker is killed mid-answer. Should the worker end before
    // the kill (its pod's status is printed), its successor is killed instead.
    loop {
        let (pod, _) = env.wait_worker(turns[1], 1).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if env.try_signal_worker(&pod, libc::SIGKILL).await {
            break;
        }
    }
    for turn in &turns[1..] {
        env.wait_succeeded(turn).await;
    }
    let second = env.status(turns[1]).await;
    assert!(second.attempt >= 2, "turn 2 was resumed: {second:#?}");
    assert_eq!(
        second.output.as_deref(),
        Some("It should arrive on Friday, by the afternoon.")
    );
    let third = env.ledger(turns[2]).await;
    let history = third[0].spec.events.iter().find_map(|e| match e {
        LedgerEvent::History { turns, .. } => Some(turns.len()),
        _ => None,
    });
    assert_eq!(history, Some(2), "{:?}", third[0].spec.events);
    let threads: Api<AgentThread> = env.api();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = retry(|| threads.get("support-4711")).await.status;
        if status
            .as_ref()
            .is_some_and(|s| s.turns == 3 && s.phase == ThreadPhase::Idle)
        {
            break;
        }
        assert!(Instant::now() < deadline, "thread status: {status:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    kubectl(&["-n", &env.ns, "delete", "agentthread", "support-4711"])
        .expect("deleting the thread");
    let deadline = Instant::now() + Duration::from_secs(180);
    let (runs, segments, pods) = (
        env.api::<AgentRun>(),
        env.api::<LedgerSegment>(),
        env.pods(),
    );
    let (leases, accounts) = (env.api::<Lease>(), env.api::<ServiceAccount>());
    let all = kube::api::ListParams::default();
    loop {
        let worker_accounts = retry(|| accounts.list(&all)).await.items;
        let left = (
            retry(|| runs.list(&all)).await.items.len(),
            retry(|| segments.list(&all)).await.items.len(),
            retry(|| pods.list(&all)).await.items.len(),
            retry(|| leases.list(&all)).await.items.len(),
            worker_accounts
                .iter()
                .filter(|a| {
                    a.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("baton-run-"))
                })
                .count(),
        );
        if left == (0, 0, 0, 0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind (runs, segments, pods, leases, worker accounts): {left:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    env.finish().await;
}
