//! What every HTTP listener of baton bounds (DESIGN §12; docs/security.md, "Listeners"). A client that sends no complete request head within [`HEADER_TIMEOUT`] (a new
//! connection, or a kept-alive one between requests) is dropped, and a body that stops
//! arriving for [`BODY_FRAME_TIMEOUT`] ends its request; so a client that withholds what it
//! sends holds nothing for long. Bodies are bounded per route where they are read.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::Semaphore;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// How long a client may take to send a request's head, counted from when the connection is
/// ready for one (also the idle limit of a kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request body may stall between two of its frames.
pub const BODY_FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// The kernel's send buffer of every connection a listener accepts (accepted sockets inherit
/// it from their listener; Linux keeps twice this for its own bookkeeping). Left to itself,
/// Linux grows a connection's send buffer while the peer keeps up, to `net.ipv4.tcp_wmem`'s
/// maximum (4 MiB by default), and what the server has written stays there until the peer
/// reads it: outside the process and its event budget, yet memory all the same (the pod's,
/// under cgroup v2), drawn from one pool of TCP memory per machine. Past that pool's limit
/// (`net.ipv4.tcp_mem`) the kernel drops packets on every connection, the API server's answers
/// among them: on the project's node a thousand clients that read nothing did that, and the
/// API server cut the server's reads of the ledger mid-body. Bounded, a thousand such clients
/// hold at most 128 MiB there; a stream still fills a link of 10 ms at 12 MB/s.
pub const SEND_BUFFER_BYTES: usize = 64 * 1024;

/// A TLS handshake that takes longer is dropped, so a silent client holds nothing for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Sets [`SEND_BUFFER_BYTES`] on `listener`, for every connection it accepts.
pub(super) fn bound_send_buffer(listener: &impl std::os::fd::AsFd) -> std::io::Result<()> {
    socket2::SockRef::from(listener).set_send_buffer_size(SEND_BUFFER_BYTES)
}

/// Sets [`HEADER_TIMEOUT`] on axum-server's connection builder.
pub(super) fn bound_auto(builder: &mut auto::Builder<TokioExecutor>) {
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
}

/// `router` with [`BODY_FRAME_TIMEOUT`] on every request body.
pub(super) fn bound_bodies(router: Router) -> Router {
    router.layer(RequestBodyTimeoutLayer::new(BODY_FRAME_TIMEOUT))
}

/// A bound on the body bytes one peer's requests hold at once on a listener: each request
/// takes its announced length (a body of unknown length: the most one may be) from its peer's
/// budget until it is answered, and one that does not fit is answered 503 at once, unread. A
/// burst of large or withheld bodies from one address then costs the process at most that
/// address's budget, never its memory limit, and takes nothing from another address (the
/// API server's reviews go on being answered).
#[derive(Clone)]
pub struct BodyBudget {
    per_peer_kib: u32,
    max_each: usize,
    peers: Arc<Mutex<HashMap<IpAddr, Arc<Semaphore>>>>,
}

/// Peers remembered before idle ones are forgotten.
const PEERS_KEPT: usize = 1024;

impl BodyBudget {
    /// `per_peer` bytes at once from one address, `max_each` for one body.
    pub fn new(per_peer: usize, max_each: usize) -> Self {
        Self {
            per_peer_kib: per_peer.div_ceil(1024) as u32,
            max_each,
            peers: Arc::default(),
        }
    }

    /// What `announced` takes from the budget, in KiB; None: over `max_each`.
    fn cost(&self, announced: Option<u64>) -> Option<u32> {
        let bytes = announced.unwrap_or(self.max_each as u64);
        (bytes <= self.max_each as u64).then(|| bytes.div_ceil(1024).max(1) as u32)
    }

    /// `peer`'s budget (a new one for an address not seen, forgetting idle ones first when
    /// many are kept).
    fn of(&self, peer: IpAddr) -> Arc<Semaphore> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.len() >= PEERS_KEPT && !peers.contains_key(&peer) {
            let full = self.per_peer_kib as usize;
            peers.retain(|_, budget| budget.available_permits() < full);
        }
        let budget = peers.entry(peer);
        budget
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_peer_kib as usize)))
            .clone()
    }
}

