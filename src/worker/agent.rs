//! The agent loop: ask the model for a turn, record each tool call durably (the one awaited
//! round trip of a step) before running it, buffer its result, repeat until a final answer,
//! a failure, a stop, a handoff or an input wait.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::budget::{self, Next};
use super::finish::Ending;
use super::model::{ModelError, ModelRequest, ModelToolCall, ModelTurn};
use super::provider::Model;
use super::resume::question_of;
use super::session::Session;
use super::spans::{self, Content};
use super::toolbox::ToolEntry;
use super::tools::{self, ToolOutput};
use crate::approval;
use crate::crd::v1alpha1::Resolution;
use crate::crd::v1alpha1::{LedgerEvent, Role, ToolKind, ToolSpec, UnknownEffect};
use crate::fence::EndReason;
use crate::traces::content;

/// Runs turns until the run reaches an ending.
pub async fn agent_loop(s: &mut Session) -> Ending {
    loop {
        if let Some(ending) = interrupted(s).or_else(|| over_budget(s, Next::ModelCall)) {
            return ending;
        }
        let turn = match call_model(s).await {
            Ok(turn) => turn,
            Err(ending) => return ending,
        };
        s.turn.pending.push(LedgerEvent::Message {
            role: Role::Assistant,
            content: turn.text.clone(),
        });
        s.turn.pending.push(LedgerEvent::ModelCall {
            input_tokens: turn.usage.map(|u| u.input_tokens),
            output_tokens: turn.usage.map(|u| u.output_tokens),
        });
        s.io.metrics
            .model_tokens(s.agent().model.name.as_deref(), turn.usage);
        s.turn.drop_deltas = true;
        if turn.tool_calls.is_empty() {
            return Ending::Final { output: turn.text };
        }
        for call in turn.tool_calls {
            if let Some(ending) = run_call(s, call).await {
                return ending;
            }
        }
    }
}

/// The run's budget, if the next call would pass it: the run fails, naming the limit.
fn over_budget(s: &Session, next: Next) -> Option<Ending> {
    let elapsed =
        s.me.run
            .status
            .as_ref()
            .and_then(|st| st.start_time.as_ref())
            .and_then(|start| {
                std::time::Duration::try_from(Timestamp::now().duration_since(start.0)).ok()
            });
    let reached = budget::check(
        s.spec().budget.as_ref(),
        &s.turn.replay.usage,
        elapsed,
        next,
    )?;
    Some(Ending::Failed {
        reason: reached.reason,
        message: reached.message,
    })
}

/// The ending an interruption asks for, if any. Losing the run wins over everything.
pub fn interrupted(s: &Session) -> Option<Ending> {
    if s.io.guard.is_lost() {
        Some(Ending::Lost)
    } else if s.io.interrupts.stop.is_cancelled() {
        Some(Ending::Stopped)
    } else if s.io.interrupts.handoff.is_cancelled() {
        Some(Ending::Handoff)
    } else {
        None
    }
}

