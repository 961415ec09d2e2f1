//! A run's `baton.dev/traceparent` annotation, through the real API server and baton's webhook:
//! given at creation, it is kept; a later change is refused naming it (every attempt of the
//! run is in the trace it names), while other annotations stay free to edit.

use crate::webhook::{ALICE, Watched, as_user, create_as, refusal};
use baton::crd::v1alpha1::AgentRun;
use baton::traces::TRACEPARENT_ANNOTATION;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn a_runs_traceparent_is_kept_as_given_at_creation() {
    let w = Watched::new("trace-annotation").await;
    let mut run = AgentRun::builder("traced").input("hi").build();
    run.annotations_mut()
        .insert(TRACEPARENT_ANNOTATION.into(), CALLER.into());
    create_as(ALICE, &w.ns.name, &run)
        .await
        .expect("a run created with a caller's traceparent");
    let runs: Api<AgentRun> = Api::namespaced(as_user(ALICE).await, &w.ns.name);
    let annotate = |value: serde_json::Value| {
        let runs = runs.clone();
        async move {
            let patch = json!({"metadata": {"annotations": value}});
            runs.patch("traced", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for changed in [
        json!({TRACEPARENT_ANNOTATION: other}),
        json!({TRACEPARENT_ANNOTATION: null}),
    ] {
        let refused = refusal(annotate(changed).await);
        assert!(
            refused.contains("metadata.annotations[baton.dev/traceparent]"),
            "{refused}"
        );
    }
    annotate(json!({"team": "search"}))
        .await
        .expect("another annotation is the user's to edit");
    let kept = runs.get("traced").await.unwrap();
    assert_eq!(
        kept.annotations()
            .get(TRACEPARENT_ANNOTATION)
            .map(String::as_str),
        Some(CALLER)
    );
    w.cleanup().await;
}
