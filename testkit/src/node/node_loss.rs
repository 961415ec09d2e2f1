//! The node's loss as a test stages it: one worker frozen (SIGSTOP), then the kubelet stopped.
//! The guard brings the node back whichever way the test ends: a test that failed while the
//! node was away must not leave it away for every test after it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use super::{NODE_NAME, node_sh, node_sh_command, signal_pid};
use crate::e2e::retry;

/// The node away: the kubelet stopped and a worker's process frozen, until [`NodeLoss::end`]
/// (or the guard's drop) starts the kubelet again and thaws the worker.
pub struct NodeLoss {
    frozen: u32,
}

impl NodeLoss {
    /// Freezes `pid` (a worker's host PID), then stops the kubelet. The worker is frozen
    /// first: stopping the kubelet takes seconds, and a worker still running meanwhile could
    /// finish its run before the loss began.
    pub async fn begin(pid: u32) -> Self {
        signal_pid(pid, libc::SIGSTOP);
        let loss = NodeLoss { frozen: pid };
        tokio::task::spawn_blocking(|| node_sh(&["stop-kubelet"]))
            .await
            .unwrap();
        loss
    }

    /// The node back: the kubelet started again, then the frozen worker woken (a zombie now).
    pub async fn end(self) {
        let pid = self.frozen;
        std::mem::forget(self);
        tokio::task::spawn_blocking(|| node_sh(&["start-kubelet"]))
            .await
            .unwrap();
        signal_pid(pid, libc::SIGCONT);
    }
}

/// A test that failed while the node was away still brings it back. Nothing here may panic
/// again (a panic while unwinding aborts): failures are printed.
impl Drop for NodeLoss {
    fn drop(&mut self) {
        let out = node_sh_command(&["start-kubelet"]).output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "the node's kubelet did not start again: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(err) => eprintln!("the node's kubelet did not start again: {err}"),
        }
        // SAFETY: kill(2) with the PID this guard froze; a process gone since is no harm.
        unsafe { libc::kill(self.frozen as i32, libc::SIGCONT) };
    }
}

/// Waits up to a minute for the node to be Ready, else fails naming its Ready condition: a
/// test on a node that is away would otherwise fail minutes later on a symptom (a rollout
/// that never ends), and so would every test after it.
pub async fn wait_node_ready(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let node = retry(|| nodes.get(NODE_NAME)).await;
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready");
        if ready.as_ref().is_some_and(|c| c.status == "True") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {NODE_NAME} is not Ready (did a test before this one leave its kubelet \
             stopped?): {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
