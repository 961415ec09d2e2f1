//! The ledger of runs kept in PostgreSQL, served to its writers and readers
//! (docs/ledger-backends.md, "Who may write"). The server holds the database's only
//! credential; a caller proves who it is with a ServiceAccount token issued for
//! [`LEDGER_AUDIENCE`], which the API server reviews (TokenReview). A write is admitted by
//! the same rule the admission webhook applies to a LedgerSegment ([`segment_refusal`]: the
//! run's worker at most at the run's fence, baton's controller one above), and a worker's
//! token must be bound to the pod of the attempt whose fence it writes under. A read is
//! admitted when Kubernetes RBAC lets the caller list LedgerSegments in the namespace.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::ServerState;
use super::body::json_within;
use super::caller::bearer_of;
use super::error::ApiError;
use super::token_cache::TokenCache;
use crate::access::{Ask, RunFacts, Writer, segment_refusal, user_may, worker_pod_refusal};
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::ledger::postgres::{PgError, PgLedger};
use crate::ledger::served::{AppendOutcome, AppendRequest, Deleted, LEDGER_AUDIENCE, ReadQuery};
use crate::ledger::served::{LEDGERS_READ_BODY_LIMIT, LedgersRequest};
use crate::ledger::{LedgerError, segment_of_run};

/// The largest append body read: one segment's events (a writer sends a larger append as the
/// segments it is stored as, `ledger::remote`) and their envelope, as the API server bounds
/// a LedgerSegment's create.
pub const APPEND_BODY_LIMIT: usize = 1536 * 1024;

/// The extra a pod-bound ServiceAccount token carries: the pod it is bound to.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// What the server needs to serve ledgers kept in PostgreSQL.
pub struct LedgerService {
    db: PgLedger,
    /// The server's own identity: token and access reviews, and reading AgentRuns. Never
    /// used to read a transcript for a caller.
    client: Client,
    /// User names baton's controller authenticates as (its seals).
    controller_users: Vec<String>,
    /// Tokens the API server accepted a moment ago.
    accepted: Mutex<TokenCache>,
}

impl LedgerService {
    pub fn new(db: PgLedger, client: Client, controller_users: Vec<String>) -> Self {
        Self {
            db,
            client,
            controller_users,
            accepted: Mutex::default(),
        }
    }

    /// The database, for the API's readers (who are asked of Kubernetes first).
    pub(super) fn db(&self) -> &PgLedger {
        &self.db
    }

    /// The user a ledger token belongs to; refused unless the API server says it is valid for
    /// [`LEDGER_AUDIENCE`] (or said so less than [`super::token_cache::TRUST_FOR`] ago).
    async fn authenticate(&self, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
        let token = bearer_of(headers).ok_or(ApiError::Unauthenticated)?;
        let cache = || self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(user) = cache().get(token, Instant::now()) {
            return Ok(user);
        }
        let user = self.review(token).await?;
        cache().accept(token, user.clone(), Instant::now());
        Ok(user)
    }

    /// The API server's TokenReview of `token` for [`LEDGER_AUDIENCE`].
    async fn review(&self, token: &str) -> Result<UserInfo, ApiError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![LEDGER_AUDIENCE.to_string()]),
            },
            ..TokenReview::default()
        };
        let api = Api::<TokenReview>::all(self.client.clone());
        let status = api
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        let for_ledgers = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|a| a == LEDGER_AUDIENCE));
        match (status.authenticated, status.user) {
            (Some(true), Some(user)) if for_ledgers => Ok(user),
            _ => Err(ApiError::Unauthenticated),
        }
    }

    /// Refused unless `user` may list LedgerSegments in `namespace` (the read a transcript is).
    async fn check_read(&self, user: &UserInfo, namespace: &str) -> Result<(), ApiError> {
        let ask = Ask::read_ledgers("");
        if user_may(&self.client, user, namespace, &ask).await? {
            return Ok(());
        }
        let who = user.username.as_deref().unwrap_or_default();
        Err(ApiError::Forbidden(format!(
            "{who} may not list ledgersegments in namespace {namespace}: the ledger is read \
             with the rights to read it from the API server"
        )))
    }

    /// Why `user` may not append under `request.fence` to run `name`, or None.
    async fn write_refusal(
        &self,
        user: &UserInfo,
        namespace: &str,
        name: &str,
        request: &AppendRequest,
    ) -> Result<Option<String>, ApiError> {
        let runs = Api::<AgentRun>::namespaced(self.client.clone(), namespace);
        let gone = || ApiError::Gone(format!("run {name} (UID {}) no longer exists", request.uid));
        let run = runs.get_opt(name).await?.ok_or_else(gone)?;
        if run.uid().as_deref() != Some(request.uid.as_str()) {
            return Err(gone());
        }
        let facts = RunFacts::of(&run);
        let username = user.username.as_deref().unwrap_or_default();
        let writer = Writer::of(username, &self.controller_users, Some(&facts));
        let seq = request.tail + 1;
        let at = segment_of_run(name, &request.uid, seq, request.fence, Vec::new());
        if let Some(refusal) = segment_refusal(&at, writer, username, Some(&facts)) {
            return Ok(Some(refusal));
        }
        if writer == Writer::RunWorker {
            return Ok(worker_pod_refusal(name, request.fence, bound_pod(user)));
        }
        Ok(None)
    }

    /// Why `user` may not delete the rows of run `name` with UID `uid`, or None: only
    /// baton's controller may, and only once the run with that UID is gone or being deleted
    /// (never the rows of a live run).
    async fn delete_refusal(
        &self,
        user: &UserInfo,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<String>, ApiError> {
        let username = user.username.as_deref().unwrap_or_default();
        if Writer::of(username, &self.controller_users, None) != Writer::Controller {
            return Ok(Some(format!(
                "{username} may not delete ledgers: only baton's controller does, once a run \
                 is deleted"
            )));
        }
        let runs = Api::<AgentRun>::namespaced(self.client.clone(), namespace);
        let live = runs.get_opt(name).await?.filter(|run| {
            run.uid().as_deref() == Some(uid) && run.metadata.deletion_timestamp.is_none()
        });
        Ok(live.map(|_| format!("run {name} (UID {uid}) is not being deleted: its ledger stays")))
    }
}

