//! The baton API: custom resource types and the names shared by every component.
//!
//! Types live in a versioned module so a future `v1beta1` can sit beside them.

pub mod v1alpha1;

use kube::CustomResourceExt;

/// API group of every baton resource.
pub const GROUP: &str = "baton.dev";
/// Field manager used for every write baton makes.
pub const FIELD_MANAGER: &str = "baton";
/// Annotation on a run Lease that carries the fencing token.
pub const FENCE_ANNOTATION: &str = "baton.dev/fence";
/// Annotation on a thread admission Lease naming the run that holds the thread.
pub const THREAD_KEY_ANNOTATION: &str = "baton.dev/thread-key";
/// Label on everything baton creates for a run (Lease, Pods, segments): the run's name.
pub const RUN_LABEL: &str = "baton.dev/run";
/// Label on LedgerSegments: the owning run's UID, so a new run with an old name never reads
/// the segments of its predecessor.
pub const RUN_UID_LABEL: &str = "baton.dev/run-uid";
/// Label on worker pods: the attempt (fence) the pod was created for.
pub const FENCE_LABEL: &str = "baton.dev/fence";
/// Label marking objects managed by baton.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Every CRD baton installs, in the order they are written to `crds/`.
pub fn all_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    vec![v1alpha1::AgentRun::crd(), v1alpha1::LedgerSegment::crd()]
}

/// The YAML that `baton crd` prints and `crds/` holds: one document per CRD.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
