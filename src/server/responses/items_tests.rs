//! Conversations and their items: what a new conversation must say, the items' order and
//! ids, and the pages of a list.

use serde_json::{Value, json};

use super::*;

fn ids(list: &Value) -> Vec<&str> {
    let data = list["data"].as_array().unwrap();
    data.iter().map(|i| i["id"].as_str().unwrap()).collect()
}

#[test]
fn a_new_conversation_names_its_agent_and_has_no_items() {
    let asked =
        new_conversation(&json!({"metadata": {"agent": "thread/support", "topic": "refund"}}));
    let asked = asked.unwrap();
    assert_eq!(asked.template, "support");
    assert_eq!(asked.metadata["topic"], "refund");
    assert!(new_conversation(&json!({"metadata": {"agent": "thread/s"}, "items": []})).is_ok());
    let refused = [
        (json!({}), "metadata.agent: required"),
        (
            json!({"metadata": {"agent": "gpt-5"}}),
            "metadata.agent: model: name the agent",
        ),
        (
            json!({"metadata": {"agent": "thread/s", "n": 1}}),
            "metadata.n: must be a string",
        ),
        (
            json!({"metadata": {"agent": "thread/s"}, "items": [{"type": "message"}]}),
            "items: ",
        ),
        (
            json!({"metadata": {"agent": "thread/s"}, "tools": []}),
            "tools: not a field",
        ),
        (json!([]), "the body must be a JSON object"),
    ];
    for (body, why) in refused {
        let err = new_conversation(&body).unwrap_err();
        assert!(err.starts_with(why), "{body}: {err}");
    }
}

#[test]
fn a_turns_items_are_its_input_its_output_and_each_answer_in_its_place() {
    let output = [
        json!({"id": "msg_1_0"}),
        json!({"id": "mcp_1"}),
        json!({"id": "msg_5_0"}),
    ];
    let answers = [(1, "yes".to_string())];
    let items = turn_items("chat-a", "refund me", &output, &answers);
    let ids: Vec<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "chat-a:input",
            "chat-a:msg_1_0",
            "chat-a:answer-0",
            "chat-a:mcp_1",
            "chat-a:msg_5_0"
        ]
    );
    assert_eq!(items[0]["content"][0]["text"], "refund me");
    assert_eq!(items[2]["role"], "user");
    assert_eq!(items[2]["content"][0]["text"], "yes");
    // An answer after the last item comes last.
    let items = turn_items("r", "q", &output[..1], &[(1, "late".into())]);
    assert_eq!(items.last().unwrap()["id"], "r:answer-0");
}

#[test]
fn a_list_is_newest_first_in_pages_after_an_item() {
    let items: Vec<Value> = (1..=5).map(|i| json!({"id": format!("i{i}")})).collect();
    let query = |order: Option<&str>, after: Option<&str>, limit: Option<i64>| ListQuery {
        order: order.map(Into::into),
        after: after.map(Into::into),
        limit,
    };
    let newest = page(items.clone(), &query(None, None, Some(2))).unwrap();
    assert_eq!(ids(&newest), ["i5", "i4"]);
    assert_eq!(
        (&newest["first_id"], &newest["has_more"]),
        (&json!("i5"), &json!(true))
    );
    let next = page(items.clone(), &query(None, Some("i4"), Some(2))).unwrap();
    assert_eq!(ids(&next), ["i3", "i2"]);
    let last = page(items.clone(), &query(Some("asc"), Some("i3"), None)).unwrap();
    assert_eq!(ids(&last), ["i4", "i5"]);
    assert_eq!(
        (&last["last_id"], &last["has_more"]),
        (&json!("i5"), &json!(false))
    );
    for (q, why) in [
        (query(None, None, Some(0)), "limit: "),
        (query(Some("up"), None, None), "order: "),
        (query(None, Some("nope"), None), "after: "),
    ] {
        assert!(page(items.clone(), &q).unwrap_err().starts_with(why));
    }
}

#[test]
fn a_conversation_shows_the_metadata_kept_on_its_thread() {
    let kept = r#"{"agent":"thread/s","topic":"t"}"#;
    let object = conversation("conv-x", 7, Some(kept));
    assert_eq!(object["object"], "conversation");
    assert_eq!(
        (&object["id"], &object["created_at"]),
        (&json!("conv-x"), &json!(7))
    );
    assert_eq!(object["metadata"]["topic"], "t");
    assert_eq!(
        conversation("t", 0, Some("not json"))["metadata"],
        json!({})
    );
    assert_eq!(conversation("t", 0, None)["metadata"], json!({}));
}
