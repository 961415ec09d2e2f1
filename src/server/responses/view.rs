//! A run's stream as OpenAI Responses events ([`super::fold`] numbers them): the follower
//! reads the ledger from its start, the fold makes every event again (once for all the run's
//! followers: [`crate::server::shared_fold`]), and only those after the client's
//! `starting_after` are sent.

use serde_json::{Value, json};

use super::fold::{END_SLOT, End, Fold, Meta, PER_POSITION};
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment, Phase};
use crate::requests::phase_of;
use crate::server::held::Outgoing;
use crate::server::shared_fold::{FoldState, Folding, Folds, Rendered};
use crate::server::view::View;
use crate::server::whole::whole_events;

impl FoldState for Fold {
    fn weight(&self) -> usize {
        Fold::weight(self)
    }
}

/// The events of the fold, rendered: each its type, number and JSON.
pub fn rendered(events: Vec<Value>) -> Vec<Rendered> {
    events
        .into_iter()
        .map(|e| Rendered {
            number: e["sequence_number"].as_i64().unwrap_or(-1),
            name: e["type"].as_str().unwrap_or("message").to_string(),
            json: e.to_string(),
        })
        .collect()
}

pub struct ResponsesView {
    meta: Meta,
    fold: Folding<Fold>,
    /// The client's `starting_after`: events up to it are not sent (None: from the start).
    after: Option<i64>,
    /// The last position folded.
    tail: i64,
    created: bool,
}

impl ResponsesView {
    /// The view of run `uid`, its fold shared with the other followers of `folds`.
    pub fn new(meta: Meta, after: Option<i64>, uid: &str, folds: &Folds) -> Self {
        Self {
            fold: folds.join("responses", uid, format!("{meta:?}")),
            meta,
            after,
            tail: 0,
            created: false,
        }
    }

    /// The events after the client's cursor, as one piece (they are of one position).
    fn outgoing(&self, events: &[Rendered]) -> Vec<Outgoing> {
        let after = self.after.unwrap_or(-1);
        let events = events.iter().filter(|e| e.number > after);
        Outgoing::joined(events.map(|e| (&e.name, &e.json)))
            .into_iter()
            .collect()
    }
}

impl View for ResponsesView {
    fn read_from(&self, _after: i64) -> i64 {
        0
    }

    fn segment(
        &mut self,
        segment: &LedgerSegment,
        rebuilt: Option<Result<LedgerEvent, String>>,
    ) -> Vec<Outgoing> {
        let events = whole_events(segment, rebuilt);
        let events: Vec<&LedgerEvent> = events.iter().map(AsRef::as_ref).collect();
        let (meta, position) = (&self.meta, segment.spec.seq);
        self.tail = position;
        let step = self.fold.advance(position, |fold| {
            rendered(fold.position(meta, position, &events))
        });
        self.outgoing(&step.events)
    }

    /// `response.created` (number 0) first; the rest comes from the ledger.
    fn run(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        if self.created {
            return Vec::new();
        }
        self.created = true;
        let response = self.fold.state().object(&self.meta, live_status(run));
        let created =
            json!({"type": "response.created", "response": response, "sequence_number": 0});
        self.outgoing(&rendered(vec![created]))
    }

    fn ended(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let Some(end) = end_of_phase(run) else {
            return Vec::new();
        };
        let made = self
            .fold
            .state()
            .ending_from_phase(&self.meta, end, self.tail + 1);
        self.outgoing(&rendered(made.into_iter().collect()))
    }

    fn deleted(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let name = kube::ResourceExt::name_any(run);
        vec![self.error(Some(&name), "the run was deleted")]
    }

    /// An `error` event, numbered just before the end's place of the last position read: after
    /// everything sent, before anything a reconnect can bring.
    fn error(&mut self, _run: Option<&str>, message: &str) -> Outgoing {
        let number = self.tail * PER_POSITION + END_SLOT - 1;
        let data = json!({
            "type": "error", "code": "stream_error", "message": message, "param": null,
            "sequence_number": number,
        });
        Outgoing::json("error", None, &data)
    }
}

/// The status of a response whose ledger has not ended it.
pub fn live_status(run: &AgentRun) -> &'static str {
    match phase_of(run) {
        Phase::Pending => "queued",
        _ => "in_progress",
    }
}

/// How the run's terminal phase ends its response (None: not ended).
pub fn end_of_phase(run: &AgentRun) -> Option<End> {
    let status = run.status.clone().unwrap_or_default();
    match status.phase {
        Phase::Succeeded => Some(End::Completed),
        Phase::Stopped => Some(End::Cancelled),
        Phase::Failed | Phase::Interrupted => Some(End::Failed {
            code: status
                .reason
                .unwrap_or_else(|| format!("{:?}", status.phase)),
            message: status.message.unwrap_or_default(),
        }),
        _ => None,
    }
}

/// What the response object says of `run` besides its ledger.
pub fn meta_of(run: &AgentRun) -> Meta {
    let annotations = kube::ResourceExt::annotations(run);
    let name = kube::ResourceExt::name_any(run);
    let model = annotations
        .get(super::MODEL_ANNOTATION)
        .cloned()
        .or_else(|| run.spec.thread.as_ref().map(|t| format!("thread/{t}")))
        .unwrap_or_else(|| format!("run/{name}"));
    Meta {
        created_at: run
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        model,
        background: annotations
            .get(super::BACKGROUND_ANNOTATION)
            .is_some_and(|b| b == "true"),
        conversation: run.spec.thread.clone(),
        id: name,
    }
}
