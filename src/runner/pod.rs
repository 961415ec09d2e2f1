//! One pod's supervisor: bind it, resolve its process, run it, report its status, honour its
//! deletion. One task per pod; the watch loop feeds it the pod's later versions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ConfigMap, ObjectReference, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tokio::process::Child;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{Instant, sleep, sleep_until};

use super::handle::Ctx;
use super::process::{self, Signal, signal_container};
use super::registry::PodEvent;
use super::spec::{self, EnvSources, ProcessSpec, SpecContext};
use super::status::{ContainerInfo, ContainerRun, Exit, pod_status};
use super::{Error, PodKey};
use crate::kube_util::{is_conflict, is_not_found};

/// Grace period when neither the deletion nor the pod gives one (the Kubernetes default).
const DEFAULT_GRACE_SECONDS: i64 = 30;
/// The longest pause between retries of a status write.
const STATUS_BACKOFF_CAP: Duration = Duration::from_secs(2);

/// How the process's supervision ended.
enum End {
    /// It exited; `deleting` when a graceful deletion was under way.
    Exited { exit: Exit, deleting: bool },
    /// The pod object vanished (force delete) and the process was killed or orphaned.
    Gone,
    /// The runner is shutting down.
    Shutdown,
}

pub(crate) struct Supervisor {
    ctx: Arc<Ctx>,
    key: PodKey,
    pod: Pod,
    rx: UnboundedReceiver<PodEvent>,
    info: ContainerInfo,
    acknowledged: Timestamp,
    /// The pod object was seen gone from the API.
    gone: bool,
}

impl Supervisor {
    pub fn new(ctx: Arc<Ctx>, pod: Pod, rx: UnboundedReceiver<PodEvent>) -> Self {
        let key = PodKey::of(&pod);
        let container = spec::container(&pod).ok();
        let info = ContainerInfo {
            name: container.map(|c| c.name.clone()).unwrap_or_default(),
            image: container.and_then(|c| c.image.clone()).unwrap_or_default(),
            pid: None,
        };
        Self {
            ctx,
            key,
            pod,
            rx,
            info,
            acknowledged: Timestamp::now(),
            gone: false,
        }
    }

    /// Binds (when asked), then supervises the pod to its end.
    pub async fn run(mut self, bind: bool) {
        if bind {
            if let Err(e) = bind_pod(&self.ctx, &self.pod).await {
                if is_conflict(&e) {
                    tracing::debug!(pod = %self.key, "already bound elsewhere");
                } else {
                    tracing::warn!(pod = %self.key, error = %e, "binding failed");
                }
                self.ctx.registry.remove(&self.key);
                return;
            }
            tracing::info!(pod = %self.key, node = %self.ctx.config.node_name, "bound");
            self.pod.spec.get_or_insert_default().node_name =
                Some(self.ctx.config.node_name.clone());
        }
        let gone = self.supervise().await;
        if gone {
            self.ctx.registry.remove(&self.key);
        } else {
            self.ctx.registry.finish(&self.key);
        }
    }

    /// Runs the pod's process to its end; true when the pod object is gone from the API.
    async fn supervise(&mut self) -> bool {
        let Some(spec) = self.prepare().await else {
            return self.gone;
        };
        let log = self.ctx.config.log_path(&self.key);
        let mut child = match process::spawn(&spec, &log) {
            Ok(child) => child,
            Err(e) => {
                tracing::warn!(pod = %self.key, program = %spec.program.display(), error = %e, "start failed");
                process::log_line(&log, &format!("start failed: {e}"));
                let exit = Exit::StartError(format!("{}: {e}", spec.program.display()));
                self.report(ContainerRun::Terminated {
                    started_at: None,
                    finished_at: Timestamp::now(),
                    exit,
                })
                .await;
                return false;
            }
        };
        let Some(pid) = child.id() else { return false };
        let started_at = Timestamp::now();
        self.ctx.registry.set_pgid(&self.key, Some(pid));
        self.info.pid = Some(pid);
        tracing::info!(pod = %self.key, pid, program = %spec.program.display(), "started");
        self.report(ContainerRun::Running { started_at }).await;
        let end = self.watch(&mut child, pid).await;
        // As a container's cgroup: nothing of the group outlives its main process.
        let _ = signal_container(pid, Signal::Kill);
        self.ctx.registry.set_pgid(&self.key, None);
        let (exit, deleting) = match end {
            End::Exited { exit, deleting } => (exit, deleting),
            End::Gone => return true,
            End::Shutdown => return false,
        };
        tracing::info!(pod = %self.key, pid, ?exit, "exited");
        process::log_line(&log, &format!("exited: {exit:?}"));
        if self.ctx.registry.is_detached(&self.key) {
            return false;
        }
        let finished_at = Timestamp::now();
        self.report(ContainerRun::Terminated {
            started_at: Some(started_at),
            finished_at,
            exit,
        })
        .await;
        if deleting {
            confirm_deletion(&self.ctx, &self.pod).await;
        }
        false
    }

