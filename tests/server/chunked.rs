//! An event too large for one segment is stored as `chunk` events in consecutive segments; a
//! run's stream sends it whole, in the segment of its last chunk, to a client that follows
//! from the start, to one that follows as it is written and to one that resumes between two
//! of its chunks (each rebuilds it from the ledger when it meets the last chunk: a stream
//! keeps nothing of a chunked event while its chunks go by). No client decodes a
//! chunk: the console's page shows it once and whole in a real browser (it used to rebuild
//! chunks itself, and could not: it parsed their base64 as JSON).

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, Role};
use baton::fence::Fence;
use baton::ledger::{SEGMENT_BUDGET_BYTES, SegmentStore, encode_events};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

const RUN: &str = "big";
/// Three chunks' worth.
const ANSWER_LENGTH: usize = 2_500_000;

#[tokio::test]
async fn a_chunked_event_is_streamed_whole_from_the_start_and_from_between_its_chunks() {
    let ns = TestNamespace::new("server-chunked").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    // No controller: the run stays as created, and the test writes its ledger.
    let run = scripted_run(RUN, vec![final_turn("-", 0)], vec![], LeaseSpec::default());
    let runs: Api<AgentRun> = ns.api();
    let created = runs.create(&PostParams::default(), &run).await.unwrap();
    let uid = created.uid().unwrap();

    let small = LedgerEvent::Message {
        role: Role::User,
        content: "write a long answer".into(),
    };
    let big = LedgerEvent::Message {
        role: Role::Assistant,
        content: "y".repeat(ANSWER_LENGTH),
    };
    let groups = encode_events(vec![small.clone(), big.clone()], SEGMENT_BUDGET_BYTES).unwrap();
    assert!(
        groups.len() >= 4,
        "the answer takes 3 chunks: {}",
        groups.len()
    );
    // A client that follows before the answer is written meets its chunks as they come.
    let events_url = format!("{url}/api/v1/namespaces/{}/runs/{RUN}/events", ns.name);
    let live = SseReader::open(&events_url, &alice, None).await;
    let store = SegmentStore::for_run(ns.client.clone(), &created);
    for (tail, group) in groups.into_iter().enumerate() {
        store
            .append(tail as i64, Fence::new(1), group)
            .await
            .expect("writing the ledger");
    }
    let stored = store.list().await.unwrap();
    let tail = stored.last().unwrap().spec.seq;
    assert!(
        stored[1..]
            .iter()
            .all(|s| matches!(s.spec.events[..], [LedgerEvent::Chunk { .. }])),
        "stored as chunks"
    );

    let from_start = read_to(&events_url, &alice, None, tail).await;
    let mut want = vec![serde_json::json!([small])];
    want.extend((2..tail).map(|_| serde_json::json!([])));
    want.push(serde_json::json!([big]));
    assert_eq!(positions(&from_start), (1..=tail).collect::<Vec<_>>());
    assert_eq!(
        events_of(&from_start),
        want,
        "every place sent, the answer whole at its last"
    );
    let live = read_from(live, tail).await;
    assert_eq!(events_of(&live), want, "followed as it was written");

    // Resumed just after the answer's first chunk (a client cut mid-event reconnects).
    let cursor = format!("{uid}:2");
    let resumed = read_to(&events_url, &alice, Some(&cursor), tail).await;
    assert_eq!(positions(&resumed), (3..=tail).collect::<Vec<_>>());
    assert_eq!(events_of(&resumed), want[2..].to_vec());

    // The console's page in a real browser shows the answer once, whole.
    let length = ANSWER_LENGTH.to_string();
    let env = [
        ("CONSOLE_URL", url.as_str()),
        ("TOKEN", alice.as_str()),
        ("NS", ns.name.as_str()),
        ("RUN", RUN),
        ("LENGTH", length.as_str()),
    ];
    browser_check("chunked.mjs", &env).await;
    ns.cleanup().await;
}

/// The `segment` events of a stream opened at `url` (after `last_event_id`), up to `tail`.
async fn read_to(url: &str, token: &str, last_event_id: Option<&str>, tail: i64) -> Vec<Sse> {
    read_from(SseReader::open(url, token, last_event_id).await, tail).await
}

/// The `segment` events `reader` brings, up to `tail`.
async fn read_from(mut reader: SseReader, tail: i64) -> Vec<Sse> {
    let mut got = Vec::new();
    while got.last().is_none_or(|e: &Sse| e.data["seq"] != tail) {
        let event = reader.next().await.expect("the stream goes on");
        assert_ne!(event.event, "error", "{:?}", event.data);
        if event.event == "segment" {
            got.push(event);
        }
    }
    got
}

fn positions(events: &[Sse]) -> Vec<i64> {
    events
        .iter()
        .map(|e| e.data["seq"].as_i64().unwrap())
        .collect()
}

fn events_of(events: &[Sse]) -> Vec<serde_json::Value> {
    events.iter().map(|e| e.data["events"].clone()).collect()
}
