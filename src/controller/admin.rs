//! The admin HTTP server: `/metrics` (OpenMetrics text), `/livez`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;

use super::Context;
use crate::serving::admin::{Ready, metrics_response, probes};
use crate::serving::{Stop, Tls};

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    pub ctx: Arc<Context>,
    /// Set once the watch caches have synced.
    pub ready: Arc<AtomicBool>,
}

/// Serves until the listener fails.
pub async fn serve(addr: SocketAddr, state: AdminState) -> std::io::Result<()> {
    let ready = Ready::once(state.ready.clone(), "caches not synced");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .merge(probes(ready))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    crate::serving::serve("admin", listener, app, Tls::Plain, Stop::WithTheProcess).await
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let runs = state.ctx.run_cache().state();
    state.ctx.metrics().remembered_runs(state.ctx.remembered());
    metrics_response(state.ctx.metrics().render(runs.iter().map(|r| r.as_ref())))
}