    /// Reads what the environment refers to and builds the process; while that fails the pod
    /// stays Pending (`CreateContainerConfigError`) and it is retried. `None`: the pod went away.
    async fn prepare(&mut self) -> Option<ProcessSpec> {
        let mut reported: Option<String> = None;
        loop {
            match self.resolve().await {
                Ok(spec) => return Some(spec),
                Err(e) => {
                    let message = e.to_string();
                    if reported.as_deref() != Some(&message) {
                        tracing::warn!(pod = %self.key, error = %message, "cannot configure the process");
                        let reason = "CreateContainerConfigError".to_string();
                        self.report(ContainerRun::Waiting {
                            reason,
                            message: Some(message.clone()),
                        })
                        .await;
                        reported = Some(message);
                    }
                }
            }
            tokio::select! {
                _ = self.ctx.cancel.cancelled() => return None,
                _ = sleep(Duration::from_secs(1)) => {}
                event = self.rx.recv() => match event {
                    Some(PodEvent::Observed(pod)) if pod.metadata.deletion_timestamp.is_some() => {
                        confirm_deletion(&self.ctx, &pod).await;
                        return None;
                    }
                    Some(PodEvent::Observed(pod)) => self.pod = *pod,
                    Some(PodEvent::Gone) | None => {
                        self.gone = true;
                        return None;
                    }
                },
            }
        }
    }

    async fn resolve(&self) -> Result<ProcessSpec, Error> {
        let container = spec::container(&self.pod)?;
        let refs = spec::env_refs(container);
        let mut sources = EnvSources::default();
        let secrets: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &self.key.namespace);
        for name in &refs.secrets {
            if let Some(secret) = secrets.get_opt(name).await? {
                sources.secrets.insert(name.clone(), secret_data(secret));
            }
        }
        let config_maps: Api<ConfigMap> =
            Api::namespaced(self.ctx.client.clone(), &self.key.namespace);
        for name in &refs.config_maps {
            if let Some(cm) = config_maps.get_opt(name).await? {
                sources
                    .config_maps
                    .insert(name.clone(), cm.data.unwrap_or_default());
            }
        }
        let ctx = SpecContext {
            baton_bin: &self.ctx.config.baton_bin,
            image_bins: &self.ctx.config.image_bins,
            host_env: &self.ctx.host_env,
            node_name: &self.ctx.config.node_name,
        };
        Ok(spec::process_spec(&self.pod, &sources, &ctx)?)
    }

    /// Waits for the process to end while honouring deletion and shutdown.
    async fn watch(&mut self, child: &mut Child, pgid: u32) -> End {
        let mut kill_at: Option<Instant> = None;
        let mut deleting = false;
        let mut gone = false;
        let mut shutting_down = false;
        let mut events_open = true;
        loop {
            tokio::select! {
                status = child.wait() => {
                    let exit = status.map(process::exit_of).unwrap_or(Exit::Lost);
                    return if shutting_down { End::Shutdown } else if gone { End::Gone } else { End::Exited { exit, deleting } };
                }
                _ = self.ctx.cancel.cancelled(), if !shutting_down => {
                    shutting_down = true;
                    let _ = signal_container(pgid, Signal::Kill);
                }
                _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                    tracing::info!(pod = %self.key, pgid, "grace period over: SIGKILL");
                    kill_at = None;
                    let _ = signal_container(pgid, Signal::Kill);
                }
                event = self.rx.recv(), if events_open => match event {
                    Some(PodEvent::Observed(pod)) => {
                        if self.ctx.registry.is_detached(&self.key) || pod.metadata.deletion_timestamp.is_none() {
                            continue;
                        }
                        let deadline = Instant::now() + Duration::from_secs(grace_seconds(&pod).max(0) as u64);
                        if !deleting {
                            deleting = true;
                            tracing::info!(pod = %self.key, pgid, grace = grace_seconds(&pod), "graceful deletion: SIGTERM");
                            let _ = signal_container(pgid, Signal::Term);
                        }
                        if !gone && kill_at.is_none_or(|at| deadline < at) {
                            kill_at = Some(deadline);
                        }
                        self.pod = *pod;
                    }
                    Some(PodEvent::Gone) => {
                        gone = true;
                        kill_at = None;
                        if self.ctx.config.orphan_on_force_delete || self.ctx.registry.is_detached(&self.key) {
                            tracing::info!(pod = %self.key, pgid, "pod deleted from the API; its process runs on (lost node)");
                            self.ctx.registry.detach(&self.key);
                        } else {
                            tracing::info!(pod = %self.key, pgid, "pod deleted from the API: SIGKILL");
                            let _ = signal_container(pgid, Signal::Kill);
                        }
                    }
                    None => events_open = false,
                },
            }
        }
    }

    async fn report(&self, run: ContainerRun) {
        if self.ctx.registry.is_detached(&self.key) {
            return;
        }
        let status = pod_status(&run, &self.info, self.acknowledged, Timestamp::now());
        write_status(&self.ctx, &self.key, &json!({ "status": status })).await;
    }
}

