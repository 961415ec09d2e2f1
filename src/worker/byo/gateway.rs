//! The model gateway: the OpenAI Chat Completions and Responses APIs and the Anthropic
//! Messages API on the pod's loopback, for the run's agent container (docs/byo-agent.md), with
//! the tool gateway beside it. It answers only the key this attempt handed the agent, checked
//! before any body is read: the tools container shares the loopback and must neither spend the
//! run's budget, write its journal nor call its tools. A call the journal holds is answered
//! from it (`journal::Cursor`); any other goes to the provider with the run's key, streamed
//! through as it comes, and is recorded (one awaited append) before its last byte reaches the
//! agent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::answers::{self, error, provider_error, stream_error};
use super::tool_gateway;
use super::upstream::Upstream;
use crate::crd::v1alpha1::{BudgetSpec, LedgerEvent, OnDivergence, Provider, RunUsage};
use crate::fence::EndReason;
use crate::ledger::journal::{self, Answer, Cursor, Journal};
use crate::ledger::model_api::{DONE, ModelApi};
use crate::serving::{Stop, Tls, serve};
use crate::worker::appender::Appender;
use crate::worker::budget::{self, Next as Upcoming};
use crate::worker::finish::Ending;
use crate::worker::model::answer::Answer as Sorted;
use crate::worker::model::sse::{SseReader, json_data};
use crate::worker::spans;

/// The largest request an agent may send: a long conversation, not a file upload.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// What the gateway tells the attempt that runs the agent.
#[derive(Debug)]
pub enum Report {
    /// Events it appended, to fold into the attempt's replay, and the API round trips the
    /// append took.
    Appended {
        events: Vec<LedgerEvent>,
        requests: u64,
    },
    /// The run must end so (a divergence, a budget, a ledger that refuses).
    End(Ending),
}

/// What the gateway is started with.
pub struct Setup {
    /// The key this attempt hands its agent.
    pub key: String,
    pub upstream: Upstream,
    pub appender: Appender,
    pub journal: Journal,
    pub usage: RunUsage,
    pub budget: Option<BudgetSpec>,
    /// How long the run has run before this attempt's start (for a deadline).
    pub elapsed_before: Option<std::time::Duration>,
    pub on_divergence: OnDivergence,
    pub reports: mpsc::UnboundedSender<Report>,
    /// The attempt's span, each live call's parent, and the run's provider.
    pub attempt: tracing::Span,
    pub provider: Provider,
}

struct Shared {
    key_digest: [u8; 32],
    upstream: Upstream,
    appender: Appender,
    journal: Journal,
    budget: Option<BudgetSpec>,
    elapsed_before: Option<std::time::Duration>,
    started: std::time::Instant,
    on_divergence: OnDivergence,
    reports: mpsc::UnboundedSender<Report>,
    attempt: tracing::Span,
    provider: Provider,
    book: Mutex<Book>,
}

/// What the calls of this attempt have taken so far.
struct Book {
    cursor: Cursor,
    usage: RunUsage,
}

/// Binds a port of the loopback and serves on it until the attempt ends, the tool gateway
/// (`tools`) beside the model's; its address.
pub async fn start(
    setup: Setup,
    tools: tool_gateway::Service,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let router = router(Arc::new(Shared::new(setup)), tools);
    let task = tokio::spawn(async move {
        if let Err(err) = serve(
            "gateway",
            listener,
            router,
            Tls::Plain,
            Stop::WithTheProcess,
        )
        .await
        {
            tracing::warn!(error = %err, "the model gateway stopped");
        }
    });
    Ok((address, task))
}

impl Shared {
    fn new(setup: Setup) -> Self {
        Self {
            key_digest: Sha256::digest(setup.key.as_bytes()).into(),
            upstream: setup.upstream,
            appender: setup.appender,
            journal: setup.journal,
            budget: setup.budget,
            elapsed_before: setup.elapsed_before,
            started: std::time::Instant::now(),
            on_divergence: setup.on_divergence,
            reports: setup.reports,
            attempt: setup.attempt,
            provider: setup.provider,
            book: Mutex::new(Book {
                cursor: Cursor::default(),
                usage: setup.usage,
            }),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn end(&self, ending: Ending) {
        let _ = self.reports.send(Report::End(ending));
    }
}

fn router(shared: Arc<Shared>, tools: tool_gateway::Service) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(|state, body| call(ModelApi::Chat, state, body)),
        )
        .route(
            "/v1/responses",
            post(|state, body| call(ModelApi::Responses, state, body)),
        )
        .route(
            "/v1/messages",
            post(|state, body| call(ModelApi::Messages, state, body)),
        )
        .nest_service(tool_gateway::PATH, tools)
        .route_layer(middleware::from_fn_with_state(shared.clone(), authenticate))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(shared)
}

