//! End-to-end harness on the real node (`hack/node.sh`): kubelet, containerd, the chart's own
//! controller pods, baton's image built from the Dockerfile. Faults are the real ones: a
//! container's process killed from the host, a pod deleted, the node drained, the kubelet
//! stopped, the controller Deployment rolled.
//!
//! `make test` brings the node up and exports `BATON_NODE_KUBECONFIG` (and `BATON_NODE_DIR`).
//! Without them these tests fail and say how to start the node: they are never skipped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerBackend, LedgerSegment, Phase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, LogParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Mutex, MutexGuard, OnceCell};

mod chaos;
mod chart;
mod effects;
mod images;
mod logs;
mod node_loss;
mod postgres;
mod previous;
pub use crate::rbac;
mod reads;
mod server;
mod traces;
mod warm;

pub use chaos::{Chaos, chaos_window, seed_and_runs};
pub use chart::*;
pub use effects::EffectsServer;
#[allow(unused_imports)]
pub use images::ImageSampler;
#[allow(unused_imports)]
pub use logs::LogFollower;
#[allow(unused_imports)]
pub use node_loss::{NodeLoss, wait_node_ready};
#[allow(unused_imports)]
pub use postgres::{InPostgres, NodePostgres};
#[allow(unused_imports)]
pub use previous::{OnPreviousRelease, PREVIOUS_TAG, PreviousRelease};
#[allow(unused_imports)]
pub use server::*;
pub use traces::{NodePhoenix, Traced};
pub use warm::{first_pod, model_thread, to_model};

use crate::e2e::{
    Effects, Recorder, Script, check_ledger, check_worker_field_manager, retry, scripted_run,
};

/// The chart's release and namespace on the node.
pub const RELEASE: &str = "baton";
pub const SYSTEM_NS: &str = "baton-system";
/// The image `hack/images.sh baton` builds, and the same bits under a second name (a "new
/// version" for the worker rollout).
pub const IMAGE: &str = "baton:dev";
pub const NEXT_IMAGE: &str = "baton:next";
/// The node's name (hack/node.sh).
pub const NODE_NAME: &str = "baton-node";
/// The node's own address inside its network namespace (hack/node.sh): pods reach it.
pub const NODE_IP: &str = "10.77.0.1";
/// The node's network namespace (hack/node.sh), as a path `nsenter` and `setns` take.
pub const NETNS: &str = "/run/netns/baton-node";
/// A run on a loaded 2-core node: pod starts and the kubelet's 10 s deletion resync add up.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(240);

fn root() -> &'static Path {
    crate::repo_root()
}

pub fn node_dir() -> PathBuf {
    std::env::var_os("BATON_NODE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/baton-node"))
}

/// The node's tests share one node and one controller Deployment: they run one at a time
/// (an async lock: each test's runtime waits on it without blocking a thread).
static SERIAL: Mutex<()> = Mutex::const_new(());

pub async fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// `hack/node.sh ARGS` (stop-kubelet, start-kubelet, restart-apiserver, nsenter ...).
pub fn node_sh(args: &[&str]) {
    let out = node_sh_command(args)
        .output()
        .expect("running hack/node.sh");
    assert_succeeded(&format!("hack/node.sh {args:?}"), &out);
}

/// `hack/node.sh ARGS`, not yet run: for a caller that must not panic (a guard's drop).
fn node_sh_command(args: &[&str]) -> Command {
    let mut command = Command::new("bash");
    command.arg(root().join("hack/node.sh")).args(args);
    command
}

/// Fails the test with the command's output unless it succeeded.
fn assert_succeeded(what: &str, out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `kubectl ARGS` against the node; Ok(stdout) or Err(stdout + stderr).
pub fn kubectl(args: &[&str]) -> Result<String, String> {
    against_node("kubectl", args)
}

/// `kubectl drain` of the node (the Eviction API, for 40 s), then `uncordon`; the drain's
/// answer. On a single node it stops at the last pods a PodDisruptionBudget keeps, so it
/// ends in an error naming the budget once everything else was evicted.
pub fn drain_then_uncordon() -> Result<String, String> {
    let drained = kubectl(&[
        "drain",
        NODE_NAME,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=40s",
    ]);
    kubectl(&["uncordon", NODE_NAME]).expect("kubectl uncordon");
    drained
}

/// The `baton` CLI (this build's binary) against the node, as a user runs it.
pub fn baton_cli(args: &[&str]) -> Result<String, String> {
    against_node(&crate::baton_bin().display().to_string(), args)
}

fn against_node(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .env("KUBECONFIG", kubeconfig())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn kubeconfig() -> PathBuf {
    std::env::var_os("BATON_NODE_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "BATON_NODE_KUBECONFIG is not set: these tests need the real node. Start it with \
             `hack/node.sh up` and `hack/images.sh all`, then export \
             BATON_NODE_KUBECONFIG=$(hack/node.sh env | cut -d= -f2), or run `make test`."
            )
        })
}

