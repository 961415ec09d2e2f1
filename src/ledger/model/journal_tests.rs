use serde_json::json;

use super::*;

const CHAT: &str = "chat.completions";

fn ask(text: &str) -> Value {
    canonical(json!({
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "metadata": {"trace": rand_id()},
        "user": "someone",
    }))
}

fn rand_id() -> String {
    format!("{:x}", rand::random::<u64>())
}

fn journal(texts: &[&str]) -> Journal {
    let mut journal = Journal::default();
    for (i, text) in texts.iter().enumerate() {
        journal.record(
            i as i64 + 1,
            RecordedCall {
                api: CHAT.into(),
                request: ask(text),
                response: json!({"answer": i}),
            },
        );
    }
    journal
}

#[test]
fn the_volatile_fields_are_left_out_and_the_rest_kept() {
    let a = ask("hi");
    assert_eq!(a, ask("hi"), "a new trace id and user change nothing");
    assert!(a.get("metadata").is_none() && a.get("user").is_none());
    assert_ne!(a, ask("hi!"));
    assert!(!streamed(&a));
    assert!(streamed(&json!({"stream": true})));
}

#[test]
fn a_sequential_agent_is_answered_in_order_then_goes_live() {
    let journal = journal(&["one", "two"]);
    let mut cursor = Cursor::default();
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("one")),
        Answer::Replay(1)
    );
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("two")),
        Answer::Replay(2)
    );
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("three")),
        Answer::Live(3)
    );
    assert_eq!(cursor.answer(&journal, CHAT, &ask("four")), Answer::Live(4));
}

#[test]
fn concurrent_calls_are_matched_by_their_request_not_their_arrival() {
    let journal = journal(&["left", "right"]);
    let mut cursor = Cursor::default();
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("right")),
        Answer::Replay(2)
    );
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("left")),
        Answer::Replay(1)
    );
    // Two equal requests take the two records in order, never one twice.
    let twice = self::journal(&["same", "same"]);
    let mut cursor = Cursor::default();
    assert_eq!(cursor.answer(&twice, CHAT, &ask("same")), Answer::Replay(1));
    assert_eq!(cursor.answer(&twice, CHAT, &ask("same")), Answer::Replay(2));
    assert_eq!(cursor.answer(&twice, CHAT, &ask("same")), Answer::Live(3));
}

#[test]
fn a_different_request_is_a_divergence_naming_the_first_field() {
    let journal = journal(&["one", "two"]);
    let mut cursor = Cursor::default();
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("one")),
        Answer::Replay(1)
    );
    assert_eq!(
        cursor.answer(&journal, CHAT, &ask("TWO")),
        Answer::Diverged {
            call: 2,
            field: "/messages/0/content".into()
        }
    );
    let mut longer = ask("two");
    longer["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "more"}));
    assert_eq!(
        cursor.answer(&journal, CHAT, &longer),
        Answer::Diverged {
            call: 2,
            field: "/messages/1".into()
        }
    );
    let mut other_model = ask("two");
    other_model["temperature"] = json!(0.5);
    assert_eq!(
        cursor.answer(&journal, CHAT, &other_model),
        Answer::Diverged {
            call: 2,
            field: "/temperature".into()
        }
    );
}

#[test]
fn past_a_divergence_the_calls_go_live_and_a_later_fold_keeps_the_new_past() {
    let mut journal = journal(&["one", "two", "three"]);
    let mut cursor = Cursor::default();
    cursor.answer(&journal, CHAT, &ask("one"));
    cursor.go_live_at(2);
    assert_eq!(cursor.answer(&journal, CHAT, &ask("2")), Answer::Live(2));
    assert_eq!(cursor.answer(&journal, CHAT, &ask("3")), Answer::Live(3));
    // As the ledger reads afterwards: the divergence, then the live calls' records.
    journal.diverge(2, "/messages/0/content");
    assert_eq!(journal.next_place(), 2);
    for (place, text) in [(2, "2"), (3, "3")] {
        journal.record(
            place,
            RecordedCall {
                api: CHAT.into(),
                request: ask(text),
                response: json!(null),
            },
        );
    }
    let mut cursor = Cursor::default();
    for (text, place) in [("one", 1), ("2", 2), ("3", 3)] {
        assert_eq!(
            cursor.answer(&journal, CHAT, &ask(text)),
            Answer::Replay(place)
        );
    }
}

#[test]
fn a_pointer_escapes_its_keys() {
    let a = json!({"a/b": {"c~d": 1}});
    let b = json!({"a/b": {"c~d": 2}});
    assert_eq!(first_difference(&a, &b, "").as_deref(), Some("/a~1b/c~0d"));
    assert_eq!(
        first_difference(&json!(1), &json!(2), "").as_deref(),
        Some("/")
    );
    assert_eq!(first_difference(&a, &a, ""), None);
}
