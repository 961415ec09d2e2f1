//! The journal of an agent container's model calls (pure): what each call's request was, in
//! canonical form, and what it got back, by place; and which recorded call a resumed agent's
//! request is answered with (docs/byo-agent.md, "Replay").
//!
//! The rule, for sequential and concurrent agents alike: a request is answered by the
//! earliest recorded call not yet answered in this attempt whose canonical request is equal.
//! When none is equal while some remain unanswered, the agent diverged: reported against the
//! earliest unanswered record, naming the first field that differs. When every record is
//! answered, the call goes live, at the next place.

use std::collections::BTreeMap;

use serde_json::Value;

use super::model_api::ModelApi;

/// The fields of a request (Chat Completions or Responses) left out of its canonical form: they say who
/// asks or where to keep it, not what is asked, and SDKs fill some per process.
pub const VOLATILE_FIELDS: [&str; 5] = [
    "metadata",
    "user",
    "store",
    "prompt_cache_key",
    "safety_identifier",
];

/// A request's canonical form: the JSON body with [`VOLATILE_FIELDS`] left out at the top.
/// Object keys compare without order; everything else as written (the same SDK writes the
/// same request the same way).
pub fn canonical(mut request: Value) -> Value {
    if let Some(fields) = request.as_object_mut() {
        for field in VOLATILE_FIELDS {
            fields.remove(field);
        }
    }
    request
}

/// Whether a canonical request asked for a stream.
pub fn streamed(request: &Value) -> bool {
    request.get("stream").and_then(Value::as_bool) == Some(true)
}

/// The model's text in a recorded answer of API `api` (a journal's name; streamed or not):
/// what a transcript shows of the call.
pub fn answer_text(api: &str, response: &Value) -> String {
    ModelApi::named(api).map_or_else(String::new, |api| api.answer_text(response))
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    pub api: String,
    pub request: Value,
    pub response: Value,
}

impl RecordedCall {
    pub fn new(api: &str, request: &Value, response: &Value) -> Self {
        Self {
            api: api.to_string(),
            request: request.clone(),
            response: response.clone(),
        }
    }
}

/// The recorded calls, by place (from 1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Journal {
    pub calls: BTreeMap<i64, RecordedCall>,
    /// Places where an attempt diverged and went on (`onDivergence: Continue`).
    pub diverged: Vec<(i64, String)>,
}

impl Journal {
    /// Folds a `gatewayCall` event: a later record of a place replaces the earlier.
    pub fn record(&mut self, call: i64, recorded: RecordedCall) {
        self.calls.insert(call, recorded);
    }

    /// Folds a `gatewayDiverged` event: the records from `call` on were the diverged
    /// attempt's past; the places after it are the live calls that followed.
    pub fn diverge(&mut self, call: i64, field: &str) {
        self.diverged.push((call, field.to_string()));
        self.calls.retain(|place, _| *place < call);
    }

    /// The place a live call takes: after every recorded one.
    pub fn next_place(&self) -> i64 {
        self.calls.keys().next_back().map_or(1, |last| last + 1)
    }
}

/// What answers a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The recorded call at this place.
    Replay(i64),
    /// Nothing recorded is left: the model answers, at this place.
    Live(i64),
    /// The request differs from the earliest unanswered record, at `field`.
    Diverged { call: i64, field: String },
}

/// Which recorded calls this attempt has answered, and where its live calls go.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    answered: Vec<i64>,
    live_next: Option<i64>,
}

impl Cursor {
    /// What answers `request` (canonical) of API `api`; a `Replay` or `Live` place is taken.
    pub fn answer(&mut self, journal: &Journal, api: &str, request: &Value) -> Answer {
        if self.live_next.is_none() {
            let mut unanswered = journal
                .calls
                .iter()
                .filter(|(place, _)| !self.answered.contains(place));
            let first = unanswered.clone().next();
            if let Some((place, _)) =
                unanswered.find(|(_, call)| call.api == api && call.request == *request)
            {
                self.answered.push(*place);
                return Answer::Replay(*place);
            }
            if let Some((place, call)) = first {
                let field =
                    first_difference(&call.request, request, "").unwrap_or_else(|| "/".to_string());
                let field = if call.api == api {
                    field
                } else {
                    format!("(the API: {} was recorded, {api} asked)", call.api)
                };
                return Answer::Diverged {
                    call: *place,
                    field,
                };
            }
        }
        let place = self.live_next.unwrap_or_else(|| journal.next_place());
        self.live_next = Some(place + 1);
        Answer::Live(place)
    }

    /// After a divergence the run continues past: every call from `call` on goes live.
    pub fn go_live_at(&mut self, call: i64) {
        self.live_next = Some(call);
    }
}

/// The JSON pointer of the first place `recorded` and `asked` differ (objects' keys in order,
/// then arrays' items), or None when they are equal.
pub fn first_difference(recorded: &Value, asked: &Value, at: &str) -> Option<String> {
    match (recorded, asked) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|key| {
                let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => first_difference(x, y, &here),
                    _ => Some(here),
                }
            })
        }
        (Value::Array(a), Value::Array(b)) => {
            let within = a
                .iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}/{i}")));
            within
                .or_else(|| (a.len() != b.len()).then(|| format!("{at}/{}", a.len().min(b.len()))))
        }
        (x, y) if x == y => None,
        _ => Some(if at.is_empty() { "/".into() } else { at.into() }),
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
