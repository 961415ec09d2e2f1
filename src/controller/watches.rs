//! The controller's watches and caches: runs (slimmed to what it decides on), pods, run and
//! thread admission Leases, threads; what each change wakes; the controller's memory dropped
//! with a deleted run.

use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::context::{Caches, Context};
use super::election::Leadership;
use super::events::{self, Queued};
use super::{CONTROLLER_NAME, Config};
use crate::crd::v1alpha1::{AgentRun, AgentThread};
use crate::crd::{MANAGED_BY_LABEL, controlling_run};
use crate::fence::run_of_lease;

pub(super) type Events = Option<(
    tokio::sync::mpsc::Receiver<Queued>,
    crate::events::Publisher,
)>;

pub(super) type Watch<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// The watches besides the runs': each keeps its cache, and a change wakes the runs it
/// concerns (a pod's, a Lease's run; a thread's turns).
pub(super) struct Watches {
    pub(super) pods: Watch<Pod>,
    pub(super) leases: Watch<Lease>,
    pub(super) threads: Watch<AgentThread>,
}

pub(super) type Built = (
    Arc<Context>,
    Controller<AgentRun>,
    Watches,
    futures::channel::mpsc::UnboundedReceiver<reflector::ObjectRef<AgentRun>>,
    Events,
);

pub(super) fn build(client: Client, config: Config) -> Built {
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
    .inspect_ok(move |event| {
        prune_memory(&pruning, event);
        recount_thread(&pruning, event);
    })
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
        .modify(slim_thread),
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

/// A thread's change wakes its turns (those that joined it) that have not ended: a turn that
/// waits on its thread's policy, or whose reconcile writes the thread's status. A turn that
/// has not joined waits on nothing of its thread: it joins at its next reconcile.
pub(super) fn turns_of_thread(
    ctx: Arc<Context>,
) -> impl Fn(AgentThread) -> Vec<reflector::ObjectRef<AgentRun>> + Send + Sync + 'static {
    move |thread| {
        let (ns, uid) = (thread.namespace().unwrap_or_default(), thread.uid());
        super::turn::turns_of(&ctx, &ns, &thread.name_any(), &uid.unwrap_or_default())
            .iter()
            // Ended turns wait on nothing: a long thread's change wakes only its few live ones.
            .filter(|r| !r.status.as_ref().is_some_and(|s| s.phase.is_terminal()))
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
) -> Watch<Lease> {
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

/// A deleted turn leaves its thread's status: written again at once (no reconcile of the turn
/// will), from the cache, which no longer holds it.
fn recount_thread(ctx: &Arc<Context>, event: &watcher::Event<AgentRun>) {
    let watcher::Event::Delete(run) = event else {
        return;
    };
    if run.thread_owner().is_none() {
        return;
    }
    let (ctx, run) = (ctx.clone(), run.clone());
    tokio::spawn(async move {
        match super::turn::publish_thread_status(&ctx, &run).await {
            Ok(_) | Err(super::Error::NotLeader) => {}
            Err(err) => {
                tracing::warn!(run = %run.name_any(), %err, "writing its thread's status failed")
            }
        }
    });
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

/// A thread as the controller decides on it: its turns' policies (`onBusy`, `context`); its
/// status is written through the status subresource, which keeps the stored spec. Its agent,
/// worker and budget (up to the whole 256 KiB a spec may be) are read from the API server by
/// the join that copies them, never from the cache.
fn slim_thread(thread: &mut AgentThread) {
    strip_metadata(thread);
    let spec = &mut thread.spec;
    spec.agent = Default::default();
    spec.worker = Default::default();
    spec.budget = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_cache_keeps_its_policies_and_not_its_agent() {
        let mut thread: AgentThread = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentThread",
            "metadata": {"name": "t"},
            "spec": {
                "agent": {"model": {"provider": "scripted"}, "systemPrompt": "x".repeat(200_000)},
                "worker": {"image": "team/agent:1"},
                "onBusy": "Reject",
                "context": {"maxHistoryTokens": 1000, "onOverflow": "DropOldestTurns"}
            }
        }))
        .unwrap();
        let policies = (thread.spec.on_busy, thread.spec.context.clone());
        slim_thread(&mut thread);
        assert_eq!((thread.spec.on_busy, thread.spec.context.clone()), policies);
        assert_eq!(thread.spec.agent.system_prompt, None);
        assert_eq!(thread.spec.worker.image, None);
        assert!(serde_json::to_string(&thread).unwrap().len() < 1000);
    }
}
