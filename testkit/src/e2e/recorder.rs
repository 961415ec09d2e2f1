//! A watch that records every ledger segment as it first appears (client clock).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerEvent, LedgerSegment};
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

/// A segment as first seen.
#[derive(Clone, Debug)]
pub struct Seen {
    pub rv: String,
    pub spec: serde_json::Value,
    pub at: Instant,
    pub run: String,
    pub fence: i64,
    pub seq: i64,
    pub events: Vec<LedgerEvent>,
}

#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub segments: BTreeMap<String, Seen>,
    /// Segments seen again with another resourceVersion or content.
    pub updated: BTreeSet<String>,
}

/// Watches the namespace's LedgerSegments and records each one as first seen (client clock).
pub struct Recorder {
    state: Arc<Mutex<Recorded>>,
    task: JoinHandle<()>,
}

impl Recorder {
    pub fn start(client: Client, ns: &str) -> Self {
        let state = Arc::new(Mutex::new(Recorded::default()));
        let api: Api<LedgerSegment> = Api::namespaced(client, ns);
        let out = state.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .touched_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let Ok(seg) = item else { continue };
                let name = seg.name_any();
                let rv = seg.resource_version().unwrap_or_default();
                let spec = serde_json::to_value(&seg.spec).unwrap();
                let mut st = out.lock().unwrap();
                match st.segments.get(&name) {
                    Some(seen) if seen.rv != rv || seen.spec != spec => {
                        st.updated.insert(name);
                    }
                    Some(_) => {}
                    None => {
                        st.segments.insert(
                            name,
                            Seen {
                                rv,
                                spec,
                                at: Instant::now(),
                                run: seg.spec.run.clone(),
                                fence: seg.spec.fence.get(),
                                seq: seg.spec.seq,
                                events: seg.spec.events.clone(),
                            },
                        );
                    }
                }
            }
        });
        Self { state, task }
    }

    pub fn snapshot(&self) -> Recorded {
        self.state.lock().unwrap().clone()
    }

    /// When the first segment of `run` with a fence above `fence` that starts an attempt was
    /// first seen.
    pub fn attempt_started_after(&self, run: &str, fence: i64) -> Option<(Instant, i64)> {
        self.state
            .lock()
            .unwrap()
            .segments
            .values()
            .filter(|s| s.run == run && s.fence > fence)
            .filter(|s| {
                s.events
                    .iter()
                    .any(|e| matches!(e, LedgerEvent::AttemptStarted { .. }))
            })
            .map(|s| (s.at, s.fence))
            .min_by_key(|(at, _)| *at)
    }

    /// Waits (up to `timeout`) for [`attempt_started_after`](Self::attempt_started_after).
    pub async fn wait_attempt_started(
        &self,
        run: &str,
        fence: i64,
        timeout: Duration,
    ) -> (Instant, i64) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.attempt_started_after(run, fence) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no attempt of {run} after fence {fence} started within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (up to `timeout`) for a segment of `run` holding an event `wanted` accepts;
    /// returns when it was first seen.
    pub async fn wait_event(
        &self,
        run: &str,
        what: &str,
        wanted: impl Fn(&LedgerEvent) -> bool,
        timeout: Duration,
    ) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self
                .state
                .lock()
                .unwrap()
                .segments
                .values()
                .filter(|s| s.run == run && s.events.iter().any(&wanted))
                .map(|s| s.at)
                .min();
            if let Some(at) = seen {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "{run}: no {what} in its ledger within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}
