//! What a run said, on its spans, only when its operator opts in (the chart's
//! `tracing.content`, the controller's `--worker-trace-content`, `BATON_TRACE_CONTENT=true` in
//! the worker pod): a model call's messages in and out, a tool call's arguments and result, in
//! the GenAI conventions' shapes (`gen_ai.input.messages`, `gen_ai.output.messages`,
//! `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`). The caller scrubs every secret the
//! worker holds first; each value is then capped, so one huge tool output cannot swell a span
//! past what a collector takes. Off (the default), nothing is built.

use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::ledger::ReplayedMessage;

/// The variable that turns content on, next to the OTLP ones.
pub const CONTENT_ENV: &str = "BATON_TRACE_CONTENT";

/// The most bytes of one value a span carries.
pub const CONTENT_CAP: usize = 16 * 1024;

/// Whether this process puts content on its spans: asked for, and traces on.
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok();
        asked(var(CONTENT_ENV)) && super::configured(var)
    })
}

/// Pure: whether the variable's value asks for content.
fn asked(value: Option<String>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Pure: `text` as a span carries it: whole, or its first [`CONTENT_CAP`] bytes (cut on a
/// character's boundary) and how much was left out.
pub fn capped(text: &str) -> String {
    if text.len() <= CONTENT_CAP {
        return text.to_string();
    }
    let end = crate::cut::char_floor(text, CONTENT_CAP);
    format!("{}… [{} more bytes]", &text[..end], text.len() - end)
}

/// Pure: a model call's input, the system prompt then the conversation, as
/// `gen_ai.input.messages` (JSON).
pub fn input_messages(system: Option<&str>, messages: &[ReplayedMessage]) -> String {
    let system = system.map(|text| message("system", vec![text_part(text)]));
    let all: Vec<Value> = system.into_iter().chain(messages.iter().map(one)).collect();
    Value::Array(all).to_string()
}

/// Pure: a model call's answer, its text and the tool calls (id, name, arguments) it asks
/// for, as `gen_ai.output.messages` (JSON).
pub fn output_messages(text: &str, tool_calls: &[(&str, &str, &str)]) -> String {
    let finish = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_call"
    };
    let mut answer = assistant(text, tool_calls.iter().copied());
    answer["finish_reason"] = json!(finish);
    Value::Array(vec![answer]).to_string()
}

fn one(message_in: &ReplayedMessage) -> Value {
    match message_in {
        ReplayedMessage::System(text) => message("system", vec![text_part(text)]),
        ReplayedMessage::User(text) => message("user", vec![text_part(text)]),
        ReplayedMessage::Assistant { text, tool_calls } => {
            let calls = tool_calls
                .iter()
                .map(|c| (c.call_id.as_str(), c.tool.as_str(), c.input.as_str()));
            assistant(text, calls)
        }
        ReplayedMessage::ToolResult {
            call_id, content, ..
        } => message(
            "tool",
            vec![json!({"type": "tool_call_response", "id": call_id, "response": content})],
        ),
    }
}

/// The model's turn: its text (if any), then its tool calls (id, name, arguments).
fn assistant<'a>(text: &str, calls: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> Value {
    let text = (!text.is_empty()).then(|| text_part(text));
    let calls = calls.map(|(id, name, arguments)| tool_call_part(id, name, arguments));
    message("assistant", text.into_iter().chain(calls).collect())
}

fn message(role: &str, parts: Vec<Value>) -> Value {
    json!({"role": role, "parts": parts})
}

fn text_part(text: &str) -> Value {
    json!({"type": "text", "content": text})
}

fn tool_call_part(id: &str, name: &str, arguments: &str) -> Value {
    let arguments: Value =
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.into()));
    json!({"type": "tool_call", "id": id, "name": name, "arguments": arguments})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ToolCallRecord;

    #[test]
    fn content_is_asked_for_only_by_true() {
        assert!(asked(Some("true".into())));
        assert!(asked(Some(" TRUE ".into())));
        for no in [
            None,
            Some("".into()),
            Some("1".into()),
            Some("false".into()),
        ] {
            assert!(!asked(no.clone()), "{no:?}");
        }
    }

    #[test]
    fn a_long_value_is_cut_on_a_character_and_says_how_much_is_left_out() {
        assert_eq!(capped("short"), "short");
        let long = "é".repeat(CONTENT_CAP); // 2 bytes each
        let shown = capped(&long);
        assert!(
            shown.ends_with(&format!("… [{} more bytes]", CONTENT_CAP)),
            "{}",
            &shown[shown.len() - 40..]
        );
        assert!(shown.len() < CONTENT_CAP + 40);
    }

    #[test]
    fn messages_take_the_conventions_shapes() {
        let call = ToolCallRecord {
            step: 1,
            call_id: "c1".into(),
            tool: "sh".into(),
            input: r#"{"command":"ls"}"#.into(),
        };
        let conversation = vec![
            ReplayedMessage::User("list the files".into()),
            ReplayedMessage::Assistant {
                text: String::new(),
                tool_calls: vec![call],
            },
            ReplayedMessage::ToolResult {
                step: 1,
                call_id: "c1".into(),
                tool: "sh".into(),
                content: "a b".into(),
                is_error: false,
            },
        ];
        let input: Value =
            serde_json::from_str(&input_messages(Some("be brief"), &conversation)).unwrap();
        assert_eq!(
            input,
            json!([
                {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
                {"role": "user", "parts": [{"type": "text", "content": "list the files"}]},
                {"role": "assistant", "parts": [
                    {"type": "tool_call", "id": "c1", "name": "sh", "arguments": {"command": "ls"}}
                ]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "a b"}]},
            ])
        );
        let output: Value = serde_json::from_str(&output_messages("done", &[])).unwrap();
        assert_eq!(
            output,
            json!([{"role": "assistant", "parts": [{"type": "text", "content": "done"}], "finish_reason": "stop"}])
        );
    }
}
