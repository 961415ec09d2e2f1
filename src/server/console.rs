//! The web console: server-rendered pages (askama templates, HTML-escaped) and a little
//! hand-written script over the browser's EventSource (`assets/console.js`); every read and
//! write is the signed-in user's own, through the same API the console's script calls.
//! Pages: the run index, a run, the threads, a thread (chat), the approvals inbox, sign-in.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Deserialize;

use super::ServerState;
use super::caller::Caller;
use super::error::ApiError;
use super::identity::csrf_token;
use crate::crd::v1alpha1::{AgentRun, AgentThread, Phase};
use crate::requests::phase_of;

/// What every page's header shows.
pub struct Nav {
    namespace: String,
    csrf: String,
    waiting: usize,
}

#[derive(Template)]
#[template(path = "console/index.html")]
struct IndexPage {
    nav: Nav,
    runs: Vec<RunRow>,
    /// The API server's token for the next page, when there is one.
    next: Option<String>,
}

struct RunRow {
    name: String,
    phase: String,
    thread: Option<String>,
    tokens: i64,
    unknown: usize,
    attempt: i64,
    age: String,
}

#[derive(Template)]
#[template(path = "console/threads.html")]
struct ThreadsPage {
    nav: Nav,
    threads: Vec<ThreadRow>,
    next: Option<String>,
}

struct ThreadRow {
    name: String,
    phase: String,
    turns: i64,
    last_turn: String,
    tokens: i64,
}

#[derive(Template)]
#[template(path = "console/run.html")]
struct RunPage {
    nav: Nav,
    name: String,
    phase: String,
}

#[derive(Template)]
#[template(path = "console/thread.html")]
struct ThreadPage {
    nav: Nav,
    name: String,
    on_busy: String,
}

#[derive(Template)]
#[template(path = "console/approvals.html")]
struct ApprovalsPage {
    nav: Nav,
    calls: Vec<WaitingCall>,
    refused: Vec<String>,
    /// More runs wait than the inbox shows ([`INBOX_SHOWN`]).
    more: bool,
}

/// A call waiting for a decision, shown whole (from the ledger) or not at all.
struct WaitingCall {
    namespace: String,
    run: String,
    step: i64,
    tool: String,
    arguments: Option<String>,
    problem: String,
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    nav: Nav,
    code: u16,
    reason: String,
    message: String,
}

/// Where the console starts and which namespaces the inbox looks in when the user may not
/// list runs cluster-wide.
#[derive(Clone, Debug, Default)]
pub struct ConsoleSettings {
    pub namespace: String,
    pub namespaces: Vec<String>,
    /// Browsers reach the console over HTTPS: its cookies are `Secure` and `__Host-`.
    pub secure_cookies: bool,
}

#[derive(Deserialize, Default)]
pub struct NsQuery {
    ns: Option<String>,
    /// The API server's token for a list's next page (`metadata.continue`).
    #[serde(rename = "continue")]
    next: Option<String>,
}

/// Rows a list page shows: the API server is asked for this many, a page at a time.
pub const LIST_PAGE: u32 = 100;
/// Runs asked for at once while looking for those waiting for approval.
const SCAN_PAGE: u32 = 250;
/// Waiting calls the inbox shows (each read from its run's ledger, a page or two).
pub const INBOX_SHOWN: usize = 50;

impl NsQuery {
    /// The list request of the page asked for.
    fn page(&self) -> ListParams {
        let params = ListParams::default().limit(LIST_PAGE);
        match &self.next {
            Some(token) if !token.is_empty() => params.continue_token(token),
            _ => params,
        }
    }
}

/// A page, or where to go instead.
type PageResult = Result<Response, Refusal>;

/// A page answered instead of the one asked for: the sign-in, or a refusal (boxed: a
/// `Response` is large for the error side of a `Result`).
pub struct Refusal(Box<Response>);

impl From<Response> for Refusal {
    fn from(response: Response) -> Self {
        Self(Box::new(response))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        *self.0
    }
}

