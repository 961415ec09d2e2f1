//! The test plays the controller: a claim built from the library's primitives, in the order
//! docs/protocol.md fixes (seal the ledger, CAS the status, move the Lease).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, Resource};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment, Phase};
use baton::fence::{Fence, worker_pod_name};
use baton::lease::LeaseClient;
use baton::ledger::SegmentStore;
use baton::status::{StatusError, cas_status};

/// Claims `run` for `fence`: returns the pod name the worker must use.
pub async fn claim(client: &Client, namespace: &str, name: &str, fence: i64) -> String {
    claim_because(client, namespace, name, fence, None).await
}

/// A claim whose status names its reason, as the controller's does (`reason`: None leaves the
/// status's reason as it was).
pub async fn claim_because(
    client: &Client,
    namespace: &str,
    name: &str,
    fence: i64,
    reason: Option<&str>,
) -> String {
    let fence = Fence::new(fence);
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), namespace);
    let pod = worker_pod_name(name, fence);
    let run = runs.get(name).await.expect("reading the run to claim");
    seal(client, &run, fence, &pod).await;
    claim_status(&runs, name, fence, &pod, reason).await;
    let owner = run.controller_owner_ref(&()).expect("owner reference");
    LeaseClient::new(client.clone(), namespace)
        .move_to(name, owner, &pod, fence, run.spec.lease.duration_seconds)
        .await
        .expect("moving the lease");
    pod
}

/// Appends `claimed{fence, pod}` at the ledger's tail + 1.
async fn seal(client: &Client, run: &AgentRun, fence: Fence, pod: &str) {
    let store = SegmentStore::for_run(client.clone(), run);
    let tail = store.list().await.expect("listing the ledger").len() as i64;
    let event = LedgerEvent::Claimed {
        fence,
        pod: pod.to_string(),
    };
    store
        .append(tail, fence, vec![event])
        .await
        .expect("sealing the ledger");
}

async fn claim_status(
    runs: &Api<AgentRun>,
    name: &str,
    fence: Fence,
    pod: &str,
    reason: Option<&str>,
) {
    for _ in 0..10 {
        let run = runs.get(name).await.expect("reading the run");
        let mut status = run.status.clone().unwrap_or_default();
        status.phase = Phase::Running;
        status.fence = fence;
        status.attempt = fence.get();
        status.worker = Some(pod.to_string());
        status.pending_approval = None;
        if let Some(reason) = reason {
            status.reason = Some(reason.to_string());
        }
        status.start_time.get_or_insert(Time(Timestamp::now()));
        match cas_status(runs, &run, status).await {
            Ok(_) => return,
            Err(StatusError::Conflict { .. }) => continue,
            Err(err) => panic!("claiming the run's status: {err}"),
        }
    }
    panic!("the run kept changing while it was claimed");
}

/// The run's segments, in order.
pub async fn segments(client: &Client, namespace: &str, name: &str) -> Vec<LedgerSegment> {
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), namespace);
    let run = runs.get(name).await.expect("reading the run");
    SegmentStore::for_run(client.clone(), &run)
        .list()
        .await
        .expect("listing the ledger (contiguous)")
}

/// Every event of the ledger with the fence that wrote it.
pub fn events(segments: &[LedgerSegment]) -> Vec<(i64, LedgerEvent)> {
    segments
        .iter()
        .flat_map(|s| {
            s.spec
                .events
                .iter()
                .map(move |e| (s.spec.fence.get(), e.clone()))
        })
        .collect()
}