/// The length a request's `Content-Length` announces, if it announces one.
pub fn announced_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    let value = headers.get(CONTENT_LENGTH)?;
    value.to_str().ok()?.parse().ok()
}

/// The middleware of [`BodyBudget`]; the peer is the connection's (`ConnectInfo`).
pub async fn within_budget(
    State(budget): State<BodyBudget>,
    request: Request,
    next: Next,
) -> Response {
    let Some(cost) = budget.cost(announced_length(request.headers())) else {
        let text = format!("the body is over the limit of {} bytes", budget.max_each);
        return (StatusCode::PAYLOAD_TOO_LARGE, text).into_response();
    };
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let Ok(_held) = budget.of(peer).try_acquire_many_owned(cost) else {
        let text = "busy: this address holds too many large bodies at once";
        return (StatusCode::SERVICE_UNAVAILABLE, text).into_response();
    };
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::{Stop, Tls, serve};

    #[test]
    fn a_body_costs_its_announced_length_or_the_most_one_may_be() {
        let budget = BodyBudget::new(8 * 1024 * 1024, 4 * 1024 * 1024);
        assert_eq!(budget.cost(Some(10)), Some(1));
        assert_eq!(budget.cost(Some(4 * 1024 * 1024)), Some(4096));
        assert_eq!(budget.cost(None), Some(4096), "unknown: the most");
        assert_eq!(budget.cost(Some(4 * 1024 * 1024 + 1)), None);
    }

    /// What the server writes for a client that reads nothing waits in the connection's send
    /// buffer: bounded, well under a MiB of an endless body is taken off the server before its
    /// writes stop; left to Linux (megabytes on loopback), several.
    #[tokio::test]
    async fn a_client_that_reads_nothing_takes_little_of_an_endless_body() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        use tokio::io::AsyncWriteExt;
        const CHUNK: usize = 16 * 1024;
        let taken = Arc::new(AtomicUsize::new(0));
        let counted = taken.clone();
        let endless = move || {
            let counted = counted.clone();
            async move {
                let chunks = futures::stream::repeat_with(move || {
                    counted.fetch_add(CHUNK, SeqCst);
                    Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(vec![0u8; CHUNK]))
                });
                axum::body::Body::from_stream(chunks)
            }
        };
        let router = Router::new().route("/", axum::routing::get(endless));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = serve("test", listener, router, Tls::Plain, Stop::WithTheProcess);
        tokio::spawn(served);
        // The server's task sets the bound before this connection's handshake: a connection
        // takes its buffer from the listener when the kernel makes it, before any accept.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let client = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None);
        let client = client.unwrap();
        client.set_recv_buffer_size(64 * 1024).unwrap();
        client.connect(&addr.into()).unwrap();
        client.set_nonblocking(true).unwrap();
        let mut client = tokio::net::TcpStream::from_std(client.into()).unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: baton\r\n\r\n")
            .await
            .unwrap();
        // Until the server has stopped taking chunks: its writes wait on the client.
        let mut last = usize::MAX;
        while taken.load(SeqCst) != last {
            last = taken.load(SeqCst);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(last > 0, "the body was never polled");
        assert!(
            last < 1024 * 1024,
            "{last} bytes taken for a client that reads nothing"
        );
        drop(client);
    }

    #[test]
    fn one_address_spending_its_budget_takes_nothing_from_another() {
        let budget = BodyBudget::new(8 * 1024, 4 * 1024);
        let attacker = IpAddr::from([10, 0, 0, 9]);
        let held = budget.of(attacker).try_acquire_many_owned(8).unwrap();
        assert!(budget.of(attacker).try_acquire_many_owned(1).is_err());
        let api_server = IpAddr::from([10, 0, 0, 1]);
        assert!(budget.of(api_server).try_acquire_many_owned(8).is_ok());
        drop(held);
        assert!(budget.of(attacker).try_acquire_many_owned(8).is_ok());
    }
}
