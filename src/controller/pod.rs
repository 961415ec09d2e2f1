//! The worker pod of one attempt (pure): deterministic name per fence, owned by the run,
//! running as the run's own ServiceAccount (see `crate::rbac`) under a restricted security
//! context: non-root, no privilege escalation, no capabilities, the runtime's default seccomp
//! profile and a read-only root filesystem, with an `emptyDir` at `/tmp` (and `TMPDIR=/tmp`)
//! so tools have somewhere to write.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, Pod,
    PodSecurityContext, PodSpec, SeccompProfile, SecretKeySelector, SecurityContext, Volume,
    VolumeMount,
};
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::crd::v1alpha1::AgentRun;
use crate::crd::{FENCE_LABEL, MANAGED_BY_LABEL, RUN_LABEL, env};
use crate::fence::{label_value, worker_pod_name};
use crate::rbac::pod_service_account;

/// Grace period a worker gets to hand off on SIGTERM.
pub const TERMINATION_GRACE_SECONDS: i64 = 30;
/// Name of the worker container.
pub const CONTAINER_NAME: &str = "worker";
/// The numeric non-root user (and group) the worker runs as: `runAsNonRoot` can only be
/// verified by the kubelet against a numeric user, and 65532 is the distroless `nonroot` user.
pub const WORKER_UID: i64 = 65532;
/// The writable scratch directory of the otherwise read-only worker container.
pub const SCRATCH_DIR: &str = "/tmp";
/// Name of the `emptyDir` volume mounted at [`SCRATCH_DIR`].
const SCRATCH_VOLUME: &str = "tmp";
/// Name of the worker's admin port (`/metrics`, `/livez`, `/readyz`), for a PodMonitor.
pub const METRICS_PORT_NAME: &str = "metrics";

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

/// The worker pod for attempt `fence` of `run`.
pub fn worker_pod(run: &AgentRun, fence: i64, image: &str) -> Pod {
    let name = worker_pod_name(&run.name_any(), fence);
    let labels = BTreeMap::from([
        (RUN_LABEL.to_string(), label_value(&run.name_any())),
        (FENCE_LABEL.to_string(), fence.to_string()),
        (MANAGED_BY_LABEL.to_string(), "baton".to_string()),
    ]);
    let worker = &run.spec.worker;
    Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: run.namespace(),
            labels: Some(labels),
            owner_references: run.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: CONTAINER_NAME.into(),
                image: Some(image.into()),
                command: Some(vec!["baton".into(), "worker".into()]),
                env: Some(worker_env(run, fence, &name)),
                ports: Some(vec![metrics_port()]),
                resources: worker.resources.clone(),
                security_context: Some(container_security_context()),
                volume_mounts: Some(vec![VolumeMount {
                    name: SCRATCH_VOLUME.into(),
                    mount_path: SCRATCH_DIR.into(),
                    ..VolumeMount::default()
                }]),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: SCRATCH_VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            security_context: Some(pod_security_context()),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            service_account_name: Some(pod_service_account(run)),
            node_selector: (!worker.node_selector.is_empty()).then(|| worker.node_selector.clone()),
            tolerations: (!worker.tolerations.is_empty()).then(|| worker.tolerations.clone()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The worker's admin port as its default address has it (the worker binds it unless
/// `BATON_ADMIN_ADDR` says otherwise).
fn metrics_port() -> ContainerPort {
    ContainerPort {
        name: Some(METRICS_PORT_NAME.into()),
        container_port: crate::worker::admin::DEFAULT_ADMIN_PORT.into(),
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
/// read-only root filesystem.
fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(WORKER_UID),
        run_as_group: Some(WORKER_UID),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

fn worker_env(run: &AgentRun, fence: i64, pod: &str) -> Vec<EnvVar> {
    let plain = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    let mut vars = vec![
        plain(env::RUN, run.name_any()),
        plain(env::NAMESPACE, run.namespace().unwrap_or_default()),
        plain(env::FENCE, fence.to_string()),
        plain(env::POD, pod.to_string()),
        plain("TMPDIR", SCRATCH_DIR.to_string()),
    ];
    if let Some(secret) = &run.spec.agent.model.api_key_secret_ref {
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
mod tests {
    use super::*;
    use crate::crd::v1alpha1::SecretKeyRef;

    fn run() -> AgentRun {
        let mut run = AgentRun::builder("r1")
            .namespace("ns")
            .stored("u-1")
            .reply("x")
            .build();
        run.spec.agent.model.api_key_secret_ref = Some(SecretKeyRef {
            name: "s".into(),
            key: "k".into(),
        });
        run
    }

    #[test]
    fn the_pod_carries_name_labels_owner_and_env() {
        let pod = worker_pod(&run(), 3, "img:1");
        assert_eq!(pod.name_any(), "r1-w3");
        assert_eq!(pod.labels()[FENCE_LABEL], "3");
        assert_eq!(pod.owner_references()[0].uid, "u-1");
        assert_eq!(pod_image(&pod), "img:1");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let env = spec.containers[0].env.clone().unwrap();
        let get = |n: &str| env.iter().find(|e| e.name == n).cloned().unwrap();
        assert_eq!(get(env::POD).value.as_deref(), Some("r1-w3"));
        assert_eq!(get(env::FENCE).value.as_deref(), Some("3"));
        assert!(get(env::MODEL_API_KEY).value.is_none());
        assert_eq!(get("TMPDIR").value.as_deref(), Some("/tmp"));
    }

    #[test]
    fn the_pod_declares_the_workers_metrics_port() {
        let spec = worker_pod(&run(), 1, "img").spec.unwrap();
        let ports = spec.containers[0].ports.clone().unwrap();
        let admin: std::net::SocketAddr = crate::worker::admin::DEFAULT_ADMIN_ADDR.parse().unwrap();
        assert_eq!(ports[0].name.as_deref(), Some(METRICS_PORT_NAME));
        assert_eq!(ports[0].container_port, i32::from(admin.port()));
    }

    #[test]
    fn the_pod_runs_as_the_runs_own_service_account_unless_the_run_names_one() {
        let mut r = run();
        let spec = worker_pod(&r, 1, "img").spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("baton-run-r1"));
        r.spec.worker.service_account_name = Some("custom".into());
        let spec = worker_pod(&r, 1, "img").spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("custom"));
    }

    #[test]
    fn the_pod_is_restricted_with_a_writable_tmp() {
        let spec = worker_pod(&run(), 1, "img").spec.unwrap();
        let pod_sc = spec.security_context.clone().unwrap();
        assert_eq!(pod_sc.run_as_non_root, Some(true));
        assert_eq!(pod_sc.run_as_user, Some(WORKER_UID));
        assert!(pod_sc.run_as_user.unwrap() > 0);
        assert_eq!(pod_sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = &spec.containers[0];
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let mount = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(mount.mount_path, "/tmp");
        let volume = spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap();
        assert!(volume.empty_dir.is_some());
    }
}
