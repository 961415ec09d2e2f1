//! Helpers shared by the runner's integration tests (`tests/runner_*.rs`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::TestNamespace;
use baton::runner::{Runner, RunnerConfig, RunnerHandle};
use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated, EnvVar, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

pub const WAIT: Duration = Duration::from_secs(20);

pub async fn start_runner(ns: &TestNamespace) -> RunnerHandle {
    let mut config = RunnerConfig::new(ns.client.clone());
    config.node_name = format!("node-{}", ns.name);
    config.namespace = Some(ns.name.clone());
    config.log_dir = scratch(ns).join("logs");
    config.heartbeat = Duration::from_secs(1);
    config.remove_node_on_shutdown = true;
    Runner::start(config).await.expect("starting the runner")
}

/// A scratch directory for one test.
pub fn scratch(ns: &TestNamespace) -> PathBuf {
    let dir = std::env::temp_dir()
        .join("baton-runner-tests")
        .join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn literal(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// A baton-labelled pod running `sh -c script`.
pub fn sh_pod(name: &str, script: &str, env: Vec<EnvVar>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "baton".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                command: Some(vec!["sh".into(), "-c".into(), script.into()]),
                env: Some(env),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub async fn create(api: &Api<Pod>, pod: Pod) {
    api.create(&PostParams::default(), &pod)
        .await
        .expect("creating pod");
}

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

/// Polls the pod until `ok` holds.
pub async fn wait_pod(api: &Api<Pod>, name: &str, what: &str, ok: impl Fn(&Pod) -> bool) -> Pod {
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(pod) = api.get_opt(name).await.expect("reading pod") {
            if ok(&pod) {
                return pod;
            }
            last = Some(pod);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "pod {name}: timed out waiting for {what}; last seen: {:?}",
        last.map(|p| p.status)
    );
}

pub async fn wait_phase(api: &Api<Pod>, name: &str, want: &str) -> Pod {
    wait_pod(api, name, want, |p| phase(p) == want).await
}

pub async fn wait_gone(api: &Api<Pod>, name: &str) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if api.get_opt(name).await.expect("reading pod").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("pod {name} was not deleted");
}

/// The process state letter from /proc (R, S, T, ...), `None` if gone or a zombie.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    (state != 'Z' && state != 'X').then_some(state)
}

pub async fn wait_dead(pid: u32) {
    let deadline = Instant::now() + WAIT;
    while proc_state(pid).is_some() {
        assert!(Instant::now() < deadline, "process {pid} is still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn read_when_present(path: &Path) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return text.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