/// Lets through only a request that carries this attempt's key (as a bearer token, or as the
/// Anthropic SDKs send it, `x-api-key`), before its body is read. The digests are compared,
/// so the time taken says nothing of the key.
async fn authenticate(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let presented = bearer
        .or(api_key)
        .map(|key| <[u8; 32]>::from(Sha256::digest(key.trim().as_bytes())));
    if presented != Some(shared.key_digest) {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "the gateway answers only the agent container of this attempt, with the key it \
             was handed in OPENAI_API_KEY",
        );
    }
    next.run(request).await
}

async fn call(api: ModelApi, State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request @ Value::Object(_)) => request,
        Ok(_) => return bad_request("the request body is not a JSON object"),
        Err(e) => return bad_request(&format!("the request body is not JSON: {e}")),
    };
    let canonical = journal::canonical(request.clone());
    let stream = journal::streamed(&canonical);
    let answer = shared
        .book()
        .cursor
        .answer(&shared.journal, api.name(), &canonical);
    let call = Call {
        api,
        request: &request,
        canonical,
    };
    match answer {
        Answer::Replay(place) => {
            answers::recorded(api, stream, &shared.journal.calls[&place].response)
        }
        Answer::Live(place) => live(&shared, place, call).await,
        Answer::Diverged { call: at, field } => diverged(&shared, at, field, call).await,
    }
}

/// An agent's model call: its API, its request as sent and in canonical form.
struct Call<'a> {
    api: ModelApi,
    request: &'a Value,
    canonical: Value,
}

fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// A request unlike the record at its place: the run fails, or (`Continue`) the divergence is
/// recorded and the call and all after it go live.
async fn diverged(shared: &Arc<Shared>, at: i64, field: String, call: Call<'_>) -> Response {
    if shared.on_divergence == OnDivergence::Fail {
        let message = format!(
            "the agent's model call {at} differs from the call recorded at its place, at \
             {field}: a resumed agent must ask what it asked before \
             (spec.agent.container.onDivergence: Fail)"
        );
        shared.end(Ending::Failed {
            reason: EndReason::ResumeDiverged,
            message: message.clone(),
        });
        // 400, not 409: the SDKs retry a 409, and asking again cannot help.
        return error(StatusCode::BAD_REQUEST, "baton_resume_diverged", &message);
    }
    let event = LedgerEvent::GatewayDiverged { call: at, field };
    if let Err(response) = append(shared, vec![event]).await {
        return response;
    }
    let place = {
        let mut book = shared.book();
        book.cursor.go_live_at(at);
        book.cursor
            .answer(&shared.journal, call.api.name(), &call.canonical)
    };
    match place {
        Answer::Live(place) => live(shared, place, call).await,
        other => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "baton_journal",
            &format!("after a divergence the call was to go live, not {other:?}"),
        ),
    }
}

/// A call the journal does not hold: to the provider, recorded before its end is sent.
async fn live(shared: &Arc<Shared>, place: i64, call: Call<'_>) -> Response {
    let (api, stream) = (call.api, journal::streamed(&call.canonical));
    if let Some(reached) = over_budget(shared) {
        let response = error(StatusCode::TOO_MANY_REQUESTS, "baton_budget", &reached);
        return response;
    }
    let model = call.request.get("model").and_then(Value::as_str);
    let span = spans::gateway_call(
        &shared.attempt,
        shared.provider,
        model.unwrap_or_default(),
        place,
    );
    let sent = shared.upstream.send(api, call.request, stream).await;
    let recorded = Recorded {
        api,
        place,
        request: call.canonical,
        span,
    };
    if !fits(api, stream, &sent) {
        spans::model_failed(&recorded.span, "provider_error");
    }
    match sent {
        Err(err) => provider_error(&err),
        Ok(Sorted::Whole(answer)) if !stream && api.is_answer(&answer) => {
            match record(shared, recorded, answer.clone()).await {
                Ok(()) => axum::Json(answer).into_response(),
                Err(response) => response,
            }
        }
        Ok(Sorted::Stream(reader)) if stream => stream_through(shared.clone(), recorded, reader),
        Ok(Sorted::Whole(answer)) if !stream => {
            let message = shared.upstream.not_an_answer(&answer, api.output_field());
            error(StatusCode::BAD_GATEWAY, "provider_error", &message)
        }
        Ok(Sorted::Whole(_)) => bad_gateway(
            shared,
            "asked for a stream, the server answered one JSON document",
        ),
        Ok(Sorted::Stream(_)) => bad_gateway(
            shared,
            "asked for one JSON document, the server answered a stream",
        ),
    }
}