/// The pod a reviewed token is bound to, if any.
fn bound_pod(user: &UserInfo) -> Option<&str> {
    let pods = user.extra.as_ref()?.get(POD_NAME_EXTRA)?;
    pods.first().map(String::as_str)
}

fn service(state: &ServerState) -> Result<&LedgerService, ApiError> {
    state.ledger.as_ref().ok_or_else(|| {
        ApiError::BadRequest(
            "this server keeps no ledger: it was started without a database".into(),
        )
    })
}

/// A ledger operation's failure as an answer: the database out of reach is worth a retry
/// (503); events that cannot be stored are the writer's (400); anything else is a ledger
/// that does not read as one (500), which no retry mends.
fn failed(err: LedgerError) -> ApiError {
    match err {
        LedgerError::Postgres(PgError::Db(_) | PgError::Pool(_)) => {
            ApiError::LedgerUnavailable(err.to_string())
        }
        LedgerError::Encode(_) => ApiError::BadRequest(format!("events: {err}")),
        other => ApiError::LedgerBroken(other.to_string()),
    }
}

/// `POST /ledger/v1/namespaces/{ns}/runs/{run}/segments`: a fenced append of at most one
/// segment. The writer is authenticated from its headers before a byte of the body is read,
/// and the body is read up to [`APPEND_BODY_LIMIT`] only.
pub async fn append(
    State(state): State<Arc<ServerState>>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AppendOutcome>, ApiError> {
    let service = service(&state)?;
    let user = service.authenticate(&headers).await?;
    let request: AppendRequest = json_within(body, APPEND_BODY_LIMIT).await?;
    match service
        .write_refusal(&user, &namespace, &name, &request)
        .await
    {
        Ok(None) => {}
        Ok(Some(refusal)) => return Err(ApiError::Forbidden(refusal)),
        // The run with this UID is gone: its writer lost it for good, as to a tombstone.
        Err(ApiError::Gone(_)) => {
            let seq = request.tail + 1;
            return Ok(Json(AppendOutcome::Deleted { seq }));
        }
        Err(err) => return Err(err),
    }
    let ledger = service.db.for_run(&namespace, &name, &request.uid);
    let result = ledger
        .append(request.tail, request.fence, request.events)
        .await;
    Ok(Json(AppendOutcome::of(result).map_err(failed)?))
}

/// `GET /ledger/v1/namespaces/{ns}/runs/{run}/segments?uid=…&after=…`: the run's segments
/// after `after`, in order.
pub async fn read(
    State(state): State<Arc<ServerState>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<ReadQuery>,
    headers: HeaderMap,
) -> Result<Json<Vec<LedgerSegment>>, ApiError> {
    let service = service(&state)?;
    let user = service.authenticate(&headers).await?;
    service.check_read(&user, &namespace).await?;
    let ledger = service.db.for_run(&namespace, &name, &query.uid);
    let segments = ledger.list_after(query.after).await.map_err(failed)?;
    Ok(Json(segments))
}

/// `POST /ledger/v1/namespaces/{ns}/ledgers`: the whole ledgers of the runs the body names
/// (each with its UID), ordered by run and position, in one query: a turn's history, however
/// many earlier turns its thread has. Read with the right to read one run's ledger; the
/// caller is authenticated and that right checked before a byte of the body is read.
pub async fn read_many(
    State(state): State<Arc<ServerState>>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Vec<LedgerSegment>>, ApiError> {
    let service = service(&state)?;
    let user = service.authenticate(&headers).await?;
    service.check_read(&user, &namespace).await?;
    let request: LedgersRequest = json_within(body, LEDGERS_READ_BODY_LIMIT).await?;
    if let Some(refusal) = request.refusal() {
        return Err(ApiError::BadRequest(refusal));
    }
    let ledgers = service.db.list_runs(&namespace, &request.runs).await;
    Ok(Json(
        ledgers.map_err(failed)?.into_iter().flatten().collect(),
    ))
}

/// `DELETE /ledger/v1/namespaces/{ns}/runs/{run}/segments?uid=…`: the run's rows, for good
/// (baton's controller, finalizing a deleted run).
pub async fn delete(
    State(state): State<Arc<ServerState>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<ReadQuery>,
    headers: HeaderMap,
) -> Result<Json<Deleted>, ApiError> {
    let service = service(&state)?;
    let user = service.authenticate(&headers).await?;
    if let Some(refusal) = service
        .delete_refusal(&user, &namespace, &name, &query.uid)
        .await?
    {
        return Err(ApiError::Forbidden(refusal));
    }
    let ledger = service.db.for_run(&namespace, &name, &query.uid);
    let segments = ledger.delete().await.map_err(failed)?;
    Ok(Json(Deleted { segments }))
}
