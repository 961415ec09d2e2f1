//! A task's stream as A2A events, each a JSON-RPC response to the request that opened it: the
//! follower reads the ledger from its start; the Responses fold and [`Translator`] make every
//! event again, and only those after the cursor are sent.

use serde_json::{Value, json};

use super::translate::{TaskIds, Translator};
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};
use crate::server::held::Outgoing;
use crate::server::responses::fold::{END_SLOT, Fold, Meta, PER_POSITION};
use crate::server::responses::{end_of_phase, meta_of};
use crate::server::view::View;
use crate::server::whole::whole_events;

pub struct A2aView {
    ids: TaskIds,
    /// The id of the JSON-RPC request every event answers.
    request: Value,
    meta: Meta,
    fold: Fold,
    translator: Translator,
    /// Events up to this number are not sent.
    after: i64,
    tail: i64,
    /// The first event: the task as it stands (sent before anything else).
    first: Option<Value>,
}

impl A2aView {
    pub fn new(ids: TaskIds, request: Value, run: &AgentRun, first: Value, after: i64) -> Self {
        Self {
            ids,
            request,
            meta: meta_of(run),
            fold: Fold::default(),
            translator: Translator::default(),
            after,
            tail: 0,
            first: Some(first),
        }
    }

    fn answer(&self, result: Value) -> Outgoing {
        let data = json!({"jsonrpc": "2.0", "id": self.request, "result": result});
        Outgoing::json("message", None, &data)
    }

    fn outgoing(&mut self, events: Vec<Value>, waiting: Vec<Value>) -> Vec<Outgoing> {
        let translated: Vec<Value> = events
            .iter()
            .filter_map(|e| self.translator.event(&self.ids, e))
            .collect();
        let mut all: Vec<Value> = translated.into_iter().chain(waiting).collect();
        all.sort_by_key(number);
        let events = all
            .into_iter()
            .filter(|e| number(e) > self.after)
            .map(|e| self.answer(e))
            .collect();
        // They are of one position: handed to the connection as one piece.
        Outgoing::joined(events).into_iter().collect()
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
        let made = self.fold.position(&self.meta, position, &events);
        let waiting = match self.fold.end() {
            Some(_) => Vec::new(),
            None => self.translator.waiting(&self.ids, position, &events),
        };
        self.outgoing(made, waiting)
    }

    fn run(&mut self, _run: &AgentRun) -> Vec<Outgoing> {
        self.first
            .take()
            .map(|task| self.answer(task))
            .into_iter()
            .collect()
    }

    fn ended(&mut self, run: &AgentRun) -> Vec<Outgoing> {
        let Some(end) = end_of_phase(run) else {
            return Vec::new();
        };
        let made = self.fold.end_from_phase(&self.meta, end, self.tail + 1);
        self.outgoing(made.into_iter().collect(), Vec::new())
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
