//! How a listener that stops on a signal stops ([`super::Stop::OnSignal`]: `baton server`).
//!
//! On SIGTERM (Kubernetes deleting its pod: a rollout, a drain) it serves on for [`LINGER`]:
//! the Service stops sending new connections to a terminating pod only a moment after the pod
//! is told, and a request sent meanwhile to a closed port costs its writer a retry, or, once
//! the pod's network is gone, a connection attempt that is never answered. Then it accepts
//! nothing new and gives the requests in flight (a worker's append, a seal) up to [`DRAIN`];
//! streams still open then are cut, and their clients reconnect to another replica with
//! `Last-Event-ID`. Ctrl-C stops at once: a person at a terminal is not a Service.

use std::net::SocketAddr;
use std::time::Duration;

use axum_server::Handle;
use futures::future::BoxFuture;

/// How long a replica told to stop (SIGTERM) serves on as before.
pub const LINGER: Duration = Duration::from_secs(5);
/// How long requests in flight may then take (within the pod's 30 s grace).
pub const DRAIN: Duration = Duration::from_secs(10);

/// Which signal asked the process to stop.
#[derive(Debug, PartialEq, Eq)]
enum Signal {
    Term,
    Interrupt,
}

/// Runs `serving` (served through `handle`) until it ends or a signal stops it, as above.
pub(super) async fn on_signal(
    mut serving: BoxFuture<'static, std::io::Result<()>>,
    handle: Handle<SocketAddr>,
) -> std::io::Result<()> {
    let signal = tokio::select! {
        served = &mut serving => return served,
        signal = signalled() => signal,
    };
    if signal == Signal::Term {
        tracing::info!(
            ?LINGER,
            "SIGTERM: serving on while the Service drops this replica"
        );
        tokio::select! {
            served = &mut serving => return served,
            () = tokio::time::sleep(LINGER) => {}
        }
    }
    tracing::info!(
        ?DRAIN,
        "stopping: nothing new accepted; requests in flight may finish"
    );
    handle.graceful_shutdown(Some(DRAIN));
    serving.await
}

async fn signalled() -> Signal {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => Signal::Term,
            _ = tokio::signal::ctrl_c() => Signal::Interrupt,
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Interrupt
        }
    }
}
