//! The runner's table of pods it supervises: the channel to each pod's supervisor task, the
//! process group of its live process, and whether it was detached.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::PodKey;

/// What the watch loop tells a pod's supervisor.
#[derive(Debug)]
pub(crate) enum PodEvent {
    /// The pod object changed (e.g. a deletionTimestamp was set).
    Observed(Box<Pod>),
    /// The pod object is gone from the API.
    Gone,
}

/// Outcome of handing an event to a pod's supervisor.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Forward {
    /// No supervisor was ever started for this pod.
    Unknown,
    /// Its supervisor has finished (the process ended and was reported).
    Finished,
    /// Delivered.
    Sent,
}

struct Slot {
    tx: UnboundedSender<PodEvent>,
    pgid: Option<u32>,
    detached: bool,
    finished: bool,
    task: Option<JoinHandle<()>>,
}

/// The runner's pods. Every lock is held for a map operation only.
#[derive(Default)]
pub(crate) struct Registry {
    slots: Mutex<HashMap<PodKey, Slot>>,
}

impl Registry {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<PodKey, Slot>) -> R) -> R {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut slots)
    }

    /// Records a new supervisor; false when one already exists.
    pub fn insert(&self, key: PodKey, tx: UnboundedSender<PodEvent>) -> bool {
        self.with(|s| {
            if s.contains_key(&key) {
                return false;
            }
            s.insert(
                key,
                Slot {
                    tx,
                    pgid: None,
                    detached: false,
                    finished: false,
                    task: None,
                },
            );
            true
        })
    }

    pub fn set_task(&self, key: &PodKey, task: JoinHandle<()>) {
        self.with(|s| match s.get_mut(key) {
            Some(slot) => slot.task = Some(task),
            None => drop(task),
        })
    }

    pub fn forward(&self, key: &PodKey, event: PodEvent) -> Forward {
        self.with(|s| match s.get(key) {
            None => Forward::Unknown,
            Some(slot) if slot.finished => Forward::Finished,
            Some(slot) => match slot.tx.send(event) {
                Ok(()) => Forward::Sent,
                Err(_) => Forward::Finished,
            },
        })
    }

    pub fn set_pgid(&self, key: &PodKey, pgid: Option<u32>) {
        self.with(|s| {
            if let Some(slot) = s.get_mut(key) {
                slot.pgid = pgid;
            }
        })
    }

    pub fn pgid(&self, key: &PodKey) -> Option<u32> {
        self.with(|s| s.get(key).and_then(|slot| slot.pgid))
    }

    /// Marks a pod detached (nothing is reported for it any more); false if unknown.
    pub fn detach(&self, key: &PodKey) -> bool {
        self.with(|s| s.get_mut(key).map(|slot| slot.detached = true).is_some())
    }

    pub fn is_detached(&self, key: &PodKey) -> bool {
        self.with(|s| s.get(key).is_some_and(|slot| slot.detached))
    }

    pub fn finish(&self, key: &PodKey) {
        self.with(|s| {
            if let Some(slot) = s.get_mut(key) {
                slot.finished = true;
                slot.pgid = None;
            }
        })
    }

    /// Forgets a pod whose supervisor has finished (its object is gone).
    pub fn remove_finished(&self, key: &PodKey) {
        self.with(|s| {
            if s.get(key).is_some_and(|slot| slot.finished) {
                s.remove(key);
            }
        })
    }

    /// Forgets a pod whatever its state (its supervisor gave up before starting anything).
    pub fn remove(&self, key: &PodKey) {
        self.with(|s| s.remove(key));
    }

    pub fn keys(&self) -> Vec<PodKey> {
        self.with(|s| s.keys().cloned().collect())
    }

    /// (pod, process group, detached, finished) for every known pod.
    pub fn list(&self) -> Vec<(PodKey, Option<u32>, bool, bool)> {
        let mut all: Vec<_> = self.with(|s| {
            s.iter()
                .map(|(k, slot)| (k.clone(), slot.pgid, slot.detached, slot.finished))
                .collect()
        });
        all.sort();
        all
    }

    pub fn live_groups(&self) -> Vec<u32> {
        self.with(|s| s.values().filter_map(|slot| slot.pgid).collect())
    }

    pub fn take_tasks(&self) -> Vec<JoinHandle<()>> {
        self.with(|s| s.values_mut().filter_map(|slot| slot.task.take()).collect())
    }
}
