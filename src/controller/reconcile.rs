//! Wiring: the watches, the kube-runtime `Controller`, the election and the admin server, and
//! the reconcile loop (observe → decide → apply, re-deciding on conflict).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::runtime::controller::Action as Requeue;
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::Instrument;

use super::admin::{self, AdminState};
use super::apply::apply;
use super::backoff::ErrorClass;
use super::context::Context;
use super::decide::{Action, decide};
use super::election;
use super::events;
use super::ledger_rows;
use super::observe::observe;
use super::turn;
use super::watches::{build, turns_of_thread};
use super::writer::Applied;
use super::{Config, Error};
use crate::crd::v1alpha1::AgentRun;

/// How many times one reconcile re-reads and re-decides after a conflict.
const MAX_REDECIDE: usize = 4;
/// Look again this soon when the caches were behind.
const SOON: Duration = Duration::from_millis(500);
/// Safety net after a write (the watch normally triggers first).
const AFTER_WRITE: Duration = Duration::from_secs(2);

/// Runs the controller until it fails. Spawn it as a task and abort it to stop it.
pub async fn run(client: Client, config: Config) -> Result<(), Error> {
    run_until(client, config, futures::future::pending()).await
}

/// [`run`] until `shutdown` resolves (SIGTERM in a pod): then it takes no new work, lets the
/// reconciles in flight finish their writes, gives up leadership so that another replica leads
/// at once, and returns Ok.
pub async fn run_until(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let (ctx, controller, watches, wake_rx, events) = build(client.clone(), config);
    let ready = ctx.synced().clone();
    let (webhook_loaded, loaded) = tokio::sync::watch::channel(ctx.config().webhook.is_none());
    tokio::spawn(mark_ready(ctx.clone(), ready.clone(), loaded));
    let mut webhook = spawn_webhook(&client, &ctx, webhook_loaded);
    let gained = leadership_gained(ctx.leadership().subscribe());
    let reconciling = controller
        .owns_stream(watches.pods)
        .owns_stream(watches.leases)
        .watches_stream(watches.threads, turns_of_thread(ctx.clone()))
        .reconcile_on(wake_rx)
        .reconcile_all_on(gained)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let publishing = async {
        if let Some((queue, publisher)) = events {
            events::publish(queue, publisher, ctx.metrics()).await;
        }
        futures::future::pending::<()>().await
    };
    let outcome = tokio::select! {
        _ = reconciling => Ok(()),
        _ = publishing => Ok(()),
        err = run_election(client.clone(), ctx.clone()) => Err(err),
        res = serve_admin(ctx.clone(), ready) => res,
        res = webhook_failed(&mut webhook) => res,
    };
    if outcome.is_ok() {
        step_down(&client, &ctx).await;
    }
    drain_webhook(webhook).await;
    outcome
}

/// How long a stopping replica keeps answering admission reviews: the API server may still
/// send it some until the Service's endpoints and the node's routes drop it, and every
/// refused review (failurePolicy Fail) is a worker's append or renewal to retry.
const WEBHOOK_DRAIN: Duration = Duration::from_secs(3);

type WebhookTask = Option<tokio::task::JoinHandle<Result<(), crate::webhook::WebhookError>>>;

/// The admission webhook, on every replica: the API server reaches any ready one.
fn spawn_webhook(
    client: &Client,
    ctx: &Context,
    loaded: tokio::sync::watch::Sender<bool>,
) -> WebhookTask {
    let config = ctx.config().webhook.clone()?;
    Some(tokio::spawn(crate::webhook::run(
        client.clone(),
        config,
        loaded,
        Some(ctx.run_cache().clone()),
    )))
}

async fn webhook_failed(task: &mut WebhookTask) -> Result<(), Error> {
    match task {
        Some(handle) => match handle.await {
            Ok(result) => Ok(result?),
            Err(join) => Err(crate::webhook::WebhookError::Ended(join.to_string()).into()),
        },
        None => futures::future::pending().await,
    }
}

async fn drain_webhook(task: WebhookTask) {
    if let Some(handle) = task {
        if !handle.is_finished() {
            tokio::time::sleep(WEBHOOK_DRAIN).await;
        }
        handle.abort();
    }
}

/// Leadership given up on shutdown: this replica stops counting itself leader first (nothing it
/// still runs may write), then frees the Lease for the others.
async fn step_down(client: &Client, ctx: &Context) {
    if !ctx.config().leader_election {
        return;
    }
    ctx.leadership().resign();
    let c = ctx.config();
    match election::release(client.clone(), &c.leader_namespace, &c.identity).await {
        Ok(true) => tracing::info!("shutting down: leadership released"),
        Ok(false) => tracing::info!("shutting down: was not leading"),
        Err(err) => {
            tracing::warn!(%err, "shutting down: releasing leadership failed; it expires by itself")
        }
    }
}

