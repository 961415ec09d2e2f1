//! The pod watch loop: every pod event goes to that pod's supervisor, or, for a pod without
//! one, to the pure [`decide`] and the action it names.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use super::PodKey;
use super::handle::Ctx;
use super::pod::{Supervisor, confirm_deletion, report_lost};
use super::registry::{Forward, PodEvent};
use super::status::{Action, decide};

/// Watches the configured pods until the runner shuts down.
pub(crate) async fn watch_pods(ctx: Arc<Ctx>) {
    let api: Api<Pod> = match &ctx.config.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let mut config = watcher::Config::default();
    if let Some(selector) = &ctx.config.label_selector {
        config = config.labels(selector);
    }
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut relisted: Option<HashSet<PodKey>> = None;
    loop {
        let event = tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying"),
            Some(Ok(watcher::Event::Init)) => relisted = Some(HashSet::new()),
            Some(Ok(watcher::Event::InitApply(pod))) => {
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(PodKey::of(&pod));
                }
                on_pod(&ctx, pod);
            }
            Some(Ok(watcher::Event::InitDone)) => {
                // Pods that vanished while the watch was down.
                let seen = relisted.take().unwrap_or_default();
                for key in ctx
                    .registry
                    .keys()
                    .into_iter()
                    .filter(|k| !seen.contains(k))
                {
                    on_gone(&ctx, &key);
                }
            }
            Some(Ok(watcher::Event::Apply(pod))) => on_pod(&ctx, pod),
            Some(Ok(watcher::Event::Delete(pod))) => on_gone(&ctx, &PodKey::of(&pod)),
        }
    }
}

fn on_pod(ctx: &Arc<Ctx>, pod: Pod) {
    let key = PodKey::of(&pod);
    let deleting = pod.metadata.deletion_timestamp.is_some();
    match ctx
        .registry
        .forward(&key, PodEvent::Observed(Box::new(pod.clone())))
    {
        Forward::Sent => return,
        Forward::Finished => {
            // Its process has ended; a deletion that raced the final status still needs confirming.
            if deleting && bound_here(ctx, &pod) {
                let ctx = ctx.clone();
                tokio::spawn(async move { confirm_deletion(&ctx, &pod).await });
            }
            return;
        }
        Forward::Unknown => {}
    }
    match decide(&pod, &ctx.config.node_name) {
        Action::Ignore => {}
        Action::Bind => start(ctx, key, pod, true),
        Action::Start => start(ctx, key, pod, false),
        Action::ConfirmDeletion => {
            let ctx = ctx.clone();
            tokio::spawn(async move { confirm_deletion(&ctx, &pod).await });
        }
        Action::Lost => {
            let ctx = ctx.clone();
            tokio::spawn(async move { report_lost(&ctx, &pod).await });
        }
    }
}

fn bound_here(ctx: &Ctx, pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(ctx.config.node_name.as_str())
}

fn start(ctx: &Arc<Ctx>, key: PodKey, pod: Pod, bind: bool) {
    let (tx, rx) = mpsc::unbounded_channel();
    if !ctx.registry.insert(key.clone(), tx) {
        return;
    }
    let supervisor = Supervisor::new(ctx.clone(), pod, rx);
    let task = tokio::spawn(supervisor.run(bind));
    ctx.registry.set_task(&key, task);
}

fn on_gone(ctx: &Ctx, key: &PodKey) {
    if ctx.registry.forward(key, PodEvent::Gone) != Forward::Sent {
        ctx.registry.remove_finished(key);
    }
}
