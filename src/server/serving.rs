//! How `baton server` serves and stops (axum-server: TLS from certificate files reloaded in
//! place, and a graceful stop with a deadline, both of which axum's own server lacks).
//!
//! With `--tls-cert-file`/`--tls-key-file` it serves HTTPS, and reads the files again every
//! [`RELOAD_EVERY`] (cert-manager rotates the Secret they are mounted from); a pair that does
//! not load is logged and the one served stays.
//!
//! On SIGTERM (Kubernetes deleting its pod: a rollout, a drain) it serves on for [`LINGER`]:
//! the Service stops sending new connections to a terminating pod only a moment after the pod
//! is told, and a request sent meanwhile to a closed port costs its writer a retry, or, once
//! the pod's network is gone, a connection attempt that is never answered. Then it accepts
//! nothing new and gives the requests in flight (a worker's append, a seal) up to [`DRAIN`];
//! streams still open then are cut, and their clients reconnect to another replica with
//! `Last-Event-ID`. Ctrl-C stops at once: a person at a terminal is not a Service.

use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum_server::Handle;
use axum_server::accept::DefaultAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use futures::future::BoxFuture;
use tokio::net::TcpListener;

/// How long a replica told to stop (SIGTERM) serves on as before.
pub const LINGER: Duration = Duration::from_secs(5);
/// How long requests in flight may then take (within the pod's 30 s grace).
pub const DRAIN: Duration = Duration::from_secs(10);
/// How often the certificate files are read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(60);

/// The certificate (chain) and key the server serves HTTPS with, as PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Which signal asked the process to stop.
#[derive(Debug, PartialEq, Eq)]
enum Signal {
    Term,
    Interrupt,
}

/// Serves `app` on `listener` (over TLS with `tls`) until the listener fails or a signal
/// stops it (as above).
pub async fn serve_until_stopped(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsFiles>,
) -> std::io::Result<()> {
    let handle: Handle<std::net::SocketAddr> = Handle::new();
    let listener = listener.into_std()?;
    crate::listener::bound_send_buffer(&listener)?;
    let mut server = axum_server::from_tcp(listener)?.handle(handle.clone());
    let cuttable = crate::connection::CuttableAcceptor::new;
    crate::listener::bound_auto(server.http_builder());
    let make = crate::listener::bound_bodies(app).into_make_service();
    let mut serving: BoxFuture<'static, std::io::Result<()>> = match tls {
        None => Box::pin(server.acceptor(cuttable(DefaultAcceptor)).serve(make)),
        Some(files) => {
            let config = RustlsConfig::from_pem_file(&files.cert, &files.key)
                .await
                .map_err(|e| std::io::Error::other(format!("{files:?}: {e}")))?;
            tokio::spawn(reload(config.clone(), files));
            let tls = RustlsAcceptor::new(config).acceptor(cuttable(DefaultAcceptor));
            Box::pin(server.acceptor(tls).serve(make))
        }
    };
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

/// Reads the certificate files again every [`RELOAD_EVERY`], for as long as the server runs.
async fn reload(config: RustlsConfig, files: TlsFiles) {
    loop {
        tokio::time::sleep(RELOAD_EVERY).await;
        if let Err(err) = config.reload_from_pem_file(&files.cert, &files.key).await {
            tracing::warn!(%err, ?files, "the TLS certificate did not reload; serving the last");
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
