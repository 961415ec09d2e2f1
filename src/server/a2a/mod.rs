//! `/api/v1/namespaces/{ns}/a2a/threads/{thread}`: each AgentThread as an A2A agent
//! (protocol 0.3, JSON-RPC): its card, `message/send` and `message/stream` (a turn of the
//! thread, the task; `contextId` is the thread), `tasks/get`, `tasks/cancel` (`spec.stop`),
//! `tasks/resubscribe` (the task as it stands, then its live tail, or every event after the
//! one a client names with the ledger-cursor extension). A message that names a task waiting
//! for input is its input. Every request is made with the caller's own credential.

pub(super) mod translate;
#[cfg(test)]
mod translate_tests;
pub(super) mod view;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::ServerState;
use super::caller::Caller;
use super::error::ApiError;
use super::runs::follow_run;
use super::shared_fold::Folds;
use super::threads::{create_turn, read_thread};
use super::trace_header::Traceparent;
use crate::crd::v1alpha1::{AgentRun, Phase};
use crate::requests::phase_of;
use crate::serving::cut::ConnectionCut;
use translate::{CURSOR_EXTENSION, STARTING_AFTER_HEADER, TaskIds};
use view::A2aView;

/// The routes, under `/api/v1/namespaces/{ns}`.
pub fn routes(ns: &str) -> Router<Arc<ServerState>> {
    let agent = format!("{ns}/a2a/threads/{{thread}}");
    Router::new()
        .route(&agent, post(rpc))
        .route(&format!("{agent}/.well-known/agent-card.json"), get(card))
}

/// A JSON-RPC error: its code and message.
struct RpcError(i64, String);

impl From<ApiError> for RpcError {
    fn from(err: ApiError) -> Self {
        let (code, _) = err.code_and_reason();
        let rpc = match code.as_u16() {
            404 => -32001,
            400 => -32602,
            _ => -32603,
        };
        RpcError(rpc, err.to_string())
    }
}

fn task_not_found(id: &str, thread: &str) -> RpcError {
    RpcError(-32001, format!("task {id} is not a task of agent {thread}"))
}

async fn card(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, thread)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let found = read_thread(caller.client(), &ns, &thread).await?;
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
    {
        Some(proto) => proto.to_string(),
        None if state.serves_https() => "https".into(),
        None => "http".into(),
    };
    let url = format!("{scheme}://{host}/api/v1/namespaces/{ns}/a2a/threads/{thread}");
    let description = format!(
        "baton AgentThread {ns}/{thread}: each message is a turn of the thread, kept alive \
         across pod deaths; contextId is the thread ({} tools)",
        found.spec.agent.tools.len()
    );
    Ok(Json(json!({
        "name": thread, "description": description, "url": url,
        "version": env!("CARGO_PKG_VERSION"), "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": true, "pushNotifications": false, "extensions": [{
            "uri": CURSOR_EXTENSION, "required": false,
            "description": "each event's metadata carries its ledger number; a resubscribe with \
                the baton-starting-after header resumes after that event",
        }]},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{"id": "turn", "name": thread, "description": "a turn of the thread", "tags": ["baton"]}],
    })))
}

async fn rpc(
    State(state): State<Arc<ServerState>>,
    caller: Caller,
    Path((ns, thread)): Path<(String, String)>,
    headers: HeaderMap,
    connection: Option<Extension<ConnectionCut>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let Ok(Json(request)) = body else {
        return rpc_answer(
            &Value::Null,
            Err(RpcError(-32700, "the body is not JSON".into())),
        );
    };
    let id = request["id"].clone();
    if request["jsonrpc"] != "2.0" || !request["method"].is_string() {
        let error = RpcError(-32600, "not a JSON-RPC 2.0 request".into());
        return rpc_answer(&id, Err(error));
    }
    let asked = Asked {
        state,
        caller,
        ns,
        thread,
        id: id.clone(),
        params: request["params"].clone(),
        traceparent: Traceparent::from_header(
            headers.get("traceparent").and_then(|v| v.to_str().ok()),
        ),
    };
    let connection = connection.map(|c| c.0);
    let answered = match request["method"].as_str().unwrap_or("") {
        "message/send" => asked.send().await,
        "message/stream" => {
            return asked
                .stream(connection)
                .await
                .unwrap_or_else(|e| rpc_answer(&id, Err(e)));
        }
        "tasks/get" => asked.get().await,
        "tasks/cancel" => asked.cancel().await,
        "tasks/resubscribe" => {
            let after = headers
                .get(STARTING_AFTER_HEADER)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.parse().ok());
            return asked
                .resubscribe(after, connection)
                .await
                .unwrap_or_else(|e| rpc_answer(&id, Err(e)));
        }
        other => Err(RpcError(-32601, format!("method {other:?} is not served"))),
    };
    rpc_answer(&id, answered)
}

