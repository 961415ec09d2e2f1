//! The W3C `traceparent` header of a request that creates a run: the run continues the
//! client's trace. It is written on the run as its `baton.dev/traceparent` annotation, the
//! same a `kubectl apply` can set (`crate::traces`), with the caller's own credentials, like
//! the rest of the run. A header the W3C format does not take is ignored, as Trace Context
//! asks of a receiver: the run then starts a trace of its own.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use kube::ResourceExt;

use crate::crd::v1alpha1::AgentRun;
use crate::traces::{TRACEPARENT_ANNOTATION, parse_traceparent};

/// A request's well-formed `traceparent`, if it sent one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traceparent(Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Traceparent {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok());
        Ok(Traceparent::from_header(header))
    }
}

impl Traceparent {
    /// Pure: the header's value, kept only when it is a W3C `traceparent`.
    pub fn from_header(value: Option<&str>) -> Traceparent {
        let value = value
            .map(str::trim)
            .filter(|v| parse_traceparent(v).is_some());
        Traceparent(value.map(str::to_string))
    }

    /// `run`, in the client's trace if the request named one.
    pub fn onto(&self, mut run: AgentRun) -> AgentRun {
        if let Some(value) = &self.0 {
            run.annotations_mut()
                .insert(TRACEPARENT_ANNOTATION.into(), value.clone());
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_w3c_traceparent_reaches_the_run() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let run = || {
            let spec = serde_json::from_value(serde_json::json!({"input": "hi"})).unwrap();
            AgentRun::new("r", spec)
        };
        let continued = Traceparent::from_header(Some(good)).onto(run());
        assert_eq!(
            continued
                .annotations()
                .get(TRACEPARENT_ANNOTATION)
                .map(String::as_str),
            Some(good)
        );
        for ignored in [
            None,
            Some(""),
            Some("00-zz-00f067aa0ba902b7-01"),
            Some("a\nb"),
        ] {
            let run = Traceparent::from_header(ignored).onto(run());
            assert!(
                run.annotations().get(TRACEPARENT_ANNOTATION).is_none(),
                "{ignored:?}"
            );
        }
    }
}
