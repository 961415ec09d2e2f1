//! The spans a worker exports when traces are on (`crate::traces`): its attempt, a child of
//! the run's root span in the run's one trace; each model call and each tool call under it,
//! named and attributed after the OpenTelemetry GenAI semantic conventions. No prompt or
//! completion is put on a span. Off, they are spans of logging like the others.
//!
//! An attempt's span and its tool calls' spans have the ids every process computes for them
//! (`RunTrace`): were the attempt killed, the one that resumes the run writes them instead
//! (`crate::traces::late`), and the model calls it had exported stay under their parent.

use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::finish::Exit;
use super::model::ModelTurn;
use super::resume::{ApprovalCall, Reconcile};
use crate::crd::v1alpha1::{AgentRun, ApprovalOutcome, ModelSpec, Phase, Provider};
use crate::fence::Fence;
use crate::ledger::Replay;
use crate::traces::between::{self, ApprovalWaited};
use crate::traces::content;
use crate::traces::late::{self, LostStep, RunEnded};
use crate::traces::{RunTrace, TARGET, with_span_id};

/// The span of this attempt of `run`: a child of the run's root, whoever served the attempts
/// before it. Held by the session, never entered.
pub fn attempt(run: &AgentRun, trace: &RunTrace, fence: Fence, pod: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "attempt",
        otel.name = %format!("attempt {fence}"),
        baton.run = run.metadata.name.as_deref().unwrap_or_default(),
        baton.namespace = run.metadata.namespace.as_deref().unwrap_or_default(),
        baton.fence = fence.get(),
        baton.pod = pod,
        baton.exit = Empty,
    );
    // Fails only when no exporting layer is installed (traces off): nothing to parent then.
    let _ = span.set_parent(trace.context());
    started_as(span, trace.attempt(fence))
}

/// `span`, started now under the id `id` (its context built on this thread, where the id is
/// pinned), rather than when it is first entered or closed.
fn started_as(span: Span, id: opentelemetry::trace::SpanId) -> Span {
    with_span_id(id, || span.context());
    span
}

/// Records how the attempt ended on its span.
pub fn attempt_ended(span: &Span, exit: Exit) {
    span.record("baton.exit", format!("{exit:?}").to_lowercase());
}

/// The span of one call to the run's model, under `attempt`.
pub fn model_call(attempt: &Span, model: &ModelSpec) -> Span {
    let name = model.name.as_deref().unwrap_or_default();
    chat(attempt, model.provider, name)
}

/// The span of an own agent's model call at place `place` (from 1) of the gateway's journal,
/// asking for `model`, under `attempt`: a call that reaches the provider (one answered from
/// the journal was a call of an earlier attempt, and is its span).
pub fn gateway_call(attempt: &Span, provider: Provider, model: &str, place: i64) -> Span {
    let span = chat(attempt, provider, model);
    span.record("baton.gateway.call", place);
    span
}

fn chat(attempt: &Span, provider: Provider, model: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: attempt,
        "chat",
        otel.name = %chat_name(model),
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider_name(provider),
        gen_ai.request.model = model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        error.type = Empty,
        baton.gateway.call = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
    )
}

/// A model call's span name, as the GenAI conventions spell it: `chat <model>`, or `chat`
/// when the model has no name.
fn chat_name(model: &str) -> String {
    match model {
        "" => "chat".into(),
        model => format!("chat {model}"),
    }
}

/// Records the tokens a model call used, as far as the provider said.
pub fn tokens_used(span: &Span, input: Option<i64>, output: Option<i64>) {
    if let Some(input) = input {
        span.record("gen_ai.usage.input_tokens", input);
    }
    if let Some(output) = output {
        span.record("gen_ai.usage.output_tokens", output);
    }
}

/// Records a model call's answer on its span: tokens and why it stopped.
pub fn model_answered(span: &Span, turn: &ModelTurn) {
    if let Some(usage) = turn.usage {
        tokens_used(span, Some(usage.input_tokens), Some(usage.output_tokens));
    }
    let reason = match turn.tool_calls.is_empty() {
        true => "stop",
        false => "tool_calls",
    };
    span.record("gen_ai.response.finish_reasons", reason);
}

