//! The local pod runner: a stand-in for the kubelet on a bare API server (DESIGN.md §5), for
//! development, the demo and the end-to-end tests. It is never part of baton's guarantees.
//!
//! What it does, as a kubelet would:
//! - registers a Node (`RunnerConfig::node_name`, default `baton-local`) that reports Ready and
//!   keeps a heartbeat (its Ready condition and a Lease in `kube-node-lease`);
//! - watches Pods (one namespace or all; label selector, default
//!   `app.kubernetes.io/managed-by=baton`), binds unbound ones to its node (`pods/binding`) and
//!   starts every pod bound to it as one LOCAL PROCESS: the container's `command` + `args`, with
//!   a command `baton` (or no command: the image's entrypoint) mapped to a local binary
//!   (`baton_bin`, or per image `image_bins`); the environment is the container's `envFrom`/`env` (literals, Secret and
//!   ConfigMap keys, `fieldRef`s, `$(VAR)` expansion) over a few variables passed through from
//!   the runner (`PATH`, `HOME`, `KUBECONFIG`, ...), so a worker talks to the same API server;
//! - runs the process in its OWN PROCESS GROUP, so a signal or kill takes every process it
//!   started with it, as a container's cgroup would; when the main process ends, whatever is
//!   left of its group is killed; stdout and stderr go to `<log_dir>/<namespace>_<pod>.log`;
//! - reports status through `pods/status`: Running (startedAt, podIP/hostIP 127.0.0.1), then
//!   Succeeded (exit 0) or Failed (exit code; `Error`, or `Killed` with exit code 128+signal)
//!   right after the process ends (one API round trip: a death is reported "as a kubelet would",
//!   so the controller need not wait for lease expiry). A paused (SIGSTOP) process stays Running;
//! - honours graceful deletion: SIGTERM to the group, up to `deletionGracePeriodSeconds`, then
//!   SIGKILL, then the final status, then confirms with a delete at grace 0 (UID precondition).
//!   A force-deleted pod (grace 0) vanishes from the API at once: its process is then killed,
//!   unless `orphan_on_force_delete` is set or the pod was `detach`ed (a lost node: the process
//!   runs on, and nothing is reported for it any more).
//!
//! Fault injection, two ways:
//! - in-process, for Rust tests: [`Runner::start`] returns a [`RunnerHandle`] with
//!   [`kill`](RunnerHandle::kill) (SIGKILL the group), [`pause`](RunnerHandle::pause) (SIGSTOP),
//!   [`resume`](RunnerHandle::resume) (SIGCONT), [`terminate`](RunnerHandle::terminate)
//!   (SIGTERM without deleting the pod), [`detach`](RunnerHandle::detach),
//!   [`drain`](RunnerHandle::drain) (graceful delete of every pod on the node),
//!   [`pid`](RunnerHandle::pid) and [`shutdown`](RunnerHandle::shutdown), which kills every
//!   process group the runner started and waits for them. Dropping the last handle kills them too.
//! - out of process: the `baton-runner` binary serves a small HTTP control endpoint on
//!   127.0.0.1 (see [`control`]); `baton-runner ctl kill NS/POD` (and `pause`, `resume`,
//!   `term`, `detach`, `pid`, `list`, `drain`) talks to it, or plain curl:
//!   `curl -X POST http://127.0.0.1:7391/pods/NS/POD/kill`.

pub mod control;
mod handle;
pub mod node;
mod pod;
pub mod process;
mod registry;
pub mod spec;
pub mod status;
mod watch;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use handle::{PodInfo, Runner, RunnerHandle};
pub use process::Signal;

/// Default node name.
pub const DEFAULT_NODE_NAME: &str = "baton-local";
/// Default label selector: the pods baton creates.
pub const DEFAULT_SELECTOR: &str = "app.kubernetes.io/managed-by=baton";
/// Variables passed from the runner's environment to every process, when set.
pub const DEFAULT_PASSTHROUGH_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "KUBECONFIG",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "SSL_CERT_FILE",
];

