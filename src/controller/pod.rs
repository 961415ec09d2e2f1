//! The worker pod of one attempt (pure): deterministic name per fence, owned by the run,
//! under a restricted security context (non-root, no privilege escalation, no capabilities,
//! the runtime's default seccomp profile, read-only root filesystems). Two containers:
//!
//! - `tools` runs the model's commands: baton's executor (copied in by the init container
//!   `install-executor`, so any image with `/bin/sh` will do) in the run's `toolsImage`, as
//!   another user, with the workspace at `/workspace` and a scratch `/tmp`. It holds no
//!   credential: the pod does not automount the ServiceAccount token and no Secret is in its
//!   environment.
//! - `worker` (baton's image) alone holds the API token (a projected volume mounted only
//!   here), the model key, and talks to the API server. It drives the executor over a Unix
//!   socket in a volume only the two containers mount.
//!
//! Process namespaces are not shared, so neither container sees the other's processes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, Container, ContainerPort, DownwardAPIProjection,
    DownwardAPIVolumeFile, EnvVar, EnvVarSource, KeyToPath, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, ProjectedVolumeSource, SeccompProfile, SecretKeySelector,
    SecretVolumeSource, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection, VolumeResourceRequirements,
};
use kube::ResourceExt;

use super::bounds::{self, bounded_empty_dir};
use crate::crd::v1alpha1::{AgentRun, WorkspaceAccessMode};
use crate::crd::{FENCE_LABEL, env};
use crate::fence::Fence;
use crate::fence::{worker_pod_name, workspace_claim_name};
use crate::owned::{Ownership, owned_meta};
use crate::rbac::pod_service_account;

/// Grace period a worker gets to hand off on SIGTERM.
pub const TERMINATION_GRACE_SECONDS: i64 = 30;
/// Name of the worker container.
pub const CONTAINER_NAME: &str = "worker";
/// Name of the tools container, where the model's commands run.
pub const TOOLS_CONTAINER_NAME: &str = "tools";
/// Name of the init container that puts the executor into the tools container's reach.
pub const INSTALL_CONTAINER_NAME: &str = "install-executor";
/// The numeric non-root user (and group) the worker runs as: `runAsNonRoot` can only be
/// verified by the kubelet against a numeric user, and 65532 is the distroless `nonroot` user.
pub const WORKER_UID: i64 = 65532;
/// The tools container's user (and group): not the worker's, so nothing of the worker's is
/// the tools' by ownership.
pub const TOOLS_UID: i64 = 65533;
/// The writable scratch directory of each otherwise read-only container.
pub const SCRATCH_DIR: &str = "/tmp";
/// Where the tools container's commands run (the `spec.workspace` claim, or an `emptyDir`).
pub const WORKSPACE_DIR: &str = "/workspace";
/// Where the executor binary is, in the tools container.
pub const EXECUTOR_DIR: &str = "/baton/bin";
/// The executor's socket, in both containers.
pub const EXECUTOR_SOCKET: &str = "/baton/socket/exec.sock";
const SOCKET_DIR: &str = "/baton/socket";
/// Where Kubernetes clients look for the in-cluster token, CA and namespace.
const API_ACCESS_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The projected token's lifetime: what the kubelet's own automounted token uses; the kubelet
/// refreshes it well before it expires, and kube's client re-reads it.
const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// Name of the worker's admin port (`/metrics`, `/livez`, `/readyz`), for a PodMonitor.
pub const METRICS_PORT_NAME: &str = "metrics";

/// The volume the init container copies the executor into.
pub const EXECUTOR_VOLUME: &str = "baton-executor";

/// The pod's volumes, by name.
mod volume {
    pub const WORKER_TMP: &str = "tmp";
    pub const TOOLS_TMP: &str = "tools-tmp";
    pub const EXECUTOR: &str = super::EXECUTOR_VOLUME;
    pub const SOCKET: &str = "baton-socket";
    pub const WORKSPACE: &str = "workspace";
    pub const API_ACCESS: &str = "kube-api-access";
    pub const LEDGER_TOKEN: &str = "baton-ledger-token";
}

/// The image the run's worker should run: the run's own, else the controller's.
pub fn desired_image(run: &AgentRun, default_image: &str) -> String {
    run.spec
        .worker
        .image
        .clone()
        .unwrap_or_else(|| default_image.to_string())
}