/// A client for the node's API server (through the relay on 127.0.0.1).
pub async fn client() -> Client {
    Client::try_from(config().await).expect("building a client")
}

/// A client that acts as `user` (impersonated, as `kubectl --as=` does), with only that
/// user's rights.
pub async fn client_as(user: &str) -> Client {
    let mut config = config().await;
    config.auth_info.impersonate = Some(user.to_string());
    Client::try_from(config).expect("building a client")
}

/// A client that signs in with `token` alone (the node's kubeconfig gives only the API server's
/// address and CA), impersonating `user` and `groups` as `kubectl --as= --as-group=` does.
pub async fn client_with_token(token: &str, user: &str, groups: &[&str]) -> Client {
    let mut config = config().await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        impersonate: Some(user.to_string()),
        impersonate_groups: Some(groups.iter().map(|g| g.to_string()).collect()),
        ..Default::default()
    };
    Client::try_from(config).expect("building a client")
}

async fn config() -> kube::Config {
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig()).expect("reading the node's kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("loading the node's kubeconfig")
}

/// A signal to a host process (the node's containers share the host's PID namespace).
pub fn signal_pid(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a PID we read from containerd's state for a container of this test.
    assert_eq!(
        unsafe { libc::kill(pid as i32, signal) },
        0,
        "kill({pid}, {signal})"
    );
}

/// One scenario's environment: a namespace of its own, the effects server, the segment recorder.
pub struct NodeEnv {
    pub client: Client,
    pub ns: String,
    pub dir: PathBuf,
    pub effects: EffectsServer,
    pub recorder: Recorder,
    /// Where runs kept in PostgreSQL are read from (set by [`NodeEnv::with_rows`]).
    rows: Option<baton::ledger::postgres::PgLedger>,
    _serial: MutexGuard<'static, ()>,
}

impl NodeEnv {
    pub async fn start(test: &str) -> Self {
        Self::start_labelled(test, Default::default()).await
    }

    /// [`NodeEnv::start`] in a namespace the chart's webhook does not watch.
    pub async fn start_without_webhook(test: &str) -> Self {
        let labels = [(WITHOUT_WEBHOOK.to_string(), "true".to_string())].into();
        Self::start_labelled(test, labels).await
    }

