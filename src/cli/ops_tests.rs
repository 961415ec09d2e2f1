//! Tests of `cli/ops.rs`.
use k8s_openapi::api::core::v1::EventSource;

use super::*;

#[test]
fn describe_shows_only_batons_events() {
    let by = |component: Option<&str>, source: Option<&str>| Event {
        reporting_component: component.map(String::from),
        source: source.map(|s| EventSource {
            component: Some(s.into()),
            ..EventSource::default()
        }),
        ..Event::default()
    };
    assert!(from_baton(&by(Some("baton-controller"), None)));
    assert!(from_baton(&by(Some("baton-worker"), None)));
    assert!(from_baton(&by(Some(""), Some("baton-worker"))));
    assert!(!from_baton(&by(Some("someone-else"), Some("baton-worker"))));
    assert!(!from_baton(&by(None, None)));
}
