//! For this project's integration tests, not an API: the controller's own code applied to a
//! copy of a run the test holds, as a controller whose watch cache is behind would apply it.
//! A stale cache cannot be had on demand from a real API server; a copy read earlier can, and
//! the traces of docs/protocol.md ("The terminal claim") are replayed with it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kube::Client;
use kube::runtime::reflector;

use super::context::Context;
use super::decide::Action;
use super::election::Leadership;
use super::metrics::Metrics;
use super::{Config, Error};
use crate::crd::v1alpha1::AgentRun;

pub use super::writer::Applied;

/// A controller with empty caches that always leads and publishes no Events.
pub fn detached(client: Client) -> Context {
    let (wake, _) = futures::channel::mpsc::unbounded();
    Context {
        client,
        runs: reflector::store().0,
        pods: reflector::store().0,
        leases: reflector::store().0,
        memory: Default::default(),
        rollouts: Default::default(),
        leadership: Arc::new(Leadership::always()),
        metrics: Arc::new(Metrics::new()),
        events: None,
        synced: Arc::new(AtomicBool::new(true)),
        wake,
        config: Config {
            leader_election: false,
            events: false,
            ..Config::default()
        },
    }
}

/// Applies `action`, decided on `run` (perhaps a stale copy), with the controller's own code.
pub async fn apply_on(ctx: &Context, run: &AgentRun, action: &Action) -> Result<Applied, Error> {
    super::apply::apply(ctx, run, action).await
}
