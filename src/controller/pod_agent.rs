//! The agent container of a run that brings its own agent (`spec.agent.container`; pure).
//!
//! It runs the user's image as a third user, with no token and no key: baton's executor
//! (from the volume the init container filled) is its entrypoint, and the worker sends it the
//! user's command over a Unix socket in a volume only the worker and the agent mount. The
//! worker hands the command, with its environment, the gateway's address and a key good for
//! this attempt only, so none of that is in the pod's spec; when the worker ends, the
//! executor kills the agent (the attempt ends with its worker). The tools container mounts
//! neither the socket nor the input.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use super::bounds::{self, bounded_empty_dir};
use super::pod::{
    CONTAINER_NAME, EXECUTOR_DIR, SCRATCH_DIR, container_security_context, mount, plain,
};
use crate::crd::env;
use crate::crd::v1alpha1::{AgentContainer, AgentRun};

/// Name of the agent container.
pub const AGENT_CONTAINER_NAME: &str = "agent";
/// The agent container's user (and group): neither the worker's nor the tools'.
pub const AGENT_UID: i64 = 65531;
/// The directory the worker and the agent share: the executor's socket and the run's input.
pub const AGENT_DIR: &str = "/baton/agent";
const AGENT_VOLUME: &str = "baton-agent";
const AGENT_TMP_VOLUME: &str = "agent-tmp";

/// `pod` with the run's agent container, if the run brings one.
pub fn with_agent_container(mut pod: Pod, run: &AgentRun) -> Pod {
    let Some(agent) = run.spec.agent().and_then(|a| a.container.as_ref()) else {
        return pod;
    };
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(bounded_empty_dir(AGENT_VOLUME, bounds::AGENT_DIR_LIMIT));
    volumes.push(bounded_empty_dir(AGENT_TMP_VOLUME, bounds::AGENT_TMP_LIMIT));
    if let Some(worker) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == CONTAINER_NAME)
    {
        worker
            .env
            .get_or_insert_with(Vec::new)
            .push(plain(env::AGENT_DIR, AGENT_DIR));
        worker
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(AGENT_VOLUME, AGENT_DIR, false));
    }
    // Before the worker: the kubelet starts containers in order, so the agent's executor is
    // listening (or soon) when the worker connects.
    let at = spec
        .containers
        .iter()
        .position(|c| c.name == CONTAINER_NAME)
        .unwrap_or(spec.containers.len());
    spec.containers.insert(at, agent_container(agent));
    pod
}

fn agent_container(agent: &AgentContainer) -> Container {
    let executor = format!("{EXECUTOR_DIR}/baton-exec");
    let socket = format!("{AGENT_DIR}/exec.sock");
    let vars = agent
        .env
        .iter()
        .map(|var| plain(&var.name, var.value.clone()))
        .chain([plain("TMPDIR", SCRATCH_DIR), plain("HOME", SCRATCH_DIR)]);
    Container {
        name: AGENT_CONTAINER_NAME.into(),
        image: Some(agent.image.clone()),
        command: Some(
            [
                &executor,
                "serve",
                "--socket",
                &socket,
                "--workspace",
                SCRATCH_DIR,
            ]
            .map(String::from)
            .to_vec(),
        ),
        env: Some(vars.collect::<Vec<EnvVar>>()),
        resources: agent.resources.clone(),
        security_context: Some(container_security_context(AGENT_UID)),
        volume_mounts: Some(vec![
            mount(super::pod::EXECUTOR_VOLUME, EXECUTOR_DIR, true),
            mount(AGENT_VOLUME, AGENT_DIR, false),
            mount(AGENT_TMP_VOLUME, SCRATCH_DIR, false),
        ]),
        ..Container::default()
    }
}