/// The grace period of a deletion under way.
fn grace_seconds(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE_SECONDS)
}

fn secret_data(secret: Secret) -> BTreeMap<String, String> {
    let mut data: BTreeMap<String, String> = secret.string_data.unwrap_or_default();
    for (k, v) in secret.data.unwrap_or_default() {
        data.insert(k, String::from_utf8_lossy(&v.0).into_owned());
    }
    data
}

fn pods(ctx: &Ctx, namespace: &str) -> Api<Pod> {
    Api::namespaced(ctx.client.clone(), namespace)
}

/// POSTs a Binding of the pod to this node (what a scheduler does).
async fn bind_pod(ctx: &Ctx, pod: &Pod) -> Result<(), kube::Error> {
    let key = PodKey::of(pod);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(key.name.clone()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Node".to_string()),
            name: Some(ctx.config.node_name.clone()),
            ..Default::default()
        },
    };
    let _: serde_json::Value = pods(ctx, &key.namespace)
        .create_subresource("binding", &key.name, &PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Writes `pods/status` (merge patch), retrying failures (e.g. an API server that is down)
/// with a capped backoff, as a kubelet's status manager does, until it lands, the pod is gone
/// or the runner shuts down.
async fn write_status(ctx: &Ctx, key: &PodKey, patch: &serde_json::Value) {
    let api = pods(ctx, &key.namespace);
    let mut backoff = Duration::from_millis(50);
    for attempt in 1u32.. {
        let result = api
            .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        match result {
            Ok(_) => return,
            Err(e) if is_not_found(&e) => return,
            Err(e) if attempt % 10 == 1 => {
                tracing::warn!(pod = %key, error = %e, attempt, "status write failed; retrying");
            }
            Err(e) => {
                tracing::debug!(pod = %key, error = %e, attempt, "status write failed; retrying")
            }
        }
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(STATUS_BACKOFF_CAP);
    }
}

/// Confirms a deletion as a kubelet does: delete at grace 0, only this very pod (UID).
pub(crate) async fn confirm_deletion(ctx: &Ctx, pod: &Pod) {
    let key = PodKey::of(pod);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods(ctx, &key.namespace).delete(&key.name, &params).await {
        Ok(_) => tracing::info!(pod = %key, "deletion confirmed"),
        Err(e) if is_not_found(&e) || is_conflict(&e) => {}
        Err(e) => tracing::warn!(pod = %key, error = %e, "confirming deletion failed"),
    }
}

/// Reports a pod this runner never started, though it had been started on this node (the
/// runner was restarted): its process is lost, the pod Failed.
pub(crate) async fn report_lost(ctx: &Ctx, pod: &Pod) {
    let key = PodKey::of(pod);
    let container = spec::container(pod).ok();
    let info = ContainerInfo {
        name: container.map(|c| c.name.clone()).unwrap_or_default(),
        image: container.and_then(|c| c.image.clone()).unwrap_or_default(),
        pid: None,
    };
    let now = Timestamp::now();
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(now, |t| t.0);
    let run = ContainerRun::Terminated {
        started_at: None,
        finished_at: now,
        exit: Exit::Lost,
    };
    tracing::warn!(pod = %key, "pod was started by an earlier runner; its process is lost");
    write_status(
        ctx,
        &key,
        &json!({ "status": pod_status(&run, &info, started, now) }),
    )
    .await;
}
