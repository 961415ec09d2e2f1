//! Conversations and items as OpenAI's Conversations API shows them (pure). A conversation is
//! an AgentThread; its items are its turns in their order, each the user's input, then what
//! the turn's response output, the user's answers to its questions in their places. An item's
//! id is `<response id>:<item id>`: unique in the conversation, and it says which response
//! it came from.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::request::thread_of_model;

/// The annotation that keeps a conversation's `metadata` (as JSON) on its AgentThread.
pub const METADATA_ANNOTATION: &str = "baton.dev/conversation-metadata";
/// The `metadata` key that names the agent a new conversation talks to.
pub const AGENT_KEY: &str = "agent";

/// The Conversation object of the thread `id` made at `created_at` (seconds), with the
/// metadata kept on it.
pub fn conversation(id: &str, created_at: i64, metadata: Option<&str>) -> Value {
    let metadata = metadata
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({
        "id": id, "object": "conversation",
        "created_at": created_at,
        "metadata": metadata,
    })
}

/// What a `POST /conversations` asks for.
#[derive(Debug, PartialEq)]
pub struct NewConversation {
    /// The AgentThread whose agent, worker and limits the conversation's thread copies.
    pub template: String,
    pub metadata: Map<String, Value>,
}

/// Reads a `POST /conversations` body; the error names the field and says why.
pub fn new_conversation(body: &Value) -> Result<NewConversation, String> {
    let Some(fields) = body.as_object() else {
        return Err("the body must be a JSON object".into());
    };
    for (field, value) in fields {
        match field.as_str() {
            "metadata" => {}
            "items" if value.is_null() || value.as_array().is_some_and(Vec::is_empty) => {}
            "items" => {
                return Err(
                    "items: a conversation's items are its turns: create it empty, then \
                            add a turn with POST /responses and conversation: <its id>"
                        .into(),
                );
            }
            other => return Err(format!("{other}: not a field of a new conversation")),
        }
    }
    let metadata = match fields.get("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err("metadata: must be an object of strings".into()),
    };
    if let Some((key, _)) = metadata.iter().find(|(_, v)| !v.is_string()) {
        return Err(format!("metadata.{key}: must be a string"));
    }
    let template = match metadata.get(AGENT_KEY).and_then(Value::as_str) {
        Some(agent) => thread_of_model(agent).map_err(|e| format!("metadata.{AGENT_KEY}: {e}"))?,
        None => {
            return Err(format!(
                "metadata.{AGENT_KEY}: required: the agent the conversation talks to, as \
                 thread/<AgentThread name> (its agent, worker and limits are copied)"
            ));
        }
    };
    Ok(NewConversation { template, metadata })
}

fn user_item(id: String, text: &str) -> Value {
    json!({
        "type": "message", "id": id, "role": "user", "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    })
}

/// The input items of response `response`: the user's input, then the answers it was given.
pub fn input_items(response: &str, input: &str, answers: &[(usize, String)]) -> Vec<Value> {
    let first = user_item(format!("{response}:input"), input);
    let answers = answers.iter().enumerate();
    let answers = answers.map(|(i, (_, text))| user_item(format!("{response}:answer-{i}"), text));
    std::iter::once(first).chain(answers).collect()
}

/// The items of one turn, response `response`: its input, then its `output` items, each answer
/// (the number of output items before it, and its text) in its place.
pub fn turn_items(
    response: &str,
    input: &str,
    output: &[Value],
    answers: &[(usize, String)],
) -> Vec<Value> {
    let mut users = input_items(response, input, answers).into_iter();
    let mut items: Vec<Value> = users.next().into_iter().collect();
    let mut places = answers.iter().map(|(at, _)| *at).peekable();
    for (index, item) in output.iter().enumerate() {
        while places.next_if(|at| *at <= index).is_some() {
            items.extend(users.next());
        }
        let mut item = item.clone();
        let id = item["id"].as_str().unwrap_or("").to_string();
        item["id"] = json!(format!("{response}:{id}"));
        items.push(item);
    }
    items.extend(users);
    items
}

/// A list request's `order`, `after` and `limit` (others, such as `include`, change nothing
/// baton shows).
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    pub order: Option<String>,
    pub after: Option<String>,
    pub limit: Option<i64>,
}

/// The page of `items` (oldest first) a list request asks for: newest first unless `order` is
/// `asc`, at most `limit` (20 unless given, 1 to 100), after the item `after`.
pub fn page(mut items: Vec<Value>, query: &ListQuery) -> Result<Value, String> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(format!("limit: from 1 to 100, not {limit}"));
    }
    match query.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => return Err(format!("order: asc or desc, not {other:?}")),
    }
    let start = match &query.after {
        None => 0,
        Some(after) => match items.iter().position(|i| i["id"] == after.as_str()) {
            Some(at) => at + 1,
            None => return Err(format!("after: no item {after:?} in this list")),
        },
    };
    let rest = &items[start..];
    let data: Vec<Value> = rest.iter().take(limit as usize).cloned().collect();
    Ok(json!({
        "object": "list",
        "first_id": data.first().map(|i| i["id"].clone()),
        "last_id": data.last().map(|i| i["id"].clone()),
        "has_more": rest.len() > data.len(),
        "data": data,
    }))
}

#[cfg(test)]
#[path = "items_tests.rs"]
mod tests;
