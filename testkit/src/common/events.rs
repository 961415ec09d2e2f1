//! Waiting for an `events.k8s.io/v1` Event about a run: shared by the tests on the API server
//! and on the real node (Events are published off the claim's path, so they may land a little
//! after it).

use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;

/// The first Event in `events` (one namespace's) about run `run` with `reason`, waited for up
/// to `timeout`.
pub async fn wait_event(events: &Api<Event>, run: &str, reason: &str, timeout: Duration) -> Event {
    let deadline = Instant::now() + timeout;
    loop {
        let listed = events
            .list(&ListParams::default())
            .await
            .expect("listing Events");
        let about_run = |e: &&Event| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(run)
                && e.reason.as_deref() == Some(reason)
        };
        if let Some(event) = listed.items.iter().find(about_run) {
            return event.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} Event about {run} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The notes of the Events in `events` (one namespace's) about run `run` with `reason`, as
/// listed now.
#[allow(dead_code)] // node_readers includes this file for `wait_event` alone
pub async fn notes(events: &Api<Event>, run: &str, reason: &str) -> Vec<String> {
    let listed = events
        .list(&ListParams::default())
        .await
        .expect("listing Events");
    listed
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(run))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}