async fn call_model(s: &mut Session) -> Result<ModelTurn, Ending> {
    let model: Arc<Model> = s.io.model.clone().map_err(|message| Ending::Failed {
        reason: EndReason::ProviderError,
        message,
    })?;
    let request = ModelRequest {
        system_prompt: s.agent().system_prompt.clone(),
        messages: s.conversation(),
        tools: s.io.toolbox.offered().to_vec(),
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let appender = s.io.appender.clone();
    let forward = tokio::spawn(async move {
        while let Some(text) = rx.recv().await {
            appender.buffer(LedgerEvent::ModelDelta { text });
        }
    });
    let cancel = CancellationToken::new();
    let span = model_span(s, &request);
    let call = model.complete(&request, &tx, &cancel, &s.io.metrics);
    let result = tokio::select! {
        r = call.instrument(span.clone()) => Some(r),
        _ = s.io.guard.token().cancelled() => None,
        _ = s.io.interrupts.stop.cancelled() => None,
        _ = s.io.interrupts.handoff.cancelled() => None,
    };
    cancel.cancel();
    drop(tx);
    let _ = forward.await;
    model_span_ended(s, &span, result.as_ref());
    match result {
        None => Err(interrupted(s).unwrap_or(Ending::Lost)),
        Some(Ok(turn)) => Ok(turn),
        Some(Err(_)) if interrupted(s).is_some() => Err(interrupted(s).unwrap_or(Ending::Lost)),
        // Providers already scrub the key from what a server says; this is the last check
        // before the ledger, status and logs.
        Some(Err(ModelError::Permanent { message, .. })) => Err(Ending::Failed {
            reason: EndReason::ProviderError,
            message: s.redact(&message),
        }),
        Some(Err(err @ ModelError::Retryable { .. })) => Err(Ending::GaveUp {
            message: s.redact(&err.to_string()),
        }),
    }
}

/// The span of the model call `request`, with what it is asked if content is on.
fn model_span(s: &Session, request: &ModelRequest) -> tracing::Span {
    let span = spans::model_call(&s.me.span, &s.agent().model);
    spans::content(&span, Content::ModelInput, || {
        let system = request.system_prompt.as_deref();
        s.redact(&content::input_messages(system, &request.messages))
    });
    span
}

/// Records how the model call ended on its span (None: interrupted), with what the model
/// said if content is on.
fn model_span_ended(
    s: &Session,
    span: &tracing::Span,
    result: Option<&Result<ModelTurn, ModelError>>,
) {
    match result {
        Some(Ok(turn)) => {
            spans::model_answered(span, turn);
            spans::content(span, Content::ModelOutput, || {
                let calls: Vec<(&str, &str, &str)> = (turn.tool_calls.iter())
                    .map(|c| (c.call_id.as_str(), c.tool.as_str(), c.arguments.as_str()))
                    .collect();
                s.redact(&content::output_messages(&turn.text, &calls))
            });
        }
        Some(Err(ModelError::Permanent { .. })) => spans::model_failed(span, "permanent"),
        Some(Err(ModelError::Retryable { .. })) => spans::model_failed(span, "retryable"),
        None => spans::model_failed(span, "interrupted"),
    }
}

/// One tool call: the write-ahead intent (awaited), then the tool, then its buffered result.
pub async fn run_call(s: &mut Session, call: ModelToolCall) -> Option<Ending> {
    if let Some(ending) = over_budget(s, Next::ToolStep) {
        return Some(ending);
    }
    let step = s.turn.replay.last_step() + 1;
    let max = s.agent().max_steps as i64;
    if step > max {
        return Some(Ending::Failed {
            reason: EndReason::MaxStepsExceeded,
            message: format!("the agent asked for step {step}, over its budget of {max} steps"),
        });
    }
    let at = (&s.me.trace, s.fence());
    let span = spans::tool_call(&s.me.span, at, step, &call.tool, &call.call_id);
    spans::content(&span, Content::ToolArguments, || s.redact(&call.arguments));
    let ending = run_step(s, step, call).instrument(span.clone()).await;
    spans::tool_ended(&span, step_outcome(ending.as_ref()));
    ending
}

/// How a step ended, as its span says: `ok` (run, whatever the tool answered), a wait, or
/// what stopped the run.
fn step_outcome(ending: Option<&Ending>) -> &'static str {
    match ending {
        None => "ok",
        Some(Ending::AwaitingApproval { .. }) => "waiting_approval",
        Some(Ending::Waiting { .. }) => "waiting_input",
        Some(Ending::Lost) => "lost",
        Some(_) => "interrupted",
    }
}

/// Step `step`: its write-ahead intent (awaited), then the tool, then its buffered result.
async fn run_step(s: &mut Session, step: i64, call: ModelToolCall) -> Option<Ending> {
    let tool = s.tool(&call.tool);
    let waits = tool
        .as_ref()
        .is_some_and(|t| approval::required(Some(s.agent()), &t.spec));
    let requested_at = Time(Timestamp::now());
    let events = intent_events(step, &call, tool.as_ref(), waits.then_some(&requested_at));
    let sent_at = Instant::now();
    if let Err(err) = s.append(events).await {
        return Some(Ending::refused(err));
    }
    s.io.metrics.step_appended(sent_at.elapsed());
    s.publish_steps();
    if waits {
        let pending = approval::pending(
            step,
            &call.call_id,
            &call.tool,
            &call.arguments,
            requested_at,
        );
        return Some(Ending::AwaitingApproval { pending });
    }
    execute(s, step, tool, &call.tool, &call.arguments).await
}

/// The step's write-ahead record: its intent and, for a call that waits for approval, the
/// request in the same append, so the step is never seen open (maybe run) before it.
fn intent_events(
    step: i64,
    call: &ModelToolCall,
    tool: Option<&ToolEntry>,
    approval_requested_at: Option<&Time>,
) -> Vec<LedgerEvent> {
    let mut events = vec![LedgerEvent::StepIntent {
        step,
        tool: call.tool.clone(),
        call_id: call.call_id.clone(),
        input: call.arguments.clone(),
        idempotent: tool.is_some_and(|t| tools::is_idempotent(&t.spec, &call.arguments)),
    }];
    if let Some(at) = approval_requested_at {
        events.push(LedgerEvent::ApprovalRequested {
            step,
            call_id: call.call_id.clone(),
            requested_at: at.clone(),
        });
    }
    events
}