/// Records on `span` the value `field` takes from `content` (built, and scrubbed of the
/// worker's secrets, by the caller), only when the run's operator opted in to content.
pub fn content(span: &Span, field: Content, content: impl FnOnce() -> String) {
    if content::on() {
        span.record(field.name(), content::capped(&content()));
    }
}

/// The content a span may carry ([`content`]).
#[derive(Debug, Clone, Copy)]
pub enum Content {
    ModelInput,
    ModelOutput,
    ToolArguments,
    ToolResult,
}

impl Content {
    fn name(self) -> &'static str {
        match self {
            Content::ModelInput => "gen_ai.input.messages",
            Content::ModelOutput => "gen_ai.output.messages",
            Content::ToolArguments => "gen_ai.tool.call.arguments",
            Content::ToolResult => "gen_ai.tool.call.result",
        }
    }
}

/// Records a failed model call on its span (`kind`: permanent, retryable, interrupted).
pub fn model_failed(span: &Span, kind: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", kind);
}

/// The span of tool call `step` (`call_id` as the model named it), under `attempt`, the
/// attempt of fence `fence` of the run of `trace`.
pub fn tool_call(
    attempt: &Span,
    at: (&RunTrace, Fence),
    step: i64,
    tool: &str,
    call_id: &str,
) -> Span {
    let (trace, fence) = at;
    let span = tracing::info_span!(
        target: TARGET,
        parent: attempt,
        "execute_tool",
        otel.name = %format!("execute_tool {tool}"),
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        gen_ai.tool.call.id = call_id,
        baton.step = step,
        baton.outcome = Empty,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
    );
    started_as(span, trace.tool(fence, step))
}

/// Records how a tool call ended on its span: `ok` (it ran, whatever the tool answered), a
/// wait (`waiting_approval`, `waiting_input`), or what stopped the run (`lost`, `interrupted`).
pub fn tool_ended(span: &Span, outcome: &str) {
    span.record("baton.outcome", outcome);
    if outcome != "ok" && outcome != "waiting_approval" && outcome != "waiting_input" {
        span.record("otel.status_code", "ERROR");
    }
}

/// Writes the spans of the attempts before `resumed_by` that died while a tool call ran (the
/// steps this attempt marks unknown), each with those calls, ended with an unknown-effect event.
pub fn killed_attempts(
    trace: &RunTrace,
    resumed_by: Fence,
    replay: &Replay,
    reconcile: &[Reconcile],
) {
    let lost: Vec<LostStep> = reconcile
        .iter()
        .filter(|r| r.mark_unknown)
        .map(|r| LostStep {
            step: r.step,
            tool: r.tool.clone(),
            call_id: replay
                .steps
                .get(&r.step)
                .map(|step| step.call_id.clone())
                .unwrap_or_default(),
            attempt: r.attempt,
        })
        .collect();
    let mut attempts: Vec<Fence> = lost.iter().map(|l| l.attempt).collect();
    attempts.sort();
    attempts.dedup();
    for attempt in attempts {
        late::killed_attempt(trace, attempt, &lost, resumed_by);
    }
}

/// Writes the run's root span: the run ended in `phase`, and its last attempt is the one that
/// knows when.
pub fn run_ended(run: &AgentRun, trace: &RunTrace, phase: Phase) {
    late::run_ended(trace, &RunEnded::of(run, phase));
}

/// Writes the span of the run's wait for the decision on `call`, now recorded as `outcome`.
pub fn approval_waited(trace: &RunTrace, call: &ApprovalCall, outcome: ApprovalOutcome) {
    let waited = ApprovalWaited {
        step: call.step,
        tool: &call.tool,
        call_id: &call.call_id,
        outcome,
        requested: std::time::SystemTime::from(call.requested_at.0),
    };
    between::approval_waited(trace, &waited);
}

/// The provider's name as the GenAI conventions spell it.
fn provider_name(provider: Provider) -> &'static str {
    match provider {
        Provider::Scripted => "baton.scripted",
        Provider::Openai => "openai",
        Provider::Anthropic => "anthropic",
    }
}