/// The image a pod runs (its worker container's).
pub fn pod_image(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER_NAME))
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// The worker pod for attempt `fence` of `run`; `image` is baton's (the worker's, and the
/// executor's source).
pub fn worker_pod(run: &AgentRun, fence: Fence, image: &str) -> Pod {
    let name = worker_pod_name(&run.name_any(), fence);
    let mut metadata = owned_meta(run, name.clone(), Ownership::Controller);
    metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(FENCE_LABEL.to_string(), fence.to_string());
    let worker = &run.spec.worker;
    Pod {
        metadata,
        spec: Some(PodSpec {
            init_containers: Some(vec![install_container(image)]),
            // The tools container first: the kubelet starts containers in order, pulling each
            // one's image first, so the executor is listening by the time the worker starts.
            containers: vec![
                tools_container(run, image),
                worker_container(run, fence, &name, image),
            ],
            volumes: Some(volumes(run)),
            security_context: Some(pod_security_context()),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            service_account_name: Some(pod_service_account(run)),
            // The worker container alone mounts a token (the projected volume).
            automount_service_account_token: Some(false),
            share_process_namespace: Some(false),
            runtime_class_name: worker.runtime_class_name.clone(),
            node_selector: (!worker.node_selector.is_empty()).then(|| worker.node_selector.clone()),
            tolerations: (!worker.tolerations.is_empty()).then(|| worker.tolerations.clone()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// `pod` for a run whose ledger `baton server` serves at `server` (runs kept in PostgreSQL):
/// its worker container gets the address and a projected token for the ledger's audience,
/// bound to this pod (the server admits a write only from the pod of the writing attempt).
/// The tools container gets neither.
pub fn with_served_ledger(mut pod: Pod, server: &str, ca: Option<&str>) -> Pod {
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: volume::LEDGER_TOKEN.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: None,
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    path: "token".into(),
                    expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                    audience: Some(crate::ledger::served::LEDGER_AUDIENCE.into()),
                }),
                ..VolumeProjection::default()
            }]),
        }),
        ..Volume::default()
    });
    if let Some(worker) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == CONTAINER_NAME)
    {
        let vars = worker.env.get_or_insert_with(Vec::new);
        vars.push(plain(env::LEDGER_SERVER, server));
        // A CA is public: a value in the pod, since a Secret of the controller's namespace
        // could not be mounted in the run's.
        if let Some(ca) = ca {
            vars.push(plain(env::LEDGER_SERVER_CA, ca));
        }
        worker
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(
                volume::LEDGER_TOKEN,
                crate::crd::LEDGER_TOKEN_DIR,
                true,
            ));
    }
    pod
}

/// The run's workspace claim, when `spec.workspace` asks for one: owned by the run, labelled
/// like its pods.
pub fn workspace_claim(run: &AgentRun) -> Option<PersistentVolumeClaim> {
    let workspace = run.spec.workspace.as_ref()?;
    let modes = workspace
        .access_modes
        .iter()
        .map(|m| match m {
            WorkspaceAccessMode::ReadWriteOnce => "ReadWriteOnce",
            WorkspaceAccessMode::ReadWriteMany => "ReadWriteMany",
        })
        .map(String::from)
        .collect();
    Some(PersistentVolumeClaim {
        metadata: owned_meta(
            run,
            workspace_claim_name(&run.name_any()),
            Ownership::Controller,
        ),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(modes),
            storage_class_name: workspace.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    workspace.size.clone(),
                )])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    })
}

pub(super) fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

pub(super) fn plain(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Copies the executor (a static binary) out of baton's image into the shared volume.
fn install_container(image: &str) -> Container {
    Container {
        name: INSTALL_CONTAINER_NAME.into(),
        image: Some(image.into()),
        command: Some(vec![
            "baton-exec".into(),
            "install".into(),
            EXECUTOR_DIR.into(),
        ]),
        security_context: Some(container_security_context(WORKER_UID)),
        volume_mounts: Some(vec![mount(volume::EXECUTOR, EXECUTOR_DIR, false)]),
        ..Container::default()
    }
}

fn tools_container(run: &AgentRun, image: &str) -> Container {
    let worker = &run.spec.worker;
    let executor = format!("{EXECUTOR_DIR}/baton-exec");
    Container {
        name: TOOLS_CONTAINER_NAME.into(),
        image: Some(worker.tools_image.clone().unwrap_or_else(|| image.into())),
        command: Some(
            [
                &executor,
                "serve",
                "--socket",
                EXECUTOR_SOCKET,
                "--workspace",
                WORKSPACE_DIR,
            ]
            .map(String::from)
            .to_vec(),
        ),
        env: Some(vec![
            plain("TMPDIR", SCRATCH_DIR),
            plain("HOME", WORKSPACE_DIR),
        ]),
        resources: Some(bounds::tools_resources(worker)),
        security_context: Some(container_security_context(TOOLS_UID)),
        volume_mounts: Some(vec![
            mount(volume::EXECUTOR, EXECUTOR_DIR, true),
            mount(volume::SOCKET, SOCKET_DIR, false),
            mount(volume::WORKSPACE, WORKSPACE_DIR, false),
            mount(volume::TOOLS_TMP, SCRATCH_DIR, false),
        ]),
        ..Container::default()
    }
}

fn worker_container(run: &AgentRun, fence: Fence, pod: &str, image: &str) -> Container {
    Container {
        name: CONTAINER_NAME.into(),
        image: Some(image.into()),
        command: Some(vec!["baton".into(), "worker".into()]),
        env: Some(worker_env(run, fence, pod)),
        ports: Some(vec![metrics_port()]),
        resources: run.spec.worker.resources.clone(),
        security_context: Some(container_security_context(WORKER_UID)),
        volume_mounts: Some(
            [
                mount(volume::WORKER_TMP, SCRATCH_DIR, false),
                mount(volume::SOCKET, SOCKET_DIR, false),
                mount(volume::API_ACCESS, API_ACCESS_DIR, true),
            ]
            .into_iter()
            .chain(mcp_header_secrets(run).map(|(volume, dir, _)| mount(&volume, &dir, true)))
            .collect(),
        ),
        ..Container::default()
    }
}

/// For each MCP server whose spec names a headers Secret: its volume's name, where the
/// worker container mounts it (`<headers dir>/<tool name>`), and the Secret. Only the worker
/// container mounts them: the tools container never sees a server's credentials.
fn mcp_header_secrets(run: &AgentRun) -> impl Iterator<Item = (String, String, String)> + '_ {
    run.spec.tools().iter().enumerate().filter_map(|(i, tool)| {
        let secret = tool.mcp.as_ref()?.headers_from_secret.clone()?;
        let dir = format!("{}/{}", crate::crd::MCP_HEADERS_DIR, tool.name);
        Some((format!("mcp-headers-{i}"), dir, secret))
    })
}

