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

use baton::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerSegment, Phase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, LogParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Mutex, MutexGuard, OnceCell};

use crate::e2e_support::{
    Effects, Recorder, Script, check_ledger, check_worker_field_manager, retry, scripted_run,
};

/// The chart's release and namespace on the node.
pub const RELEASE: &str = "baton";
pub const SYSTEM_NS: &str = "baton-system";
/// The image `hack/images.sh baton` builds, and the same bits under a second name (a "new
/// version" for the worker rollout).
pub const IMAGE: &str = "baton:dev";
pub const NEXT_IMAGE: &str = "baton:next";
/// The node's own address inside its network namespace (hack/node.sh): pods reach it.
pub const NODE_IP: &str = "10.77.0.1";
/// A run on a loaded 2-core node: pod starts and the kubelet's 10 s deletion resync add up.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(240);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
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
    let out = Command::new("bash")
        .arg(root().join("hack/node.sh"))
        .args(args)
        .output()
        .expect("running hack/node.sh");
    assert_succeeded(&format!("hack/node.sh {args:?}"), &out);
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

/// The `baton` CLI (this build's binary) against the node, as a user runs it.
pub fn baton_cli(args: &[&str]) -> Result<String, String> {
    against_node(env!("CARGO_BIN_EXE_baton"), args)
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

async fn config() -> kube::Config {
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig()).expect("reading the node's kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("loading the node's kubeconfig")
}

static INSTALLED: OnceCell<()> = OnceCell::const_new();

/// baton installed by its chart (once per test binary; an existing release is kept), with
/// both controller replicas Ready.
pub async fn installed(client: &Client) {
    INSTALLED
        .get_or_init(|| async {
            let exists =
                kubectl(&["-n", SYSTEM_NS, "get", "deployment", &deployment_name()]).is_ok();
            if !exists {
                helm_install(&serde_json::json!({}));
            }
            wait_controllers_ready(client, Duration::from_secs(180)).await;
        })
        .await;
}

pub fn deployment_name() -> String {
    format!("{RELEASE}-controller")
}

/// The label that takes a test namespace out of the webhook's `namespaceSelector`
/// ([`NodeEnv::start_without_webhook`]): there only the readers' own checks stand.
pub const WITHOUT_WEBHOOK: &str = "baton.dev/test-without-webhook";

/// The values every install on the node uses: the image imported into containerd, never
/// pulled; the webhook for every namespace but those labelled [`WITHOUT_WEBHOOK`].
pub fn values(extra: &serde_json::Value) -> serde_json::Value {
    let mut values = serde_json::json!({
        "image": {"repository": "baton", "tag": "dev", "pullPolicy": "Never"},
        "controller": {"leaderLeaseSeconds": 6},
        "webhook": {"namespaceSelector": {"matchExpressions": [
            {"key": WITHOUT_WEBHOOK, "operator": "DoesNotExist"}
        ]}},
    });
    merge(&mut values, extra);
    values
}

fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

fn helm_install(extra: &serde_json::Value) {
    helm("install", &["--create-namespace"], extra);
}

/// `helm upgrade` of the release with these values (on top of [`values`]).
pub fn helm_upgrade(extra: &serde_json::Value) {
    helm("upgrade", &[], extra);
}

/// `hack/helm.py ACTION` (Helm's SDK) of the chart as the release, with [`values`] and `extra`.
fn helm(action: &str, flags: &[&str], extra: &serde_json::Value) {
    let values = values(extra).to_string();
    let out = Command::new("python3")
        .env("KUBECONFIG", kubeconfig())
        .arg(root().join("hack/helm.py"))
        .args([
            action,
            "charts/baton",
            "--name",
            RELEASE,
            "--namespace",
            SYSTEM_NS,
        ])
        .args(flags)
        .args(["--values", &values])
        .current_dir(root())
        .output()
        .expect("running hack/helm.py");
    assert_succeeded(&format!("helm {action}"), &out);
}

/// Waits until the Deployment has all its replicas updated and Ready.
pub async fn wait_controllers_ready(client: &Client, timeout: Duration) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NS);
    let deadline = Instant::now() + timeout;
    let name = deployment_name();
    loop {
        let d = retry(|| api.get(&name)).await;
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.clone().unwrap_or_default();
        let generation_seen = st.observed_generation >= d.metadata.generation;
        if generation_seen
            && st.updated_replicas == Some(want)
            && st.ready_replicas == Some(want)
            && st.replicas == Some(want)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "controller Deployment not ready after {timeout:?}: {st:?}\n{}",
            kubectl(&["-n", SYSTEM_NS, "describe", "pods"]).unwrap_or_else(|e| e)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `kubectl rollout restart` of the controller Deployment.
pub fn restart_controllers() {
    kubectl(&[
        "-n",
        SYSTEM_NS,
        "rollout",
        "restart",
        "deployment",
        &deployment_name(),
    ])
    .expect("kubectl rollout restart");
}

/// Scales the controller Deployment (0: no controller runs at all).
pub fn scale_controllers(replicas: u32) {
    kubectl(&[
        "-n",
        SYSTEM_NS,
        "scale",
        "deployment",
        &deployment_name(),
        &format!("--replicas={replicas}"),
    ])
    .expect("kubectl scale");
}

/// The controller pods of the Deployment, and which one holds the leader Lease.
pub async fn controller_pods(client: &Client) -> (Vec<Pod>, Option<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let params = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let list = retry(|| pods.list(&params)).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM_NS);
    let holder = leases
        .get_opt(baton::controller::LEADER_LEASE_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty());
    (list.items, holder)
}

