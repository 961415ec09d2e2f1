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

/// Applies every CRD (server-side apply) and waits until the API server serves them.
/// Used by `baton crd --apply`, the demo and the test harness; production installs use Helm.
pub async fn install(
    client: kube::Client,
    timeout: std::time::Duration,
) -> Result<(), InstallError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    use kube::runtime::wait::{await_condition, conditions};

    let api: Api<CustomResourceDefinition> = Api::all(client);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(timeout, established)
            .await
            .map_err(|_| InstallError::NotEstablished { name: name.clone() })??;
    }
    Ok(())
}

/// Errors installing the CRDs.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("applying CRD: {0}")]
    Kube(#[from] kube::Error),
    #[error("waiting for CRD: {0}")]
    Wait(#[from] kube::runtime::wait::Error),
    #[error("CRD {name} was not Established in time")]
    NotEstablished { name: String },
}

/// Environment variables the controller gives a worker pod (and the runner passes through).
pub mod env {
    /// The run's name.
    pub const RUN: &str = "BATON_RUN";
    /// The run's namespace.
    pub const NAMESPACE: &str = "BATON_NAMESPACE";
    /// The fence this pod was created for.
    pub const FENCE: &str = "BATON_FENCE";
    /// The pod's own name: its holder identity on the run Lease.
    pub const POD: &str = "BATON_POD";
    /// The model API key, from the run's `apiKeySecretRef`. Never logged or stored.
    pub const MODEL_API_KEY: &str = "BATON_MODEL_API_KEY";
    /// Given to tools: the step number.
    pub const STEP: &str = "BATON_STEP";
    /// Given to tools: `<run-uid>/<step>`.
    pub const IDEMPOTENCY_KEY: &str = "BATON_IDEMPOTENCY_KEY";
}

/// The deterministic name of a run's worker pod for one attempt. Deterministic so that a
/// controller repeating a step creates nothing twice.
pub fn worker_pod_name(run: &str, fence: i64) -> String {
    format!("{run}-w{fence}")
}
