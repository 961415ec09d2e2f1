//! The bench's cleanup: every object it made in its namespace deleted, then the namespace.

use std::time::Instant;

use baton::crd::v1alpha1::{AgentRun, LedgerSegment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};

/// Deletes what the bench made (the local control plane has no garbage collector and no
/// namespace controller, so nothing else would): every object of these kinds in the bench's
/// own namespace, then the namespace.
pub async fn cleanup(client: &Client, ns: &str) {
    let t = Instant::now();
    let mut left = 0;
    left += purge::<AgentRun>(client, ns).await;
    left += purge::<LedgerSegment>(client, ns).await;
    left += purge::<Lease>(client, ns).await;
    left += purge::<Pod>(client, ns).await;
    left += purge::<ServiceAccount>(client, ns).await;
    left += purge::<Role>(client, ns).await;
    left += purge::<RoleBinding>(client, ns).await;
    left += purge::<CoreEvent>(client, ns).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
    println!(
        "bench: cleanup of namespace {ns} took {:.1} s ({left} objects left)",
        t.elapsed().as_secs_f64()
    );
}

/// `deletecollection` over the namespace until nothing is left (a large collection can
/// outlast one request's timeout). Returns how many objects are left.
async fn purge<K>(client: &Client, ns: &str) -> usize
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams::background().grace_period(0);
    let mut left = usize::MAX;
    for _ in 0..10 {
        if let Err(err) = api.delete_collection(&params, &ListParams::default()).await {
            eprintln!("bench: deleting {}: {err}", K::kind(&Default::default()));
        }
        left = api
            .list_metadata(&ListParams::default())
            .await
            .map_or(usize::MAX, |l| l.items.len());
        if left == 0 {
            break;
        }
    }
    left
}
