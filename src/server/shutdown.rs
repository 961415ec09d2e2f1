//! How `baton server` stops. On SIGTERM (Kubernetes deleting its pod: a rollout, a drain) it
//! serves on for [`LINGER`]: the Service stops sending new connections to a terminating pod
//! only a moment after the pod is told, and a request sent meanwhile to a closed port costs
//! its writer a retry, or, once the pod's network is gone, a connection attempt that is
//! never answered. Then it accepts nothing new and gives the requests in flight (a worker's
//! append, a seal) up to [`DRAIN`] to finish; streams still open then are cut, and their
//! clients reconnect to another replica with `Last-Event-ID`. Ctrl-C stops at once: a person
//! at a terminal is not a Service.

use std::future::IntoFuture;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

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

/// Serves `app` on `listener` until the listener fails or a signal stops it (as above).
pub async fn serve_until_stopped(listener: TcpListener, app: Router) -> std::io::Result<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .into_future();
    tokio::pin!(server);
    let signal = tokio::select! {
        served = &mut server => return served,
        signal = signalled() => signal,
    };
    if signal == Signal::Term {
        tracing::info!(
            ?LINGER,
            "SIGTERM: serving on while the Service drops this replica"
        );
        tokio::select! {
            served = &mut server => return served,
            () = tokio::time::sleep(LINGER) => {}
        }
    }
    tracing::info!(
        ?DRAIN,
        "stopping: nothing new accepted; requests in flight may finish"
    );
    let _ = stop.send(());
    match tokio::time::timeout(DRAIN, server).await {
        Ok(served) => served,
        Err(_) => {
            tracing::info!("streams still open are cut; their clients reconnect elsewhere");
            Ok(())
        }
    }
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
