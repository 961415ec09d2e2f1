//! What the `node_tools` tests share: scripted turns, outputs and logs read back, the workspace.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerEvent, ScriptToolCall, ScriptTurn};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{ListParams, LogParams, PostParams};
use kube::{Api, ResourceExt};

use baton_testkit::e2e::effect_command;
use baton_testkit::node::{NodeEnv, RUN_TIMEOUT};

pub fn turn(text: &str, command: &str) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        tool_calls: vec![ScriptToolCall {
            tool: "sh".into(),
            arguments: [("command".to_string(), command.to_string())].into(),
        }],
        delay_milliseconds: Some(200),
        usage: None,
    }
}

pub fn answer(text: &str) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        ..ScriptTurn::default()
    }
}

/// Every step's recorded output, in step order.
pub async fn step_outputs(env: &NodeEnv, name: &str) -> Vec<(i64, String)> {
    env.ledger(name)
        .await
        .iter()
        .flat_map(|s| s.spec.events.clone())
        .filter_map(|e| match e {
            LedgerEvent::StepResult { step, output, .. } => Some((step, output)),
            _ => None,
        })
        .collect()
}

/// The effect of `turn`, then `seconds` of sleep, then a second effect under turn `100 + turn`:
/// that one lands only if the command was not killed.
pub fn effect_then_marker(sink: &str, run: &str, turn: usize, seconds: u64) -> String {
    let (host, port) = sink.rsplit_once(':').expect("host:port");
    let marker = 100 + turn;
    format!(
        "{}; sleep {seconds}; bash -c 'echo \"{run} {marker} $BATON_STEP $BATON_FENCE\" > /dev/tcp/{host}/{port}'",
        effect_command(sink, run, turn, 0)
    )
}

/// Every log line of both containers of every pod of the run.
pub async fn all_logs(env: &NodeEnv, name: &str) -> String {
    let mut out = String::new();
    let pods = env.pods().list(&ListParams::default()).await.unwrap();
    for pod in pods
        .items
        .iter()
        .filter(|p| p.name_any().starts_with(&format!("{name}-w")))
    {
        for container in ["worker", "tools", "install-executor"] {
            let params = LogParams {
                container: Some(container.into()),
                ..LogParams::default()
            };
            if let Ok(text) = env.pods().logs(&pod.name_any(), &params).await {
                out.push_str(&text);
            }
        }
    }
    out
}

/// Waits until the pod's tools container is no longer running.
pub async fn wait_tools_gone(env: &NodeEnv, pod: &str) {
    let deadline = Instant::now() + RUN_TIMEOUT;
    while env.container_pid_of(pod, "tools").await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the tools container of {pod} still runs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A PersistentVolume the test provides (the bed has no provisioner): a host directory, in a
/// storage class of the test's own so that only this test's claim binds it.
pub async fn provide_volume(env: &NodeEnv, class: &str) -> std::path::PathBuf {
    let dir = env.dir.join("pv");
    std::fs::create_dir_all(&dir).unwrap();
    // hostPath volumes keep their host permissions (fsGroup does not apply): open to the
    // tools user.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": class},
        "spec": {
            "capacity": {"storage": "64Mi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": dir.display().to_string(), "type": "Directory"},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(env.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("creating the test's PersistentVolume");
    dir
}

/// The run's `WorkspaceReady` condition, as (status, reason).
async fn workspace_ready(env: &NodeEnv, name: &str) -> Option<(String, String)> {
    let st = env.status(name).await;
    st.conditions
        .iter()
        .find(|c| c.type_ == "WorkspaceReady")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

pub async fn wait_workspace_ready(env: &NodeEnv, name: &str, want: (&str, &str)) {
    let deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        let now = workspace_ready(env, name).await;
        if now
            .as_ref()
            .is_some_and(|(s, r)| (s.as_str(), r.as_str()) == want)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "WorkspaceReady is {now:?}, not {want:?}: {:#?}",
            env.status(name).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
