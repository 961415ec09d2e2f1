//! A task's stream as A2A events, each a JSON-RPC response to the request that opened it: the
//! follower reads the ledger from its start; the Responses fold and [`Translator`] make every
//! event again (once for all the task's followers: [`crate::server::shared_fold`]), and only
//! those after the cursor are sent.

use serde_json::{Value, json};

use super::translate::{TaskIds, Translator};
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};
use crate::server::held::Outgoing;
use crate::server::responses::fold::{END_SLOT, Fold, Meta, PER_POSITION};
use crate::server::responses::{end_of_phase, meta_of};
use crate::server::shared_fold::{FoldState, Folding, Folds, Rendered};
use crate::server::view::View;
use crate::server::whole::whole_events;

/// The Responses fold and what the translation remembers.
#[derive(Clone, Default)]
pub struct A2aFold {
    fold: Fold,
    translator: Translator,
}

impl FoldState for A2aFold {
    fn weight(&self) -> usize {
        self.fold.weight()
    }
}

/// The A2A events of the fold's `events` and of the `waiting` states, in their order.
fn translated(
    translator: &mut Translator,
    ids: &TaskIds,
    events: Vec<Value>,
    waiting: Vec<Value>,
) -> Vec<Rendered> {
    let translated = events.iter().filter_map(|e| translator.event(ids, e));
    let mut all: Vec<Value> = translated.chain(waiting).collect();
    all.sort_by_key(number);
    all.into_iter()
        .map(|e| Rendered {
            number: number(&e),
            name: "message".to_string(),
            json: e.to_string(),
        })
        .collect()
}

impl A2aFold {
    /// The events of ledger position `position`.
    fn position(
        &mut self,
        ids: &TaskIds,
        meta: &Meta,
        position: i64,
        events: &[&LedgerEvent],
    ) -> Vec<Rendered> {
        let made = self.fold.position(meta, position, events);
        let waiting = match self.fold.end() {
            Some(_) => Vec::new(),
            None => self.translator.waiting(ids, position, events),
        };
        translated(&mut self.translator, ids, made, waiting)
    }
}

pub struct A2aView {
    ids: TaskIds,
    /// The id of the JSON-RPC request every event answers, and it as JSON.
    request: Value,
    request_json: String,
    meta: Meta,
    fold: Folding<A2aFold>,
    /// Events up to this number are not sent.
    after: i64,
    tail: i64,
    /// The first event: the task as it stands (sent before anything else).
    first: Option<Value>,
}

impl A2aView {
    /// The view of `run`'s task, its fold shared with the other followers of `folds`.
    pub fn new(
        ids: TaskIds,
        request: &Value,
        run: &AgentRun,
        first: Value,
        after: i64,
        folds: &Folds,
    ) -> Self {
        let meta = meta_of(run);
        let uid = kube::ResourceExt::uid(run).unwrap_or_default();
        Self {
            fold: folds.join("a2a", &uid, format!("{meta:?} {ids:?}")),
            ids,
            request: request.clone(),
            request_json: request.to_string(),
            meta,
            after,
            tail: 0,
            first: Some(first),
        }
    }

    /// A JSON-RPC response of the opening request carrying `result` (JSON).
    fn answer(&self, result: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#,
            self.request_json
        )
    }

    /// The events after the cursor, as one piece (they are of one position).
    fn outgoing(&self, events: &[Rendered]) -> Vec<Outgoing> {
        let events = events.iter().filter(|e| e.number > self.after);
        Outgoing::joined(events.map(|e| ("message", self.answer(&e.json))))
            .into_iter()
            .collect()
    }
}

fn number(event: &Value) -> i64 {
    let extension = &event["metadata"][super::translate::CURSOR_EXTENSION];
    extension["sequenceNumber"].as_i64().unwrap_or(0)
}

impl View for A2aView {
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
        let position = segment.spec.seq;
        self.tail = position;
        let (ids, meta) = (&self.ids, &self.meta);
        let step = self
            .fold
            .advance(position, |fold| fold.position(ids, meta, position, &events));
        self.outgoing(&step.events)
    }

    fn run(&mut self, _run: &AgentRun) -> Vec<Outgoing> {
        let first = self
            .first
            .take()
            .map(|task| ("message", self.answer(&task.to_string())));
        Outgoing::joined(first).into_iter().collect()
    }

    fn ended(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let Some(end) = end_of_phase(run) else {
            return Vec::new();
        };
        // The stream ends here: the fold is left as it is (others may share it), and what the
        // translation remembers is copied.
        let state = self.fold.state();
        let made = state.fold.ending_from_phase(&self.meta, end, self.tail + 1);
        let mut translator = state.translator.clone();
        let events = translated(
            &mut translator,
            &self.ids,
            made.into_iter().collect(),
            vec![],
        );
        self.outgoing(&events)
    }

    fn deleted(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let name = kube::ResourceExt::name_any(run);
        vec![self.error(Some(&name), "the task's run was deleted")]
    }

    /// A JSON-RPC error ends the stream: the ledger cannot be read, or access was revoked.
    fn error(&mut self, _run: Option<&str>, message: &str) -> Outgoing {
        let number = self.tail * PER_POSITION + END_SLOT - 1;
        let data = json!({
            "jsonrpc": "2.0", "id": self.request,
            "error": {"code": -32603, "message": message, "data": super::translate::cursor(number)},
        });
        Outgoing::json("message", None, &data)
    }
}
