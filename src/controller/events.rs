//! Events about runs, published off the reconcile path through a bounded queue: a claim never
//! waits for its Event, and when the API server falls behind, Events are dropped and counted
//! rather than piling up in memory and then competing with later claims for the API server.
//! They are written by [`crate::events::Publisher`], which keeps nothing after.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Event;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::metrics::Metrics;
use crate::events::Publisher;

/// An Event and the run it is about.
pub type Queued = (Event, ObjectReference);

/// How many Events may wait to be published: a burst of 5,000 runs created at once queues
/// ~2,000 of their start Events while the API server is busy starting them (each a few hundred
/// bytes held here), and they are published late rather than dropped.
const EVENT_QUEUE: usize = 8192;
/// How many Events are published at once: enough to keep up with a burst of claims (a start
/// of thousands of runs makes one Event each) so that none is still queued minutes later.
const EVENT_PUBLISHERS: usize = 8;

/// The queue's two ends. The bound holds however many times the sender is cloned (a futures
/// channel grants every sender clone a slot of its own, which made the old queue unbounded).
pub fn queue() -> (Sender<Queued>, Receiver<Queued>) {
    channel(EVENT_QUEUE)
}

/// Queues `event`, or drops and counts it when the queue is full. The gauge goes up before
/// the send, so a publisher taking the Event at once never drives it below zero.
pub fn enqueue(queue: &Sender<Queued>, metrics: &Metrics, event: Queued) {
    metrics.event_queued();
    if queue.try_send(event).is_err() {
        metrics.event_dequeued();
        metrics.event_dropped();
    }
}

/// Publishes queued Events until every sender is gone.
pub async fn publish(mut queue: Receiver<Queued>, publisher: Publisher, metrics: &Metrics) {
    use futures::StreamExt;
    futures::stream::poll_fn(|cx| queue.poll_recv(cx))
        .for_each_concurrent(EVENT_PUBLISHERS, |(event, reference)| {
            metrics.event_dequeued();
            let publisher = publisher.clone();
            async move {
                if let Err(err) = publisher.publish(&event, &reference).await {
                    tracing::debug!(%err, "publishing an event");
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::events::EventType;

    fn an_event() -> Queued {
        let event = Event {
            type_: EventType::Normal,
            reason: "Claimed".into(),
            note: None,
            action: "Claimed".into(),
            secondary: None,
        };
        (event, ObjectReference::default())
    }

    fn sample(text: &str, name: &str) -> String {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_full_queue_drops_and_counts_even_through_cloned_senders() {
        let metrics = Metrics::new();
        let (tx, _rx) = channel(2);
        for _ in 0..3 {
            enqueue(&tx.clone(), &metrics, an_event());
        }
        let text = metrics.render(std::iter::empty());
        assert_eq!(
            sample(&text, "baton_events_queued"),
            "baton_events_queued 2"
        );
        assert_eq!(
            sample(&text, "baton_events_dropped_total"),
            "baton_events_dropped_total 1"
        );
    }
}
