//! `/api/v1/namespaces/{ns}/runs…`: list, get, the event stream, and what a person asks of a
//! run (stop, an input, a decision), each made with the caller's own credential.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::{Extension, Json};
use kube::Api;
use kube::api::ListParams;
use serde::Deserialize;
use serde_json::{Value, json};

use super::ServerState;
use super::caller::Caller;
use super::cursor::Resume;
use super::error::ApiError;
use super::shared_fold::Folds;
use super::view::{Native, View};
use crate::crd::v1alpha1::{AgentRun, LedgerSegment, Phase, Verdict};
use crate::requests::{Stopped, phase_of};
use crate::serving::cut::ConnectionCut;

/// `?thread=`, `?phase=`, `?labelSelector=` of a list.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunFilter {
    thread: Option<String>,
    phase: Option<String>,
    label_selector: Option<String>,
}

pub async fn list(
    caller: Caller,
    Path(ns): Path<String>,
    Query(filter): Query<RunFilter>,
) -> Result<Json<Value>, ApiError> {
    let phase = match filter.phase.as_deref() {
        None | Some("") => None,
        Some(p) => Some(parse_phase(p)?),
    };
    let mut params = ListParams::default();
    if let Some(selector) = filter.label_selector.as_deref() {
        params = params.labels(selector);
    }
    let api: Api<AgentRun> = Api::namespaced(caller.client().clone(), &ns);
    let mut runs = api.list(&params).await?.items;
    runs.retain(|r| {
        filter
            .thread
            .as_deref()
            .is_none_or(|t| r.spec.thread.as_deref() == Some(t))
            && phase.is_none_or(|p| phase_of(r) == p)
    });
    runs.sort_by_key(|r| (r.spec.thread.clone(), r.turn_order()));
    Ok(Json(json!({ "kind": "AgentRunList", "items": runs })))
}

fn parse_phase(text: &str) -> Result<Phase, ApiError> {
    serde_json::from_value(Value::String(text.to_string()))
        .map_err(|_| ApiError::BadRequest(format!("phase: {text:?} is not a phase of AgentRun")))
}

pub async fn get(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<AgentRun>, ApiError> {
    Ok(Json(state.requests(&caller, &ns).read(&name).await?))
}

/// `?after=` (a position or an event id) and `?lastEventId=` for clients that cannot set a
/// header.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuery {
    after: Option<String>,
    last_event_id: Option<String>,
}

impl StreamQuery {
    pub fn resume(&self, headers: &HeaderMap) -> Result<Resume, ApiError> {
        let header = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .or(self.last_event_id.as_deref());
        Ok(Resume::from_request(header, self.after.as_deref())?)
    }
}

pub async fn events(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<StreamQuery>,
    connection: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let resume = query.resume(&headers)?;
    let view = |run: &AgentRun, _: &Folds| {
        let after = resume.position_in(&run.id().uid);
        (Box::new(Native::default()) as Box<dyn View>, after)
    };
    follow_run(&state, &caller, &ns, &name, connection.map(|c| c.0), view).await
}

/// A stream of run `name`, shown to the client by the view `view` makes of the run (with the
/// position its cursor names): the caller's slot and hub, the run read (and so authorized)
/// before the stream opens, so that a refusal is a plain HTTP answer.
pub(super) async fn follow_run(
    state: &Arc<ServerState>,
    caller: &Caller,
    ns: &str,
    name: &str,
    connection: Option<ConnectionCut>,
    view: impl FnOnce(&AgentRun, &Folds) -> (Box<dyn View>, i64),
) -> Result<Response, ApiError> {
    let slot = state.stream_slot(caller)?;
    let hub = state.hubs.join(caller, ns)?;
    let (follow, response) = state.follow(state.requests(caller, ns), hub.clone(), connection);
    let run = follow.requests().read(name).await?;
    follow.requests().probe_ledgers().await?;
    let (view, after) = view(&run, &hub.folds);
    let mut follow = follow.viewed_as(view);
    let metrics = state.metrics.clone();
    let watchdog = follow.watchdog();
    tokio::spawn(async move {
        metrics.followers.inc();
        watchdog.beside(follow.run(run, after)).await;
        metrics.followers.dec();
        drop(slot);
    });
    Ok(response)
}

/// `?after=`: a ledger position (0, or absent: from the start).
#[derive(Deserialize, Default)]
pub struct SegmentsQuery {
    #[serde(default)]
    after: i64,
    /// At most this many segments ([`SEGMENTS_PAGE`] when absent or larger).
    limit: Option<usize>,
}

/// The most segments one `GET …/segments` answers: a client reads a longer ledger page by
/// page, each from the last position it has (`after`), until an answer is empty.
pub const SEGMENTS_PAGE: usize = 100;

/// `GET …/runs/{run}/segments?after=N&limit=L`: at most a page of the run's segments after
/// position N, as JSON, read
/// with the caller's rights as a stream's are (for a client that reads once, such as `baton
/// transcript --server` without `-f`).
pub async fn segments(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<SegmentsQuery>,
) -> Result<Json<Vec<LedgerSegment>>, ApiError> {
    let requests = state.requests(&caller, &ns);
    let run = requests.read(&name).await?;
    let limit = query.limit.unwrap_or(SEGMENTS_PAGE).clamp(1, SEGMENTS_PAGE);
    let after = query.after.max(0);
    Ok(Json(requests.ledger_page(&run, after, limit).await?))
}

pub async fn stop(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let answer = match state.requests(&caller, &ns).stop(&name).await? {
        Stopped::Requested(phase) => json!({ "stopRequested": true, "phase": phase }),
        Stopped::AlreadyEnded(phase) => json!({ "stopRequested": false, "phase": phase }),
    };
    Ok(Json(answer))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    text: String,
}

pub async fn input(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<InputBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(bad_body)?;
    let count = state
        .requests(&caller, &ns)
        .input(&name, &body.text)
        .await?;
    Ok(Json(json!({ "inputs": count })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    decision: Verdict,
    step: Option<i64>,
    reason: Option<String>,
}

pub async fn decide(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<DecisionBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(bad_body)?;
    let reason = body.reason.filter(|r| !r.trim().is_empty());
    if body.decision == Verdict::Deny && reason.is_none() {
        return Err(ApiError::BadRequest(
            "reason: required to deny a call (the model is told why)".into(),
        ));
    }
    let decided = state
        .requests(&caller, &ns)
        .decide(&name, body.step, body.decision, reason)
        .await?;
    let call = decided
        .call
        .map(|c| json!({ "callId": c.call_id, "tool": c.tool, "arguments": c.arguments }));
    Ok(Json(
        json!({ "step": decided.step, "decision": body.decision, "call": call }),
    ))
}

/// A body that is not the JSON asked for: 400, with serde's words (they name the field).
pub fn bad_body(rejection: JsonRejection) -> ApiError {
    ApiError::BadRequest(format!("request body: {}", rejection.body_text()))
}
