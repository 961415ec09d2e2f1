//! `baton server` on the node, as the server's tests reach it: a loopback relay into the
//! node's network namespace (to a pod, or to the Service's cluster IP), the chart's server
//! Deployment Ready, and people: ServiceAccounts with exactly the rights a test gives them.

use std::net::TcpListener;
use std::process::{Child, Command};

use k8s_openapi::api::apps::v1::Deployment;

use super::*;

/// The chart's server Deployment and Service.
pub const SERVER: &str = "baton-server";

/// A loopback port relayed into the node's network namespace (hack/relay.py), to `target`;
/// the relay process is stopped by its PID when dropped.
pub struct Relay {
    child: Child,
    pub port: u16,
}

impl Relay {
    pub fn start(target: &str) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let relay = crate::repo_root().join("hack/relay.py");
        let child = Command::new("python3")
            .arg(relay)
            .args([&port.to_string(), NETNS, target])
            .spawn()
            .expect("starting hack/relay.py");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the relay to {target} never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The chart's server Deployment with both replicas Ready (installed by an upgrade when an
/// older release on this node has none); the Ready pods.
pub async fn servers_ready(client: &Client) -> Vec<Pod> {
    if kubectl(&["-n", SYSTEM_NS, "get", "deployment", SERVER]).is_err() {
        helm_upgrade(&serde_json::json!({}));
    }
    // A rollout still under way (an earlier test's `helm upgrade`) has Ready pods of the old
    // version about to go: the pods returned are the current version's.
    wait_only_current_pods(client, SERVER, Duration::from_secs(180)).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let params = ListParams::default().labels("app.kubernetes.io/component=server");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let d = retry(|| deployments.get(SERVER)).await;
        let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        let live: Vec<Pod> = retry(|| pods.list(&params))
            .await
            .items
            .into_iter()
            .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        if ready == 2 && live.len() == 2 {
            return live;
        }
        assert!(
            Instant::now() < deadline,
            "baton server never had 2 Ready pods"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The cluster IP of the chart's server Service.
pub async fn server_cluster_ip(client: &Client) -> String {
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), SYSTEM_NS);
    let service = retry(|| services.get(SERVER)).await;
    service
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the server Service has a cluster IP")
}

// People are made as the other bed tests make them.
#[allow(unused_imports)]
pub use super::rbac::{person, rule};
