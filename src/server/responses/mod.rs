//! `/api/v1/namespaces/{ns}/openai/v1/responses…`: the OpenAI Responses API over baton's runs,
//! so an application that speaks it (the `openai` SDK with this as its `base_url`, the
//! caller's Kubernetes token as its `api_key`) gets a crash-durable background response.
//! A response is an AgentRun: a turn of a thread when a `conversation` is given, else a run
//! of its own with the agent of the thread the `model` names (`thread/<name>`). Its id is the
//! run's name. Every request is made with the caller's own credential, as the rest of the API:
//! what a response borrows from its thread is asked of its creator (DESIGN §12).
//!
//! The events are a view of the one stream of the run ([`view`], numbered by [`fold`]):
//! `GET …/responses/{id}?stream=true&starting_after=N` resumes after event N for as long as
//! the run exists, across worker deaths and server restarts.

mod conversations;
pub(super) mod fold;
#[cfg(test)]
mod fold_tests;
mod items;
mod request;
#[cfg(test)]
mod request_tests;
mod view;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ServerState;
use super::caller::Caller;
use super::error::ApiError;
use super::runs::follow_run;
use super::shared_fold::Folds;
use super::threads::{create_turn, read_thread};
use super::trace_header::Traceparent;
use crate::crd::v1alpha1::{AgentRun, AgentRunSpec, AgentThread};
use crate::ledger::Unchunker;
use crate::requests::{RunRequests, phase_of};
use crate::serving::cut::ConnectionCut;
use fold::{End, Fold};
use view::live_status;
pub(super) use view::{ResponsesView, end_of_phase, meta_of};

/// The `model` the client named, kept on the run for the response object.
pub const MODEL_ANNOTATION: &str = "baton.dev/responses-model";
/// `"true"` when the response was created with `background: true`.
pub const BACKGROUND_ANNOTATION: &str = "baton.dev/responses-background";

/// The routes, under `/api/v1/namespaces/{ns}`.
pub fn routes(ns: &str) -> Router<Arc<ServerState>> {
    let base = format!("{ns}/openai/v1/responses");
    Router::new()
        .route(&base, post(create))
        .route(&format!("{base}/{{id}}"), get(retrieve))
        .route(&format!("{base}/{{id}}/cancel"), post(cancel))
        .merge(conversations::routes(ns))
}

/// An error as OpenAI's clients read one: `{"error": {"message", "type", "code"}}`, with the
/// HTTP code baton's own API gives it.
pub struct OpenAiError(ApiError);

impl<E: Into<ApiError>> From<E> for OpenAiError {
    fn from(err: E) -> Self {
        Self(err.into())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let (code, reason) = self.0.code_and_reason();
        let kind = match code {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            _ => "api_error",
        };
        let body = json!({"error": {
            "message": self.0.to_string(), "type": kind, "code": reason, "param": null,
        }});
        (code, Json(body)).into_response()
    }
}

async fn create(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    traceparent: Traceparent,
    Path(ns): Path<String>,
    connection: Option<Extension<ConnectionCut>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, OpenAiError> {
    let Json(body) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let asked = request::parse(&body).map_err(ApiError::BadRequest)?;
    let annotate = |mut run: AgentRun| {
        let notes = run.annotations_mut();
        notes.insert(MODEL_ANNOTATION.into(), asked.model.clone());
        notes.insert(BACKGROUND_ANNOTATION.into(), asked.background.to_string());
        traceparent.onto(run)
    };
    let created = match asked.turn {
        true => {
            let turn = |t: &AgentThread| annotate(t.new_turn(&asked.input));
            create_turn(caller.client(), &ns, &asked.thread, turn).await?
        }
        false => {
            let thread = read_thread(caller.client(), &ns, &asked.thread).await?;
            let api: Api<AgentRun> = Api::namespaced(caller.client().clone(), &ns);
            let run = annotate(run_with_agent_of(&thread, &asked.input));
            api.create(&PostParams::default(), &run).await?
        }
    };
    let name = created.name_any();
    if asked.stream {
        let connection = connection.map(|c| c.0);
        return Ok(stream(&state, &caller, &ns, &name, None, connection).await?);
    }
    if !asked.background {
        wait_for_end(caller.client(), &ns, &name).await?;
    }
    let requests = state.requests(&caller, &ns);
    Ok(Json(response_object(&requests, &name).await?).into_response())
}

/// A run of its own with `thread`'s agent, worker and limits, and `input`.
fn run_with_agent_of(thread: &AgentThread, input: &str) -> AgentRun {
    let t = &thread.spec;
    let spec = AgentRunSpec {
        agent: Some(t.agent.clone()),
        worker: t.worker.clone(),
        budget: t.budget.clone(),
        lease: t.lease.clone(),
        max_attempts: t.max_attempts,
        ..thread.new_turn(input).spec
    };
    AgentRun {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("resp-".into()),
            ..Default::default()
        },
        spec: AgentRunSpec {
            thread: None,
            ..spec
        },
        status: None,
    }
}

