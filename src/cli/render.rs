//! Pure rendering for the CLI: the `get` table, the transcript and `describe`. No I/O here;
//! every function takes what was read and `now`, and returns text.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::crd::v1alpha1::{
    AgentRun, AgentRunStatus, AgentThread, ApprovalOutcome, LedgerEvent, LedgerSegment,
    ProbeOutcome, Role,
};
use crate::display::age;
use crate::fence::Fence;
use crate::ledger::Unchunker;

// === the `get` table ===

/// The `get` table: like `kubectl get agentruns`, with the unknown effects spelled out.
pub fn runs_table(runs: &[AgentRun], all_namespaces: bool, now: Timestamp) -> String {
    let mut header = vec![
        "NAME",
        "PHASE",
        "ATTEMPT",
        "STEPS",
        "UNKNOWN EFFECTS",
        "WORKER",
        "AGE",
    ];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for run in runs {
        let status = run.status.clone().unwrap_or_default();
        let mut row = vec![
            run.name_any(),
            status.phase.to_string(),
            status.attempt.to_string(),
            status.steps.to_string(),
            unknown_effects_cell(&status),
            status.worker.clone().unwrap_or_else(|| "<none>".into()),
            age(run.metadata.creation_timestamp.as_ref(), now),
        ];
        if all_namespaces {
            row.insert(0, run.id().namespace);
        }
        rows.push(row);
    }
    align(&rows)
}