/// A `()` each time this replica becomes leader: every run is reconciled then.
fn leadership_gained(rx: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

async fn run_election(client: Client, ctx: Arc<Context>) -> Error {
    if !ctx.config().leader_election {
        return futures::future::pending().await;
    }
    let c = ctx.config();
    let result = election::run(
        client,
        &c.leader_namespace,
        &c.identity,
        c.leader_lease,
        ctx.leadership(),
    )
    .await;
    Error::Election(format!("{result:?}"))
}

async fn serve_admin(ctx: Arc<Context>, ready: Arc<AtomicBool>) -> Result<(), Error> {
    match ctx.config().admin_addr {
        Some(addr) => Ok(admin::serve(
            addr,
            AdminState {
                ctx: ctx.clone(),
                ready,
            },
        )
        .await?),
        None => futures::future::pending().await,
    }
}

/// Ready once the caches are synced and, with a webhook, its certificate is served (the
/// Service sends admission reviews only to ready replicas).
async fn mark_ready(
    ctx: Arc<Context>,
    ready: Arc<AtomicBool>,
    mut webhook_loaded: tokio::sync::watch::Receiver<bool>,
) {
    // Not the run store: the Controller's applier already waits on it, and a second waiter
    // would never be woken.
    let synced = async {
        ctx.pod_cache().wait_until_ready().await.ok()?;
        ctx.lease_cache().wait_until_ready().await.ok()?;
        webhook_loaded
            .wait_for(|loaded| *loaded)
            .await
            .ok()
            .map(|_| ())
    };
    if synced.await.is_some() {
        ready.store(true, Ordering::Release);
    }
}

async fn reconcile(run: Arc<AgentRun>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = Instant::now();
    let mut result = reconcile_run(&run, &ctx)
        .instrument(crate::run_span!("reconcile", &run))
        .await;
    if result.is_ok() {
        match turn::publish_thread_status(&ctx, &run).await {
            // The thread's pod started ahead is removed when the idle thread stops wanting
            // it: a run that would wait for a change looks again then.
            Ok(Some(again)) if result.as_ref().is_ok_and(|r| *r == Requeue::await_change()) => {
                result = Ok(Requeue::requeue(again));
            }
            Ok(_) | Err(Error::NotLeader) => {}
            Err(err) => {
                tracing::warn!(run = %run.name_any(), %err, "writing its thread's status failed")
            }
        }
    }
    ctx.metrics().reconciled(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.reconcile_passed(&run);
    }
    result
}

/// observe → decide → apply; on a conflict the run is re-read and decided again.
async fn reconcile_run(run: &AgentRun, ctx: &Context) -> Result<Requeue, Error> {
    if !ctx.leadership().is_leader(Instant::now()) {
        return Ok(Requeue::await_change());
    }
    if !ctx.synced().load(Ordering::Acquire) {
        return Ok(Requeue::requeue(SOON));
    }
    if run.resource_version().is_some()
        && ctx.memory_of(run).replaced_version == run.resource_version()
    {
        // Our own status write has not reached the cache yet; its watch event will bring
        // the run back (the requeue is only a safety net).
        return Ok(Requeue::requeue(SOON));
    }
    // A run kept in PostgreSQL is guarded by its finalizer before anything else is done for
    // it, and while it is deleted nothing else is.
    if let Some(applied) = ledger_rows::tend(ctx, run).await? {
        return Ok(match applied {
            Applied::Done => Requeue::await_change(),
            Applied::Requeue | Applied::Conflict => Requeue::requeue(SOON),
        });
    }
    let mut run = run.clone();
    for _ in 0..MAX_REDECIDE {
        let decision = decide(&observe(ctx, &run, Instant::now()));
        tracing::debug!(run = %run.name_any(), action = ?decision.action, "decided");
        match apply(ctx, &run, &decision.action).await? {
            Applied::Conflict => match ctx.runs_api(&run).get_opt(&run.name_any()).await? {
                Some(fresh) => run = fresh,
                None => return Ok(Requeue::await_change()),
            },
            Applied::Requeue => return Ok(Requeue::requeue(SOON)),
            Applied::Done if decision.action != Action::Nothing => {
                return Ok(Requeue::requeue(AFTER_WRITE));
            }
            Applied::Done => {
                return Ok(decision
                    .requeue
                    .map_or_else(Requeue::await_change, Requeue::requeue));
            }
        }
    }
    Ok(Requeue::requeue(SOON))
}

/// A failed reconcile is tried again after a backoff by the class of its error, doubling with
/// each failure of the run in a row ([`ErrorClass::backoff`]).
fn error_policy(run: Arc<AgentRun>, err: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics().error(err.label());
    if matches!(err, Error::NotLeader) {
        return Requeue::await_change();
    }
    let class = ErrorClass::of(err);
    let wait = class.backoff(ctx.reconcile_failed(&run));
    tracing::warn!(run = %run.name_any(), %err, ?class, ?wait, "reconcile failed");
    Requeue::requeue(wait)
}
