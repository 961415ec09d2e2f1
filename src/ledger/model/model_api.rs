//! The model APIs an agent container's gateway serves (OpenAI Chat Completions and Responses,
//! Anthropic Messages), and what differs between them (pure):
//! where a call goes, what a whole answer and a stream look like, where the usage is, and the
//! model's text in a recorded answer (docs/byo-agent.md, The gateway). The journal and the
//! gateway are the same for all; only these facts change.

use serde_json::Value;

/// A model API, as the journal names it in `gatewayCall.api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelApi {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    Chat,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
}

/// The last event of a Chat Completions stream.
pub const DONE: &str = "[DONE]";

impl ModelApi {
    pub const ALL: [ModelApi; 3] = [ModelApi::Chat, ModelApi::Responses, ModelApi::Messages];

    /// Its name in the journal.
    pub fn name(self) -> &'static str {
        match self {
            ModelApi::Chat => "chat.completions",
            ModelApi::Responses => "responses",
            ModelApi::Messages => "messages",
        }
    }

    /// The API a journal's name stands for.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|api| api.name() == name)
    }

    /// Its path after the provider's `…/v1` base URL.
    pub fn path(self) -> &'static str {
        match self {
            ModelApi::Chat => "/chat/completions",
            ModelApi::Responses => "/responses",
            ModelApi::Messages => "/messages",
        }
    }

    /// The field a whole answer holds its output in; a 2xx document without it is an error
    /// a server sent with the wrong status.
    pub fn output_field(self) -> &'static str {
        match self {
            ModelApi::Chat => "choices",
            ModelApi::Responses => "output",
            ModelApi::Messages => "content",
        }
    }

    /// Whether a whole JSON answer is this API's answer.
    pub fn is_answer(self, answer: &Value) -> bool {
        answer.get(self.output_field()).is_some_and(Value::is_array)
    }

    /// Whether a stream's event is its last: Chat Completions ends with [`DONE`] (not an
    /// event of JSON); a Responses stream with the response completed, failed or incomplete;
    /// a Messages stream with `message_stop`.
    pub fn ends_stream(self, event: &Value) -> bool {
        let kind = event.get("type").and_then(Value::as_str);
        match self {
            ModelApi::Chat => false,
            ModelApi::Responses => matches!(
                kind,
                Some("response.completed" | "response.failed" | "response.incomplete")
            ),
            ModelApi::Messages => kind == Some("message_stop"),
        }
    }

    /// The last event of a complete stream, as an error about one cut short names it.
    pub fn last_event(self) -> &'static str {
        match self {
            ModelApi::Chat => DONE,
            ModelApi::Responses => "response.completed",
            ModelApi::Messages => "message_stop",
        }
    }

    /// A stream's event as sent (`event:` named as its `type`, but for Chat Completions).
    pub fn frame(self, event: &Value) -> String {
        match (self, event.get("type").and_then(Value::as_str)) {
            (ModelApi::Chat, _) | (_, None) => format!("data: {event}\n\n"),
            (_, Some(kind)) => format!("event: {kind}\ndata: {event}\n\n"),
        }
    }

    /// What follows a stream's recorded events when it is sent again.
    pub fn stream_end(self) -> Option<String> {
        match self {
            ModelApi::Chat => Some(format!("data: {DONE}\n\n")),
            ModelApi::Responses | ModelApi::Messages => None,
        }
    }

    /// The tokens an answer reports (whole, or the stream's event that carries them).
    pub fn usage(self, response: &Value) -> Option<(i64, i64)> {
        if let (ModelApi::Messages, Value::Array(events)) = (self, response) {
            return messages_stream_usage(events);
        }
        let (input, output) = match self {
            ModelApi::Chat => ("prompt_tokens", "completion_tokens"),
            ModelApi::Responses | ModelApi::Messages => ("input_tokens", "output_tokens"),
        };
        let of = |v: &Value| {
            let usage = match self {
                ModelApi::Chat | ModelApi::Messages => v.get("usage"),
                ModelApi::Responses => v
                    .get("usage")
                    .or_else(|| v.pointer("/response/usage"))
                    .filter(|u| !u.is_null()),
            }?;
            Some((usage.get(input)?.as_i64()?, usage.get(output)?.as_i64()?))
        };
        match response {
            Value::Array(events) => events.iter().rev().find_map(of),
            whole => of(whole),
        }
    }

    /// The model's text in a recorded answer (streamed or not): what a transcript shows.
    pub fn answer_text(self, response: &Value) -> String {
        match (self, response) {
            (ModelApi::Chat, Value::Array(events)) => events
                .iter()
                .filter_map(|e| e.pointer("/choices/0/delta/content")?.as_str())
                .collect(),
            (ModelApi::Chat, whole) => whole
                .pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            (ModelApi::Responses, Value::Array(events)) => events
                .iter()
                .rev()
                .find_map(|e| e.get("response").filter(|r| r.get("output").is_some()))
                .map(output_text)
                .unwrap_or_default(),
            (ModelApi::Responses, whole) => output_text(whole),
            (ModelApi::Messages, Value::Array(events)) => events
                .iter()
                .filter_map(|e| e.pointer("/delta/text")?.as_str())
                .collect(),
            (ModelApi::Messages, whole) => content_text(whole),
        }
    }
}

