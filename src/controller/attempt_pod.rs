//! The pod of an attempt as this controller makes it: the worker pod (`pod`), the run's own
//! agent container (`pod_agent`), and the ledger server's address and token for a run kept in
//! PostgreSQL, and where the worker exports its traces. One place, for the claim that creates it and for a thread's next turn whose pod
//! is started ahead (`warm`), which must be the same pod.

use k8s_openapi::api::core::v1::{EnvVar, Pod};

use super::context::Context;
use super::pod::{CONTAINER_NAME, desired_image, plain, with_served_ledger, worker_pod};
use super::pod_agent::with_agent_container;
use crate::crd::v1alpha1::{AgentRun, LedgerBackend};
use crate::fence::Fence;

/// The pod of attempt `fence` of `run`.
pub fn attempt_pod(ctx: &Context, run: &AgentRun, fence: Fence) -> Pod {
    let image = desired_image(run, &ctx.config().worker_image);
    let pod = with_agent_container(worker_pod(run, fence, &image), run);
    let pod = match &ctx.config().worker_traces {
        Some(traces) => with_traces(pod, traces),
        None => pod,
    };
    match &ctx.config().ledger_server {
        Some(server) if ctx.ledgers().backend_of(run) == LedgerBackend::PostgreSQL => {
            with_served_ledger(pod, server.base(), server.ca())
        }
        _ => pod,
    }
}

/// `pod` with its worker container exporting traces as `traces` says (the tools and agent
/// containers get nothing of it).
fn with_traces(mut pod: Pod, traces: &crate::traces::WorkerTraces) -> Pod {
    if let Some(vars) = worker_env_mut(&mut pod) {
        vars.extend(
            traces
                .env()
                .into_iter()
                .map(|(name, value)| plain(name, value)),
        );
    }
    pod
}

/// The worker container's environment in `pod`, to add to (None: `pod` has no worker).
pub(super) fn worker_env_mut(pod: &mut Pod) -> Option<&mut Vec<EnvVar>> {
    let containers = &mut pod.spec.as_mut()?.containers;
    let worker = containers.iter_mut().find(|c| c.name == CONTAINER_NAME)?;
    Some(worker.env.get_or_insert_with(Vec::new))
}

#[cfg(test)]
mod tests {
    use super::super::pod::TOOLS_CONTAINER_NAME;
    use super::*;
    use crate::traces::WorkerTraces;

    #[test]
    fn only_the_worker_container_is_told_where_traces_go() {
        let run = AgentRun::builder("r1")
            .namespace("ns")
            .stored("u-1")
            .reply("x")
            .build();
        let traces = WorkerTraces {
            endpoint: "http://collector:4318".into(),
            sampling: 0.25,
            content: true,
        };
        let pod = with_traces(worker_pod(&run, Fence::new(1), "img"), &traces);
        let containers = pod.spec.unwrap().containers;
        let env_of = |name: &str| -> Vec<(String, Option<String>)> {
            let container = containers.iter().find(|c| c.name == name).unwrap();
            let vars = container.env.clone().unwrap_or_default();
            vars.into_iter()
                .filter(|v| v.name.starts_with("OTEL_"))
                .map(|v| (v.name, v.value))
                .collect()
        };
        let told = |n: &str, v: &str| (n.to_string(), Some(v.to_string()));
        assert_eq!(
            env_of(CONTAINER_NAME),
            vec![
                told("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                told("OTEL_TRACES_SAMPLER", "traceidratio"),
                told("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]
        );
        assert_eq!(env_of(TOOLS_CONTAINER_NAME), vec![]);
        let worker = containers
            .iter()
            .find(|c| c.name == CONTAINER_NAME)
            .unwrap();
        let content = worker
            .env
            .iter()
            .flatten()
            .find(|v| v.name == "BATON_TRACE_CONTENT");
        assert_eq!(content.and_then(|v| v.value.as_deref()), Some("true"));
    }
}