async fn wait_for_end(client: &kube::Client, ns: &str, name: &str) -> Result<(), ApiError> {
    let api: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let ended = |run: Option<&AgentRun>| run.is_none_or(|r| phase_of(r).is_terminal());
    kube::runtime::wait::await_condition(api, name, ended)
        .await
        .map_err(|e| ApiError::Unreachable(e.to_string()))?;
    Ok(())
}

/// `?stream=true&starting_after=N` of a retrieve.
#[derive(Deserialize, Default)]
pub struct RetrieveQuery {
    #[serde(default)]
    stream: bool,
    starting_after: Option<i64>,
}

async fn retrieve(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    Query(query): Query<RetrieveQuery>,
    connection: Option<Extension<ConnectionCut>>,
) -> Result<Response, OpenAiError> {
    if query.stream {
        let connection = connection.map(|c| c.0);
        let after = query.starting_after;
        return Ok(stream(&state, &caller, &ns, &id, after, connection).await?);
    }
    if query.starting_after.is_some() {
        let why = "starting_after: only with stream=true";
        return Err(ApiError::BadRequest(why.into()).into());
    }
    let requests = state.requests(&caller, &ns);
    Ok(Json(response_object(&requests, &id).await?).into_response())
}

/// `cancel` is `spec.stop`: answered with the response as it stands (it ends `cancelled`
/// once its worker has stopped, or `completed` if it finished first).
async fn cancel(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
) -> Result<Response, OpenAiError> {
    let requests = state.requests(&caller, &ns);
    requests.stop(&id).await.map_err(ApiError::from)?;
    Ok(Json(response_object(&requests, &id).await?).into_response())
}

async fn stream(
    state: &Arc<ServerState>,
    caller: &Caller,
    ns: &str,
    name: &str,
    after: Option<i64>,
    connection: Option<ConnectionCut>,
) -> Result<Response, ApiError> {
    let view = |run: &AgentRun, folds: &Folds| {
        let uid = run.uid().unwrap_or_default();
        let view = ResponsesView::new(meta_of(run), after, &uid, folds);
        (Box::new(view) as Box<dyn super::view::View>, 0)
    };
    follow_run(state, caller, ns, name, connection, view).await
}

/// The Response object of run `name`: its whole ledger folded, read with the caller's rights.
async fn response_object(requests: &RunRequests, name: &str) -> Result<Value, ApiError> {
    let run = requests.read(name).await?;
    let (fold, _) = folded(requests, &run).await?;
    Ok(fold.object(&meta_of(&run), response_status(&fold, &run)))
}

/// The response's `status`: the end its ledger folds to, else what its run's phase says.
fn response_status(fold: &Fold, run: &AgentRun) -> &'static str {
    fold.end().map_or_else(|| live_status(run), End::status)
}

/// `run`'s whole ledger folded (read a page at a time with the caller's rights, chunked events
/// rebuilt), its end from the run's phase when the ledger has none yet; and the number of the
/// last event made.
pub(super) async fn folded(
    requests: &RunRequests,
    run: &AgentRun,
) -> Result<(Fold, i64), ApiError> {
    let meta = meta_of(run);
    let mut fold = Fold::default();
    let mut chunks = Unchunker::default();
    let (mut after, mut tail, mut last) = (0, 0, 0);
    let mut note = |made: &[Value]| {
        if let Some(n) = made
            .iter()
            .filter_map(|e| e["sequence_number"].as_i64())
            .max()
        {
            last = n;
        }
    };
    loop {
        let page = requests.ledger_page(run, after, PAGE).await?;
        for segment in &page {
            let mut events = Vec::new();
            for event in &segment.spec.events {
                if let Ok(Some(whole)) = chunks.feed(event) {
                    events.push(whole.into_owned());
                }
            }
            let events: Vec<_> = events.iter().collect();
            note(&fold.position(&meta, segment.spec.seq, &events));
            tail = segment.spec.seq;
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after = last.spec.seq,
            _ => break,
        }
    }
    if let Some(end) = end_of_phase(run) {
        note(
            &fold
                .end_from_phase(&meta, end, tail + 1)
                .into_iter()
                .collect::<Vec<_>>(),
        );
    }
    Ok((fold, last))
}

/// Segments read at once for a response object.
const PAGE: usize = 100;