/// A Messages stream's usage: the input on `message_start`, the output on the last
/// `message_delta` (each a running total).
fn messages_stream_usage(events: &[Value]) -> Option<(i64, i64)> {
    let input = events
        .iter()
        .find_map(|e| e.pointer("/message/usage/input_tokens")?.as_i64())?;
    let output = events
        .iter()
        .rev()
        .find_map(|e| e.pointer("/usage/output_tokens")?.as_i64())?;
    Some((input, output))
}

/// The text of a Messages answer's blocks, and the tools it asks for.
fn content_text(message: &Value) -> String {
    let blocks = message.get("content").and_then(Value::as_array);
    let mut text = String::new();
    for block in blocks.into_iter().flatten() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                let name = block.get("name").and_then(Value::as_str).unwrap_or("?");
                let input = block.get("input").map(Value::to_string).unwrap_or_default();
                text.push_str(&format!("\n→ {name}({input})"));
            }
            _ => {}
        }
    }
    text
}

/// The text of a Responses answer's messages, and the calls it asks for.
fn output_text(response: &Value) -> String {
    let items = response.get("output").and_then(Value::as_array);
    let mut text = String::new();
    for item in items.into_iter().flatten() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let parts = item.get("content").and_then(Value::as_array);
                for part in parts.into_iter().flatten() {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            Some("function_call") => {
                let name = item.get("name").and_then(Value::as_str).unwrap_or("?");
                let arguments = item.get("arguments").and_then(Value::as_str).unwrap_or("");
                text.push_str(&format!("\n→ {name}({arguments})"));
            }
            _ => {}
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_api_says_where_its_output_and_usage_are() {
        let chat = json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        assert!(ModelApi::Chat.is_answer(&chat) && !ModelApi::Responses.is_answer(&chat));
        assert_eq!(ModelApi::Chat.usage(&chat), Some((3, 2)));
        let response = json!({"object": "response", "output": [], "usage": {"input_tokens": 7, "output_tokens": 4}});
        assert!(ModelApi::Responses.is_answer(&response));
        assert_eq!(ModelApi::Responses.usage(&response), Some((7, 4)));
        let streamed = json!([
            {"type": "response.created", "response": {"usage": null}},
            {"type": "response.completed", "response": {"output": [], "usage": {"input_tokens": 9, "output_tokens": 1}}},
        ]);
        assert_eq!(ModelApi::Responses.usage(&streamed), Some((9, 1)));
        assert_eq!(ModelApi::named("responses"), Some(ModelApi::Responses));
        assert_eq!(ModelApi::named("messages"), Some(ModelApi::Messages));
        assert_eq!(ModelApi::named("completions"), None);
    }

    #[test]
    fn a_responses_stream_ends_with_its_response_and_is_framed_by_type() {
        let done = json!({"type": "response.completed", "response": {}});
        let delta = json!({"type": "response.output_text.delta", "delta": "hi"});
        assert!(ModelApi::Responses.ends_stream(&done));
        assert!(!ModelApi::Responses.ends_stream(&delta) && !ModelApi::Chat.ends_stream(&done));
        assert!(
            ModelApi::Responses
                .frame(&delta)
                .starts_with("event: response.output_text.delta\ndata: {")
        );
        assert_eq!(ModelApi::Responses.stream_end(), None);
        assert_eq!(
            ModelApi::Chat.stream_end().as_deref(),
            Some("data: [DONE]\n\n")
        );
    }

    #[test]
    fn a_messages_answer_has_its_usage_split_over_its_stream() {
        let whole = json!({"type": "message", "content": [{"type": "text", "text": "hi"}, {"type": "tool_use", "name": "sh", "input": {}}], "usage": {"input_tokens": 4, "output_tokens": 2}});
        assert!(ModelApi::Messages.is_answer(&whole));
        assert_eq!(ModelApi::Messages.usage(&whole), Some((4, 2)));
        assert_eq!(ModelApi::Messages.answer_text(&whole), "hi\n→ sh({})");
        let streamed = json!([
            {"type": "message_start", "message": {"usage": {"input_tokens": 6, "output_tokens": 1}}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "h"}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "i"}},
            {"type": "message_delta", "usage": {"output_tokens": 3}},
            {"type": "message_stop"},
        ]);
        assert_eq!(ModelApi::Messages.usage(&streamed), Some((6, 3)));
        assert_eq!(ModelApi::Messages.answer_text(&streamed), "hi");
        assert!(ModelApi::Messages.ends_stream(&streamed[4]));
        assert!(
            ModelApi::Messages
                .frame(&streamed[4])
                .starts_with("event: message_stop\n")
        );
    }

    #[test]
    fn the_text_of_an_answer_whole_or_streamed() {
        let message =
            json!({"type": "message", "content": [{"type": "output_text", "text": "done"}]});
        let call = json!({"type": "function_call", "name": "sh", "arguments": "{}"});
        let whole = json!({"output": [message, call]});
        assert_eq!(ModelApi::Responses.answer_text(&whole), "done\n→ sh({})");
        let streamed = json!([{"type": "response.created"}, {"type": "response.completed", "response": whole}]);
        assert_eq!(ModelApi::Responses.answer_text(&streamed), "done\n→ sh({})");
        let chunks = json!([{"choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {"content": "b"}}]}]);
        assert_eq!(ModelApi::Chat.answer_text(&chunks), "ab");
    }
}
