//! Traces on the node: Arize Phoenix run inside the node's network namespace, listening on the
//! node's address where the worker pods send their OTLP, read by the test through a loopback
//! relay; and the release (its worker pods, controllers and servers) told to send there
//! (chart values `tracing`) for as long as a test needs it.

use super::*;
use crate::common::phoenix::{Phoenix, phoenix_bin};

/// Phoenix on the node's network.
pub struct NodePhoenix {
    pub phoenix: Phoenix,
    /// Its OTLP/HTTP endpoint as pods reach it (the node's address).
    pub endpoint: String,
    _relay: Relay,
}

impl NodePhoenix {
    pub async fn start() -> Self {
        let port = crate::free_port();
        let address = format!("{NODE_IP}:{port}");
        let relay = Relay::start(&address);
        // `nsenter` without `--fork` execs Phoenix itself: the child's PID is Phoenix's, and
        // dropping it stops Phoenix.
        let mut command = tokio::process::Command::new("nsenter");
        command.arg(format!("--net={NETNS}")).arg(phoenix_bin());
        let phoenix = Phoenix::serve(command, NODE_IP, port, relay.url()).await;
        Self {
            phoenix,
            endpoint: format!("http://{address}"),
            _relay: relay,
        }
    }
}

/// The release exporting its worker pods' traces to `endpoint`, every run sampled, for as
/// long as this lives; its default values again when dropped.
pub struct Traced;

impl Traced {
    pub async fn switch(client: &Client, endpoint: &str) -> Self {
        helm_upgrade(&serde_json::json!({
            "tracing": {"endpoint": endpoint, "sampling": 1},
        }));
        rolled_out(client).await;
        Traced
    }

    /// Switches the release back and waits for it, before the next test runs.
    pub async fn switch_back(self, client: &Client) {
        std::mem::forget(self);
        helm_upgrade(&serde_json::json!({}));
        rolled_out(client).await;
    }
}

/// The release's controllers and servers, all of its current version.
async fn rolled_out(client: &Client) {
    wait_rolled_out(client, SERVER, Duration::from_secs(180)).await;
    wait_controllers_ready(client, Duration::from_secs(180)).await;
}

/// A test that failed before [`Traced::switch_back`] still switches the release back.
impl Drop for Traced {
    fn drop(&mut self) {
        helm_upgrade(&serde_json::json!({}));
    }
}
