//! What a `POST /responses` body asks for, and what is refused, naming the field.

use serde_json::json;

use super::request::parse;

#[test]
fn a_model_naming_a_thread_is_a_run_of_its_own_with_its_agent() {
    let asked =
        parse(&json!({"model": "thread/support", "input": "hi", "background": true})).unwrap();
    assert_eq!(asked.thread, "support");
    assert!(!asked.turn);
    assert!(asked.background && !asked.stream);
    assert_eq!(asked.input, "hi");
    assert_eq!(asked.model, "thread/support");
}

#[test]
fn a_conversation_makes_a_turn_of_its_thread() {
    for conversation in [json!("support"), json!({"id": "support"})] {
        let asked = parse(&json!({"conversation": conversation, "input": "hi"})).unwrap();
        assert_eq!((asked.thread.as_str(), asked.turn), ("support", true));
        assert_eq!(asked.model, "thread/support");
    }
    let other = parse(&json!({"model": "thread/a", "conversation": "b", "input": "hi"}));
    assert!(other.unwrap_err().starts_with("conversation:"));
}

#[test]
fn user_messages_are_the_input() {
    let body = json!({"model": "thread/t", "stream": true, "input": [
        {"role": "user", "content": "one"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
    ]});
    let asked = parse(&body).unwrap();
    assert_eq!(asked.input, "one\n\ntwo");
    assert!(asked.stream);
    let tool_output = json!({"model": "thread/t", "input": [
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]});
    assert!(parse(&tool_output).unwrap_err().starts_with("input[0]:"));
}

#[test]
fn what_baton_cannot_honour_is_refused_naming_the_field() {
    let refused = |field: &str, value| {
        let mut body = json!({"model": "thread/t", "input": "hi"});
        body[field] = value;
        parse(&body).unwrap_err()
    };
    assert!(refused("tools", json!([])).starts_with("tools: not supported"));
    assert!(refused("instructions", json!("be brief")).starts_with("instructions:"));
    assert!(refused("previous_response_id", json!("r")).contains("conversation"));
    assert!(refused("background", json!("yes")).starts_with("background:"));
    assert!(refused("input", json!("  ")).starts_with("input:"));
    // What a client library sends and changes nothing is taken.
    assert!(
        parse(&json!({"model": "thread/t", "input": "hi", "store": true, "metadata": {}})).is_ok()
    );
    for model in ["gpt-4o", "thread/", "thread/a/b"] {
        let err = parse(&json!({"model": model, "input": "hi"})).unwrap_err();
        assert!(err.starts_with("model:"), "{err}");
    }
    assert!(
        parse(&json!({"input": "hi"}))
            .unwrap_err()
            .starts_with("model:")
    );
}