/// Whether the provider answered what the agent asked for: an answer, or a stream.
fn fits<E>(api: ModelApi, stream: bool, sent: &Result<Sorted, E>) -> bool {
    match sent {
        Ok(Sorted::Whole(answer)) => !stream && api.is_answer(answer),
        Ok(Sorted::Stream(_)) => stream,
        Err(_) => false,
    }
}

fn bad_gateway(shared: &Shared, message: &str) -> Response {
    let message = shared.upstream.error_text(message);
    error(StatusCode::BAD_GATEWAY, "provider_error", &message)
}

/// The budget's limit the next model call would pass, failing the run; None when within.
fn over_budget(shared: &Shared) -> Option<String> {
    let elapsed = shared
        .elapsed_before
        .map(|before| before + shared.started.elapsed());
    let usage = shared.book().usage.clone();
    let reached = budget::check(shared.budget.as_ref(), &usage, elapsed, Upcoming::ModelCall)?;
    let message = reached.message.clone();
    shared.end(Ending::Failed {
        reason: reached.reason,
        message: reached.message,
    });
    Some(message)
}

/// A live call's place and request, to record once it completes.
struct Recorded {
    api: ModelApi,
    place: i64,
    request: Value,
    /// The call's span: ended when the record is written (or the call fails).
    span: tracing::Span,
}

/// Streams the provider's events to the agent as they come. The stream's end (Chat
/// Completions' [`DONE`], a Responses or Messages stream's last event) is held back until the call is
/// recorded, and only then sent. A stream that breaks off is an error event, and nothing is
/// recorded: the call was not complete.
fn stream_through(shared: Arc<Shared>, recorded: Recorded, mut reader: Box<SseReader>) -> Response {
    let api = recorded.api;
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(32);
    tokio::spawn(async move {
        let mut events = Vec::new();
        let ending = loop {
            match reader.next().await {
                Ok(Some(event)) if event.data.trim() == DONE => {
                    break Ok(api.stream_end().unwrap_or_default());
                }
                Ok(Some(event)) if event.data.trim().is_empty() => {}
                Ok(Some(event)) => match json_data(&event.data) {
                    Ok(value) if api.ends_stream(&value) => {
                        let last = api.frame(&value);
                        events.push(value);
                        break Ok(last);
                    }
                    Ok(value) => {
                        // A gone agent does not stop the call: it completes and is recorded.
                        let _ = tx.send(Ok(Bytes::from(api.frame(&value)))).await;
                        events.push(value);
                    }
                    Err(err) => break Err(err.to_string()),
                },
                Ok(None) => break Err(reader.ended_early(api.last_event()).to_string()),
                Err(err) => break Err(err.to_string()),
            }
        };
        let last = match ending {
            Err(message) => {
                spans::model_failed(&recorded.span, "stream_broken");
                stream_error(api, &message)
            }
            Ok(last) => match record(&shared, recorded, Value::Array(events)).await {
                Ok(()) => Bytes::from(last),
                Err(_) => stream_error(
                    api,
                    "the call's record could not be written; the attempt ends",
                ),
            },
        };
        let _ = tx.send(Ok(last)).await;
    });
    let body = Body::from_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    answers::event_stream(body)
}

/// Records a complete call (its usage with it): the one awaited append of the call.
async fn record(shared: &Shared, recorded: Recorded, response: Value) -> Result<(), Response> {
    let (input_tokens, output_tokens) = recorded.api.usage(&response).unzip();
    spans::tokens_used(&recorded.span, input_tokens, output_tokens);
    let events = vec![
        LedgerEvent::GatewayCall {
            call: recorded.place,
            api: recorded.api.name().into(),
            request: recorded.request,
            response,
        },
        LedgerEvent::ModelCall {
            input_tokens,
            output_tokens,
        },
    ];
    append(shared, events).await?;
    shared
        .book()
        .usage
        .add_model_call(input_tokens, output_tokens);
    Ok(())
}

/// One awaited append; a refusal ends the run as the appender says, and the agent is told.
async fn append(shared: &Shared, events: Vec<LedgerEvent>) -> Result<(), Response> {
    match shared.appender.append(events.clone(), false).await {
        Ok(acked) => {
            let requests = acked.requests;
            let _ = shared.reports.send(Report::Appended { events, requests });
            Ok(())
        }
        Err(err) => {
            let message = format!("the call's record could not be written: {err}");
            shared.end(Ending::refused(err));
            Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "baton_ledger",
                &message,
            ))
        }
    }
}
