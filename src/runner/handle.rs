//! Starting the runner, and the handle tests and the control endpoint use to inject faults.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::process::{Signal, signal_container};
use super::registry::Registry;
use super::status::is_terminal;
use super::{Error, PodKey, RunnerConfig, node, watch};

/// How long `shutdown` waits for killed processes to be reaped.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// What the supervisors share.
pub(crate) struct Ctx {
    pub client: Client,
    pub config: RunnerConfig,
    pub host_env: Vec<(String, String)>,
    pub registry: Registry,
    pub cancel: CancellationToken,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        kill_all(&self.registry);
    }
}

fn kill_all(registry: &Registry) {
    for pgid in registry.live_groups() {
        let _ = signal_container(pgid, Signal::Kill);
    }
}

/// The local pod runner.
pub struct Runner;

impl Runner {
    /// Registers the node, then starts the heartbeat and the pod watch in the background.
    pub async fn start(config: RunnerConfig) -> Result<RunnerHandle, Error> {
        node::register(&config.client, &config.node_name).await?;
        tracing::info!(node = %config.node_name, namespace = ?config.namespace, selector = ?config.label_selector, "local pod runner started");
        let ctx = Arc::new(Ctx {
            client: config.client.clone(),
            host_env: config.host_env(),
            config,
            registry: Registry::default(),
            cancel: CancellationToken::new(),
        });
        let watch = tokio::spawn(watch::watch_pods(ctx.clone()));
        let heartbeat = tokio::spawn(heartbeat(ctx.clone()));
        Ok(RunnerHandle {
            inner: Arc::new(Inner {
                ctx,
                background: AsyncMutex::new(vec![watch, heartbeat]),
            }),
        })
    }
}

async fn heartbeat(ctx: Arc<Ctx>) {
    let lease_seconds = i32::try_from(ctx.config.heartbeat.as_secs().saturating_mul(4))
        .unwrap_or(40)
        .max(1);
    loop {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = tokio::time::sleep(ctx.config.heartbeat) => {}
        }
        if let Err(e) = node::heartbeat(&ctx.client, &ctx.config.node_name, lease_seconds).await {
            tracing::warn!(node = %ctx.config.node_name, error = %e, "node heartbeat failed");
        }
    }
}

struct Inner {
    ctx: Arc<Ctx>,
    background: AsyncMutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ctx.cancel.cancel();
        kill_all(&self.ctx.registry);
    }
}

/// The running runner. Cheap to clone; dropping the last clone kills every container (session) the
/// runner started (without waiting); [`shutdown`](Self::shutdown) does so and waits.
#[derive(Clone)]
pub struct RunnerHandle {
    inner: Arc<Inner>,
}

/// A pod the runner knows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    /// The pid (= session and process group id) of its live process.
    pub pid: Option<u32>,
    /// Its status is no longer reported (detached, or force-deleted with orphaning on).
    pub detached: bool,
    /// Its process has ended and been reported.
    pub finished: bool,
}

impl RunnerHandle {
    fn ctx(&self) -> &Ctx {
        &self.inner.ctx
    }

    /// The node this runner registered.
    pub fn node_name(&self) -> &str {
        &self.ctx().config.node_name
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &RunnerConfig {
        &self.ctx().config
    }

    /// The pid (and session id) of the live process behind a pod.
    pub fn pid(&self, namespace: &str, pod: &str) -> Option<u32> {
        self.ctx().registry.pgid(&PodKey::new(namespace, pod))
    }

    /// Waits until the pod's process runs (polling every 20 ms), up to `timeout`.
    pub async fn wait_for_pid(&self, namespace: &str, pod: &str, timeout: Duration) -> Option<u32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pid) = self.pid(namespace, pod) {
                return Some(pid);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `signal` to the container (session) behind a pod.
    pub fn signal(&self, namespace: &str, pod: &str, signal: Signal) -> Result<(), Error> {
        let key = PodKey::new(namespace, pod);
        let pgid = self
            .ctx()
            .registry
            .pgid(&key)
            .ok_or_else(|| Error::NoProcess(key.clone()))?;
        tracing::info!(pod = %key, pgid, ?signal, "signal injected");
        Ok(signal_container(pgid, signal)?)
    }

    /// kill -9 the container (session) behind a pod (the pod is then reported Failed, exit 137).
    pub fn kill(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.signal(namespace, pod, Signal::Kill)
    }

    /// SIGSTOP the group: the process is paused, the pod stays Running.
    pub fn pause(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.signal(namespace, pod, Signal::Stop)
    }

    /// SIGCONT the group.
    pub fn resume(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.signal(namespace, pod, Signal::Cont)
    }

    /// SIGTERM the group without deleting the pod.
    pub fn terminate(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.signal(namespace, pod, Signal::Term)
    }

    /// Simulates losing this pod's node: nothing more is reported for the pod (its status
    /// stays as it is, its deletion is never confirmed), and its process runs on until it
    /// exits, is killed through this handle, or the runner shuts down.
    pub fn detach(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        let key = PodKey::new(namespace, pod);
        if self.ctx().registry.detach(&key) {
            Ok(())
        } else {
            Err(Error::NoProcess(key))
        }
    }

    /// Every pod the runner has supervised and not yet forgotten.
    pub fn pods(&self) -> Vec<PodInfo> {
        self.ctx()
            .registry
            .list()
            .into_iter()
            .map(|(key, pid, detached, finished)| PodInfo {
                namespace: key.namespace,
                name: key.name,
                pid,
                detached,
                finished,
            })
            .collect()
    }

    /// Drains the node: deletes every non-terminal pod bound to it with its own grace period
    /// (as `kubectl drain` evicts), so each gets SIGTERM, its grace period, then SIGKILL.
    /// Returns the pods it deleted; it does not wait for them to go.
    pub async fn drain(&self) -> Result<Vec<PodKey>, Error> {
        let ctx = self.ctx();
        if ctx.cancel.is_cancelled() {
            return Err(Error::ShutDown);
        }
        let api: Api<Pod> = match &ctx.config.namespace {
            Some(ns) => Api::namespaced(ctx.client.clone(), ns),
            None => Api::all(ctx.client.clone()),
        };
        let params =
            ListParams::default().fields(&format!("spec.nodeName={}", ctx.config.node_name));
        let mut drained = Vec::new();
        for pod in api.list(&params).await?.items {
            if is_terminal(&pod) || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let key = PodKey::of(&pod);
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
            match pods.delete(&key.name, &DeleteParams::default()).await {
                Ok(_) => drained.push(key),
                Err(e) if crate::kube_util::is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(node = %ctx.config.node_name, pods = drained.len(), "node drained");
        Ok(drained)
    }

    /// Stops watching, kills every container (session) the runner started and waits until they are
    /// reaped (up to 10 s). Statuses are not reported for processes killed this way. Idempotent.
    pub async fn shutdown(&self) {
        let ctx = self.ctx();
        ctx.cancel.cancel();
        kill_all(&ctx.registry);
        let background: Vec<_> = self.inner.background.lock().await.drain(..).collect();
        let tasks = ctx.registry.take_tasks();
        let all = futures::future::join_all(background.into_iter().chain(tasks));
        if tokio::time::timeout(SHUTDOWN_WAIT, all).await.is_err() {
            tracing::warn!("some pod processes did not end within {SHUTDOWN_WAIT:?}");
            kill_all(&ctx.registry);
        }
        if ctx.config.remove_node_on_shutdown {
            node::remove(&ctx.client, &ctx.config.node_name).await;
        }
        tracing::info!(node = %ctx.config.node_name, "local pod runner stopped");
    }
}
