//! The admin HTTP server: `/metrics` (Prometheus text), `/livez`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::Context;

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    pub ctx: Arc<Context>,
    /// Set once the watch caches have synced.
    pub ready: Arc<AtomicBool>,
}

/// Serves until the listener fails.
pub async fn serve(addr: SocketAddr, state: AdminState) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server listening");
    crate::listener::serve_plain(listener, app).await
}

async fn metrics(
    State(state): State<AdminState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let runs = state.ctx.run_cache().state();
    state.ctx.metrics().remembered_runs(state.ctx.remembered());
    let body = state.ctx.metrics().render(runs.iter().map(|r| r.as_ref()));
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
}

async fn ready(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}