    async fn start_labelled(
        test: &str,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Self {
        let serial = serial().await;
        let client = client().await;
        wait_node_ready(&client).await;
        installed(&client).await;
        let suffix: u32 = rand::random::<u32>() % 1_000_000;
        let ns = format!(
            "node-{}-{suffix}",
            test.replace('_', "-").chars().take(40).collect::<String>()
        );
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        labels: Some(labels),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .expect("creating the test namespace");
        let dir = std::env::temp_dir().join(&ns);
        std::fs::create_dir_all(&dir).unwrap();
        let effects = EffectsServer::start(&dir);
        let recorder = Recorder::start(client.clone(), &ns);
        Self {
            client,
            ns,
            dir,
            effects,
            recorder,
            rows: None,
            _serial: serial,
        }
    }

    /// Reads the ledgers of runs kept in PostgreSQL from `rows` (the node's database).
    pub fn with_rows(self, rows: baton::ledger::postgres::PgLedger) -> Self {
        Self {
            rows: Some(rows),
            ..self
        }
    }

    pub fn runs(&self) -> Api<AgentRun> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A scripted run whose tools record their effects with the effects server.
    pub fn scripted(&self, name: &str, script: &Script) -> AgentRun {
        scripted_run(&self.effects.addr, name, script)
    }

    pub async fn create(&self, run: &AgentRun) {
        self.runs()
            .create(&PostParams::default(), run)
            .await
            .expect("creating the AgentRun");
    }

    pub async fn create_scripted(&self, names: &[String], script: &Script) {
        for name in names {
            self.create(&self.scripted(name, script)).await;
        }
    }

    pub async fn status(&self, name: &str) -> AgentRunStatus {
        let runs = self.runs();
        retry(|| runs.get(name)).await.status.unwrap_or_default()
    }

    pub async fn wait_run(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        ok: impl Fn(&AgentRunStatus) -> bool,
    ) -> AgentRunStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status(name).await;
            if ok(&st) {
                return st;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out ({timeout:?}) waiting for run {name} to be {what}; status: {st:#?}\n{}",
                    self.pod_logs(name).await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_succeeded(&self, name: &str) -> AgentRunStatus {
        let st = self
            .wait_run(name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
            .await;
        assert_eq!(
            st.phase,
            Phase::Succeeded,
            "{st:#?}\n{}",
            self.pod_logs(name).await
        );
        st
    }

    /// Waits until the run is Running at fence ≥ `min_fence` and its worker container runs;
    /// returns (pod, fence).
    pub async fn wait_worker(&self, name: &str, min_fence: i64) -> (String, i64) {
        let deadline = Instant::now() + RUN_TIMEOUT;
        loop {
            let st = self.status(name).await;
            if st.phase == Phase::Running
                && st.fence.get() >= min_fence
                && let Some(pod) = st.worker.clone()
                && self.container_pid(&pod).await.is_some()
            {
                return (pod, st.fence.get());
            }
            assert!(
                Instant::now() < deadline,
                "run {name} has no running worker at fence >= {min_fence}: {st:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the effect of `turn` of run `name` was recorded by the effects server.
    pub async fn wait_effect(&self, name: &str, turn: usize) {
        let deadline = Instant::now() + RUN_TIMEOUT;
        while Effects::read(&self.effects.file).count(name, turn) == 0 {
            assert!(Instant::now() < deadline, "no effect of {name} turn {turn}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The host PID of a pod's worker container, as containerd's shim recorded it.
    pub async fn container_pid(&self, pod: &str) -> Option<u32> {
        self.container_pid_of(pod, "worker").await
    }

    /// The host PID of one of a pod's containers (`worker`, `tools`) while it runs.
    pub async fn container_pid_of(&self, pod: &str, container: &str) -> Option<u32> {
        container_pid(&self.pods(), pod, container).await
    }

    /// A signal to the worker container's process, from the host (as the OOM killer or an
    /// operator's `kill` would send it: no API involved).
    pub async fn signal_worker(&self, pod: &str, signal: libc::c_int) {
        assert!(
            self.try_signal_worker(pod, signal).await,
            "pod {pod} has no running worker container to signal"
        );
    }

    /// Like `signal_worker`, but says (false, with the pod's status printed) when the worker
    /// container no longer runs: a loaded machine may hand a run to a new pod meanwhile.
    pub async fn try_signal_worker(&self, pod: &str, signal: libc::c_int) -> bool {
        let Some(pid) = self.container_pid(pod).await else {
            let pods = self.pods();
            let status = retry(|| pods.get_opt(pod)).await.and_then(|p| p.status);
            eprintln!("pod {pod} has no running worker container to signal: {status:#?}");
            return false;
        };
        signal_pid(pid, signal);
        true
    }

    /// Sets `spec.stop`.
    pub async fn stop(&self, name: &str) {
        let patch = serde_json::json!({"spec": {"stop": true}});
        self.runs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("setting spec.stop");
    }

    /// Appends an entry to `spec.inputs`.
    pub async fn answer(&self, name: &str, text: &str) {
        let runs = self.runs();
        let run = retry(|| runs.get(name)).await;
        let mut inputs = run.spec.inputs.clone();
        inputs.push(text.into());
        let patch = serde_json::json!({"spec": {"inputs": inputs}});
        runs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("adding an input");
    }

    /// Waits until the pod's worker container no longer runs (exited, or the pod is gone).
    pub async fn wait_container_gone(&self, pod: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.container_pid(pod).await.is_some() {
            assert!(
                Instant::now() < deadline,
                "the worker container of {pod} still runs"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn delete_pod(&self, pod: &str) {
        self.pods()
            .delete(pod, &DeleteParams::default())
            .await
            .expect("deleting the pod");
    }

    /// Deletes the namespace (the garbage collector takes the rest).
    pub async fn finish(self) {
        self.recorder.stop();
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The host PID of container `container` of pod `pod` (in `pods`' namespace) while it runs, as
/// containerd's shim recorded it.
pub async fn container_pid(pods: &Api<Pod>, pod: &str, container: &str) -> Option<u32> {
    // An API hiccup must not read as "not running": retried, only a missing pod is None.
    let pod = retry(|| pods.get_opt(pod)).await?;
    let status = pod
        .status?
        .container_statuses?
        .into_iter()
        .find(|c| c.name == container)?;
    status.state.as_ref()?.running.as_ref()?;
    let id = status
        .container_id?
        .strip_prefix("containerd://")?
        .to_string();
    let pidfile = node_dir()
        .join("containerd/state/io.containerd.runtime.v2.task/k8s.io")
        .join(id)
        .join("init.pid");
    std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()
}
