//! A thread's context policy on the API server, with the real controller and real workers:
//! `onOverflow: Fail` ends a turn whose history is too large `ContextExceeded`, naming the
//! sizes, before its model is asked anything; `DropOldestTurns` sends the turns that fit and
//! records which were left out.

use crate::threads::*;
use baton::crd::v1alpha1::{ContextPolicy, LedgerEvent, Overflow, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::*;

/// An answer of about 100 tokens (400 bytes, one token per 4).
fn long_answer(tag: &str) -> String {
    format!("{tag}: {}", "word ".repeat(79))
}

fn with_context(
    server: &Server,
    max: i64,
    on_overflow: Overflow,
) -> baton::crd::v1alpha1::AgentThread {
    let mut t = thread("geo", server);
    t.spec.context = Some(ContextPolicy {
        max_history_tokens: max,
        on_overflow,
    });
    t
}

#[tokio::test]
async fn a_turn_whose_history_is_too_large_fails_context_exceeded_naming_the_sizes() {
    let ns = TestNamespace::new("thread-overflow-fail").await;
    let server = Server::start(vec![Reply::sse(answer_stream(&long_answer("one")))]).await;
    let _controller = start_controller(&ns);
    create(&ns, &with_context(&server, 50, Overflow::Fail)).await;
    whole_turn(&ns, "geo-1", "Tell me about Paris.").await;

    create(&ns, &turn("geo-2", "geo", "More?")).await;
    let mut worker = run_pod(&ns, "geo-2", 1).await;
    let code = worker.wait(crate::EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", worker.log_text());
    let failed = wait_phase(&ns, "geo-2", Phase::Failed).await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("ContextExceeded"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("1 earlier turn") && message.contains("maxHistoryTokens (50)"),
        "{message}"
    );
    assert_eq!(
        server.received().len(),
        1,
        "the model was asked with a cut history"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn dropping_sends_the_newest_turns_that_fit_and_records_the_rest() {
    let ns = TestNamespace::new("thread-overflow-drop").await;
    let server = Server::start(vec![
        Reply::sse(answer_stream(&long_answer("one"))),
        Reply::sse(answer_stream(&long_answer("two"))),
        Reply::sse(answer_stream("three")),
    ])
    .await;
    let _controller = start_controller(&ns);
    create(&ns, &with_context(&server, 150, Overflow::DropOldestTurns)).await;
    whole_turn(&ns, "geo-1", "First?").await;
    whole_turn(&ns, "geo-2", "Second?").await;
    let third = whole_turn(&ns, "geo-3", "Third?").await;

    let received = server.received();
    assert_eq!(received.len(), 3);
    let seen = conversation(&received[2]);
    let users: Vec<&str> = seen
        .iter()
        .filter(|(r, _)| r == "user")
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(users, ["Second?", "Third?"], "{seen:?}");
    let events: Vec<LedgerEvent> = ledger(&ns, &third)
        .await
        .into_iter()
        .flat_map(|s| s.spec.events)
        .collect();
    let dropped = events.iter().find_map(|e| match e {
        LedgerEvent::HistoryDropped { turns, tokens } => Some((turns.clone(), *tokens)),
        _ => None,
    });
    let (turns, tokens) = dropped.expect("the drop is recorded");
    assert_eq!(turns, ["geo-1"]);
    assert!(tokens > 100, "{tokens}");
    ns.cleanup().await;
}
