//! A turn's history read as the worker reads it (`Ledgers::read_history`), against the API
//! server, its requests counted:
//! - the earlier turns' ledgers come in one list of the thread's segments, however many turns;
//! - a turn whose segments carry no thread label (written by a release before it) is read on
//!   its own, and the history is the same;
//! - the label only finds segments: another run's under it, or a namesake's, is no turn's.

use std::sync::Arc;

use baton::crd::v1alpha1::{HistoryTurn, LedgerSegment};
use baton::crd::{RUN_UID_LABEL, THREAD_UID_LABEL};
use baton::ledger::{Ledgers, ReplayedMessage};
use baton::worker::api_count::{ApiCounters, ApiCounts, counted_client};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::thread_ledgers::{create_thread, texts, write_turns};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

/// The user questions of a history, in order.
fn questions(history: &[(HistoryTurn, Vec<ReplayedMessage>)]) -> Vec<String> {
    history
        .iter()
        .flat_map(|(_, messages)| messages.iter())
        .filter_map(|m| match m {
            ReplayedMessage::User(text) => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// Reads `turns` as a turn of the thread of UID `thread_uid` does; the history and the
/// requests it took.
async fn read(
    ns: &TestNamespace,
    thread_uid: &str,
    turns: &[HistoryTurn],
) -> (Vec<(HistoryTurn, Vec<ReplayedMessage>)>, ApiCounts) {
    let counters = Arc::new(ApiCounters::default());
    let client = counted_client(counters.clone()).await.unwrap();
    let history = Ledgers::api_server(client)
        .read_history(&ns.name, Some(thread_uid), turns)
        .await
        .expect("the API server answers")
        .expect("the history is whole");
    (history, counters.snapshot())
}

/// Sets (None: removes) the thread label on every segment of `turn`'s ledger.
async fn set_thread_label(ns: &TestNamespace, turn: &HistoryTurn, thread_uid: Option<&str>) {
    let segments: Api<LedgerSegment> = ns.api();
    let selector = format!("{RUN_UID_LABEL}={}", turn.uid);
    let label = serde_json::json!({"metadata": {"labels": {THREAD_UID_LABEL: thread_uid}}});
    let of_turn = ListParams::default().labels(&selector);
    for segment in segments.list(&of_turn).await.unwrap() {
        let name = segment.name_any();
        let params = PatchParams::default();
        segments
            .patch(&name, &params, &Patch::Merge(&label))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn earlier_turns_are_read_with_one_list_and_unlabelled_ones_alone() {
    let ns = TestNamespace::new("thread-history").await;
    let thread = create_thread(&ns.client, &ns.name, "long").await;
    let uid = thread.uid().unwrap();
    let turns = write_turns(&ns.client, &thread, 1, 12).await;
    let expected: Vec<String> = (1..=12).map(|p| texts(p).0).collect();

    let (history, counts) = read(&ns, &uid, &turns).await;
    assert_eq!(questions(&history), expected);
    assert_eq!(
        (counts.list, counts.get),
        (1, 0),
        "twelve turns, one list: {counts:?}"
    );

    // Turn 5's ledger as a release before the label wrote it.
    set_thread_label(&ns, &turns[4], None).await;
    let (history, counts) = read(&ns, &uid, &turns).await;
    assert_eq!(questions(&history), expected, "the same history");
    assert_eq!(
        (counts.list, counts.get),
        (2, 1),
        "the thread's list, then turn 5's own and the read that confirms its end: {counts:?}"
    );

    // Another thread's turns, labelled for this thread (as no webhook would let a worker):
    // found by the list, taken by no turn of this history.
    let other = create_thread(&ns.client, &ns.name, "other").await;
    let strangers = write_turns(&ns.client, &other, 1, 2).await;
    for stranger in &strangers {
        set_thread_label(&ns, stranger, Some(&uid)).await;
    }
    let (history, _) = read(&ns, &uid, &turns).await;
    assert_eq!(questions(&history), expected, "strangers are no turn's");
}
