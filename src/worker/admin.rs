//! The worker's admin HTTP server: `/metrics` (OpenMetrics text), `/livez`, `/readyz`.
//!
//! Many workers may share one host (the worker tests run them as processes), so a busy port is
//! not an error: the worker logs a warning and runs without the endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use tracing::warn;

use super::metrics::WorkerMetrics;
use crate::serving::admin::{Ready, metrics_response, probes};
use crate::serving::{Stop, Tls, serve};

/// Where the admin server listens, if anywhere (`none` or empty disables it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminAddr(pub Option<SocketAddr>);

impl std::str::FromStr for AdminAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("none") {
            return Ok(AdminAddr(None));
        }
        s.parse()
            .map(|addr| AdminAddr(Some(addr)))
            .map_err(|_| format!("{s:?} is not host:port (or `none` to disable)"))
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    pub metrics: Arc<WorkerMetrics>,
    /// Set once the attempt holds the run and has replayed its ledger.
    pub ready: Arc<AtomicBool>,
}

/// Binds `addr` and serves in the background. A port that cannot be bound is logged and
/// skipped: the run matters more than its metrics.
pub async fn start(addr: AdminAddr, state: AdminState) -> Option<tokio::task::JoinHandle<()>> {
    let addr = addr.0?;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(err) => {
            warn!(%addr, error = %err, "admin server not started: metrics and probes are off");
            return None;
        }
    };
    Some(tokio::spawn(async move {
        let app = router(state);
        let served = serve("admin", listener, app, Tls::Plain, Stop::WithTheProcess).await;
        if let Err(err) = served {
            warn!(error = %err, "admin server stopped");
        }
    }))
}

/// The routes.
pub fn router(state: AdminState) -> Router {
    let ready = Ready::once(state.ready.clone(), "not holding the run yet");
    Router::new()
        .route("/metrics", get(metrics))
        .merge(probes(ready))
        .with_state(state)
}

async fn metrics(State(state): State<AdminState>) -> Response {
    metrics_response(state.metrics.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_and_empty_disable_the_admin_server() {
        assert_eq!("none".parse::<AdminAddr>(), Ok(AdminAddr(None)));
        assert_eq!("".parse::<AdminAddr>(), Ok(AdminAddr(None)));
        let addr: AdminAddr = crate::serving::admin::WORKER_ADMIN_ADDR.parse().unwrap();
        assert_eq!(
            addr.0.map(|a| a.port()),
            Some(crate::serving::admin::WORKER_ADMIN_PORT)
        );
        assert!("localhost".parse::<AdminAddr>().is_err());
    }

    #[tokio::test]
    async fn a_busy_port_is_skipped_not_fatal() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = AdminAddr(Some(taken.local_addr().unwrap()));
        let state = AdminState {
            metrics: Arc::new(WorkerMetrics::new()),
            ready: Arc::default(),
        };
        assert!(start(addr, state.clone()).await.is_none());
        assert!(start(AdminAddr(None), state).await.is_none());
    }

    #[tokio::test]
    async fn serves_metrics_and_probes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let state = AdminState {
            metrics: Arc::new(WorkerMetrics::new()),
            ready: Arc::default(),
        };
        let server = start(AdminAddr(Some(addr)), state.clone()).await;
        assert!(server.is_some());
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/livez").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        state
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        let metrics = get("/metrics").await;
        assert!(
            metrics.contains("baton_worker_ledger_bytes_total"),
            "{metrics}"
        );
    }
}
