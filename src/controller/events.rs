//! Events about runs, published off the reconcile path through a bounded queue: a claim never
//! waits for its Event, and when the API server falls behind, Events are dropped and counted
//! rather than piling up in memory and then competing with later claims for the API server.
//!
//! They are written as `events.k8s.io/v1` objects, one create each, and nothing is kept after.
//! (kube's `Recorder` keeps every Event it published for 6 minutes, to count repeats into a
//! series. Ours never repeat: each is about one claim of one fence, and its key holds the
//! run's resourceVersion. At 5,000 runs its 10,000 cached Events were ~20 MiB of the
//! controller's memory.)

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::metrics::Metrics;

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

/// Writes Events for one reporter.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    reporter: Reporter,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let object = event_object(event, regarding, &self.reporter, Timestamp::now());
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &object)
            .await
            .map(|_| ())
    }
}

/// The Event object for `event` about `regarding`, as of `now`. Its name is the object's
/// name and the time in hex nanoseconds, as client-go names Events.
pub fn event_object(
    event: &Event,
    regarding: &ObjectReference,
    reporter: &Reporter,
    now: Timestamp,
) -> K8sEvent {
    let subject = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!("{subject}.{:x}", now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        reason: Some(event.reason.clone()),
        action: Some(event.action.clone()),
        note: event.note.clone(),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        ..K8sEvent::default()
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

    #[test]
    fn an_event_names_its_run_the_time_and_its_reporter() {
        let (mut event, _) = an_event();
        event.type_ = EventType::Warning;
        event.note = Some("attempt 2 claimed for pod r-w2 (LeaseExpired)".into());
        let run = ObjectReference {
            kind: Some("AgentRun".into()),
            name: Some("r".into()),
            namespace: Some("ns".into()),
            ..ObjectReference::default()
        };
        let reporter = Reporter {
            controller: "baton-controller".into(),
            instance: Some("pod-a".into()),
        };
        let now = Timestamp::from_nanosecond(0x1234).unwrap();
        let object = event_object(&event, &run, &reporter, now);
        assert_eq!(object.metadata.name.as_deref(), Some("r.1234"));
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(object.type_.as_deref(), Some("Warning"));
        assert_eq!(object.reason.as_deref(), Some("Claimed"));
        assert_eq!(object.note, event.note);
        assert_eq!(object.regarding, Some(run));
        assert_eq!(
            object.reporting_controller.as_deref(),
            Some("baton-controller")
        );
        assert_eq!(object.reporting_instance.as_deref(), Some("pod-a"));
        assert_eq!(object.event_time, Some(MicroTime(now)));
    }
}
