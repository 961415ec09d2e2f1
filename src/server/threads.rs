//! `/api/v1/namespaces/{ns}/threads…`: list, get, a new turn, and the thread's stream: every
//! turn in its place, each as a run's stream, open for the turns still to come.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ServerState;
use super::caller::Caller;
use super::cursor::Resume;
use super::error::ApiError;
use super::hub::Change;
use super::runs::{StreamQuery, bad_body};
use super::stream::{Ended, Follow};
use super::trace_header::Traceparent;
use super::view::json_event;
use crate::crd::v1alpha1::{AgentRun, AgentThread, BusyPolicy};
use crate::kube_util::is_not_found;
use crate::requests::phase_of;
use crate::serving::cut::ConnectionCut;

pub async fn list(caller: Caller, Path(ns): Path<String>) -> Result<Json<Value>, ApiError> {
    let api: Api<AgentThread> = Api::namespaced(caller.client().clone(), &ns);
    let threads = api.list(&ListParams::default()).await?.items;
    Ok(Json(json!({ "kind": "AgentThreadList", "items": threads })))
}

pub async fn get(
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<AgentThread>, ApiError> {
    Ok(Json(read_thread(caller.client(), &ns, &name).await?))
}

pub(super) async fn read_thread(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<AgentThread, ApiError> {
    let api: Api<AgentThread> = Api::namespaced(client.clone(), ns);
    api.get(name).await.map_err(|e| {
        if is_not_found(&e) {
            ApiError::ThreadNotFound {
                name: name.into(),
                namespace: ns.into(),
            }
        } else {
            e.into()
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnBody {
    input: String,
}

/// Creates a turn. Under `onBusy: Reject` a busy thread is answered 409 `ThreadBusy` and
/// nothing is created; a turn created in the instant the thread turns busy is still refused,
/// by the controller (its stream's `end` says `ThreadBusy`).
pub async fn post_turn(
    caller: Caller,
    traceparent: Traceparent,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<TurnBody>, JsonRejection>,
) -> Result<(StatusCode, Json<AgentRun>), ApiError> {
    let Json(body) = body.map_err(bad_body)?;
    if body.input.trim().is_empty() {
        return Err(ApiError::BadRequest("input: must not be empty".into()));
    }
    let turn = |t: &AgentThread| traceparent.onto(t.new_turn(&body.input));
    let created = create_turn(caller.client(), &ns, &name, turn).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Creates the turn `turn` makes of thread `name`, unless the thread is busy and its onBusy
/// policy is Reject (409 `ThreadBusy`, nothing created).
pub(super) async fn create_turn(
    client: &kube::Client,
    ns: &str,
    name: &str,
    turn: impl FnOnce(&AgentThread) -> AgentRun,
) -> Result<AgentRun, ApiError> {
    let thread = read_thread(client, ns, name).await?;
    if thread.spec.on_busy == BusyPolicy::Reject
        && let Some(live) = thread.busy()
    {
        return Err(ApiError::ThreadBusy {
            thread: name.to_string(),
            live: live.to_string(),
        });
    }
    let api: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let asked = turn(&thread);
    Ok(crate::requests::create_turn(&api, &thread, asked).await?)
}

/// The thread's turns, in their places (those that have not joined yet last).
pub(super) async fn turns(
    client: &kube::Client,
    ns: &str,
    thread: &AgentThread,
) -> Result<Vec<AgentRun>, ApiError> {
    let api: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let (name, uid) = (thread.name_any(), thread.uid().unwrap_or_default());
    let mut turns: Vec<AgentRun> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|r| r.is_turn_of(&name, &uid))
        .collect();
    turns.sort_by_key(AgentRun::turn_order);
    Ok(turns)
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
    let thread = read_thread(caller.client(), &ns, &name).await?;
    // Refused before the stream opens for a caller who may not read transcripts here.
    let requests = state.requests(&caller, &ns);
    requests.probe_ledgers().await?;
    let slot = state.stream_slot(&caller)?;
    let hub = state.hubs.join(&caller, &ns)?;
    let client = caller.client().clone();
    let (follow, response) = state.follow(requests, hub, connection.map(|c| c.0));
    let mut stream = ThreadStream {
        follow,
        client,
        ns,
        thread,
        streamed: HashSet::new(),
    };
    let after = stream.skip_to(&resume).await?;
    let metrics = state.metrics.clone();
    let watchdog = stream.follow.watchdog();
    tokio::spawn(async move {
        metrics.followers.inc();
        watchdog.beside(stream.run(after)).await;
        metrics.followers.dec();
        drop(slot);
    });
    Ok(response)
}

/// One client's stream of a thread.
struct ThreadStream {
    follow: Follow,
    client: kube::Client,
    ns: String,
    thread: AgentThread,
    /// The turns streamed to their end (by UID).
    streamed: HashSet<String>,
}

impl ThreadStream {
    /// Marks the turns before the cursor's as streamed; returns the position to continue
    /// after in the cursor's turn. A cursor naming no turn of this thread is refused (it
    /// cannot say what the client has).
    async fn skip_to(&mut self, resume: &Resume) -> Result<Option<(String, i64)>, ApiError> {
        let Resume::After(id) = resume else {
            return match resume {
                Resume::AfterPosition(_) => Err(ApiError::BadRequest(
                    "after: a thread's stream resumes after an event id (<turn UID>:<position>), not a bare position".into(),
                )),
                _ => Ok(None),
            };
        };
        let turns = turns(&self.client, &self.ns, &self.thread).await?;
        let Some(at) = turns
            .iter()
            .position(|t| t.uid().as_deref() == Some(&id.uid))
        else {
            return Err(ApiError::BadRequest(format!(
                "Last-Event-ID: {id} names no turn of thread {} (deleted?); open the stream without it",
                self.thread.name_any()
            )));
        };
        for t in &turns[..at] {
            self.streamed.insert(t.id().uid);
        }
        Ok(Some((id.uid.clone(), id.seq)))
    }

    async fn run(&mut self, mut resume: Option<(String, i64)>) {
        loop {
            let Ok(turns) = turns(&self.client, &self.ns, &self.thread).await else {
                let data = json!({ "thread": self.thread.name_any(), "message": "cannot list the thread's turns" });
                let _ = self.follow.send(json_event("error", &data)).await;
                return;
            };
            let next = turns.into_iter().find(|t| {
                !self.streamed.contains(&t.id().uid)
                    && (t.has_joined() || phase_of(t).is_terminal())
            });
            match next {
                Some(turn) => {
                    let uid = turn.id().uid;
                    let after = match resume.take() {
                        Some((u, seq)) if u == uid => seq,
                        _ => 0,
                    };
                    match self.follow.run(turn, after).await {
                        Ended::ClientGone | Ended::Failed => return,
                        Ended::Run | Ended::Deleted => self.streamed.insert(uid),
                    };
                }
                None => {
                    if !self.wait_for_turn().await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits until a run of this thread changes (or the watch starts again); false once the
    /// client is gone.
    async fn wait_for_turn(&mut self) -> bool {
        let name = self.thread.name_any();
        loop {
            match self.follow.next_change().await {
                None => return false,
                Some(Change::Run(r)) if r.spec.thread.as_deref() == Some(name.as_str()) => {
                    return true;
                }
                Some(Change::Resync) => return true,
                Some(_) => {}
            }
        }
    }
}
