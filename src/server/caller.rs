//! Who asks: every request is served with the caller's own Kubernetes credential, passed
//! through to the API server, so Kubernetes RBAC on AgentRuns, AgentThreads and
//! LedgerSegments stays the only authority. The server's own ServiceAccount is never used to
//! read or write a run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::request::Parts;
use kube::Client;
use kube::api::{Api, PostParams};

use super::error::ApiError;

/// How many callers' clients are kept (each holds a connection pool); the least recently
/// used goes first.
const MAX_CLIENTS: usize = 512;

/// A caller's credential and the client that acts with it (see `identity.rs` for where the
/// credential comes from).
#[derive(Clone)]
pub struct Caller {
    token: Arc<str>,
    client: Client,
}

impl Caller {
    /// The caller whose credential is `token`, acting through `client`.
    pub fn new(token: &str, client: Client) -> Self {
        Self {
            token: Arc::from(token),
            client,
        }
    }

    /// The bearer token, as the key of the caller's shared watches: two requests share a
    /// watch only if the API server would see the very same credential for each.
    pub fn token(&self) -> &Arc<str> {
        &self.token
    }

    /// The client that acts as the caller.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// One client per credential: building one costs a TLS handshake per request otherwise.
pub struct Callers {
    base: kube::Config,
    clients: Mutex<HashMap<Arc<str>, (Client, Instant)>>,
}

impl Callers {
    /// `base` names the API server and how to trust it; its own credentials are dropped.
    pub fn new(base: kube::Config) -> Self {
        Self {
            base,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The client that acts as the holder of `token`.
    pub fn client_for(&self, token: &str) -> Result<Caller, ApiError> {
        self.client_as(token, None)
    }

    /// The client that acts as the holder of `token`, impersonating `person` when given (an
    /// authenticating proxy's mode: the API server allows the impersonation only if the
    /// token's holder may impersonate that user and those groups).
    pub fn client_as(&self, token: &str, person: Option<&Person>) -> Result<Caller, ApiError> {
        let key = match person {
            Some(p) => format!("{token}\n{}\n{}", p.user, p.groups.join(",")),
            None => token.to_string(),
        };
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((client, used)) = clients.get_mut(key.as_str()) {
            *used = Instant::now();
            let client = client.clone();
            return Ok(Caller::new(&key, client));
        }
        if clients.len() >= MAX_CLIENTS
            && let Some(oldest) = clients
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            clients.remove(&oldest);
        }
        let client = self.build(token, person)?;
        clients.insert(Arc::from(key.as_str()), (client.clone(), Instant::now()));
        Ok(Caller::new(&key, client))
    }

    fn build(&self, token: &str, person: Option<&Person>) -> Result<Client, ApiError> {
        let mut config = self.base.clone();
        // Through serde: kube keeps a token as a secret string type of a crate baton does not
        // depend on otherwise. `as` and `as-groups` are kubeconfig's impersonation fields.
        let mut auth = serde_json::json!({ "token": token });
        if let Some(p) = person {
            auth["as"] = p.user.clone().into();
            if !p.groups.is_empty() {
                auth["as-groups"] = p.groups.clone().into();
            }
        }
        config.auth_info = serde_json::from_value(auth)
            .map_err(|e| ApiError::BadRequest(format!("Authorization: {e}")))?;
        Client::try_from(config).map_err(|e| ApiError::Unreachable(e.to_string()))
    }
}

/// The person an authenticating proxy says it signed in (its trusted headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub user: String,
    pub groups: Vec<String>,
}

/// The bearer token of `Authorization`, if the request carries a well-formed one.
pub fn bearer_token(parts: &Parts) -> Option<&str> {
    bearer_of(&parts.headers)
}

/// The bearer token of `headers`, if well formed.
pub fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    well_formed(token).then_some(token)
}

/// A token goes into a header of every request to the API server: printable ASCII only.
pub fn well_formed(token: &str) -> bool {
    !token.is_empty() && token.len() <= 16 * 1024 && token.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether the API server accepts the credential `client` acts with: a SelfSubjectAccessReview,
/// which any accepted credential may create and which writes nothing (401 otherwise).
pub async fn check_token(client: &kube::Client) -> Result<(), kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("baton.dev".into()),
                resource: Some("agentruns".into()),
                verb: Some("list".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    api.create(&PostParams::default(), &review)
        .await
        .map(|_| ())
}
