//! Pure rendering of `baton describe`: phase, attempts and fences (from the ledger), unknown
//! effects, conditions and baton's own Events. No I/O here.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::render::{align, block};
use crate::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerEvent, LedgerSegment};
use crate::display::age;
use crate::fence::Fence;

/// What `describe` shows about a run.
pub struct Description<'a> {
    pub run: &'a AgentRun,
    pub segments: &'a [LedgerSegment],
    pub events: &'a [Event],
    pub now: Timestamp,
}

/// The `describe` text: phase, attempts and fences (from the ledger), unknown effects,
/// conditions and Events.
pub fn describe(d: &Description) -> String {
    let status = d.run.status.clone().unwrap_or_default();
    let mut out = String::new();
    out.push_str(&summary(d.run, &status));
    out.push_str(&attempts_section(d.segments));
    out.push_str(&unknown_section(&status));
    out.push_str(&conditions_section(&status, d.now));
    out.push_str(&events_section(d.events, d.now));
    out
}

fn summary(run: &AgentRun, s: &AgentRunStatus) -> String {
    let mut lines = vec![
        ("Name", run.name_any()),
        ("Namespace", run.id().namespace),
        ("Phase", s.phase.to_string()),
        ("Reason", s.reason.clone().unwrap_or_default()),
        ("Message", s.message.clone().unwrap_or_default()),
        ("Attempt", s.attempt.to_string()),
        ("Fence", s.fence.to_string()),
        (
            "Failed attempts",
            format!("{} of {}", s.failed_attempts, run.spec.max_attempts),
        ),
        (
            "Worker",
            s.worker.clone().unwrap_or_else(|| "<none>".into()),
        ),
        ("Steps", s.steps.to_string()),
        (
            "Inputs",
            format!(
                "{} consumed of {}",
                s.inputs_consumed,
                run.spec.inputs.len()
            ),
        ),
        ("Stop requested", run.spec.stop.to_string()),
    ];
    if let Some(l) = &s.ledger {
        lines.push((
            "Ledger",
            format!(
                "{} segments, {} events, {} bytes",
                l.segments, l.events, l.bytes
            ),
        ));
    }
    if let Some(p) = &s.pending_approval {
        lines.push((
            "Waiting for approval",
            format!(
                "step {} ({}), call {}, since {}: {}",
                p.step, p.tool, p.call_id, p.requested_at.0, p.arguments
            ),
        ));
    }
    if let Some(output) = &s.output {
        let label = if s.output_partial {
            "Output (partial)"
        } else {
            "Output"
        };
        lines.push((label, output.clone()));
    }
    let mut out: String = lines
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| block(&format!("{:<16}", format!("{k}:")), &v) + "\n")
        .collect();
    out.push('\n');
    out
}

/// One line per attempt, from the ledger: its fence, pod, and how it ended.
fn attempts_section(segments: &[LedgerSegment]) -> String {
    let mut out = String::from("Attempts (from the ledger):\n");
    let history = attempt_history(segments);
    if history.is_empty() {
        out.push_str("  <none>\n");
    }
    for (fence, pod, end) in history {
        out.push_str(&format!("  fence {fence:<3} pod {pod:<24} {end}\n"));
    }
    out.push('\n');
    out
}

/// `(fence, pod, how it ended)` for each attempt the ledger records, in order.
pub fn attempt_history(segments: &[LedgerSegment]) -> Vec<(Fence, String, String)> {
    let mut history: Vec<(Fence, String, String)> = Vec::new();
    for event in segments.iter().flat_map(|s| s.spec.events.iter()) {
        let end = match event {
            LedgerEvent::Claimed { fence, pod } => {
                end_last(&mut history, "superseded (claimed for a new attempt)");
                history.push((*fence, pod.clone(), "claimed".into()));
                continue;
            }
            LedgerEvent::AttemptStarted { fence, pod } => {
                match history.last_mut() {
                    Some(last) if last.0 == *fence => last.2 = "running".into(),
                    _ => history.push((*fence, pod.clone(), "running".into())),
                }
                continue;
            }
            LedgerEvent::Handoff => "handed off",
            LedgerEvent::WaitingInput { .. } => "waited for input",
            LedgerEvent::ApprovalRequested { .. } => "waited for approval",
            LedgerEvent::Final { .. } => "finished with a final answer",
            LedgerEvent::Failed { .. } => "failed",
            LedgerEvent::Stopped => "stopped",
            LedgerEvent::Closed { fence, .. } => {
                // A terminal claim's own seal, `claimed` at the same fence, names a pod that
                // never ran: the end belongs to the attempt before it.
                if history
                    .last()
                    .is_some_and(|last| last.0 == *fence && last.2 == "claimed")
                {
                    history.pop();
                }
                "closed by the controller"
            }
            _ => continue,
        };
        if let Some(last) = history.last_mut() {
            last.2 = end.into();
        }
    }
    history
}

fn end_last(history: &mut [(Fence, String, String)], end: &str) {
    if let Some(last) = history.last_mut()
        && (last.2 == "running" || last.2 == "claimed")
    {
        last.2 = end.into();
    }
}

fn unknown_section(s: &AgentRunStatus) -> String {
    let mut out = String::from("Unknown effects:\n");
    if s.unknown_effects.is_empty() {
        out.push_str("  <none>\n");
    }
    for e in &s.unknown_effects {
        out.push_str(&format!(
            "  step {} ({}), attempt {}: {} - {}\n",
            e.step, e.tool, e.attempt, e.resolution, e.summary
        ));
    }
    out.push('\n');
    out
}

fn conditions_section(s: &AgentRunStatus, now: Timestamp) -> String {
    let mut rows = vec![
        ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]
            .map(String::from)
            .to_vec(),
    ];
    for c in &s.conditions {
        rows.push(vec![
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            age(Some(&c.last_transition_time), now),
            c.message.clone(),
        ]);
    }
    section("Conditions", &rows)
}

fn events_section(events: &[Event], now: Timestamp) -> String {
    let mut rows = vec![
        ["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]
            .map(String::from)
            .to_vec(),
    ];
    for e in events {
        let when = e
            .event_time
            .as_ref()
            .map(|t| Time(t.0))
            .or_else(|| e.last_timestamp.clone());
        let from = e.reporting_component.clone().filter(|c| !c.is_empty());
        let from = from.or_else(|| e.source.as_ref().and_then(|s| s.component.clone()));
        rows.push(vec![
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            age(
                when.as_ref().or(e.metadata.creation_timestamp.as_ref()),
                now,
            ),
            from.unwrap_or_default(),
            e.message.clone().unwrap_or_default(),
        ]);
    }
    section("Events", &rows)
}

fn section(title: &str, rows: &[Vec<String>]) -> String {
    if rows.len() < 2 {
        return format!("{title}: <none>\n\n");
    }
    let table: String = align(rows).lines().map(|l| format!("  {l}\n")).collect();
    format!("{title}:\n{table}\n")
}
