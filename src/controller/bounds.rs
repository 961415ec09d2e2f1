//! The worker pod's default bounds (pure): what one run may take from its node when its spec
//! does not say. A model-chosen `dd` into `/workspace` or a runaway build must cost the run
//! its pod (evicted, then handed off), never the node with every run on it. Each is
//! overridable in the run's spec; the node's pid bound is the cluster's (kubelet
//! `podPidsLimit`), since no pod field sets one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, ResourceRequirements, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::crd::v1alpha1::WorkerSpec;

/// `/workspace` as an `emptyDir`, unless `spec.worker.workspaceSizeLimit` says otherwise.
pub const WORKSPACE_LIMIT: &str = "4Gi";
/// Each container's `/tmp`: the worker's holds nothing large; the tools' is a build's scratch.
pub const WORKER_TMP_LIMIT: &str = "64Mi";
pub const TOOLS_TMP_LIMIT: &str = "1Gi";
/// The executor binary (a few MiB) and the executor's socket.
pub const EXECUTOR_LIMIT: &str = "64Mi";
/// The directory the worker and an agent container share: a socket and the run's input.
pub const AGENT_DIR_LIMIT: &str = "16Mi";
/// An agent container's scratch `/tmp` (its `HOME` too).
pub const AGENT_TMP_LIMIT: &str = "1Gi";
pub const SOCKET_LIMIT: &str = "1Mi";
/// The tools container without `spec.worker.toolsResources`: limits that stop one command
/// from taking the node's memory or disk, requests small enough not to reserve a node per run.
pub const TOOLS_MEMORY_LIMIT: &str = "2Gi";
pub const TOOLS_STORAGE_LIMIT: &str = "1Gi";
pub const TOOLS_MEMORY_REQUEST: &str = "64Mi";
pub const TOOLS_CPU_REQUEST: &str = "50m";

/// An `emptyDir` named `name`, bounded to `limit`.
pub fn bounded_empty_dir(name: &str, limit: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(limit.into())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The workspace `emptyDir`'s limit: the run's, else the default.
pub fn workspace_limit(worker: &WorkerSpec) -> String {
    worker
        .workspace_size_limit
        .as_ref()
        .map_or_else(|| WORKSPACE_LIMIT.to_string(), |q| q.0.clone())
}

/// The tools container's resources: the run's, else the bounded defaults.
pub fn tools_resources(worker: &WorkerSpec) -> ResourceRequirements {
    worker.tools_resources.clone().unwrap_or_else(|| {
        let quantities = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        ResourceRequirements {
            limits: Some(quantities(&[
                ("memory", TOOLS_MEMORY_LIMIT),
                ("ephemeral-storage", TOOLS_STORAGE_LIMIT),
            ])),
            requests: Some(quantities(&[
                ("cpu", TOOLS_CPU_REQUEST),
                ("memory", TOOLS_MEMORY_REQUEST),
            ])),
            ..ResourceRequirements::default()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_get_bounds_unless_the_run_sets_its_own() {
        let defaults = tools_resources(&WorkerSpec::default());
        let limits = defaults.limits.unwrap();
        assert_eq!(limits["memory"].0, TOOLS_MEMORY_LIMIT);
        assert_eq!(limits["ephemeral-storage"].0, TOOLS_STORAGE_LIMIT);
        assert!(!defaults.requests.unwrap().contains_key("ephemeral-storage"));
        let own = ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity("8Gi".into()))].into()),
            ..ResourceRequirements::default()
        };
        let worker = WorkerSpec {
            tools_resources: Some(own.clone()),
            ..WorkerSpec::default()
        };
        assert_eq!(tools_resources(&worker), own);
    }

    #[test]
    fn the_workspace_limit_is_the_runs_else_the_default() {
        assert_eq!(workspace_limit(&WorkerSpec::default()), WORKSPACE_LIMIT);
        let worker = WorkerSpec {
            workspace_size_limit: Some(Quantity("500Mi".into())),
            ..WorkerSpec::default()
        };
        assert_eq!(workspace_limit(&worker), "500Mi");
        let volume = bounded_empty_dir("w", "500Mi");
        assert_eq!(volume.empty_dir.unwrap().size_limit.unwrap().0, "500Mi");
    }
}
