//! The worker pods of a namespace sampled while runs go on through an upgrade (the upgrade
//! lane, `make bench-upgrade`): the images each run's workers ran, and when a worker of the
//! previous release's image was last seen alive.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::*;

/// Every worker pod of the namespace seen while the runs go on: each run's images, and when
/// a pod of the previous release's image was last seen alive.
pub struct ImageSampler {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Seen {
    images: BTreeMap<String, BTreeSet<String>>,
    old_last_seen: Option<Instant>,
}

impl ImageSampler {
    pub fn start(env: &NodeEnv) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let pods = env.pods();
        let into = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&ListParams::default()).await {
                    record(&mut into.lock().unwrap(), &list.items);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { seen, task }
    }

    /// Stops sampling; when a worker of the old image was last seen alive.
    pub fn stop(&self) -> Option<Instant> {
        self.task.abort();
        self.seen.lock().unwrap().old_last_seen
    }

    /// Whether a worker of `run` ran this tree's image ([`IMAGE`]).
    pub fn ran_new(&self, run: &str) -> bool {
        self.images(run).contains(IMAGE)
    }

    /// Whether a worker of `run` ran the previous release's image ([`PREVIOUS_TAG`]).
    pub fn ran_previous(&self, run: &str) -> bool {
        self.images(run).iter().any(|image| is_previous(image))
    }

    /// The images `run`'s workers ran.
    pub fn images(&self, run: &str) -> BTreeSet<String> {
        let seen = self.seen.lock().unwrap();
        seen.images.get(run).cloned().unwrap_or_default()
    }
}

fn record(seen: &mut Seen, pods: &[k8s_openapi::api::core::v1::Pod]) {
    for pod in pods {
        let name = pod.name_any();
        let Some((run, _)) = name.rsplit_once("-w") else {
            continue;
        };
        let image = baton::controller::pod::pod_image(pod);
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let alive = matches!(phase.as_deref(), Some("Pending" | "Running"));
        if alive && is_previous(&image) {
            seen.old_last_seen = Some(Instant::now());
        }
        seen.images
            .entry(run.to_string())
            .or_default()
            .insert(image);
    }
}

fn is_previous(image: &str) -> bool {
    image.ends_with(&format!(":{PREVIOUS_TAG}"))
}
