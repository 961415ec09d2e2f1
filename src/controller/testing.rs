//! For this project's integration tests, not an API: the controller's own code applied to a
//! copy of a run the test holds, as a controller whose watch cache is behind would apply it.
//! A stale cache cannot be had on demand from a real API server; a copy read earlier can, and
//! the traces of docs/protocol.md ("The terminal claim") are replayed with it.

use std::future::Future;
use std::ops::ControlFlow::{Break, Continue};

use kube::Client;
use kube::runtime::reflector;

use super::claim::{Sealed, confirm_current, prepare, seal};
use super::context::{Caches, Context};
use super::decide::{Action, Close};
use super::election::Leadership;
use super::{Config, Error};
use crate::crd::v1alpha1::AgentRun;

pub use super::writer::Applied;

/// A controller with empty caches that always leads and publishes no Events.
pub fn detached(client: Client) -> Context {
    let (wake, _) = futures::channel::mpsc::unbounded();
    let caches = Caches {
        runs: reflector::store().0,
        pods: reflector::store().0,
        leases: reflector::store().0,
        threads: reflector::store().0,
    };
    let config = Config {
        leader_election: false,
        events: false,
        ..Config::default()
    };
    Context::new(
        client,
        config,
        caches,
        Leadership::always(),
        None,
        wake,
        true,
    )
}

/// Applies `action`, decided on `run` (perhaps a stale copy), with the controller's own code.
pub async fn apply_on(ctx: &Context, run: &AgentRun, action: &Action) -> Result<Applied, Error> {
    super::apply::apply(ctx, run, action).await
}

/// The terminal claim of [`super::claim::terminal_claim`], stage by stage, with `between` run after its
/// first stage (the run confirmed current, the ledger's end found) and before its seal: where
/// a worker that wakes from a pause appends, and no re-read of the run can see it coming.
pub async fn terminal_claim_paused(
    ctx: &Context,
    run: &AgentRun,
    close: &Close,
    between: impl Future<Output = ()>,
) -> Result<Applied, Error> {
    let (prepared, ()) = match prepare(ctx, run, confirm_current(ctx, run)).await? {
        Continue(prepared) => prepared,
        Break(applied) => return Ok(applied),
    };
    between.await;
    match seal(ctx, prepared).await? {
        Continue(Sealed(prepared)) => {
            super::close::end(ctx, prepared.run, prepared.holder.fence, close).await
        }
        Break(applied) => Ok(applied),
    }
}