pub(super) fn html(page: impl Template) -> Response {
    match page.render() {
        Ok(body) => guarded(Html(body).into_response()),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// No page of the console may be framed (its buttons approve tool calls), and it runs only
/// its own script.
pub(super) fn guarded(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The signed-in caller, or the sign-in page.
fn signed_in(caller: Result<Caller, ApiError>) -> Result<Caller, Refusal> {
    caller.map_err(|_| Redirect::to("/console/login").into_response().into())
}

impl ServerState {
    /// The namespace `?ns=` names, or the console's own when it names none (or is not a
    /// namespace's name at all).
    fn namespace_of(&self, query: &NsQuery) -> String {
        query
            .ns
            .clone()
            .filter(|n| super::names::is_object_name(n))
            .unwrap_or_else(|| self.console.namespace.clone())
    }

    async fn nav(&self, caller: &Caller, namespace: &str) -> Nav {
        let waiting = self.waiting_runs(caller, namespace).await.0.len();
        Nav {
            namespace: namespace.to_string(),
            csrf: csrf_token(caller.token()),
            waiting,
        }
    }

    /// The runs waiting for approval that the caller may see, at most [`INBOX_SHOWN`] (true
    /// when there are more): cluster-wide if it may list runs there, else in the console's
    /// namespaces and `namespace`; with the namespaces it was refused. Runs are listed a page
    /// at a time and only the waiting ones kept, so no page holds every run of the cluster.
    async fn waiting_runs(
        &self,
        caller: &Caller,
        namespace: &str,
    ) -> (Vec<AgentRun>, Vec<String>, bool) {
        let mut found = Waiting::default();
        let all: Api<AgentRun> = Api::all(caller.client().clone());
        if found.scan(&all).await.is_ok() {
            return (found.runs, Vec::new(), found.more);
        }
        found = Waiting::default();
        let mut namespaces = self.console.namespaces.clone();
        if !namespaces.iter().any(|n| n == namespace) {
            namespaces.push(namespace.to_string());
        }
        let mut refused = Vec::new();
        for ns in namespaces {
            let api: Api<AgentRun> = Api::namespaced(caller.client().clone(), &ns);
            // Forbidden, or out of reach: the page says it could not look there.
            if found.scan(&api).await.is_err() {
                refused.push(ns);
            }
        }
        (found.runs, refused, found.more)
    }

    /// A refusal as a page (a forbidden namespace, a missing run), with the API server's words.
    async fn error_page(&self, caller: &Caller, namespace: &str, err: ApiError) -> Refusal {
        let (code, reason) = err.code_and_reason();
        let page = ErrorPage {
            nav: self.nav(caller, namespace).await,
            code: code.as_u16(),
            reason,
            message: err.to_string(),
        };
        let mut response = html(page);
        *response.status_mut() = code;
        response.into()
    }

    /// What a page needs, or the error page for `caller` in `namespace` saying why not.
    async fn or_error_page<T>(
        &self,
        caller: &Caller,
        namespace: &str,
        read: Result<T, impl Into<ApiError>>,
    ) -> Result<T, Refusal> {
        match read {
            Ok(value) => Ok(value),
            Err(e) => Err(self.error_page(caller, namespace, e.into()).await),
        }
    }
}

pub async fn index(
    State(state): State<Arc<ServerState>>,
    caller: Result<Caller, ApiError>,
    Query(query): Query<NsQuery>,
) -> PageResult {
    let caller = signed_in(caller)?;
    let ns = state.namespace_of(&query);
    let api: Api<AgentRun> = Api::namespaced(caller.client().clone(), &ns);
    let listed = api.list(&query.page()).await;
    let listed = state.or_error_page(&caller, &ns, listed).await?;
    let next = listed.metadata.continue_.filter(|t| !t.is_empty());
    let mut runs = listed.items;
    runs.sort_by_key(|r| std::cmp::Reverse(r.metadata.creation_timestamp.clone()));
    let now = Timestamp::now();
    let rows = runs.iter().map(|r| run_row(r, now)).collect();
    Ok(html(IndexPage {
        nav: state.nav(&caller, &ns).await,
        runs: rows,
        next,
    }))
}

fn run_row(run: &AgentRun, now: Timestamp) -> RunRow {
    let status = run.status.clone().unwrap_or_default();
    let age = crate::display::age(run.metadata.creation_timestamp.as_ref(), now);
    RunRow {
        name: run.name_any(),
        phase: status.phase.to_string(),
        thread: run.spec.thread.clone(),
        tokens: status.usage.map(|u| u.total_tokens).unwrap_or(0),
        unknown: status.unknown_effects.len(),
        attempt: status.attempt,
        age,
    }
}

pub async fn threads(
    State(state): State<Arc<ServerState>>,
    caller: Result<Caller, ApiError>,
    Query(query): Query<NsQuery>,
) -> PageResult {
    let caller = signed_in(caller)?;
    let ns = state.namespace_of(&query);
    let api: Api<AgentThread> = Api::namespaced(caller.client().clone(), &ns);
    let listed = api.list(&query.page()).await;
    let listed = state.or_error_page(&caller, &ns, listed).await?;
    let next = listed.metadata.continue_.filter(|t| !t.is_empty());
    let threads = listed.items;
    let rows = threads
        .iter()
        .map(|t| {
            let st = t.status.clone().unwrap_or_default();
            ThreadRow {
                name: t.name_any(),
                phase: format!("{:?}", st.phase),
                turns: st.turns,
                last_turn: st.last_turn.unwrap_or_default(),
                tokens: st.usage.total_tokens,
            }
        })
        .collect();
    Ok(html(ThreadsPage {
        nav: state.nav(&caller, &ns).await,
        threads: rows,
        next,
    }))
}

pub async fn run(
    State(state): State<Arc<ServerState>>,
    caller: Result<Caller, ApiError>,
    Path((ns, name)): Path<(String, String)>,
) -> PageResult {
    let caller = signed_in(caller)?;
    let read = state.requests(&caller, &ns).read(&name).await;
    let run = state.or_error_page(&caller, &ns, read).await?;
    Ok(html(RunPage {
        nav: state.nav(&caller, &ns).await,
        name,
        phase: phase_of(&run).to_string(),
    }))
}

pub async fn thread(
    State(state): State<Arc<ServerState>>,
    caller: Result<Caller, ApiError>,
    Path((ns, name)): Path<(String, String)>,
) -> PageResult {
    let caller = signed_in(caller)?;
    let api: Api<AgentThread> = Api::namespaced(caller.client().clone(), &ns);
    let read = api.get(&name).await;
    let thread = state.or_error_page(&caller, &ns, read).await?;
    Ok(html(ThreadPage {
        nav: state.nav(&caller, &ns).await,
        name,
        on_busy: format!("{:?}", thread.spec.on_busy),
    }))
}

pub async fn approvals(
    State(state): State<Arc<ServerState>>,
    caller: Result<Caller, ApiError>,
    Query(query): Query<NsQuery>,
) -> PageResult {
    let caller = signed_in(caller)?;
    let ns = state.namespace_of(&query);
    let (runs, refused, more) = state.waiting_runs(&caller, &ns).await;
    let mut calls = Vec::new();
    for run in &runs {
        calls.push(waiting_call(&state, &caller, run).await);
    }
    let nav = Nav {
        namespace: ns,
        csrf: csrf_token(caller.token()),
        waiting: calls.len(),
    };
    Ok(html(ApprovalsPage {
        nav,
        calls,
        refused,
        more,
    }))
}

/// The runs waiting for approval found so far, up to [`INBOX_SHOWN`].
#[derive(Default)]
struct Waiting {
    runs: Vec<AgentRun>,
    more: bool,
}

impl Waiting {
    /// Lists `api`'s runs a page at a time, keeping the waiting ones, until the inbox is full.
    async fn scan(&mut self, api: &Api<AgentRun>) -> Result<(), kube::Error> {
        let mut params = ListParams::default().limit(SCAN_PAGE);
        loop {
            let page = api.list(&params).await?;
            for run in page.items {
                if phase_of(&run) != Phase::WaitingApproval {
                    continue;
                }
                if self.runs.len() == INBOX_SHOWN {
                    self.more = true;
                    return Ok(());
                }
                self.runs.push(run);
            }
            match page.metadata.continue_.filter(|t| !t.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(()),
            }
        }
    }
}

/// The call `run` waits on, whole from its ledger (read with the caller's credential), or
/// why it cannot be shown (then it cannot be approved from here).
async fn waiting_call(state: &ServerState, caller: &Caller, run: &AgentRun) -> WaitingCall {
    let namespace = run.id().namespace;
    let pending = run.status.as_ref().and_then(|s| s.pending_approval.clone());
    let mut call = WaitingCall {
        namespace: namespace.clone(),
        run: run.name_any(),
        step: pending.as_ref().map_or(0, |p| p.step),
        tool: pending.map(|p| p.tool).unwrap_or_default(),
        arguments: None,
        problem: String::new(),
    };
    let requests = state.requests(caller, &namespace);
    match requests.recorded_call(&call.run, None).await {
        Ok((step, recorded)) => {
            call.step = step;
            call.tool = recorded.tool;
            call.arguments = Some(recorded.arguments);
        }
        Err(e) => call.problem = e.to_string(),
    }
    call
}

#[cfg(test)]
#[path = "console_tests.rs"]
mod tests;
