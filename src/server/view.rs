//! What a stream's client sees of a run: the one follower (`stream.rs`) reads the ledger and
//! the live tail in order, without a gap or a repeat; a view turns what it reads into the
//! events of the client's protocol. baton's own (`segment`, `status`, `end`) is [`Native`];
//! the OpenAI Responses events are `responses::ResponsesView`.

use kube::ResourceExt;
use serde_json::json;

use super::held::Outgoing;
use super::whole::segment_event;
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment, Phase};

/// Turns a run's ledger and status into a client's events.
pub trait View: Send + Sync {
    /// Where the follower reads the ledger from when the client's cursor is `after`: a view
    /// that numbers its events from the whole ledger reads it from the start.
    fn read_from(&self, after: i64) -> i64 {
        after
    }

    /// The events of `segment`, the next in order (`rebuilt`: the chunked event it ends).
    fn segment(
        &mut self,
        segment: &LedgerSegment,
        rebuilt: Option<Result<LedgerEvent, String>>,
    ) -> Vec<Outgoing>;

    /// The events of the run as it is now (its phase may have changed).
    fn run(&mut self, run: &AgentRun) -> Vec<Outgoing>;

    /// The last events, once the run has ended and its ledger was read to its end.
    fn ended(&mut self, run: &AgentRun) -> Vec<Outgoing>;

    /// The last event, once the run was deleted.
    fn deleted(&mut self, run: &AgentRun) -> Vec<Outgoing>;

    /// The stream ends on an error: the ledger cannot be read, or access was revoked.
    fn error(&mut self, run: Option<&str>, message: &str) -> Outgoing;
}

/// baton's own events (docs/reference/http-api.md): a `segment` per ledger position, a
/// `status` when the phase (or the step waiting for approval) changes, then `end`.
#[derive(Default)]
pub struct Native {
    /// The phase and waiting step last sent.
    sent: Option<(Phase, Option<i64>)>,
}

impl View for Native {
    fn segment(
        &mut self,
        segment: &LedgerSegment,
        rebuilt: Option<Result<LedgerEvent, String>>,
    ) -> Vec<Outgoing> {
        vec![segment_event(segment, rebuilt)]
    }

    fn run(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let status = run.status.clone().unwrap_or_default();
        let key = (
            status.phase,
            status.pending_approval.as_ref().map(|p| p.step),
        );
        if self.sent == Some(key) {
            return Vec::new();
        }
        self.sent = Some(key);
        let mut data = phase_data(run);
        data["pendingApproval"] = json!(status.pending_approval);
        vec![json_event("status", &data)]
    }

    fn ended(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        vec![json_event("end", &phase_data(run))]
    }

    fn deleted(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let data = json!({ "run": run.name_any(), "uid": run.uid(), "deleted": true });
        vec![json_event("end", &data)]
    }

    fn error(&mut self, run: Option<&str>, message: &str) -> Outgoing {
        let data = match run {
            Some(run) => json!({ "run": run, "message": message }),
            None => json!({ "message": message }),
        };
        json_event("error", &data)
    }
}

/// The run's name, UID, phase, reason and message.
fn phase_data(run: &AgentRun) -> serde_json::Value {
    let status = run.status.clone().unwrap_or_default();
    json!({
        "run": run.name_any(),
        "uid": run.uid(),
        "phase": status.phase,
        "reason": status.reason,
        "message": status.message,
    })
}

/// An event named `name` with `data` as its JSON (one line: JSON escapes every newline, so
/// nothing a model or a tool wrote can end an event early or forge one).
pub fn json_event(name: &str, data: &serde_json::Value) -> Outgoing {
    Outgoing::json(name, None, data)
}
