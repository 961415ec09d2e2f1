//! The local pod runner against the real local API server: binding, process lifecycle, status
//! reporting, the node, process groups and fault injection (kill, pause, resume).

mod common;
mod runner_support;

use std::time::{Duration, Instant};

use common::TestNamespace;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, ObjectFieldSelector, Pod, Secret, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use runner_support::*;

#[tokio::test]
async fn runs_a_pod_and_reports_a_kill_promptly() {
    let ns = TestNamespace::new("runner_kill").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    create(&pods, sh_pod("sleeper", "echo hi; sleep 30", vec![])).await;

    let pod = wait_phase(&pods, "sleeper", "Running").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(runner.node_name())
    );
    let status = pod.status.unwrap();
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    let running = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .running
        .unwrap();
    assert!(running.started_at.is_some());
    let pid = runner.pid(&ns.name, "sleeper").expect("a pid");
    let log = runner
        .config()
        .log_path(&baton::runner::PodKey::new(&ns.name, "sleeper"));
    assert!(read_when_present(&log).await.contains("hi"));

    let killed = Instant::now();
    runner.kill(&ns.name, "sleeper").unwrap();
    let pod = wait_phase(&pods, "sleeper", "Failed").await;
    let latency = killed.elapsed();
    let t = terminated(&pod).expect("terminated state");
    assert_eq!(
        (t.exit_code, t.signal, t.reason.as_deref()),
        (137, Some(9), Some("Killed"))
    );
    println!("kill -9 → pod Failed observed after {latency:?}");
    assert!(
        latency < Duration::from_secs(1),
        "death reported after {latency:?}"
    );
    wait_dead(pid).await;
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn exit_codes_become_phases() {
    let ns = TestNamespace::new("runner_exit").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    create(&pods, sh_pod("three", "exit 3", vec![])).await;
    create(&pods, sh_pod("ok", "true", vec![])).await;
    let mut missing = sh_pod("missing", "", vec![]);
    missing.spec.as_mut().unwrap().containers[0].command =
        Some(vec!["/nonexistent/program".into()]);
    create(&pods, missing).await;

    let t = terminated(&wait_phase(&pods, "three", "Failed").await)
        .cloned()
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
    let t = terminated(&wait_phase(&pods, "ok", "Succeeded").await)
        .cloned()
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    let t = terminated(&wait_phase(&pods, "missing", "Failed").await)
        .cloned()
        .unwrap();
    assert_eq!(t.reason.as_deref(), Some("StartError"));
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn secret_and_field_refs_resolve() {
    let ns = TestNamespace::new("runner_env").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    let out = scratch(&ns).join("env");
    let key_ref = EnvVarSource {
        secret_key_ref: Some(SecretKeySelector {
            name: "model".into(),
            key: "apiKey".into(),
            optional: None,
        }),
        ..Default::default()
    };
    let pod_ref = EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            field_path: "metadata.name".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let env = vec![
        literal("OUT", out.to_str().unwrap()),
        EnvVar {
            name: "BATON_MODEL_API_KEY".into(),
            value_from: Some(key_ref),
            ..Default::default()
        },
        EnvVar {
            name: "BATON_POD".into(),
            value_from: Some(pod_ref),
            ..Default::default()
        },
    ];
    let script = r#"echo "$BATON_MODEL_API_KEY $BATON_POD ${KUBECONFIG:+kubeconfig}" > "$OUT""#;
    create(&pods, sh_pod("envy", script, env)).await;

    // The Secret does not exist yet: the pod waits, as a kubelet's CreateContainerConfigError.
    wait_pod(&pods, "envy", "CreateContainerConfigError", |p| {
        let waiting = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.clone());
        waiting
            .and_then(|s| s.waiting)
            .and_then(|w| w.reason)
            .as_deref()
            == Some("CreateContainerConfigError")
    })
    .await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("model".into()),
            ..Default::default()
        },
        data: Some([("apiKey".to_string(), ByteString(b"sk-test".to_vec()))].into()),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    wait_phase(&pods, "envy", "Succeeded").await;
    assert_eq!(read_when_present(&out).await, "sk-test envy kubeconfig");
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn the_process_group_dies_with_the_pod() {
    let ns = TestNamespace::new("runner_group").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    let dir = scratch(&ns);
    let (killed_file, left_file) = (dir.join("killed.pid"), dir.join("left.pid"));
    // A grandchild in a subshell, and a background child left behind by a leader that exits.
    let killed = r#"(sleep 300 & echo $! > "$PIDFILE"; wait) & wait"#;
    let leaves = r#"sleep 300 & echo $! > "$PIDFILE"; exit 0"#;
    create(
        &pods,
        sh_pod(
            "killed",
            killed,
            vec![literal("PIDFILE", killed_file.to_str().unwrap())],
        ),
    )
    .await;
    create(
        &pods,
        sh_pod(
            "leaves",
            leaves,
            vec![literal("PIDFILE", left_file.to_str().unwrap())],
        ),
    )
    .await;

    wait_phase(&pods, "killed", "Running").await;
    let grandchild: u32 = read_when_present(&killed_file).await.parse().unwrap();
    assert!(proc_state(grandchild).is_some());
    runner.kill(&ns.name, "killed").unwrap();
    wait_phase(&pods, "killed", "Failed").await;
    wait_dead(grandchild).await;

    wait_phase(&pods, "leaves", "Succeeded").await;
    let left: u32 = read_when_present(&left_file).await.parse().unwrap();
    wait_dead(left).await;
    runner.shutdown().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn pause_keeps_the_pod_running_and_resume_continues() {
    let ns = TestNamespace::new("runner_pause").await;
    let runner = start_runner(&ns).await;
    let pods: Api<Pod> = ns.api();
    let counter = scratch(&ns).join("counter");
    let script = r#"i=0; while true; do i=$((i+1)); echo $i > "$COUNTER"; sleep 0.05; done"#;
    create(
        &pods,
        sh_pod(
            "ticker",
            script,
            vec![literal("COUNTER", counter.to_str().unwrap())],
        ),
    )
    .await;
    wait_phase(&pods, "ticker", "Running").await;
    let pid = runner.pid(&ns.name, "ticker").unwrap();
    read_when_present(&counter).await;

    runner.pause(&ns.name, "ticker").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(proc_state(pid), Some('T'), "the process is stopped");
    let paused_at = read_when_present(&counter).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        read_when_present(&counter).await,
        paused_at,
        "no progress while paused"
    );
    assert_eq!(
        phase(&pods.get("ticker").await.unwrap()),
        "Running",
        "a paused process is not dead"
    );

    runner.resume(&ns.name, "ticker").unwrap();
    let deadline = Instant::now() + WAIT;
    while read_when_present(&counter).await == paused_at {
        assert!(Instant::now() < deadline, "no progress after resume");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(proc_state(pid), Some('T'));
    runner.shutdown().await;
    wait_dead(pid).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn registers_a_ready_node_with_a_heartbeat() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;
    let ns = TestNamespace::new("runner_node").await;
    let runner = start_runner(&ns).await;
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let node = nodes
        .get(runner.node_name())
        .await
        .expect("the runner's node");
    let conditions = node.status.unwrap().conditions.unwrap();
    let ready = conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(ready.status, "True");
    let first_beat = ready.last_heartbeat_time.clone().unwrap();

    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), "kube-node-lease");
    let deadline = Instant::now() + WAIT;
    loop {
        let node = nodes.get(runner.node_name()).await.unwrap();
        let beat = node
            .status
            .unwrap()
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        let lease = leases.get_opt(runner.node_name()).await.unwrap();
        if beat.last_heartbeat_time.unwrap().0 > first_beat.0 && lease.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no heartbeat");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    runner.shutdown().await;
    assert!(
        nodes.get_opt(runner.node_name()).await.unwrap().is_none(),
        "node removed on shutdown"
    );
    ns.cleanup().await;
}
