//! Wiring: the watches, the kube-runtime `Controller`, the election and the admin server, and
//! the reconcile loop (observe → decide → apply, re-deciding on conflict).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use kube::runtime::controller::{self, Action as Requeue, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use super::admin::{self, AdminState};
use super::apply::apply;
use super::backoff::ErrorClass;
use super::context::{Caches, Context};
use super::decide::{Action, decide};
use super::election::{self, Leadership};
use super::events::{self, Queued};
use super::observe::observe;
use super::turn;
use super::writer::Applied;
use super::{CONTROLLER_NAME, Config, Error};
use crate::crd::v1alpha1::{AgentRun, AgentThread};
use crate::crd::{MANAGED_BY_LABEL, controlling_run};
use crate::fence::run_of_lease;

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

type Events = Option<(
    tokio::sync::mpsc::Receiver<Queued>,
    crate::events::Publisher,
)>;

type Watch<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// The watches besides the runs': each keeps its cache, and a change wakes the runs it
/// concerns (a pod's, a Lease's run; a thread's turns).
struct Watches {
    pods: Watch<Pod>,
    leases: Watch<Lease>,
    threads: Watch<AgentThread>,
}

type Built = (
    Arc<Context>,
    Controller<AgentRun>,
    Watches,
    futures::channel::mpsc::UnboundedReceiver<reflector::ObjectRef<AgentRun>>,
    Events,
);

fn build(client: Client, config: Config) -> Built {
    let wc = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}=baton"));
    let (runs, run_writer) = reflector::store();
    let (pods, pod_writer) = reflector::store();
    let (leases, lease_writer) = reflector::store();
    let (threads, thread_writer) = reflector::store();
    let (wake, wake_rx) = futures::channel::mpsc::unbounded();
    let leadership = if config.leader_election {
        Leadership::elected()
    } else {
        Leadership::always()
    };
    let (events, queue) = event_queue(&client, &config);
    let caches = Caches {
        runs: runs.clone(),
        pods,
        leases,
        threads,
    };
    let ctx = Context::new(
        client.clone(),
        config,
        caches,
        leadership,
        events,
        wake,
        false,
    );
    let ctx = Arc::new(ctx);
    // The caches keep only what the controller reads: no managedFields anywhere (a large
    // share of every object), and of a pod only its phase, owner, labels and worker image.
    let pruning = ctx.clone();
    let run_events = reflector(
        run_writer,
        watcher(
            scoped::<AgentRun>(&client, ctx.config()),
            watcher::Config::default(),
        )
        .modify(slim_run),
    )
    .inspect_ok(move |event| prune_memory(&pruning, event))
    .applied_objects();
    let controller = Controller::for_stream(run_events, runs)
        .with_config(controller::Config::default().concurrency(ctx.config().concurrency));
    let pods = watcher(scoped::<Pod>(&client, ctx.config()), wc.clone()).modify(slim_pod);
    let pod_events = reflector(pod_writer, pods)
        .default_backoff()
        .touched_objects()
        .boxed();
    let lease_events = lease_events(&client, ctx.clone(), lease_writer, wc);
    let thread_events = reflector(
        thread_writer,
        watcher(
            scoped::<AgentThread>(&client, ctx.config()),
            watcher::Config::default(),
        )
        .modify(strip_metadata),
    )
    .default_backoff()
    .touched_objects()
    .boxed();
    let watches = Watches {
        pods: pod_events,
        leases: lease_events,
        threads: thread_events,
    };
    (ctx, controller, watches, wake_rx, queue)
}

/// A thread's change wakes its turns (a turn that waits on its thread's policy, the thread's
/// status that follows them).
fn turns_of_thread(
    ctx: Arc<Context>,
) -> impl Fn(AgentThread) -> Vec<reflector::ObjectRef<AgentRun>> + Send + Sync + 'static {
    move |thread| {
        let ns = thread.namespace().unwrap_or_default();
        ctx.run_cache()
            .state()
            .iter()
            .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
            .filter(|r| r.spec.thread.as_deref() == Some(thread.name_any().as_str()))
            .map(|r| reflector::ObjectRef::from_obj(r.as_ref()))
            .collect()
    }
}

