//! Threads whose next turn is started ahead (`spec.warm`), for `tests/node_warm.rs` and the
//! node figures: a thread against a model server in the node's namespace, turns created as
//! `baton chat` creates them, the pod started ahead, and how long a turn took to reach its model.

use std::time::{Duration, Instant};

use baton::crd::WARM_THREAD_LABEL;
use baton::crd::v1alpha1::AgentThread;
use baton::fence::{Fence, worker_pod_name};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::json;

use super::NodeEnv;
use crate::e2e::retry;
use crate::model::Server;

/// The pod of a turn's first attempt.
pub fn first_pod(turn: &str) -> String {
    worker_pod_name(turn, Fence::new(1))
}

/// A thread `name` whose turns ask `server`, with `spec.warm` when `idle_seconds` is given.
pub fn model_thread(name: &str, server: &Server, idle_seconds: Option<i64>) -> AgentThread {
    let model = serde_json::to_value(server.openai_model()).unwrap();
    let mut spec = json!({ "agent": { "model": model, "tools": [] } });
    if let Some(idle) = idle_seconds {
        spec["warm"] = json!({ "idleSeconds": idle });
    }
    AgentThread::new(name, serde_json::from_value(spec).unwrap())
}

impl NodeEnv {
    /// Creates a turn of `thread` as `baton chat` and `baton server` do (under the name the
    /// thread offers, if any); returns its name and when it was asked for. Asked again while
    /// the API server could not call baton's webhook (its replicas restarting: nothing was
    /// created), as a client would.
    pub async fn create_turn(&self, thread: &str, input: &str) -> (String, Instant) {
        let threads = self.api::<AgentThread>();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let thread = retry(|| threads.get(thread)).await;
            let turn = thread.new_turn(input);
            let asked = Instant::now();
            match baton::requests::create_turn(&self.runs(), &thread, turn).await {
                Ok(created) => return (created.name_any(), asked),
                Err(kube::Error::Api(e))
                    if e.message.contains("failed calling webhook")
                        && Instant::now() < deadline =>
                {
                    eprintln!("creating a turn: {}; asking again", e.message);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => panic!("creating a turn: {err}"),
            }
        }
    }

    /// The name `thread` offers its next turn and the UID of the pod started for it, once
    /// that pod runs.
    pub async fn started_ahead(&self, thread: &str) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let seen = self.api::<AgentThread>().get(thread).await.unwrap();
            if let Some(name) = seen.offered_turn_name()
                && let Some(pod) = self.pods().get_opt(&first_pod(name)).await.unwrap()
                && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && pod.labels().contains_key(WARM_THREAD_LABEL)
                && pod
                    .owner_references()
                    .iter()
                    .all(|o| o.kind == "AgentThread")
            {
                return (name.to_string(), pod.uid().unwrap());
            }
            assert!(Instant::now() < deadline, "no pod started ahead: {seen:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The pods of `thread` started ahead that have not ended (none once it is idle long enough).
    pub async fn pods_started_ahead(&self, thread: &AgentThread) -> Vec<String> {
        let uid = thread.uid().unwrap_or_default();
        let selector = format!("{WARM_THREAD_LABEL}={uid}");
        let listed = self
            .pods()
            .list(&ListParams::default().labels(&selector))
            .await;
        let live = |p: &Pod| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            p.owner_references().iter().all(|o| o.kind == "AgentThread")
                && p.metadata.deletion_timestamp.is_none()
                && !matches!(phase, Some("Succeeded" | "Failed"))
        };
        listed
            .unwrap()
            .items
            .iter()
            .filter(|p| live(p))
            .map(|p| p.name_any())
            .collect()
    }

    /// Whether turn `name` ran its first attempt on a pod started ahead (adopted: labelled
    /// for its thread, controlled by the run).
    pub async fn ran_on_pod_started_ahead(&self, name: &str) -> bool {
        let pod = self.pods().get_opt(&first_pod(name)).await.unwrap();
        pod.is_some_and(|p| {
            p.labels().contains_key(WARM_THREAD_LABEL)
                && p.owner_references().iter().any(|o| o.kind == "AgentRun")
        })
    }
}

/// How long after `asked` the model server received the first request carrying `input`.
pub fn to_model(server: &Server, input: &str, asked: Instant) -> Duration {
    let received = server.received();
    let first = received
        .iter()
        .find(|r| r.body.to_string().contains(input))
        .unwrap_or_else(|| panic!("no request carried {input:?}: {received:?}"));
    first.at.saturating_duration_since(asked)
}