/// `baton get`'s threads: name, phase, turns, last turn, tokens, age.
pub fn threads_table(threads: &[AgentThread], all_namespaces: bool, now: Timestamp) -> String {
    let mut header = vec!["THREAD", "PHASE", "TURNS", "LAST TURN", "TOKENS", "AGE"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for thread in threads {
        let status = thread.status.clone().unwrap_or_default();
        let last = match (&status.last_turn, status.last_turn_phase) {
            (Some(turn), Some(phase)) => format!("{turn} ({phase})"),
            (Some(turn), None) => turn.clone(),
            _ => "<none>".into(),
        };
        let mut row = vec![
            thread.name_any(),
            format!("{:?}", status.phase),
            status.turns.to_string(),
            last,
            status.usage.total_tokens.to_string(),
            age(thread.metadata.creation_timestamp.as_ref(), now),
        ];
        if all_namespaces {
            row.insert(0, thread.namespace().unwrap_or_default());
        }
        rows.push(row);
    }
    align(&rows)
}

/// `0`, or the count and which steps: `2 (#3 shell, #5 http)`.
pub fn unknown_effects_cell(status: &AgentRunStatus) -> String {
    let effects = &status.unknown_effects;
    if effects.is_empty() {
        return status.unknown_effect_count.to_string();
    }
    let steps: Vec<String> = effects
        .iter()
        .map(|e| format!("#{} {}", e.step, e.tool))
        .collect();
    format!("{} ({})", effects.len(), steps.join(", "))
}

/// Columns padded to their widest cell, separated by three spaces (as kubectl does).
pub(super) fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

// === the transcript ===

/// Renders ledger segments as a readable transcript, one segment at a time (so `-f` can feed
/// segments as they arrive). Keeps what spans segments: chunked events, streamed model text,
/// the tool of each step.
#[derive(Debug, Default)]
pub struct Transcript {
    chunks: Unchunker,
    streamed: String,
    tools: std::collections::BTreeMap<i64, String>,
    /// Position of the last segment rendered.
    pub tail: i64,
}

impl Transcript {
    /// The lines for one segment (the next position).
    pub fn segment(&mut self, segment: &LedgerSegment) -> Vec<String> {
        self.tail = segment.spec.seq;
        let mut lines = Vec::new();
        for event in &segment.spec.events {
            if let Some(event) = self.assemble(event, &mut lines) {
                self.event(segment.spec.fence, &event, &mut lines);
            }
        }
        lines
    }

    /// Lines for anything still pending at the end (a dead attempt's streamed text).
    pub fn finish(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        self.flush_streamed(&mut lines);
        lines
    }

    /// Rebuilds chunked events ([`Unchunker`], the one decoder); passes others through.
    fn assemble(&mut self, event: &LedgerEvent, lines: &mut Vec<String>) -> Option<LedgerEvent> {
        match self.chunks.feed(event) {
            Ok(whole) => whole.map(|e| e.into_owned()),
            Err(err) => {
                lines.push(format!("!! a chunked event could not be rebuilt: {err}"));
                None
            }
        }
    }

    fn event(&mut self, fence: Fence, event: &LedgerEvent, lines: &mut Vec<String>) {
        use LedgerEvent as E;
        match event {
            E::ModelDelta { text } => return self.streamed.push_str(text),
            E::Message {
                role: Role::Assistant,
                ..
            } => self.streamed.clear(),
            E::Claimed { .. } | E::AttemptStarted { .. } | E::Closed { .. } | E::Handoff => {
                self.flush_streamed(lines)
            }
            _ => {}
        }
        if let E::StepIntent { step, tool, .. } = event {
            self.tools.insert(*step, tool.clone());
        }
        lines.extend(event_lines(fence, event, &self.tools));
    }

    fn flush_streamed(&mut self, lines: &mut Vec<String>) {
        let text = std::mem::take(&mut self.streamed);
        if !text.trim().is_empty() {
            lines.push(block(
                "[assistant, streamed; its attempt ended before it was recorded]",
                &text,
            ));
        }
    }
}

/// Renders a whole ledger (segments in order) at once: what the streamed [`Transcript`] adds up
/// to, which the tests check (`baton transcript` streams segment by segment).
#[cfg(test)]
pub fn transcript(segments: &[LedgerSegment]) -> String {
    let mut t = Transcript::default();
    let mut lines: Vec<String> = segments.iter().flat_map(|s| t.segment(s)).collect();
    lines.extend(t.finish());
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// The lines of one (complete) event, written under `fence`.
fn event_lines(
    fence: Fence,
    event: &LedgerEvent,
    tools: &std::collections::BTreeMap<i64, String>,
) -> Vec<String> {
    use LedgerEvent as E;
    let tool = |step: &i64| tools.get(step).cloned().unwrap_or_else(|| "?".into());
    let line = match event {
        E::AttemptStarted { fence, pod } => format!("=== attempt {fence} started in pod {pod}"),
        E::Claimed { fence, pod } => {
            format!("=== claimed: attempt {fence} goes to pod {pod} (fence {fence})")
        }
        E::History { thread, turns, .. } => format!(
            "=== a turn of thread {thread}: its model sees the {} earlier turn(s) before it",
            turns.len()
        ),
        E::HistoryDropped { turns, tokens } => format!(
            "=== history: the oldest turn(s) {} left out ({tokens} tokens) to fit the thread's maxHistoryTokens",
            turns.join(", ")
        ),
        E::Message { role, content } => block(&format!("[{}]", role_name(*role)), content),
        E::GatewayCall {
            call,
            api,
            response,
            ..
        } => block(
            &format!("[assistant, the agent's model call {call} ({api})]"),
            &crate::ledger::journal::answer_text(api, response),
        ),
        E::GatewayDiverged { call, field } => format!(
            "!! the agent's model call {call} differed from its record at {field}: it and every later call went to the model"
        ),
        E::Input { index, content } => block(&format!("[user input #{}]", index + 1), content),
        E::StepIntent {
            step,
            tool,
            input,
            idempotent,
            ..
        } => {
            let marker = if *idempotent { " (idempotent)" } else { "" };
            block(&format!("-> step {step}: {tool}{marker}"), input)
        }
        E::StepResult {
            step,
            output,
            is_error,
        } => {
            let kind = if *is_error { "error" } else { "result" };
            block(&format!("<- step {step} {kind} ({}):", tool(step)), output)
        }
        E::StepUnknown { step, attempt } => format!(
            "!! step {step} ({}): effect UNKNOWN: the worker of attempt {attempt} died while it ran; it was not re-run",
            tool(step)
        ),
        E::StepProbed { step, outcome } => {
            format!("   probe of step {step}: {}", probe_name(*outcome))
        }
        E::WaitingInput { step, question } => {
            block(&format!("?? waiting for input (step {step}):"), question)
        }
        E::McpTools { tool, tools } => {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            format!("   MCP server {tool} offers: {}", names.join(", "))
        }
        E::ApprovalRequested { step, .. } => {
            format!("?? step {step} ({}) waits for approval", tool(step))
        }
        E::ApprovalDecided {
            step,
            outcome,
            reason,
        } => {
            let said = if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            };
            format!("   step {step} {}{said}", approval_name(*outcome))
        }
        E::Handoff => format!("=== attempt {fence} handed off"),
        E::Final { output } => block("=== final answer:", output),
        E::Failed { reason, message } => format!("=== failed: {reason}: {message}"),
        E::Stopped => "=== stopped on request".to_string(),
        E::Closed { fence, reason } => {
            format!("=== closed by the controller at fence {fence}: {reason}")
        }
        E::ModelCall {
            input_tokens: Some(input),
            output_tokens: Some(output),
        } => format!("   model call: {input} input + {output} output tokens"),
        E::ModelCall { .. } => "   model call: tokens not reported".to_string(),
        E::ModelDelta { .. } | E::Chunk { .. } => return Vec::new(),
        E::Unrecognized(event) => format!(
            "=== an event of kind {:?}, written by a newer baton: not shown (upgrade this CLI)",
            event.kind()
        ),
    };
    vec![line]
}

/// `head` followed by `body`, on the same line when it is one line, else indented below.
pub(super) fn block(head: &str, body: &str) -> String {
    let body = body.trim_end();
    if !body.contains('\n') {
        return if body.is_empty() {
            head.to_string()
        } else {
            format!("{head} {body}")
        };
    }
    let indented: Vec<String> = body.lines().map(|l| format!("    {l}")).collect();
    format!("{head}\n{}", indented.join("\n"))
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

fn probe_name(outcome: ProbeOutcome) -> &'static str {
    match outcome {
        ProbeOutcome::Applied => "applied (recorded, not re-run)",
        ProbeOutcome::NotApplied => "not applied (safe to run again)",
        ProbeOutcome::Unknown => "could not tell (still unknown)",
    }
}

fn approval_name(outcome: ApprovalOutcome) -> &'static str {
    match outcome {
        ApprovalOutcome::Approved => "approved (it runs)",
        ApprovalOutcome::Denied => "denied (not run)",
        ApprovalOutcome::TimedOut => "denied by default: no decision in time (not run)",
    }
}
