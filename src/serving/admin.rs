//! What every baton process answers besides its own routes: `/livez`, `/readyz`, and
//! `/metrics` in OpenMetrics text, rendered one way from the process's own registry.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

/// The worker's default `--admin-addr` (metrics, probes): every interface, [`WORKER_ADMIN_PORT`].
/// The controller declares the port as the worker pod's `metrics` port, so both sides read it
/// here.
pub const WORKER_ADMIN_ADDR: &str = "0.0.0.0:9090";
pub const WORKER_ADMIN_PORT: u16 = 9090;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The OpenMetrics text of every metric in `registry`.
pub fn openmetrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; a metric that fails to encode leaves nothing half said.
    if encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// `text` (from [`openmetrics_text`]) as the answer to `/metrics`.
pub fn metrics_response(text: String) -> Response {
    ([(CONTENT_TYPE, OPENMETRICS)], text).into_response()
}

/// When a process is ready to serve: always (`baton server`), or once a flag is set (the
/// controller's caches synced, a worker holding its run), with what `/readyz` says until then.
#[derive(Clone)]
pub struct Ready {
    flag: Option<Arc<AtomicBool>>,
    not_yet: &'static str,
}

impl Ready {
    pub fn always() -> Self {
        Self {
            flag: None,
            not_yet: "",
        }
    }

    pub fn once(flag: Arc<AtomicBool>, not_yet: &'static str) -> Self {
        Self {
            flag: Some(flag),
            not_yet,
        }
    }

    fn answer(&self) -> (StatusCode, &'static str) {
        match &self.flag {
            Some(flag) if !flag.load(Ordering::Relaxed) => {
                (StatusCode::SERVICE_UNAVAILABLE, self.not_yet)
            }
            _ => (StatusCode::OK, "ok"),
        }
    }
}

/// `/livez` (the process answers) and `/readyz` (as `ready` says).
pub fn probes<S>(ready: Ready) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(move || async move { ready.answer() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_says_why_until_the_flag_is_set() {
        let flag = Arc::new(AtomicBool::new(false));
        let ready = Ready::once(flag.clone(), "caches not synced");
        assert_eq!(
            ready.answer(),
            (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
        );
        flag.store(true, Ordering::Relaxed);
        assert_eq!(ready.answer(), (StatusCode::OK, "ok"));
        assert_eq!(Ready::always().answer(), (StatusCode::OK, "ok"));
    }
}
