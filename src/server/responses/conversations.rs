//! `/conversations` and a response's `input_items`, as far as they map onto threads: a
//! conversation is an AgentThread, made from another thread as its template; its items are
//! its turns' inputs and outputs ([`super::items`]), read with the caller's own rights. What
//! does not map (items added or deleted one by one, metadata changed afterwards) is not
//! served: docs/reference/responses-api.md says why.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::items::{self, ListQuery, METADATA_ANNOTATION};
use super::{OpenAiError, folded, meta_of, response_status};
use crate::crd::v1alpha1::{AgentRun, AgentThread};
use crate::kube_util::is_not_found;
use crate::requests::RunRequests;
use crate::server::ServerState;
use crate::server::caller::Caller;
use crate::server::error::ApiError;
use crate::server::threads::{read_thread, turns};

/// The routes, under `/api/v1/namespaces/{ns}`.
pub fn routes(ns: &str) -> Router<Arc<ServerState>> {
    let base = format!("{ns}/openai/v1");
    let conversations = format!("{base}/conversations");
    Router::new()
        .route(&conversations, post(create))
        .route(
            &format!("{conversations}/{{id}}"),
            get(retrieve).delete(delete),
        )
        .route(&format!("{conversations}/{{id}}/items"), get(list_items))
        .route(
            &format!("{base}/responses/{{id}}/input_items"),
            get(input_items),
        )
}

fn object_of(thread: &AgentThread) -> Value {
    let created = thread.metadata.creation_timestamp.as_ref();
    let metadata = thread.annotations().get(METADATA_ANNOTATION);
    items::conversation(
        &thread.name_any(),
        created.map_or(0, |t| t.0.as_second()),
        metadata.map(String::as_str),
    )
}

/// A new AgentThread copying the agent, worker and limits of the thread `metadata.agent` names:
/// created with the caller's credential, so what it borrows is asked of the caller (the one
/// borrow rule, docs/security.md).
async fn create(
    caller: Caller,
    Path(ns): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Json(body) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let asked = items::new_conversation(&body).map_err(ApiError::BadRequest)?;
    let template = read_thread(caller.client(), &ns, &asked.template).await?;
    let metadata = Value::Object(asked.metadata).to_string();
    let thread = AgentThread {
        metadata: ObjectMeta {
            generate_name: Some("conv-".into()),
            annotations: Some([(METADATA_ANNOTATION.to_string(), metadata)].into()),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    };
    let api: Api<AgentThread> = Api::namespaced(caller.client().clone(), &ns);
    let created = api.create(&PostParams::default(), &thread).await?;
    Ok(Json(object_of(&created)))
}

async fn retrieve(
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
) -> Result<Json<Value>, OpenAiError> {
    Ok(Json(object_of(
        &read_thread(caller.client(), &ns, &id).await?,
    )))
}

/// Deletes the thread; its turns go with it (they are its own).
async fn delete(
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
) -> Result<Json<Value>, OpenAiError> {
    let api: Api<AgentThread> = Api::namespaced(caller.client().clone(), &ns);
    match api.delete(&id, &DeleteParams::default()).await {
        Ok(_) => Ok(Json(
            json!({"id": id, "object": "conversation.deleted", "deleted": true}),
        )),
        Err(e) if is_not_found(&e) => Err(ApiError::ThreadNotFound {
            name: id,
            namespace: ns,
        }
        .into()),
        Err(e) => Err(ApiError::from(e).into()),
    }
}

/// Every turn's items, each turn's ledger folded with the caller's rights.
async fn list_items(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, OpenAiError> {
    let thread = read_thread(caller.client(), &ns, &id).await?;
    let requests = state.requests(&caller, &ns);
    let mut all = Vec::new();
    for turn in turns(caller.client(), &ns, &thread).await? {
        all.extend(turn_items(&requests, &turn).await?);
    }
    Ok(Json(
        items::page(all, &query).map_err(ApiError::BadRequest)?,
    ))
}

async fn turn_items(requests: &RunRequests, turn: &AgentRun) -> Result<Vec<Value>, ApiError> {
    let (fold, _) = folded(requests, turn).await?;
    let object = fold.object(&meta_of(turn), response_status(&fold, turn));
    let output = object["output"].as_array().map_or(&[][..], Vec::as_slice);
    let (id, input) = (turn.name_any(), &turn.spec.input);
    Ok(items::turn_items(&id, input, output, fold.answers()))
}

/// The response's input: the user's message, then the answers it was given.
async fn input_items(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, OpenAiError> {
    let requests = state.requests(&caller, &ns);
    let run = requests.read(&id).await.map_err(ApiError::from)?;
    let (fold, _) = folded(&requests, &run).await?;
    let all = items::input_items(&id, &run.spec.input, fold.answers());
    Ok(Json(
        items::page(all, &query).map_err(ApiError::BadRequest)?,
    ))
}
