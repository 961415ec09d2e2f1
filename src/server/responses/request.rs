//! A `POST /responses` body as baton reads it (pure): which agent answers, the input, and how
//! the answer is wanted. What baton cannot honour is refused, naming the field, never ignored:
//! an agent's model, tools and instructions are its thread's, not the request's.

use serde_json::{Map, Value};

/// What the request asks for.
#[derive(Debug, PartialEq)]
pub struct Create {
    /// The thread whose agent answers.
    pub thread: String,
    /// True: the response is a turn of the thread (its conversation goes on); false: a run of
    /// its own with the thread's agent, worker and limits.
    pub turn: bool,
    pub input: String,
    pub background: bool,
    pub stream: bool,
    /// The `model` as the client wrote it (what the response object says).
    pub model: String,
}

/// Fields a client library may send that change nothing baton does.
const IGNORED: [&str; 6] = [
    "metadata",
    "store",
    "user",
    "include",
    "stream_options",
    "service_tier",
];
const MODEL_FORM: &str = "model: name the agent as thread/<AgentThread name> (its agent answers)";

/// Reads `body`; the error names the field and says why.
pub fn parse(body: &Value) -> Result<Create, String> {
    let Some(fields) = body.as_object() else {
        return Err("the body must be a JSON object".into());
    };
    refuse_unsupported(fields)?;
    let model = match fields.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.as_str()),
        Some(_) => return Err(format!("{MODEL_FORM}; it is not a string")),
    };
    let from_model = model.map(thread_of_model).transpose()?;
    let conversation = conversation_of(fields.get("conversation"))?;
    let (thread, turn) = match (from_model, conversation) {
        (Some(m), Some(c)) if m != c => {
            return Err(format!(
                "conversation: {c:?} is not the thread the model names ({m:?}); a conversation is \
                 its thread's, omit model or name the same thread"
            ));
        }
        (_, Some(c)) => (c, true),
        (Some(m), None) => (m, false),
        (None, None) => return Err(format!("{MODEL_FORM}, or give a conversation")),
    };
    Ok(Create {
        model: model.map_or_else(|| format!("thread/{thread}"), str::to_string),
        thread,
        turn,
        input: input_of(fields.get("input"))?,
        background: flag(fields, "background")?,
        stream: flag(fields, "stream")?,
    })
}

fn refuse_unsupported(fields: &Map<String, Value>) -> Result<(), String> {
    const KNOWN: [&str; 5] = ["model", "input", "background", "stream", "conversation"];
    for (field, value) in fields {
        if KNOWN.contains(&field.as_str()) || IGNORED.contains(&field.as_str()) || value.is_null() {
            continue;
        }
        let why = match field.as_str() {
            "previous_response_id" => "continue a conversation with conversation: <thread> instead",
            "instructions"
            | "tools"
            | "tool_choice"
            | "temperature"
            | "top_p"
            | "reasoning"
            | "text"
            | "max_output_tokens"
            | "max_tool_calls"
            | "parallel_tool_calls"
            | "truncation"
            | "prompt" => "the agent's settings are its thread's (spec.agent)",
            _ => "baton does not know it",
        };
        return Err(format!("{field}: not supported: {why}"));
    }
    Ok(())
}

pub(super) fn thread_of_model(model: &str) -> Result<String, String> {
    match model.strip_prefix("thread/") {
        Some(name) if !name.is_empty() && !name.contains('/') => Ok(name.to_string()),
        _ => Err(format!("{MODEL_FORM}; {model:?} is not of that form")),
    }
}

/// `conversation`: the thread's name, as a string or `{"id": …}`.
fn conversation_of(value: Option<&Value>) -> Result<Option<String>, String> {
    let id = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(id)) => id.as_str(),
        Some(Value::Object(o)) => match o.get("id") {
            Some(Value::String(id)) => id.as_str(),
            _ => return Err("conversation.id: must be the thread's name".into()),
        },
        Some(_) => return Err("conversation: must be the thread's name, or {\"id\": name}".into()),
    };
    match id.is_empty() {
        true => Err("conversation: must not be empty".into()),
        false => Ok(Some(id.to_string())),
    }
}

/// `input`: a string, or user messages whose text is joined (a paragraph each).
fn input_of(value: Option<&Value>) -> Result<String, String> {
    let text = match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(items)) => {
            let texts = items
                .iter()
                .enumerate()
                .map(|(i, item)| user_text(i, item))
                .collect::<Result<Vec<_>, _>>()?;
            texts.join("\n\n")
        }
        None | Some(Value::Null) => return Err("input: required (the user's message)".into()),
        Some(_) => return Err("input: must be a string or a list of user messages".into()),
    };
    match text.trim().is_empty() {
        true => Err("input: must not be empty".into()),
        false => Ok(text),
    }
}

fn user_text(i: usize, item: &Value) -> Result<String, String> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let role = item.get("role").and_then(Value::as_str).unwrap_or("");
    if kind != "message" || role != "user" {
        return Err(format!(
            "input[{i}]: only user messages are taken (this is type {kind:?}, role {role:?}); \
             the agent's tools and earlier turns are baton's to keep"
        ));
    }
    match item.get("content") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(
                |(j, part)| match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("input_text"), Some(Value::String(text))) => Ok(text.clone()),
                    _ => Err(format!(
                        "input[{i}].content[{j}]: only input_text parts are taken"
                    )),
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(|parts| parts.concat()),
        _ => Err(format!(
            "input[{i}].content: must be a string or a list of input_text parts"
        )),
    }
}

fn flag(fields: &Map<String, Value>, name: &str) -> Result<bool, String> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{name}: must be true or false")),
    }
}