/// Samples the leader Lease during a controller rollout until both replicas are new and Ready:
/// the longest time no controller pod that was not being deleted held it.
pub async fn leaderless_until_rolled(client: &Client, timeout: Duration) -> Duration {
    let deadline = Instant::now() + timeout;
    let mut longest = Duration::ZERO;
    let mut gap_since: Option<Instant> = None;
    // The rollout has begun once the Deployment's generation moved; it ends with all Ready.
    tokio::time::sleep(Duration::from_millis(500)).await;
    loop {
        let (pods, holder) = controller_pods(client).await;
        let led = holder
            .as_deref()
            .and_then(|h| leader_pod(&pods, h))
            .is_some_and(|name| {
                pods.iter()
                    .any(|p| p.name_any() == name && p.metadata.deletion_timestamp.is_none())
            });
        match (led, gap_since) {
            (false, None) => gap_since = Some(Instant::now()),
            (true, Some(since)) => {
                longest = longest.max(since.elapsed());
                gap_since = None;
            }
            _ => {}
        }
        let rolled = pods.len() == 2
            && pods
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p));
        if rolled && led {
            return longest;
        }
        assert!(
            Instant::now() < deadline,
            "controller rollout not done after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod whose name the leader identity (`<pod>-<suffix>`) starts with.
pub fn leader_pod(pods: &[Pod], holder: &str) -> Option<String> {
    pods.iter()
        .map(|p| p.name_any())
        .find(|name| holder.starts_with(&format!("{name}-")))
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

/// `hack/effects.py` inside the node's namespace: the shell tools' effects, counted outside baton.
pub struct EffectsServer {
    child: Child,
    pub addr: String,
    pub file: PathBuf,
}

impl EffectsServer {
    pub fn start(dir: &Path) -> Self {
        let port = 20_000 + rand::random::<u16>() % 20_000;
        let addr = format!("{NODE_IP}:{port}");
        let file = dir.join("effects.log");
        std::fs::write(&file, "").unwrap();
        let child = Command::new("nsenter")
            .arg("--net=/run/netns/baton-node")
            .arg("python3")
            .arg(root().join("hack/effects.py"))
            .arg(&addr)
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting hack/effects.py in the node's namespace");
        // Listening once it accepts a connection made from inside the namespace.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Command::new("nsenter")
            .arg("--net=/run/netns/baton-node")
            .args(["bash", "-c", &format!("exec 3<>/dev/tcp/{NODE_IP}/{port}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "hack/effects.py did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, addr, file }
    }
}

impl Drop for EffectsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scenario's environment: a namespace of its own, the effects server, the segment recorder.
pub struct NodeEnv {
    pub client: Client,
    pub ns: String,
    pub dir: PathBuf,
    pub effects: EffectsServer,
    pub recorder: Recorder,
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
            _serial: serial,
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
                && st.fence >= min_fence
                && let Some(pod) = st.worker.clone()
                && self.container_pid(&pod).await.is_some()
            {
                return (pod, st.fence);
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
        let pod = self.pods().get_opt(pod).await.ok().flatten()?;
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

    /// A signal to the worker container's process, from the host (as the OOM killer or an
    /// operator's `kill` would send it: no API involved).
    pub async fn signal_worker(&self, pod: &str, signal: libc::c_int) {
        let pid = self
            .container_pid(pod)
            .await
            .expect("the worker container's host PID");
        signal_pid(pid, signal);
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

    pub async fn ledger(&self, name: &str) -> Vec<LedgerSegment> {
        let runs = self.runs();
        let run = retry(|| runs.get(name)).await;
        baton::ledger::SegmentStore::for_run(self.client.clone(), &run)
            .list()
            .await
            .expect("listing the ledger (contiguous)")
    }

    /// The last lines of every worker pod's log of run `name` (for failure messages).
    pub async fn pod_logs(&self, name: &str) -> String {
        let mut out = String::new();
        let Ok(list) = self.pods().list(&ListParams::default()).await else {
            return out;
        };
        for pod in list
            .items
            .iter()
            .filter(|p| p.name_any().starts_with(&format!("{name}-w")))
        {
            let params = LogParams {
                container: Some("worker".into()),
                tail_lines: Some(25),
                ..LogParams::default()
            };
            let text = self
                .pods()
                .logs(&pod.name_any(), &params)
                .await
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!(
                "---- {} (last lines) ----\n{text}\n",
                pod.name_any()
            ));
        }
        out
    }

    /// The chaos invariants for `names`, which must all be terminal: ledgers contiguous, no
    /// stale-fence write after a seal, no segment changed, no non-idempotent effect twice.
    pub async fn check_invariants(&self, names: &[String]) {
        let effects = Effects::read(&self.effects.file);
        let recorded = self.recorder.snapshot();
        for name in names {
            let st = self.status(name).await;
            assert!(st.phase.is_terminal(), "{name} is not terminal: {st:#?}");
            let segments = self.ledger(name).await;
            check_ledger(name, &st, &segments, &recorded);
            check_worker_field_manager(name, &segments);
            for (turn, n) in effects.per_turn(name) {
                assert!(
                    n <= 1,
                    "{name}: the non-idempotent effect of turn {turn} ran {n} times\n{}",
                    self.pod_logs(name).await
                );
            }
        }
        assert!(
            recorded.updated.is_empty(),
            "segments changed: {:?}",
            recorded.updated
        );
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
