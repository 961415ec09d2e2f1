//! The runner's Node: registered on start, kept alive by a heartbeat (its Ready condition and a
//! Lease in `kube-node-lease`, as a kubelet does).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::spec::LOCAL_IP;
use crate::kube_util::{is_already_exists, is_not_found};

/// Namespace of node heartbeat Leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Label on the Node: this node is a baton local runner.
pub const RUNNER_NODE_LABEL: &str = "baton.dev/local-runner";

/// The Node object the runner registers.
pub fn node_object(name: &str) -> Node {
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        (RUNNER_NODE_LABEL.to_string(), "true".to_string()),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The status the runner reports for its node: Ready, loopback addresses, generous capacity.
pub fn node_status(name: &str, now: Timestamp) -> NodeStatus {
    let capacity = BTreeMap::from([
        ("cpu".to_string(), Quantity("64".to_string())),
        ("memory".to_string(), Quantity("256Gi".to_string())),
        ("pods".to_string(), Quantity("1000".to_string())),
    ]);
    NodeStatus {
        conditions: Some(vec![ready_condition(now)]),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".to_string(),
                address: LOCAL_IP.to_string(),
            },
            NodeAddress {
                type_: "Hostname".to_string(),
                address: name.to_string(),
            },
        ]),
        allocatable: Some(capacity.clone()),
        capacity: Some(capacity),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.to_string(),
            operating_system: std::env::consts::OS.to_string(),
            os_image: "baton local pod runner".to_string(),
            kubelet_version: format!("baton-runner/{}", env!("CARGO_PKG_VERSION")),
            container_runtime_version: "local-process://0".to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ready_condition(now: Timestamp) -> NodeCondition {
    NodeCondition {
        type_: "Ready".to_string(),
        status: "True".to_string(),
        reason: Some("KubeletReady".to_string()),
        message: Some("baton local pod runner is posting ready status".to_string()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Creates the Node if it does not exist and reports it Ready.
pub async fn register(client: &Client, name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes
        .create(&PostParams::default(), &node_object(name))
        .await
    {
        Ok(_) => {}
        Err(e) if is_already_exists(&e) => {}
        Err(e) => return Err(e),
    }
    let status = json!({ "status": node_status(name, Timestamp::now()) });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// One heartbeat: refresh the Ready condition and renew the node Lease (best effort: a server
/// without `kube-node-lease` still gets the condition).
pub async fn heartbeat(client: &Client, name: &str, lease_seconds: i32) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({ "status": { "conditions": [ready_condition(now)] } });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    if let Err(e) = renew_lease(client, name, lease_seconds, now).await {
        tracing::debug!(node = name, error = %e, "node lease not renewed");
    }
    Ok(())
}

async fn renew_lease(
    client: &Client,
    name: &str,
    lease_seconds: i32,
    now: Timestamp,
) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let spec = LeaseSpec {
        holder_identity: Some(name.to_string()),
        lease_duration_seconds: Some(lease_seconds),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    };
    let patch = json!({ "spec": spec });
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Deletes the Node and its Lease (for runners that should leave nothing behind, e.g. tests).
pub async fn remove(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    if let Err(e) = nodes.delete(name, &DeleteParams::default()).await {
        tracing::debug!(node = name, error = %e, "node not deleted");
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let _ = leases.delete(name, &DeleteParams::default()).await;
}