fn rpc_answer(id: &Value, answered: Result<Value, RpcError>) -> Response {
    let body = match answered {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(RpcError(code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    Json(body).into_response()
}

/// One JSON-RPC request of a caller to thread `thread`'s agent.
struct Asked {
    state: Arc<ServerState>,
    caller: Caller,
    ns: String,
    thread: String,
    id: Value,
    params: Value,
    /// The request's `traceparent`: a task it makes continues the client's trace.
    traceparent: Traceparent,
}

impl Asked {
    /// The message's text, and the task it continues (a task waiting for input), if any.
    fn message(&self) -> Result<(String, Option<String>), RpcError> {
        let message = &self.params["message"];
        let invalid = |why: &str| RpcError(-32602, format!("params.message: {why}"));
        if message["role"] != "user" {
            return Err(invalid("role must be user"));
        }
        let parts = message["parts"]
            .as_array()
            .ok_or_else(|| invalid("parts: required"))?;
        let mut text = String::new();
        for (i, part) in parts.iter().enumerate() {
            match (part["kind"].as_str(), part["text"].as_str()) {
                (Some("text"), Some(t)) => text.push_str(t),
                _ => return Err(invalid(&format!("parts[{i}]: only text parts are taken"))),
            }
        }
        if text.trim().is_empty() {
            return Err(invalid("its text must not be empty"));
        }
        if let Some(context) = message["contextId"].as_str()
            && context != self.thread
        {
            let why = format!(
                "contextId {context:?} is not this agent's thread ({:?})",
                self.thread
            );
            return Err(invalid(&why));
        }
        Ok((text, message["taskId"].as_str().map(str::to_string)))
    }

    /// The task the message makes (a new turn) or continues (its input).
    async fn task_of_message(&self) -> Result<AgentRun, RpcError> {
        let (text, task) = self.message()?;
        let requests = self.state.requests(&self.caller, &self.ns);
        if let Some(task) = task {
            let run = self.run(&task).await?;
            requests.input(&task, &text).await.map_err(ApiError::from)?;
            return Ok(run);
        }
        let turn = |t: &crate::crd::v1alpha1::AgentThread| self.traceparent.onto(t.new_turn(&text));
        Ok(create_turn(self.caller.client(), &self.ns, &self.thread, turn).await?)
    }

    /// Run `name`, if it is a task of this agent.
    async fn run(&self, name: &str) -> Result<AgentRun, RpcError> {
        let requests = self.state.requests(&self.caller, &self.ns);
        let run = requests
            .read(name)
            .await
            .map_err(|_| task_not_found(name, &self.thread))?;
        match run.spec.thread.as_deref() == Some(self.thread.as_str()) {
            true => Ok(run),
            false => Err(task_not_found(name, &self.thread)),
        }
    }

    fn ids(&self, run: &AgentRun) -> TaskIds {
        TaskIds {
            task: run.name_any(),
            context: self.thread.clone(),
        }
    }

    /// `message/send`: blocking unless the configuration says not, until the task ends or
    /// waits on a person.
    async fn send(&self) -> Result<Value, RpcError> {
        let run = self.task_of_message().await?;
        if self.params["configuration"]["blocking"] != false {
            self.wait_until_settled(&run.name_any()).await?;
        }
        self.task(&run.name_any()).await.map(|(task, _)| task)
    }

    async fn wait_until_settled(&self, name: &str) -> Result<(), RpcError> {
        let api: Api<AgentRun> = Api::namespaced(self.caller.client().clone(), &self.ns);
        let settled = |run: Option<&AgentRun>| {
            run.is_none_or(|r| {
                let phase = phase_of(r);
                phase.is_terminal() || matches!(phase, Phase::WaitingInput | Phase::WaitingApproval)
            })
        };
        kube::runtime::wait::await_condition(api, name, settled)
            .await
            .map_err(|e| RpcError(-32603, e.to_string()))?;
        Ok(())
    }

    /// The task as it stands, and the number of the last event folded into it.
    async fn task(&self, name: &str) -> Result<(Value, i64), RpcError> {
        let run = self.run(name).await?;
        let requests = self.state.requests(&self.caller, &self.ns);
        let (fold, last) = crate::server::responses::folded(&requests, &run).await?;
        Ok((translate::task(&self.ids(&run), &fold, &run, last), last))
    }

    async fn get(&self) -> Result<Value, RpcError> {
        let id = self.task_id()?;
        self.task(&id).await.map(|(task, _)| task)
    }

    async fn cancel(&self) -> Result<Value, RpcError> {
        let id = self.task_id()?;
        self.run(&id).await?;
        let requests = self.state.requests(&self.caller, &self.ns);
        requests.stop(&id).await.map_err(ApiError::from)?;
        self.task(&id).await.map(|(task, _)| task)
    }

    fn task_id(&self) -> Result<String, RpcError> {
        match self.params["id"].as_str() {
            Some(id) if !id.is_empty() => Ok(id.to_string()),
            _ => Err(RpcError(
                -32602,
                "params.id: the task's id is required".into(),
            )),
        }
    }

    /// `message/stream`: the new task first, then every event of it.
    async fn stream(&self, connection: Option<ConnectionCut>) -> Result<Response, RpcError> {
        let run = self.task_of_message().await?;
        let ids = self.ids(&run);
        let fold = Default::default();
        let first = translate::task(&ids, &fold, &run, 0);
        self.follow(&run.name_any(), ids, first, 0, connection)
            .await
    }

    /// `tasks/resubscribe`: the task as it stands, then the events after it (or after the
    /// event the client names).
    async fn resubscribe(
        &self,
        after: Option<i64>,
        connection: Option<ConnectionCut>,
    ) -> Result<Response, RpcError> {
        let id = self.task_id()?;
        let (task, last) = self.task(&id).await?;
        let run = self.run(&id).await?;
        let ids = self.ids(&run);
        self.follow(&id, ids, task, after.unwrap_or(last), connection)
            .await
    }

    async fn follow(
        &self,
        name: &str,
        ids: TaskIds,
        first: Value,
        after: i64,
        connection: Option<ConnectionCut>,
    ) -> Result<Response, RpcError> {
        let request = self.id.clone();
        let view = |run: &AgentRun, folds: &Folds| {
            let view = A2aView::new(ids, &request, run, first, after, folds);
            (Box::new(view) as Box<dyn super::view::View>, 0)
        };
        let (state, caller) = (&self.state, &self.caller);
        Ok(follow_run(state, caller, &self.ns, name, connection, view).await?)
    }
}