/// Errors of the runner.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("pod spec: {0}")]
    Spec(#[from] spec::SpecError),
    #[error("no process runs for pod {0}")]
    NoProcess(PodKey),
    #[error("the runner is shut down")]
    ShutDown,
}

/// A pod's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a pod object.
    pub fn of(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        Self::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// `NS/POD` → key.
    pub fn parse(s: &str) -> Option<Self> {
        let (ns, name) = s.split_once('/')?;
        (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then(|| Self::new(ns, name))
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How to run the runner.
#[derive(Clone)]
pub struct RunnerConfig {
    pub client: kube::Client,
    /// The Node this runner registers and binds pods to.
    pub node_name: String,
    /// Only pods in this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Only pods matching this label selector (all pods when `None`).
    pub label_selector: Option<String>,
    /// The local binary that runs for the container command `baton`.
    pub baton_bin: PathBuf,
    /// Per-image overrides of `baton_bin`: a pod whose image is a key runs that binary
    /// (rollout tests can give an "old" and a "new" worker different binaries).
    pub image_bins: BTreeMap<String, PathBuf>,
    /// Where `<namespace>_<pod>.log` files go.
    pub log_dir: PathBuf,
    /// Variables passed through from the runner's environment (when set there).
    pub passthrough_env: Vec<String>,
    /// Variables given to every process on top of the passed-through ones (tests).
    pub extra_env: Vec<(String, String)>,
    /// Keep the process of a force-deleted pod running (simulates a lost node).
    pub orphan_on_force_delete: bool,
    /// Node heartbeat interval.
    pub heartbeat: Duration,
    /// Delete the Node on shutdown (tests; a kubelet leaves its Node).
    pub remove_node_on_shutdown: bool,
}

impl RunnerConfig {
    /// The defaults: node `baton-local`, all namespaces, baton's pods, `baton` next to the
    /// current executable, logs under `$TMPDIR/baton-runner/logs`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            node_name: DEFAULT_NODE_NAME.to_string(),
            namespace: None,
            label_selector: Some(DEFAULT_SELECTOR.to_string()),
            baton_bin: default_baton_bin(),
            image_bins: BTreeMap::new(),
            log_dir: default_log_dir(),
            passthrough_env: DEFAULT_PASSTHROUGH_ENV
                .iter()
                .map(|s| s.to_string())
                .collect(),
            extra_env: Vec::new(),
            orphan_on_force_delete: false,
            heartbeat: Duration::from_secs(10),
            remove_node_on_shutdown: false,
        }
    }

    /// The log file of a pod.
    pub fn log_path(&self, key: &PodKey) -> PathBuf {
        self.log_dir
            .join(format!("{}_{}.log", key.namespace, key.name))
    }

    /// The environment every process starts from.
    fn host_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .passthrough_env
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
            .collect();
        for (k, v) in &self.extra_env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }
}

/// `baton` in the directory of the current executable; for a cargo test binary (in
/// `target/<profile>/deps/`), the `baton` one level up when the first does not exist.
pub fn default_baton_bin() -> PathBuf {
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from))
    else {
        return PathBuf::from("baton");
    };
    let beside = dir.join("baton");
    match dir.parent() {
        Some(up) if !beside.exists() && dir.file_name().is_some_and(|n| n == "deps") => {
            up.join("baton")
        }
        _ => beside,
    }
}

/// `$TMPDIR/baton-runner/logs`.
pub fn default_log_dir() -> PathBuf {
    std::env::temp_dir().join("baton-runner").join("logs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_key_parse_and_display() {
        let key = PodKey::parse("ns/pod-1").unwrap();
        assert_eq!(key, PodKey::new("ns", "pod-1"));
        assert_eq!(key.to_string(), "ns/pod-1");
        assert_eq!(PodKey::parse("nope"), None);
        assert_eq!(PodKey::parse("/x"), None);
        assert_eq!(PodKey::parse("a/b/c"), None);
    }
}
