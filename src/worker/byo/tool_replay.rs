//! Which recorded step answers an agent container's tool call (pure; docs/byo-agent.md, The
//! tool gateway). A resumed agent runs again from the top and calls its tools again; a call
//! the ledger already holds a result for is answered with that result and does not run. A
//! call is matched by its tool and its arguments (as JSON values, so key order and spacing do
//! not matter) to the earliest recorded step of the same call not yet answered in this
//! attempt: parallel calls that arrive in another order still find their own records, and the
//! same call made twice finds its two records in turn. A call that matches none is new: it
//! gets the next step and runs.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::ledger::{Replay, ReplayedMessage};

/// What a step told the agent: its result as the model of the built-in loop would see it
/// (for a step whose effect is unknown, the notice saying so).
#[derive(Debug, Clone, PartialEq)]
pub struct Told {
    pub step: i64,
    pub content: String,
    pub is_error: bool,
}

/// A recorded call, not yet answered in this attempt.
#[derive(Debug, Clone)]
struct Recorded {
    tool: String,
    arguments: Value,
    told: Told,
}

/// The recorded tool calls of the run, answered at most once each per attempt.
#[derive(Debug, Clone, Default)]
pub struct ToolReplay {
    unanswered: Vec<Recorded>,
}

impl ToolReplay {
    /// Every step of `replay` with a result in the conversation, in step order. A step
    /// without one (waiting for approval or an answer) is settled by the resume plan before
    /// the agent starts; one still unsettled is not a record to answer from.
    pub fn new(replay: &Replay) -> Self {
        let results = results(replay);
        let unanswered = replay
            .steps
            .values()
            .filter_map(|s| {
                let told = results.get(&s.step)?.clone();
                Some(Recorded {
                    tool: s.tool.clone(),
                    arguments: arguments_of(&s.input),
                    told,
                })
            })
            .collect();
        Self { unanswered }
    }

    /// The record that answers a call of `tool` with `arguments`, taken so it answers no
    /// other call; None: the call is new.
    pub fn answer(&mut self, tool: &str, arguments: &Value) -> Option<Told> {
        let arguments = normalized(arguments);
        let i = self
            .unanswered
            .iter()
            .position(|r| r.tool == tool && r.arguments == arguments)?;
        Some(self.unanswered.remove(i).told)
    }
}

/// What step `step` told the model, as the replay holds it.
pub fn told(replay: &Replay, step: i64) -> Option<Told> {
    replay.messages.iter().rev().find_map(|m| match m {
        ReplayedMessage::ToolResult {
            step: s,
            content,
            is_error,
            ..
        } if *s == step => Some(Told {
            step,
            content: content.clone(),
            is_error: *is_error,
        }),
        _ => None,
    })
}

fn results(replay: &Replay) -> BTreeMap<i64, Told> {
    let mut results = BTreeMap::new();
    for message in &replay.messages {
        if let ReplayedMessage::ToolResult {
            step,
            content,
            is_error,
            ..
        } = message
        {
            let told = Told {
                step: *step,
                content: content.clone(),
                is_error: *is_error,
            };
            results.insert(*step, told);
        }
    }
    results
}

/// A step's recorded input as a JSON value (an input that is not JSON compares as its text).
fn arguments_of(input: &str) -> Value {
    match serde_json::from_str::<Value>(input) {
        Ok(value) => normalized(&value),
        Err(_) => Value::String(input.to_string()),
    }
}

/// No arguments and empty arguments are one call.
fn normalized(arguments: &Value) -> Value {
    match arguments {
        Value::Null => Value::Object(Default::default()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::LedgerEvent;
    use crate::fence::Fence;
    use serde_json::json;

    fn intent(step: i64, tool: &str, input: &str) -> LedgerEvent {
        LedgerEvent::StepIntent {
            step,
            tool: tool.into(),
            call_id: format!("c{step}"),
            input: input.into(),
            idempotent: false,
        }
    }

    fn result(step: i64, output: &str) -> LedgerEvent {
        LedgerEvent::StepResult {
            step,
            output: output.into(),
            is_error: false,
        }
    }

    fn replay(events: &[LedgerEvent]) -> Replay {
        let mut replay = Replay::default();
        for event in events {
            replay.apply(Fence::new(1), event);
        }
        replay
    }

    #[test]
    fn a_call_is_answered_by_its_own_record_whatever_the_order_and_key_order() {
        let mut tools = ToolReplay::new(&replay(&[
            intent(1, "sh", r#"{"command":"a","cwd":"/"}"#),
            intent(2, "sh", r#"{"command":"b"}"#),
            result(2, "B"),
            result(1, "A"),
        ]));
        let b = tools.answer("sh", &json!({"command": "b"})).unwrap();
        assert_eq!((b.step, b.content.as_str()), (2, "B"));
        let a = tools
            .answer("sh", &json!({"cwd": "/", "command": "a"}))
            .unwrap();
        assert_eq!((a.step, a.content.as_str()), (1, "A"));
        assert_eq!(
            tools.answer("sh", &json!({"command": "a", "cwd": "/"})),
            None
        );
    }

    #[test]
    fn the_same_call_twice_takes_its_records_in_turn_then_runs() {
        let mut tools = ToolReplay::new(&replay(&[
            intent(1, "sh", r#"{"command":"date"}"#),
            result(1, "first"),
            intent(2, "sh", r#"{"command":"date"}"#),
            result(2, "second"),
        ]));
        let call = json!({"command": "date"});
        assert_eq!(tools.answer("sh", &call).unwrap().content, "first");
        assert_eq!(tools.answer("sh", &call).unwrap().content, "second");
        assert_eq!(tools.answer("sh", &call), None);
    }

    #[test]
    fn another_tool_or_other_arguments_are_a_new_call() {
        let mut tools = ToolReplay::new(&replay(&[
            intent(1, "sh", r#"{"command":"a"}"#),
            result(1, "A"),
        ]));
        assert_eq!(tools.answer("http", &json!({"command": "a"})), None);
        assert_eq!(tools.answer("sh", &json!({"command": "a "})), None);
        assert!(tools.answer("sh", &json!({"command": "a"})).is_some());
    }

    #[test]
    fn a_step_whose_effect_is_unknown_answers_with_the_notice() {
        let mut tools = ToolReplay::new(&replay(&[
            intent(1, "pay", "{}"),
            LedgerEvent::StepUnknown {
                step: 1,
                attempt: Fence::new(1),
            },
        ]));
        let told = tools.answer("pay", &Value::Null).unwrap();
        assert!(told.is_error);
        assert_eq!(told.content, crate::ledger::UNKNOWN_EFFECT_NOTICE);
    }

    #[test]
    fn a_step_without_a_result_answers_nothing() {
        let r = replay(&[intent(1, "sh", "{}")]);
        assert_eq!(ToolReplay::new(&r).answer("sh", &json!({})), None);
        assert_eq!(told(&r, 1), None);
    }
}
