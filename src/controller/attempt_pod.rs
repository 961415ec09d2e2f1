//! The pod of an attempt as this controller makes it: the worker pod (`pod`), the run's own
//! agent container (`pod_agent`), and the ledger server's address and token for a run kept in
//! PostgreSQL. One place, for the claim that creates it and for a thread's next turn whose pod
//! is started ahead (`warm`), which must be the same pod.

use k8s_openapi::api::core::v1::Pod;

use super::context::Context;
use super::pod::{desired_image, with_served_ledger, worker_pod};
use super::pod_agent::with_agent_container;
use crate::crd::v1alpha1::{AgentRun, LedgerBackend};
use crate::fence::Fence;

/// The pod of attempt `fence` of `run`.
pub fn attempt_pod(ctx: &Context, run: &AgentRun, fence: Fence) -> Pod {
    let image = desired_image(run, &ctx.config().worker_image);
    let pod = with_agent_container(worker_pod(run, fence, &image), run);
    match &ctx.config().ledger_server {
        Some(server) if ctx.ledgers().backend_of(run) == LedgerBackend::PostgreSQL => {
            with_served_ledger(pod, server.base(), server.ca())
        }
        _ => pod,
    }
}
