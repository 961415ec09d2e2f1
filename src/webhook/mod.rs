//! The admission webhook: baton checks who asks (docs/security.md).
//!
//! Served by every controller replica (not only the leader) on its own TLS port. For an
//! AgentRun it asks the API server whether the requesting user could do themselves what the
//! manifest makes baton do (read a Secret, create a pod); for a LedgerSegment it admits only
//! the run's own worker or the controller, with a name, `spec.run`, UID label and fence that
//! agree with the live run; for a run Lease it keeps the worker from re-pointing it; for an
//! AgentThread it asks its writer for everything the thread lends its turns (`borrow`: the one
//! borrow rule). Its mutating half stamps a new turn with its thread's generation.
//! `rules` decides (pure), `review` reads and answers, `tls` keeps the certificate.

pub mod borrow;
pub mod cert;
pub(crate) mod review;
pub(crate) mod rules;
mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::post;
use kube::Client;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use kube::runtime::reflector::Store;
use tokio::net::TcpListener;

use crate::crd::v1alpha1::AgentRun;
use crate::serving::bounds::{BodyBudget, within_budget};
use crate::serving::{Stop, Tls};

pub use review::Reviewer;
pub use tls::{CertIssuer, TlsSettings};

/// The path the validating webhook configuration points at.
pub const PATH: &str = "/validate";
/// The path the mutating webhook configuration points at: it stamps a turn with the
/// generation of its thread that its admission is asked about.
pub const MUTATE_PATH: &str = "/mutate";
/// The largest AgentRun spec admitted by default, in bytes of JSON.
pub const DEFAULT_MAX_SPEC_BYTES: usize = 256 * 1024;
/// A review carries the old and the new object, each at most etcd's 1.5 MiB.
const MAX_REVIEW_BYTES: usize = 4 * 1024 * 1024;
/// The review bytes one address holds at once: a burst of large reviews from anyone who
/// reaches the port is answered 503 past it instead of growing the controller to its memory
/// limit, and takes nothing from the API server's own budget.
const REVIEW_BYTES_PER_PEER: usize = 16 * 1024 * 1024;
/// How often each replica checks the certificate Secret.
pub const CHECK_EVERY: Duration = Duration::from_secs(30);

/// Errors of the webhook.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("webhook certificate: {0}")]
    Cert(#[from] cert::CertError),
    #[error("webhook TLS configuration: {0}")]
    Tls(String),
    #[error("webhook API call: {0}")]
    Api(#[from] kube::Error),
    #[error("webhook certificate: the Secret {0} is not there (is its issuer running?)")]
    NoSecret(String),
    #[error("the webhook's task ended: {0}")]
    Ended(String),
}

/// How the webhook runs.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub addr: SocketAddr,
    pub tls: TlsSettings,
    /// The user names baton's controller authenticates as (its seals are admitted).
    pub controller_users: Vec<String>,
    pub max_spec_bytes: usize,
}

/// The API server's client CA from `path` (`--webhook-client-ca-file`), checked to hold at
/// least one CA certificate: a bad file stops the controller at its start, naming the flag.
pub fn read_client_ca(path: &std::path::Path) -> Result<String, WebhookError> {
    let named =
        |e: String| WebhookError::Tls(format!("--webhook-client-ca-file {}: {e}", path.display()));
    let pem = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
    tls::client_roots(&pem).map_err(|e| named(e.to_string()))?;
    Ok(pem)
}

/// Serves the webhook until it fails; `loaded` turns true once a certificate is served.
/// `known`: the controller's watch of the runs, when it runs beside it: a ledger append the
/// run as last seen admits is admitted without a read ([`Reviewer::with_known_runs`]).
pub async fn run(
    client: Client,
    config: WebhookConfig,
    loaded: tokio::sync::watch::Sender<bool>,
    known: Option<Store<AgentRun>>,
) -> Result<(), WebhookError> {
    let (served_tx, served) = tokio::sync::watch::channel(None);
    let keeping = tls::keep(client.clone(), config.tls.clone(), served_tx);
    let reviewer = Reviewer::new(
        client,
        config.controller_users.clone(),
        config.max_spec_bytes,
    )
    .with_known_runs(known);
    let mut watching = served.clone();
    let announcing = async move {
        if watching.wait_for(Option::is_some).await.is_ok() {
            loaded.send_replace(true);
        }
        futures::future::pending::<Result<(), WebhookError>>().await
    };
    tokio::select! {
        res = keeping => res,
        res = serve(config.addr, served, reviewer) => res,
        res = announcing => res,
    }
}

/// Serves the reviews on `addr` over TLS with the certificate `served` publishes (nothing is
/// accepted before the first is loaded: the API server's call waits, then retries or fails
/// closed).
async fn serve(
    addr: SocketAddr,
    served: crate::serving::Published,
    reviewer: Reviewer,
) -> Result<(), WebhookError> {
    let app = Router::new()
        .route(PATH, post(validate))
        .route(MUTATE_PATH, post(mutate))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            BodyBudget::new(REVIEW_BYTES_PER_PEER, MAX_REVIEW_BYTES),
            within_budget,
        ))
        .with_state(reviewer);
    let listener = TcpListener::bind(addr).await?;
    let tls = Tls::Published(served);
    Ok(crate::serving::serve("webhook", listener, app, tls, Stop::WithTheProcess).await?)
}

async fn mutate(
    State(reviewer): State<Reviewer>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(reviewer.stamp(review).await)
}

async fn validate(
    State(reviewer): State<Reviewer>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(reviewer.answer(review).await)
}