/// Runs a step whose intent is in the ledger and buffers its result.
pub async fn execute(
    s: &mut Session,
    step: i64,
    tool: Option<ToolEntry>,
    name: &str,
    arguments: &str,
) -> Option<Ending> {
    let Some(tool) = tool else {
        let output = format!("there is no tool named {name:?}");
        s.buffer(result(step, ToolOutput::error(output)));
        return None;
    };
    if tool.spec.kind == ToolKind::AskUser {
        return Some(Ending::Waiting {
            step,
            question: question_of(arguments),
        });
    }
    match run_tool(s, &tool, arguments, step).await {
        ToolRun::Done(output) => {
            s.buffer(result(step, output));
            None
        }
        ToolRun::Killed => {
            mark_killed(s, step, &tool.spec, arguments).await;
            Some(interrupted(s).unwrap_or(Ending::Lost))
        }
        ToolRun::Lost => Some(Ending::Lost),
        ToolRun::ToolsLost => Some(tools_lost(step)),
    }
}

/// The executor died mid-step: nothing is recorded for the step, so the next owner finds it
/// open and reports its effect unknown; this attempt ends without a decision (the pod is
/// broken: its tools container is gone), so the controller claims the run again.
pub fn tools_lost(step: i64) -> Ending {
    Ending::GaveUp {
        message: format!(
            "the tools container's executor went away during step {step} (its container died or was killed): the step's effect is unknown"
        ),
    }
}

/// A step's result event.
pub fn result(step: i64, output: ToolOutput) -> LedgerEvent {
    LedgerEvent::StepResult {
        step,
        output: output.output,
        is_error: output.is_error,
    }
}

/// How a tool run ended.
pub enum ToolRun {
    Done(ToolOutput),
    /// Killed by a stop or an overdue handoff: its effect is unknown.
    Killed,
    /// The run was lost while it ran: record nothing.
    Lost,
    /// The tools container's executor went away while it ran: its effect is unknown.
    ToolsLost,
}

/// Runs a tool; a stop kills it at once, a handoff after the grace period, a loss at once.
pub async fn run_tool(s: &Session, tool: &ToolEntry, arguments: &str, step: i64) -> ToolRun {
    let kill = CancellationToken::new();
    let escalate = {
        let (guard, interrupts, kill, grace) = (
            s.io.guard.clone(),
            s.io.interrupts.clone(),
            kill.clone(),
            s.me.cfg.handoff_grace,
        );
        tokio::spawn(async move {
            tokio::select! {
                _ = guard.token().cancelled() => {}
                _ = interrupts.stop.cancelled() => {}
                _ = async { interrupts.handoff.cancelled().await; tokio::time::sleep(grace).await } => {}
            }
            kill.cancel();
        })
    };
    let tool_env = s.tool_env(step);
    let output = tools::run(&s.io.tools, &s.io.mcp, tool, arguments, &tool_env, &kill).await;
    escalate.abort();
    let Ok(mut output) = output else {
        return if s.io.guard.is_lost() {
            ToolRun::Lost
        } else {
            ToolRun::ToolsLost
        };
    };
    output.output = s.redact(&output.output);
    // A model's call runs in its span (`run_call` instruments it); elsewhere (a re-run, an
    // approved call) the current span has no such field, and nothing is recorded.
    spans::content(&tracing::Span::current(), Content::ToolResult, || {
        output.output.clone()
    });
    if s.io.guard.is_lost() {
        ToolRun::Lost
    } else if kill.is_cancelled() {
        ToolRun::Killed
    } else {
        ToolRun::Done(output)
    }
}

/// A tool killed mid-run has an unknown effect: recorded as such for the next owner.
async fn mark_killed(s: &mut Session, step: i64, tool: &ToolSpec, arguments: &str) {
    let attempt = s.fence();
    s.buffer(LedgerEvent::StepUnknown { step, attempt });
    s.report_unknown(UnknownEffect {
        step,
        tool: tool.name.clone(),
        attempt,
        resolution: Resolution::Unknown,
        summary: summary(arguments),
    })
    .await;
}

/// A short summary of a call's arguments for status.
pub fn summary(arguments: &str) -> String {
    let mut s: String = arguments.chars().take(120).collect();
    if arguments.chars().count() > 120 {
        s.push('…');
    }
    s
}