/// The run Leases' watch: each change sighted as it arrives (deletions are not sightings).
fn lease_events(
    client: &Client,
    ctx: Arc<Context>,
    writer: reflector::store::Writer<Lease>,
    wc: watcher::Config,
) -> std::pin::Pin<Box<dyn Stream<Item = Result<Lease, watcher::Error>> + Send>> {
    reflector(
        writer,
        watcher(scoped::<Lease>(client, ctx.config()), wc).modify(strip_metadata),
    )
    .default_backoff()
    .inspect_ok(move |event| match event {
        watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
            sight_on_arrival(&ctx, lease)
        }
        _ => {}
    })
    .touched_objects()
    .boxed()
}

/// The Event queue the reconciles fill and its publisher (none when Events are off).
fn event_queue(
    client: &Client,
    config: &Config,
) -> (Option<tokio::sync::mpsc::Sender<Queued>>, Events) {
    if !config.events {
        return (None, None);
    }
    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: Some(config.identity.clone()),
    };
    let publisher = crate::events::Publisher::new(client.clone(), reporter);
    let (tx, rx) = events::queue();
    (Some(tx), Some((rx, publisher)))
}

/// The controller's memory of a run goes with the run: dropped when the watch sees it deleted
/// (by anyone: a user, the garbage collector, a TTL), and, after a re-list, for every run the
/// list no longer has.
fn prune_memory(ctx: &Context, event: &watcher::Event<AgentRun>) {
    match event {
        watcher::Event::Delete(run) => ctx.forget_deleted(run),
        watcher::Event::InitDone => ctx.forget_uncached(),
        _ => {}
    }
}

/// A run Lease change is seen when its watch event arrives, not when the run is next
/// reconciled: a busy reconcile queue must not push expiry deadlines later. Only a Lease of a
/// run the controller knows is sighted: a deleted run's Lease (until the garbage collector
/// takes it) must not bring its memory back. The run is the one the Lease's name gives, and
/// its controller reference must agree: a worker may edit its own Lease's ownerReferences,
/// and must not keep another run "alive" that way.
fn sight_on_arrival(ctx: &Context, lease: &Lease) {
    let name = lease.name_any();
    let (Some(run), Some(owner)) = (run_of_lease(&name), controlling_run(lease)) else {
        return;
    };
    let ns = lease.namespace().unwrap_or_default();
    if owner.name != run || !ctx.caches_run(&ns, run, Some(owner.uid.as_str())) {
        return;
    }
    let key = (ns, run.to_string());
    let now = Instant::now();
    ctx.sight(key, owner.uid.as_str(), lease, now);
}

fn strip_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A run as the controller decides on it: the user's texts (the input, later inputs, the
/// system prompt, approval reasons) are the worker's to read, not the controller's, and are
/// most of a large spec. Only the number of inputs is kept: a new one wakes the run. (Status
/// writes go to the status subresource, which never takes a spec from its request.)
fn slim_run(run: &mut AgentRun) {
    strip_metadata(run);
    let spec = &mut run.spec;
    spec.input.clear();
    spec.inputs.iter_mut().for_each(String::clear);
    if let Some(agent) = spec.agent.as_mut() {
        agent.system_prompt = None;
    }
    spec.approvals.iter_mut().for_each(|a| a.reason = None);
}

/// A worker pod as the controller needs it: metadata, containers' names and images, phase.
fn slim_pod(pod: &mut Pod) {
    strip_metadata(pod);
    if let Some(spec) = pod.spec.take() {
        let containers = spec
            .containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                image: c.image,
                ..Container::default()
            })
            .collect();
        pod.spec = Some(PodSpec {
            containers,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        // What `observe::classify_pod` reads: containers that will never start or that
        // started, and the scheduler's refusal.
        let telling = |all: Option<Vec<ContainerStatus>>| {
            all.map(|all| {
                all.into_iter()
                    .filter(|c| {
                        super::observe::unstartable(c).is_some() || super::observe::has_started(c)
                    })
                    .collect()
            })
        };
        let conditions = status.conditions.map(|all| {
            all.into_iter()
                .filter(|c| c.type_ == "PodScheduled" && c.status == "False")
                .collect()
        });
        pod.status = Some(PodStatus {
            phase: status.phase,
            container_statuses: telling(status.container_statuses),
            init_container_statuses: telling(status.init_container_statuses),
            conditions,
            ..PodStatus::default()
        });
    }
}

fn scoped<K>(client: &Client, config: &Config) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
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
    let result = reconcile_run(&run, &ctx).await;
    if result.is_ok() {
        match turn::publish_thread_status(&ctx, &run).await {
            Ok(()) | Err(Error::NotLeader) => {}
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
