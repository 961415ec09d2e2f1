//! Pure kubelet logic: what to do with a pod the runner sees, and the pod status that reports
//! the state of its process.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::spec::LOCAL_IP;

/// What the runner does with a pod it has no supervisor for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Not ours, or nothing to do.
    Ignore,
    /// Unbound: bind it to this node, then start it.
    Bind,
    /// Bound to this node and not started: start its process.
    Start,
    /// Being deleted and nothing runs for it here: confirm the deletion.
    ConfirmDeletion,
    /// Reported as started on this node, but this runner never started it (the runner was
    /// restarted): its process is lost, report it Failed.
    Lost,
}

/// The decision for a pod without a supervisor on this node.
pub fn decide(pod: &Pod, node: &str) -> Action {
    let bound_to = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    let deleting = pod.metadata.deletion_timestamp.is_some();
    if bound_to.is_empty() {
        // The API server deletes an unscheduled pod at once; nothing to bind.
        return if deleting {
            Action::Ignore
        } else {
            Action::Bind
        };
    }
    if bound_to != node {
        return Action::Ignore;
    }
    if deleting {
        return Action::ConfirmDeletion;
    }
    if is_terminal(pod) {
        return Action::Ignore;
    }
    if was_started(pod) {
        Action::Lost
    } else {
        Action::Start
    }
}

/// Succeeded or Failed.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), Some("Succeeded" | "Failed"))
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn was_started(pod: &Pod) -> bool {
    let running = phase(pod) == Some("Running");
    let container_started = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.waiting.is_none()))
        });
    running || container_started
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
    /// It could not be started (e.g. no such program).
    StartError(String),
    /// The runner lost track of it.
    Lost,
}

/// The state of the one container, as the runner knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerRun {
    /// Not started yet.
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        started_at: Option<Timestamp>,
        finished_at: Timestamp,
        exit: Exit,
    },
}

/// The identity the status reports for the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    pub image: String,
    pub pid: Option<u32>,
}

/// The pod status a kubelet would report for `run`; `pod_started` is when the pod was first
/// acknowledged (the pod's `startTime`), `now` stamps the conditions.
pub fn pod_status(
    run: &ContainerRun,
    info: &ContainerInfo,
    pod_started: Timestamp,
    now: Timestamp,
) -> PodStatus {
    let (phase, ready) = match run {
        ContainerRun::Waiting { .. } => ("Pending", false),
        ContainerRun::Running { .. } => ("Running", true),
        ContainerRun::Terminated {
            exit: Exit::Code(0),
            ..
        } => ("Succeeded", false),
        ContainerRun::Terminated { .. } => ("Failed", false),
    };
    let ready_reason = match run {
        ContainerRun::Terminated { .. } => Some("PodCompleted"),
        ContainerRun::Waiting { .. } => Some("ContainersNotReady"),
        ContainerRun::Running { .. } => None,
    };
    let conditions = vec![
        condition("PodScheduled", true, None, now),
        condition("Initialized", true, None, now),
        condition("ContainersReady", ready, ready_reason, now),
        condition("Ready", ready, ready_reason, now),
    ];
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        container_statuses: Some(vec![container_status(run, info)]),
        host_ip: Some(LOCAL_IP.to_string()),
        pod_ip: Some(LOCAL_IP.to_string()),
        pod_ips: Some(vec![PodIP {
            ip: LOCAL_IP.to_string(),
        }]),
        start_time: Some(Time(pod_started)),
        ..Default::default()
    }
}

fn condition(type_: &str, status: bool, reason: Option<&str>, now: Timestamp) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    }
}

fn container_status(run: &ContainerRun, info: &ContainerInfo) -> ContainerStatus {
    let state = match run {
        ContainerRun::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..Default::default()
        },
        ContainerRun::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..Default::default()
        },
        ContainerRun::Terminated {
            started_at,
            finished_at,
            exit,
        } => ContainerState {
            terminated: Some(terminated(exit, *started_at, *finished_at)),
            ..Default::default()
        },
    };
    let running = matches!(run, ContainerRun::Running { .. });
    ContainerStatus {
        name: info.name.clone(),
        image: info.image.clone(),
        image_id: String::new(),
        container_id: info.pid.map(|pid| format!("baton-runner://{pid}")),
        ready: running,
        started: Some(running),
        restart_count: 0,
        state: Some(state),
        ..Default::default()
    }
}

/// The terminated state: exit code, signal and reason as a kubelet reports them.
pub fn terminated(
    exit: &Exit,
    started_at: Option<Timestamp>,
    finished_at: Timestamp,
) -> ContainerStateTerminated {
    let (exit_code, signal, reason, message) = match exit {
        Exit::Code(0) => (0, None, "Completed", None),
        Exit::Code(code) => (*code, None, "Error", None),
        Exit::Signal(sig) => (
            128 + sig,
            Some(*sig),
            "Killed",
            Some(format!("killed by signal {sig}")),
        ),
        Exit::StartError(msg) => (128, None, "StartError", Some(msg.clone())),
        Exit::Lost => (
            137,
            None,
            "ContainerStatusUnknown",
            Some("The container could not be located: the local runner was restarted".to_string()),
        ),
    };
    ContainerStateTerminated {
        exit_code,
        signal,
        reason: Some(reason.to_string()),
        message,
        started_at: started_at.map(Time),
        finished_at: Some(Time(finished_at)),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
