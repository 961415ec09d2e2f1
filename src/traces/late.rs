//! Spans written after the fact, under the ids every process computes (`RunTrace`): the run's
//! root, written by whoever ends the run (its last attempt, or the controller), and the spans of an attempt killed before it
//! could export them, written by the attempt that resumes the run. A killed attempt's own
//! spans were still open, so none of them reached the backend: these are their only copy.
//!
//! When a killed attempt died, and when its tool call began, are recorded nowhere (the ledger
//! keeps no clocks), so its spans are stamped with the moment the resuming attempt learned of
//! them and say so (`baton.late = true`). Traces off, nothing is built.

use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::global::{self, BoxedSpan};
use opentelemetry::trace::{Span, SpanId, Status, Tracer};

use super::RunTrace;
use super::ids::with_ids;
use crate::crd::v1alpha1::{AgentRun, Phase};
use crate::fence::Fence;

/// A tool call of a killed attempt, open when it died: its effect is unknown.
#[derive(Debug, Clone, PartialEq)]
pub struct LostStep {
    pub step: i64,
    pub tool: String,
    pub call_id: String,
    /// The fence of the attempt that ran it.
    pub attempt: Fence,
}

/// Writes the span of the killed attempt `attempt` and of its open tool calls `steps`, each
/// ended with an unknown-effect event, as the attempt of fence `resumed_by` found them.
pub fn killed_attempt(trace: &RunTrace, attempt: Fence, steps: &[LostStep], resumed_by: Fence) {
    let now = SystemTime::now();
    let name = format!("attempt {attempt}");
    let mut span = start(
        trace,
        trace.context(),
        trace.attempt(attempt),
        name,
        now,
        late(vec![
            KeyValue::new("baton.fence", attempt.get()),
            KeyValue::new("baton.exit", "killed"),
            KeyValue::new("baton.resumed_by", resumed_by.get()),
        ]),
    );
    span.set_status(Status::error("its worker died before it ended the attempt"));
    for lost in steps.iter().filter(|s| s.attempt == attempt) {
        unknown_step(trace, lost, resumed_by, now);
    }
    span.end_with_timestamp(now);
}

/// The span of a killed attempt's tool call, ended with an unknown-effect event.
fn unknown_step(trace: &RunTrace, lost: &LostStep, resumed_by: Fence, now: SystemTime) {
    let parent = trace.context_of(trace.attempt(lost.attempt));
    let name = format!("execute_tool {}", lost.tool);
    let mut span = start(
        trace,
        parent,
        trace.tool(lost.attempt, lost.step),
        name,
        now,
        late(vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", lost.tool.clone()),
            KeyValue::new("gen_ai.tool.call.id", lost.call_id.clone()),
            KeyValue::new("baton.step", lost.step),
            KeyValue::new("baton.outcome", "unknown"),
        ]),
    );
    span.add_event_with_timestamp(
        "baton.unknown_effect",
        now,
        vec![
            KeyValue::new("baton.step", lost.step),
            KeyValue::new("baton.attempt", lost.attempt.get()),
            KeyValue::new("baton.resumed_by", resumed_by.get()),
        ],
    );
    span.set_status(Status::error(
        "the step's worker died while it ran: its effect is unknown",
    ));
    span.end_with_timestamp(now);
}

/// How a run ended, as its root span says.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEnded {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The run's terminal phase.
    pub phase: Phase,
    pub created: SystemTime,
    /// The thread the run is a turn of, and the session its turns share.
    pub thread: Option<ThreadSession>,
}

/// A thread as its turns' root spans name it: `session.id` (OpenInference's attribute, by
/// which a backend such as Phoenix shows a thread's turns, each a trace, as one session) is
/// the thread's UID once the turn joined it, else its namespace and name.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSession {
    pub name: String,
    pub session: String,
}

impl ThreadSession {
    /// The thread `run` is a turn of, if any.
    fn of(run: &AgentRun) -> Option<Self> {
        let name = run.spec.thread.clone()?;
        let session = match run.thread_owner() {
            Some(owner) => owner.uid.clone(),
            None => format!(
                "{}/{name}",
                run.metadata.namespace.as_deref().unwrap_or_default()
            ),
        };
        Some(Self { name, session })
    }
}

impl RunEnded {
    /// `run` (read from the API server), ended in `phase`.
    pub fn of(run: &AgentRun, phase: Phase) -> Self {
        let meta = &run.metadata;
        Self {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            phase,
            created: meta
                .creation_timestamp
                .as_ref()
                .map_or_else(SystemTime::now, |t| SystemTime::from(t.0)),
            thread: ThreadSession::of(run),
        }
    }
}

/// Writes the run's root span, from its creation to now; a child of the caller's span if a
/// `traceparent` named one.
pub fn run_ended(trace: &RunTrace, run: &RunEnded) {
    let now = SystemTime::now();
    let name = format!("run {}", run.name);
    let mut attributes = vec![
        KeyValue::new("baton.run", run.name.clone()),
        KeyValue::new("baton.namespace", run.namespace.clone()),
        KeyValue::new("baton.uid", run.uid.clone()),
        KeyValue::new("baton.phase", run.phase.as_str()),
    ];
    if let Some(thread) = &run.thread {
        attributes.push(KeyValue::new("baton.thread", thread.name.clone()));
        attributes.push(KeyValue::new("session.id", thread.session.clone()));
    }
    let mut span = start(
        trace,
        trace.parent_context(),
        trace.root,
        name,
        run.created,
        attributes,
    );
    if run.phase != Phase::Succeeded {
        span.set_status(Status::error(format!("the run ended {}", run.phase)));
    }
    span.end_with_timestamp(now);
}

/// `attributes` of a span stamped when it was found rather than when it happened.
fn late(mut attributes: Vec<KeyValue>) -> Vec<KeyValue> {
    attributes.push(KeyValue::new("baton.late", true));
    attributes
}

/// Starts span `id` of `trace` under `parent` at `at`.
pub(super) fn start(
    trace: &RunTrace,
    parent: opentelemetry::Context,
    id: SpanId,
    name: String,
    at: SystemTime,
    attributes: Vec<KeyValue>,
) -> BoxedSpan {
    let tracer = global::tracer("baton");
    let builder = tracer
        .span_builder(name)
        .with_start_time(at)
        .with_attributes(attributes);
    // A span without a parent (the root of a run no caller named) draws its trace id too.
    with_ids(trace.trace_id, id, || {
        tracer.build_with_context(builder, &parent)
    })
}
