//! `baton server`: the HTTP API over runs and threads, with Server-Sent Events whose id is
//! the ledger position (docs/architecture.md, "Server"). Stateless: every request acts
//! with the caller's own Kubernetes credential, and any replica answers any request the same.

mod a2a;
mod args;
mod body;
mod caller;
mod console;
pub mod cursor;
mod error;
mod held;
mod hub;
mod identity;
mod ledger_api;
mod metrics;
mod names;
mod responses;
mod runs;
mod session;
mod shared_fold;
#[cfg(test)]
mod shared_views_tests;
mod signin;
mod slots;
mod stream;
mod threads;
mod token_cache;
mod trace_header;
mod view;
pub mod visible;
mod watchdog;
mod whole;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::mpsc;

use crate::ledger::Ledgers;
use crate::serving::admin::{Ready, metrics_response, probes};
use crate::serving::{Stop, Tls, TlsFiles};

pub use args::{ConsoleArgs, ServerArgs};
pub use caller::well_formed;
pub use error::ApiError;
pub use held::DEFAULT_STREAM_BYTES;
pub use hub::MAX_HUBS;
pub use slots::MAX_STREAMS_PER_CREDENTIAL;

use caller::Callers;
pub use console::ConsoleSettings;
use hub::Hubs;
use identity::{Identity, LocalUser};
pub use ledger_api::{APPEND_BODY_LIMIT, LedgerService};
use metrics::ServerMetrics;
pub use session::{SessionError, SessionKey};

/// The longest an open stream stays silent: proxies close idle connections, and a client
/// tells a dead server from a quiet run by the heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// The largest body of the caller's routes (an input is at most 64 Ki characters, each at
/// most 6 bytes as escaped JSON); the ledger's appends have their own bound
/// ([`ledger_api::APPEND_BODY_LIMIT`]).
const BODY_LIMIT: usize = 512 * 1024;

/// What every handler shares.
pub struct ServerState {
    identity: Identity,
    hubs: Hubs,
    metrics: Arc<ServerMetrics>,
    console: ConsoleSettings,
    /// The PostgreSQL ledger, when this server serves one.
    ledger: Option<LedgerService>,
    /// The key the console's sessions are sealed under.
    sessions: SessionKey,
    /// How often an open stream asks its caller's access again.
    access_recheck: Duration,
    /// How long a stream waits for its client to take one event before dropping it.
    slow_follower: Duration,
    /// The bytes of events every stream together holds for its clients.
    stream_bytes: held::EventBudget,
    /// Credentials the API server accepted a moment ago, for the routes that read a body.
    verified: std::sync::Mutex<token_cache::TokenCache>,
    /// The streams each credential holds open.
    slots: slots::StreamSlots,
}

impl ServerState {
    /// In-cluster: `base` says where the API server is and how to trust it; its credentials
    /// are never used, each caller's own are.
    pub fn new(base: kube::Config, console: ConsoleSettings) -> Self {
        Self::with(
            Identity::PassThrough(Box::new(Callers::new(base)), None),
            console,
        )
    }

    /// In-cluster behind an authenticating proxy that names its signed-in person in
    /// `user_header` (and groups in `groups_header`).
    pub fn behind_proxy(
        base: kube::Config,
        console: ConsoleSettings,
        user_header: &str,
        groups_header: Option<&str>,
    ) -> Self {
        let headers = identity::ProxyHeaders {
            user: user_header.to_ascii_lowercase(),
            groups: groups_header.map(str::to_ascii_lowercase),
        };
        Self::with(
            Identity::PassThrough(Box::new(Callers::new(base)), Some(headers)),
            console,
        )
    }

    /// `baton console`: `client` is the local user's; the browser that opens the one-time
    /// address acts as that user.
    pub fn local(client: kube::Client, console: ConsoleSettings) -> Self {
        Self::with(Identity::Local(LocalUser::new(client)), console)
    }

    fn with(identity: Identity, console: ConsoleSettings) -> Self {
        let metrics = Arc::new(ServerMetrics::default());
        Self {
            identity,
            hubs: Hubs::new(metrics.clone()),
            metrics,
            console,
            ledger: None,
            sessions: SessionKey::random(),
            access_recheck: stream::ACCESS_RECHECK,
            slow_follower: stream::SLOW_FOLLOWER,
            stream_bytes: held::EventBudget::new(held::DEFAULT_STREAM_BYTES),
            slots: slots::StreamSlots::new(slots::MAX_STREAMS_PER_CREDENTIAL),
            verified: Default::default(),
        }
    }

