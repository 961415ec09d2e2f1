//! Kubernetes Events about runs, written as `events.k8s.io/v1` objects: one create each, and
//! nothing kept after. (kube's `Recorder` keeps every Event it published for 6 minutes, to
//! count repeats into a series. baton's never repeat: each is about one claim of one fence, or
//! one step's unknown effect, and the Recorder's key holds the run's resourceVersion. At
//! 5,000 runs its 10,000 cached Events were ~20 MiB of the controller's memory.)

/// The reporting controller of the controller's Events.
pub const CONTROLLER_NAME: &str = "baton-controller";
/// The reporting controller of a worker's Events.
pub const WORKER_REPORTER: &str = "baton-worker";

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};

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

    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_run_the_time_and_its_reporter() {
        let mut event = Event {
            type_: EventType::Normal,
            reason: "Claimed".into(),
            note: None,
            action: "Claimed".into(),
            secondary: None,
        };
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
