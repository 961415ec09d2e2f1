//! Per-caller bounds: a ledger longer than a page is served a page at a time (`GET
//! …/segments` answers at most 100 segments; a stream replays page by page and still sends
//! every position once, in order), and a client that takes nothing is dropped instead of
//! pinning its stream, sooner while other streams wait for room.

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, Role};
use baton::fence::Fence;
use baton::ledger::SegmentStore;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::{final_turn, scripted_run};
use baton_testkit::server::*;
use kube::ResourceExt;
use kube::api::PostParams;

/// A run (no controller: it stays as created) with `count` segments of one message each, of
/// `size` bytes.
async fn run_with_segments(ns: &TestNamespace, name: &str, count: usize, size: usize) -> AgentRun {
    let run = scripted_run(
        name,
        vec![final_turn("hi", 0)],
        vec![],
        LeaseSpec::default(),
    );
    let run = ns
        .api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .unwrap();
    let events = (0..count)
        .map(|i| LedgerEvent::Message {
            role: Role::User,
            content: format!("{i} {}", "x".repeat(size)),
        })
        .collect();
    // A budget over one message and under two: each message is a segment of its own.
    SegmentStore::for_run(ns.client.clone(), &run)
        .with_budget(size * 3 / 2 + 100)
        .append(0, Fence::new(1), events)
        .await
        .unwrap();
    run
}

fn positions(page: &serde_json::Value) -> Vec<i64> {
    let page = page.as_array().expect("a JSON array");
    page.iter()
        .map(|s| s["spec"]["seq"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_long_ledger_is_served_in_pages_and_a_stream_replays_it_whole() {
    let ns = TestNamespace::new("server-pages").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let run = run_with_segments(&ns, "long", 230, 256).await;
    let segments = format!("{url}/api/v1/namespaces/{}/runs/long/segments", ns.name);
    let page = |query: &str| get_page(format!("{segments}?{query}"), alice.clone());
    assert_eq!(
        positions(&page("after=0").await),
        (1..=100).collect::<Vec<_>>()
    );
    assert_eq!(
        positions(&page("after=100&limit=5000").await),
        (101..=200).collect::<Vec<_>>(),
        "a limit over the page is the page"
    );
    assert_eq!(
        positions(&page("after=200").await),
        (201..=230).collect::<Vec<_>>()
    );
    assert!(positions(&page("after=230").await).is_empty());
    assert_eq!(positions(&page("after=7&limit=3").await), [8, 9, 10]);

    // The stream reads the ledger a page (8) at a time: all 230, each once, in order.
    let events = format!("{url}/api/v1/namespaces/{}/runs/long/events", ns.name);
    let mut stream = SseReader::open(&events, &alice, None).await;
    let uid = run.uid().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 230 {
        let event = stream.next().await.expect("the stream's next event");
        if event.event == "segment" {
            seen.push(event.id.clone().unwrap_or_default());
        }
    }
    let want: Vec<String> = (1..=230).map(|p| format!("{uid}:{p}")).collect();
    assert_eq!(seen, want);
    ns.cleanup().await;
}

async fn get_page(url: String, token: String) -> serde_json::Value {
    let (code, body) = get(&url, Some(&token)).await;
    assert_eq!(code, 200, "{url}: {body}");
    body
}

/// A client that stops reading holds its stream until the connection's buffers and the
/// stream's few events are full, then for [`with_slow_follower`] (a second here) at most: the
/// stream ends and its place is free again (one place per credential here).
#[tokio::test]
async fn a_client_that_takes_nothing_is_dropped() {
    let ns = TestNamespace::new("server-slow").await;
    let patience = std::time::Duration::from_secs(1);
    let (url, _server) =
        start_server_with(|s| s.with_slow_follower(patience).with_stream_limit(1)).await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    // 12 MB of ledger: more than the loopback connection's buffers hold.
    run_with_segments(&ns, "big", 100, 120 * 1024).await;
    let events = format!("{url}/api/v1/namespaces/{}/runs/big/events", ns.name);
    let mut stalled = SseReader::open(&events, &alice, None).await;
    stalled.next().await.expect("the first event");
    // `stalled` reads nothing more, and stays open.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while SseReader::try_open(&events, &alice, None).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "a client that read nothing for 30 s still holds its stream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    drop(stalled);
    ns.cleanup().await;
}

/// Five clients replay a 12 MB ledger at once through a server whose streams may hold 512 KiB
/// of events together: each waits its turn in the budget, none is starved, all get it all.
#[tokio::test]
async fn streams_share_one_budget_and_each_gets_its_whole_replay() {
    let ns = TestNamespace::new("server-budget").await;
    let (url, _server) = start_server_with(|s| s.with_stream_bytes(512 * 1024)).await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let run = run_with_segments(&ns, "shared", 100, 120 * 1024).await;
    let events = format!("{url}/api/v1/namespaces/{}/runs/shared/events", ns.name);
    let readers = (0..5).map(|_| {
        let (events, alice) = (events.clone(), alice.clone());
        tokio::spawn(async move {
            if let Err(e) = baton_testkit::sse::reads_in_order(events, alice, 100).await {
                panic!("every segment once, in order: {e}");
            }
        })
    });
    for reader in readers.collect::<Vec<_>>() {
        tokio::time::timeout(std::time::Duration::from_secs(120), reader)
            .await
            .expect("every reader gets its replay")
            .unwrap();
    }
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("baton_server_stream_bytes_held"),
        "{metrics}"
    );
    assert!(run.uid().is_some());
    ns.cleanup().await;
}

/// Clients that open a stream and read nothing fill the budget (their connections' buffers
/// full, their streams holding room): later clients still get their streams, and a reader its
/// whole replay, because a client that holds room and takes nothing while others wait is cut
/// within seconds (`PRESSED_PATIENCE`), not after the slow-follower patience (ten minutes
/// here), and cutting it closes its connection, freeing what hyper held queued on it. Before,
/// a stream waiting for room was never cut, a cut left the events queued in hyper held, and
/// the sixth idle client's first event never came.
#[tokio::test]
async fn idle_clients_do_not_keep_a_reader_waiting() {
    let ns = TestNamespace::new("server-idle").await;
    let patience = std::time::Duration::from_secs(600);
    let (url, _server) =
        start_server_with(|s| s.with_stream_bytes(512 * 1024).with_slow_follower(patience)).await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    run_with_segments(&ns, "big", 100, 120 * 1024).await;
    let events = format!("{url}/api/v1/namespaces/{}/runs/big/events", ns.name);
    let scenario = async {
        let mut idle = Vec::new();
        for _ in 0..8 {
            let mut stream = SseReader::open(&events, &alice, None).await;
            stream.next().await.expect("the first event");
            idle.push(stream);
        }
        let whole = baton_testkit::sse::reads_in_order(events.clone(), alice.clone(), 100).await;
        if let Err(e) = whole {
            panic!("the reader got every segment once, in order: {e}");
        }
        idle
    };
    let idle = tokio::time::timeout(std::time::Duration::from_secs(180), scenario)
        .await
        .expect(
            "idle clients and then a reader all got their streams while idle ones held the budget",
        );
    drop(idle);
    ns.cleanup().await;
}