    /// Each credential may hold at most `limit` streams open at once.
    pub fn with_stream_limit(mut self, limit: usize) -> Self {
        self.slots = slots::StreamSlots::new(limit);
        self
    }

    /// A place for one more stream of `caller`, or the refusal (429) when it holds its limit.
    fn stream_slot(&self, caller: &caller::Caller) -> Result<slots::Slot, ApiError> {
        let limit = self.slots.limit();
        self.slots
            .take(caller.token())
            .ok_or(ApiError::TooManyStreams { limit })
    }

    /// Open streams ask their caller's access again every `every` (tests: seconds).
    pub fn with_access_recheck(mut self, every: Duration) -> Self {
        self.access_recheck = every;
        self
    }

    /// True if the API server accepted `caller`'s credential a moment ago.
    fn recently_verified(&self, caller: &caller::Caller) -> bool {
        let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        verified
            .get(caller.token(), std::time::Instant::now())
            .is_some()
    }

    /// Keeps `caller`'s credential as accepted by the API server, for a moment.
    fn verified(&self, caller: &caller::Caller) {
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        verified.accept(
            caller.token(),
            Default::default(),
            std::time::Instant::now(),
        );
    }

    /// Streams drop a client that takes no event for `patience` (tests: a second).
    pub fn with_slow_follower(mut self, patience: Duration) -> Self {
        self.slow_follower = patience;
        self
    }

    /// At most `limit` hubs (credential and namespace pairs followed) live at once.
    pub fn with_hub_limit(mut self, limit: usize) -> Self {
        self.hubs =
            std::mem::replace(&mut self.hubs, Hubs::new(self.metrics.clone())).with_limit(limit);
        self
    }

    /// All streams together hold at most `bytes` of events for their clients.
    pub fn with_stream_bytes(mut self, bytes: usize) -> Self {
        self.stream_bytes = held::EventBudget::new(bytes);
        self
    }

    /// A stream of `requests` from `hub`, with this server's timing and budget, and the
    /// response its client reads (at most [`stream::STREAM_BUFFER`] events waiting in it).
    /// `connection`: the switch of the client's connection (absent where the server is not
    /// served through [`crate::serving::serve`]), for its watchdog to cut it.
    fn follow(
        &self,
        requests: crate::requests::RunRequests,
        hub: Arc<hub::Hub>,
        connection: Option<crate::serving::cut::ConnectionCut>,
    ) -> (stream::Follow, Response) {
        let (out, events) = mpsc::channel(stream::STREAM_BUFFER);
        let (cut, cut_seen) = tokio::sync::watch::channel(false);
        let follow = stream::Follow::new(requests, hub, out, self.stream_bytes.clone(), cut)
            .rechecking_every(self.access_recheck)
            .patience(self.slow_follower)
            .counting_replays(self.metrics.replaying.clone())
            .on_connection(connection);
        (follow, held::sse_response(events, cut_seen, HEARTBEAT))
    }

    /// Seals the console's sessions under `key` (the one every replica holds).
    pub fn with_session_key(mut self, key: SessionKey) -> Self {
        self.sessions = key;
        self
    }

    /// True when clients reach this server over HTTPS (its own TLS, or a proxy's: the
    /// console's cookies are `Secure` then): the scheme of the addresses it hands out.
    fn serves_https(&self) -> bool {
        self.console.secure_cookies
    }

    /// How the console's cookies are written.
    fn cookies(&self) -> identity::Cookies {
        identity::Cookies {
            secure: self.console.secure_cookies,
        }
    }

    /// Serves the ledgers `ledger` keeps, besides the API: to their writers, and to the
    /// API's and the console's readers (each asked of Kubernetes first, as for LedgerSegments).
    pub fn with_ledger(mut self, ledger: LedgerService) -> Self {
        self.hubs = Hubs::new(self.metrics.clone())
            .with_rows(ledger.db())
            .with_limit(self.hubs.limit());
        self.ledger = Some(ledger);
        self
    }

