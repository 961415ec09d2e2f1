//! The one serving layer of every baton listener (DESIGN §12; docs/security.md, "Listeners"):
//! `baton server`, the admission webhook, the controller's and the workers' admin ports. Each
//! hands [`serve`] its router, says where its certificate comes from ([`Tls`]) and when it stops
//! ([`Stop`]), and gets the same from it: the bounds on what a client may withhold (`bounds`),
//! the switch that cuts a connection (`cut`), the peer's address as `ConnectInfo`, and a span
//! per request (`spans`). `admin` has the probes and the one metrics renderer.
//!
//! Served by axum-server: TLS with a configuration swapped in place and a graceful stop with a
//! deadline, both of which axum's own server lacks.

pub mod admin;
pub mod bounds;
pub mod cut;
mod spans;
mod stop;
mod tls;

use std::net::SocketAddr;

use axum::Router;
use axum_server::Handle;
use axum_server::accept::DefaultAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use futures::future::BoxFuture;
use tokio::net::TcpListener;

pub use stop::{DRAIN, LINGER};
pub use tls::{Published, RELOAD_EVERY, TlsFiles};

/// Where a listener's certificate comes from.
pub enum Tls {
    /// Plain HTTP: the admin ports (inside the pod network, read by Prometheus and the
    /// kubelet), and `baton server` without certificate files.
    Plain,
    /// PEM files, read again every [`RELOAD_EVERY`].
    Files(TlsFiles),
    /// A configuration its keeper publishes and replaces (the webhook's own certificate).
    Published(Published),
}

/// When a listener stops serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// With its process (or when the listener fails): the admin ports and the webhook, whose
    /// process stops on its own terms.
    WithTheProcess,
    /// On SIGTERM after [`LINGER`] and a drain of [`DRAIN`], on Ctrl-C at once (`stop`).
    OnSignal,
}

/// Serves `router` on `listener` (named `name` in logs and spans) until the listener fails or
/// `stop` says.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    tls: Tls,
    stop: Stop,
) -> std::io::Result<()> {
    let handle: Handle<SocketAddr> = Handle::new();
    let listener = listener.into_std()?;
    bounds::bound_send_buffer(&listener)?;
    let address = listener.local_addr()?;
    let mut server = axum_server::from_tcp(listener)?.handle(handle.clone());
    bounds::bound_auto(server.http_builder());
    let app = spans::per_request(bounds::bound_bodies(router), name)
        .into_make_service_with_connect_info::<SocketAddr>();
    let cuttable = cut::CuttableAcceptor::new(DefaultAcceptor);
    let serving: BoxFuture<'static, std::io::Result<()>> = match tls {
        Tls::Plain => Box::pin(server.acceptor(cuttable).serve(app)),
        Tls::Files(files) => {
            let tls = over_tls(tls::from_files(files).await?, cuttable);
            Box::pin(server.acceptor(tls).serve(app))
        }
        Tls::Published(published) => {
            let tls = over_tls(tls::following(published).await?, cuttable);
            Box::pin(server.acceptor(tls).serve(app))
        }
    };
    tracing::info!(listener = name, addr = %address, "listening");
    match stop {
        Stop::WithTheProcess => serving.await,
        Stop::OnSignal => stop::on_signal(serving, handle).await,
    }
}

/// TLS around `inner`, with a handshake bounded like a request's head.
fn over_tls<A>(config: RustlsConfig, inner: A) -> RustlsAcceptor<A> {
    RustlsAcceptor::new(config)
        .handshake_timeout(bounds::HANDSHAKE_TIMEOUT)
        .acceptor(inner)
}

#[cfg(test)]
mod tests {
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::telemetry::caught::Caught;

    #[tokio::test]
    async fn every_request_is_answered_in_a_span_naming_its_listener_method_and_path() {
        let caught = Caught::default();
        let _guard = caught.on_this_thread();
        let handled = || async {
            tracing::info!("handled");
            "ok"
        };
        let router = Router::new().route("/runs/{name}", get(handled));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(
            "test",
            listener,
            router,
            Tls::Plain,
            Stop::WithTheProcess,
        ));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request =
            "GET /runs/r1?once=secret HTTP/1.1\r\nHost: baton\r\nConnection: close\r\n\r\n";
        client.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let text = caught.text();
        let span = "request{listener=\"test\" method=GET path=\"/runs/r1\"}: ";
        assert!(
            text.contains(&format!("{span}baton::serving::tests: handled")),
            "{text}"
        );
        assert!(!text.contains("secret"), "the query is not logged: {text}");
    }
}