/// A Secret as a volume. Optional: a Secret that does not exist mounts empty, and the worker
/// then fails the run naming it, instead of the pod waiting in ContainerCreating.
fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            optional: Some(true),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn volumes(run: &AgentRun) -> Vec<Volume> {
    let workspace = match &run.spec.workspace {
        Some(_) => Volume {
            name: volume::WORKSPACE.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: workspace_claim_name(&run.name_any()),
                read_only: None,
            }),
            ..Volume::default()
        },
        None => bounded_empty_dir(
            volume::WORKSPACE,
            &bounds::workspace_limit(&run.spec.worker),
        ),
    };
    let headers =
        mcp_header_secrets(run).map(|(volume, _, secret)| secret_volume(&volume, &secret));
    [
        bounded_empty_dir(volume::WORKER_TMP, bounds::WORKER_TMP_LIMIT),
        bounded_empty_dir(volume::TOOLS_TMP, bounds::TOOLS_TMP_LIMIT),
        bounded_empty_dir(volume::EXECUTOR, bounds::EXECUTOR_LIMIT),
        bounded_empty_dir(volume::SOCKET, bounds::SOCKET_LIMIT),
        workspace,
        api_access_volume(),
    ]
    .into_iter()
    .chain(headers)
    .collect()
}

/// The token, CA and namespace an automounted ServiceAccount volume would hold, as the
/// kubelet projects them (a bound, expiring token), but mounted in the worker container only.
fn api_access_volume() -> Volume {
    Volume {
        name: volume::API_ACCESS.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: None,
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                        audience: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..DownwardAPIVolumeFile::default()
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
        }),
        ..Volume::default()
    }
}

/// The worker's admin port as its default address has it (the worker binds it unless
/// `BATON_ADMIN_ADDR` says otherwise).
fn metrics_port() -> ContainerPort {
    ContainerPort {
        name: Some(METRICS_PORT_NAME.into()),
        container_port: crate::serving::admin::WORKER_ADMIN_PORT.into(),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

/// Pod level: a numeric non-root user and group, and the runtime's default seccomp profile.
fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(WORKER_UID),
        run_as_group: Some(WORKER_UID),
        fs_group: Some(WORKER_UID),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    }
}

/// Container level (the Pod Security "restricted" profile): no escalation, no capabilities,
/// read-only root filesystem, as `uid`.
pub(super) fn container_security_context(uid: i64) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

fn worker_env(run: &AgentRun, fence: Fence, pod: &str) -> Vec<EnvVar> {
    let mut vars = vec![
        plain(env::RUN, run.name_any()),
        plain(env::NAMESPACE, run.id().namespace),
        plain(env::FENCE, fence.to_string()),
        plain(env::POD, pod),
        plain("TMPDIR", SCRATCH_DIR),
        plain(env::EXECUTOR_SOCKET, EXECUTOR_SOCKET),
    ];
    if let Some(secret) = run
        .spec
        .agent()
        .and_then(|a| a.model.api_key_secret_ref.as_ref())
    {
        vars.push(EnvVar {
            name: env::MODEL_API_KEY.into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.name.clone(),
                    key: secret.key.clone(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
        });
    }
    vars
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