    /// `caller`'s requests on the runs of `namespace`, reading ledgers wherever this server
    /// can reach them.
    fn requests(&self, caller: &caller::Caller, namespace: &str) -> crate::requests::RunRequests {
        let client = caller.client().clone();
        let ledgers = match &self.ledger {
            Some(ledger) => Ledgers::with_postgres(client.clone(), ledger.db().clone()),
            None => Ledgers::api_server(client.clone()),
        };
        crate::requests::RunRequests::new(client, namespace).reading(ledgers)
    }

    /// The one-time sign-in secret of `baton console` (None in-cluster, or once used).
    pub fn one_time_secret(&self) -> Option<String> {
        match &self.identity {
            Identity::Local(user) => user.one_time(),
            Identity::PassThrough(..) => None,
        }
    }
}

/// Every route of the server.
pub fn router(state: Arc<ServerState>) -> Router {
    let ns = "/api/v1/namespaces/{ns}";
    Router::new()
        .route(&format!("{ns}/runs"), get(runs::list))
        .route(&format!("{ns}/runs/{{run}}"), get(runs::get))
        .route(&format!("{ns}/runs/{{run}}/events"), get(runs::events))
        .route(&format!("{ns}/runs/{{run}}/segments"), get(runs::segments))
        .route(&format!("{ns}/runs/{{run}}/stop"), post(runs::stop))
        .route(&format!("{ns}/runs/{{run}}/inputs"), post(runs::input))
        .route(&format!("{ns}/runs/{{run}}/approvals"), post(runs::decide))
        .route(&format!("{ns}/threads"), get(threads::list))
        .route(&format!("{ns}/threads/{{thread}}"), get(threads::get))
        .route(
            &format!("{ns}/threads/{{thread}}/events"),
            get(threads::events),
        )
        .route(
            &format!("{ns}/threads/{{thread}}/turns"),
            post(threads::post_turn),
        )
        .merge(responses::routes(ns))
        .merge(a2a::routes(ns))
        .route("/console", get(console::index))
        .route("/console/threads", get(console::threads))
        .route("/console/approvals", get(console::approvals))
        .route("/console/ns/{ns}/runs/{run}", get(console::run))
        .route("/console/ns/{ns}/threads/{thread}", get(console::thread))
        .route("/console/login", signin::route())
        .route("/console/logout", post(signin::logout))
        .route("/console/assets/console.js", get(signin::script))
        .route("/console/assets/console.css", get(signin::style))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(
            BODY_LIMIT,
            body::announced_within,
        ))
        .merge(ledger_routes())
        .route_layer(middleware::from_fn(names::checked))
        .route(
            "/",
            get(|| async { axum::response::Redirect::to("/console") }),
        )
        .route("/metrics", get(metrics_text))
        .merge(probes(Ready::always()))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_responses,
        ))
        .with_state(state)
}

/// The ledger's routes, for its writers and readers: an append is read only once its
/// writer is authenticated, and at most one segment of it.
fn ledger_routes() -> Router<Arc<ServerState>> {
    Router::new()
        .route(
            &crate::ledger::served::ledger_path("{ns}", "{run}"),
            post(ledger_api::append)
                .get(ledger_api::read)
                .delete(ledger_api::delete),
        )
        .route(
            &crate::ledger::served::ledgers_path("{ns}"),
            post(ledger_api::read_many),
        )
        .layer(middleware::from_fn_with_state(
            APPEND_BODY_LIMIT,
            body::announced_within,
        ))
}

async fn metrics_text(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    let held = i64::try_from(state.stream_bytes.held_bytes()).unwrap_or(i64::MAX);
    state.metrics.stream_bytes.set(held);
    metrics_response(state.metrics.render())
}

async fn count_responses(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let code = response.status().as_u16().to_string();
    state
        .metrics
        .responses
        .get_or_create(&vec![("code", code)])
        .inc();
    response
}

