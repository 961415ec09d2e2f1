//! The local pod runner against the real local API server: graceful deletion (SIGTERM, grace
//! period, SIGKILL, confirmation), forced deletion and lost nodes, drain, and runner restarts.

mod common;
mod runner_support;

use std::time::{Duration, Instant};

use common::TestNamespace;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use runner_support::*;

#[tokio::test]
async fn graceful_delete_sends_term_and_confirms() {
    let ns = TestNamespace::new("runner_graceful").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    let mark = scratch(&ns).join("term");
    let script = r#"trap 'echo got-term > "$MARK"; exit 0' TERM; while true; do sleep 0.05; done"#;
    create(
        &pods,
        sh_pod(
            "polite",
            script,
            vec![literal("MARK", mark.to_str().unwrap())],
        ),
    )
    .await;
    wait_phase(&pods, "polite", "Running").await;
    let pid = runner.pid(&ns.name, "polite").unwrap();

    let dp = DeleteParams {
        grace_period_seconds: Some(10),
        ..Default::default()
    };
    let started = Instant::now();
    pods.delete("polite", &dp).await.unwrap();
    wait_gone(&pods, "polite").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the handoff took {:?}",
        started.elapsed()
    );
    assert_eq!(read_when_present(&mark).await, "got-term");
    wait_dead(pid).await;
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn term_ignored_is_killed_after_the_grace_period() {
    let ns = TestNamespace::new("runner_stubborn").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    create(
        &pods,
        sh_pod(
            "stubborn",
            "trap '' TERM; while true; do sleep 0.05; done",
            vec![],
        ),
    )
    .await;
    wait_phase(&pods, "stubborn", "Running").await;
    let pid = runner.pid(&ns.name, "stubborn").unwrap();

    let started = Instant::now();
    pods.delete(
        "stubborn",
        &DeleteParams {
            grace_period_seconds: Some(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        proc_state(pid).is_some(),
        "killed before the grace period ended"
    );
    assert!(
        pods.get_opt("stubborn").await.unwrap().is_some(),
        "confirmed before the process ended"
    );
    wait_gone(&pods, "stubborn").await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(6),
        "gone after {elapsed:?}"
    );
    wait_dead(pid).await;
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn force_delete_kills_unless_detached() {
    let ns = TestNamespace::new("runner_force").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    create(&pods, sh_pod("forced", "sleep 300", vec![])).await;
    create(&pods, sh_pod("lost", "sleep 300", vec![])).await;
    wait_phase(&pods, "forced", "Running").await;
    wait_phase(&pods, "lost", "Running").await;
    let (forced, lost) = (
        runner.pid(&ns.name, "forced").unwrap(),
        runner.pid(&ns.name, "lost").unwrap(),
    );

    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("forced", &force).await.unwrap();
    wait_dead(forced).await;

    // A lost node: the pod object goes, its process runs on.
    runner.detach(&ns.name, "lost").unwrap();
    pods.delete("lost", &force).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        proc_state(lost).is_some(),
        "a detached process keeps running"
    );
    assert_eq!(runner.pid(&ns.name, "lost"), Some(lost));
    runner.shutdown().await;
    wait_dead(lost).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn drain_deletes_every_pod_gracefully() {
    let ns = TestNamespace::new("runner_drain").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    let script = "trap 'exit 0' TERM; while true; do sleep 0.05; done";
    for name in ["d1", "d2"] {
        create(&pods, sh_pod(name, script, vec![])).await;
    }
    create(&pods, sh_pod("done", "true", vec![])).await;
    wait_phase(&pods, "d1", "Running").await;
    wait_phase(&pods, "d2", "Running").await;
    wait_phase(&pods, "done", "Succeeded").await;

    let mut drained: Vec<String> = runner
        .drain()
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.name)
        .collect();
    drained.sort();
    assert_eq!(drained, vec!["d1", "d2"]);
    wait_gone(&pods, "d1").await;
    wait_gone(&pods, "d2").await;
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_restarted_runner_reports_lost_processes() {
    let ns = TestNamespace::new("runner_restart").await;
    let pods: Api<Pod> = ns.api();
    let first = start_runner(&ns).await;
    create(&pods, sh_pod("orphan", "sleep 300", vec![])).await;
    wait_phase(&pods, "orphan", "Running").await;
    let pid = first.pid(&ns.name, "orphan").unwrap();
    first.shutdown().await;
    wait_dead(pid).await;
    assert_eq!(
        phase(&pods.get("orphan").await.unwrap()),
        "Running",
        "a stopped runner reports nothing"
    );

    let second = start_runner(&ns).await;
    let pod = wait_phase(&pods, "orphan", "Failed").await;
    assert_eq!(
        terminated(&pod).unwrap().reason.as_deref(),
        Some("ContainerStatusUnknown")
    );
    second.shutdown().await;
    ns.cleanup().await;
}
