//! A turn's history whose earlier turns are kept in PostgreSQL, read as a worker reads it:
//! through `baton server`, in one request however many turns (the server counts what it
//! answered). The read is refused before its body is read to a caller without a token, and to
//! one who may not read ledgers in the namespace; a read naming too many runs is refused
//! naming the field.

use baton::crd::v1alpha1::{HistoryTurn, LedgerBackend};
use baton::ledger::postgres::PgLedger;
use baton::ledger::served::{LEDGER_AUDIENCE, LedgerClient, LedgerToken, ledgers_path};
use baton::ledger::{Ledgers, ReplayedMessage};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::thread_ledgers::{TurnLedgers, create_thread, texts, write_turns_in};
use baton_testkit::rbac::mint_token_for;
use baton_testkit::server::*;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::ResourceExt;
use serde_json::{Value, json};

/// The user questions of a history, in order.
fn questions(history: &[(HistoryTurn, Vec<ReplayedMessage>)]) -> Vec<String> {
    let asked = |m: &ReplayedMessage| match m {
        ReplayedMessage::User(text) => Some(text.clone()),
        _ => None,
    };
    history
        .iter()
        .flat_map(|(_, messages)| messages.iter().filter_map(asked))
        .collect()
}

/// A ledger token of a ServiceAccount `name` with `rules`.
async fn token_of(ns: &TestNamespace, name: &str, rules: Vec<PolicyRule>) -> String {
    person(ns, name, rules).await;
    mint_token_for(&ns.client, &ns.name, name, LEDGER_AUDIENCE, None).await
}

/// A POST of `body` (already JSON) with `token`, if any; the status code and the answer.
async fn post_raw(url: &str, token: Option<&str>, body: String) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let code = response.status().as_u16();
    (code, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_threads_turns_in_postgresql_are_read_in_one_request() {
    let ns = TestNamespace::new("pg-history").await;
    let (base, _server) = start_ledger_server(vec![]).await;
    let url = std::env::var("BATON_TEST_POSTGRES_URL").unwrap();
    let db = PgLedger::connect(&url, 4).await.unwrap();
    let direct = Ledgers::with_postgres(ns.client.clone(), db);
    let kept = TurnLedgers {
        ledgers: &direct,
        backend: LedgerBackend::PostgreSQL,
    };
    let thread = create_thread(&ns.client, &ns.name, "long").await;
    let turns = write_turns_in(&ns.client, &kept, &thread, 1, 30).await;
    let expected: Vec<String> = (1..=30).map(|p| texts(p).0).collect();

    // A turn's worker reads them through the server, with the right to read ledgers.
    let reader = token_of(
        &ns,
        "reader",
        vec![rule(&["ledgersegments"], &["get", "list"])],
    )
    .await;
    let server = LedgerClient::new(&base, LedgerToken::Fixed(reader.clone()));
    let through = Ledgers::with_server(ns.client.clone(), server, LedgerBackend::PostgreSQL);
    let before = answered(&base).await;
    let history = through
        .read_history(&ns.name, thread.uid().as_deref(), &turns)
        .await
        .expect("the API server answers")
        .expect("the history is whole");
    let requests = answered(&base).await - before - 1;
    assert_eq!(questions(&history), expected);
    assert_eq!(requests, 1, "thirty turns, one request");

    // The same, read directly (`baton server` itself, for a person): the same history.
    let history = direct
        .read_history(&ns.name, thread.uid().as_deref(), &turns)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(questions(&history), expected);

    let read_url = format!("{base}{}", ledgers_path(&ns.name));
    let one = json!({"runs": [{"run": turns[0].run, "uid": turns[0].uid}]}).to_string();
    // No token: refused before the body is read (a body past the bound is not what is said).
    let (code, body) = post_raw(&read_url, None, "x".repeat(400 * 1024)).await;
    assert_eq!(code, 401, "{body}");
    // A token whose account may not read ledgers here: refused, the body unread.
    let outsider = token_of(
        &ns,
        "outsider",
        vec![rule(&["agentruns"], &["get", "list"])],
    )
    .await;
    let (code, body) = post_raw(&read_url, Some(&outsider), "x".repeat(400 * 1024)).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("outsider"),
        "{body}"
    );
    let (code, body) = post_raw(&read_url, Some(&outsider), one.clone()).await;
    assert_eq!(code, 403, "{body}");
    // The reader: one run's ledger, whole; a body past its bound; too many runs named.
    let (code, body) = post_raw(&read_url, Some(&reader), one).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(5), "{body}");
    let (code, body) = post_raw(&read_url, Some(&reader), "x".repeat(400 * 1024)).await;
    assert_eq!(code, 413, "{body}");
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"run": format!("r{i}"), "uid": format!("u{i}")}))
        .collect();
    let (code, body) = post_raw(&read_url, Some(&reader), json!({"runs": many}).to_string()).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("runs:"),
        "{body}"
    );
}