/// Runs the server until the listener fails or SIGTERM/SIGINT comes (`serving.rs`: on
/// SIGTERM it serves on a moment, then lets requests in flight finish; open streams are cut
/// and their clients reconnect to another replica with `Last-Event-ID`, losing nothing).
pub async fn main(args: ServerArgs) -> Result<(), crate::Error> {
    // Each stream a client follows is a span of its run's trace, exported where the
    // standard OTLP variables say (the chart sets them from `tracing.endpoint`).
    let traces = crate::telemetry::init_logging_and_traces(args.log_format, "baton-server");
    let served = serve_args(args).await;
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    served
}

async fn serve_args(args: ServerArgs) -> Result<(), crate::Error> {
    let base = crate::kube_util::config_for("server").await?;
    let console = ConsoleSettings {
        namespace: args.console_namespace,
        namespaces: args.console_namespaces,
        secure_cookies: args.console_secure_cookies || args.tls_cert_file.is_some(),
    };
    let sessions = match &args.console_session_key_file {
        Some(path) => SessionKey::from_file(path)
            .map_err(|e| crate::Error::Io(std::io::Error::other(e.to_string())))?,
        None => SessionKey::random(),
    };
    let ledger = match args.ledger_postgres_url.as_deref() {
        Some(url) => {
            let ca = args.ledger_postgres_ca_file.as_deref();
            Some(ledger_service(url, ca, &base, args.controller_user).await?)
        }
        None => None,
    };
    let mut state = match args.proxy_user_header.as_deref() {
        Some(user) => {
            ServerState::behind_proxy(base, console, user, args.proxy_groups_header.as_deref())
        }
        None => ServerState::new(base, console),
    };
    if let Some(ledger) = ledger {
        state = state.with_ledger(ledger);
    }
    let state = state
        .with_session_key(sessions)
        .with_stream_limit(args.max_streams_per_credential)
        .with_stream_bytes(args.max_stream_bytes)
        .with_hub_limit(args.max_hubs);
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let tls = args.tls_cert_file.zip(args.tls_key_file);
    let tls = match tls {
        Some((cert, key)) => Tls::Files(TlsFiles { cert, key }),
        None => Tls::Plain,
    };
    serve(listener, state, tls).await
}

/// The PostgreSQL ledger at `url` (schema migrated; its certificate checked against `ca`,
/// else the system's roots), served with the server's own identity from `base` for token
/// and access reviews.
async fn ledger_service(
    url: &str,
    ca: Option<&std::path::Path>,
    base: &kube::Config,
    controller_users: Vec<String>,
) -> Result<LedgerService, crate::Error> {
    use crate::ledger::postgres::{DEFAULT_POOL_SIZE, PgLedger};
    let db = match ca {
        Some(ca) => PgLedger::connect_trusting(url, DEFAULT_POOL_SIZE, ca).await,
        None => PgLedger::connect(url, DEFAULT_POOL_SIZE).await,
    };
    let db = db.map_err(|e| {
        crate::Error::Io(std::io::Error::other(format!("--ledger-postgres-url: {e}")))
    })?;
    let client = kube::Client::try_from(base.clone())?;
    Ok(LedgerService::new(db, client, controller_users))
}

/// `baton console`: the console and the API on a loopback port, acting as the kubeconfig's
/// user for the browser that opens the one-time address it prints.
pub async fn console_main(args: ConsoleArgs) -> Result<(), crate::Error> {
    if !args.addr.ip().is_loopback() {
        return Err(crate::Error::Io(std::io::Error::other(format!(
            "--addr {}: the console acts as you, so it listens on a loopback address only",
            args.addr
        ))));
    }
    let config = crate::kube_util::config_for("console").await?;
    let console = ConsoleSettings {
        namespace: args
            .namespace
            .unwrap_or_else(|| config.default_namespace.clone()),
        namespaces: args.namespaces,
        secure_cookies: false,
    };
    let client = kube::Client::try_from(config)?;
    let state = Arc::new(ServerState::local(client, console));
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let addr = listener.local_addr()?;
    let secret = state.one_time_secret().unwrap_or_default();
    println!("baton console: open http://{addr}/console/login?once={secret}");
    println!("(the address signs one browser in, once; stop with Ctrl-C)");
    serve(listener, state, Tls::Plain).await
}

async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    tls: Tls,
) -> Result<(), crate::Error> {
    let app = router(state);
    Ok(crate::serving::serve("server", listener, app, tls, Stop::OnSignal).await?)
}

#[cfg(test)]
mod router_tests;
