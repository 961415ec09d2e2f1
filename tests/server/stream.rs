//! A run's stream against its ledger: the worker killed -9 mid-run, the second drained
//! (SIGTERM, a handoff) and a third finishing at fence 3, while clients follow, leave and
//! come back.

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerSegment, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::segments as ledger;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

const RUN: &str = "streamed";

fn script() -> Vec<baton::crd::v1alpha1::ScriptTurn> {
    let mut turns: Vec<_> = (1..=12)
        .map(|i| shell_turn(&format!("step {i}"), "sh", &format!("echo out-{i}"), 400))
        .collect();
    turns.push(final_turn("all done", 100));
    turns
}

/// The stream's segment events equal the ledger: every position once, in order, each event
/// as stored, each id `<uid>:<position>`.
fn assert_equals_ledger(got: &[&Sse], ledger: &[LedgerSegment], uid: &str, from: i64) {
    let want: Vec<&LedgerSegment> = ledger.iter().filter(|s| s.spec.seq > from).collect();
    let ids: Vec<String> = got
        .iter()
        .map(|e| e.id.clone().unwrap_or_default())
        .collect();
    let want_ids: Vec<String> = want
        .iter()
        .map(|s| format!("{uid}:{}", s.spec.seq))
        .collect();
    assert_eq!(ids, want_ids, "after position {from}");
    for (event, segment) in got.iter().zip(&want) {
        assert_eq!(event.data["seq"], segment.spec.seq);
        assert_eq!(event.data["run"], RUN);
        assert_eq!(
            event.data["events"],
            serde_json::to_value(&segment.spec.events).unwrap(),
            "position {}",
            segment.spec.seq
        );
    }
}

#[tokio::test]
async fn a_stream_survives_a_worker_kill_and_a_handoff_and_every_reconnect_gets_exactly_the_rest() {
    let ns = TestNamespace::new("server-stream").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let lease = LeaseSpec {
        duration_seconds: 4,
        renew_seconds: 1,
        startup_seconds: 60,
    };
    let run = scripted_run(RUN, script(), vec![shell_tool("sh", false)], lease);
    let runs: Api<AgentRun> = ns.api();
    let created = runs.create(&PostParams::default(), &run).await.unwrap();
    let uid = created.uid().unwrap();
    let events_url = format!("{url}/api/v1/namespaces/{}/runs/{RUN}/events", ns.name);

    let mut whole = SseReader::open(&events_url, &alice, None).await;
    let mut leaver = SseReader::open(&events_url, &alice, None).await;
    let mut others = Vec::new();
    for _ in 0..4 {
        others.push(SseReader::open(&events_url, &alice, None).await);
    }
    let mut first = run_pod(&ns, RUN, 1).await;

    // A client leaves after two segments, while the first worker runs.
    let mut left_with = Vec::new();
    while left_with.len() < 2 {
        let e = leaver.next().await.expect("the leaver's stream");
        if e.event == "segment" {
            left_with.push(e);
        }
    }
    drop(leaver);

    // Six streams of one caller in one namespace: one hub, two API watches.
    let metrics = format!("{url}/metrics");
    wait_until(T, "one hub holding two watches", || async {
        let text = http()
            .get(&metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.contains("baton_server_hubs 1\n") && text.contains("baton_server_api_watches 2\n")
    })
    .await;

    wait_until(T, "four segments", || async {
        ledger(&ns.client, &ns.name, RUN).await.len() >= 4
    })
    .await;
    first.kill9().await;
    // The second worker is drained mid-run (SIGTERM: a handoff), and a third finishes.
    let second = run_pod(&ns, RUN, 2).await;
    let before = ledger(&ns.client, &ns.name, RUN).await.len();
    wait_until(T, "the second worker's segments", || async {
        ledger(&ns.client, &ns.name, RUN).await.len() >= before + 3
    })
    .await;
    second.signal(libc::SIGTERM);
    let mut third = run_pod(&ns, RUN, 3).await;
    assert_eq!(third.wait(T).await, 0, "{}", third.log_text());
    wait_until(T, "Succeeded", || async {
        runs.get(RUN)
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.phase == Phase::Succeeded)
    })
    .await;

    let stored = ledger(&ns.client, &ns.name, RUN).await;
    let tail = stored.last().unwrap().spec.seq;
    for fence in [2, 3] {
        assert!(
            stored.iter().any(|s| s.spec.fence.get() == fence),
            "the run went on at fence {fence}"
        );
    }

    let streamed = whole.until_end().await;
    assert_equals_ledger(&segments(&streamed), &stored, &uid, 0);
    let end = streamed.last().unwrap();
    assert_eq!(end.event, "end");
    assert_eq!(end.data["phase"], "Succeeded");
    assert!(
        streamed.iter().any(|e| e.event == "status"),
        "the run's status is streamed"
    );
    for mut other in others {
        assert_equals_ledger(&segments(&other.until_end().await), &stored, &uid, 0);
    }

    // The leaver comes back with its last id: the rest, nothing twice.
    let last = left_with.last().unwrap().id.clone().unwrap();
    let mut back = SseReader::open(&events_url, &alice, Some(&last)).await;
    let rest = back.until_end().await;
    let mut joined: Vec<&Sse> = left_with.iter().collect();
    joined.extend(segments(&rest));
    assert_equals_ledger(&joined, &stored, &uid, 0);

    // A reconnect at every position gets exactly the positions after it, then the end.
    for k in 0..=tail {
        let id = format!("{uid}:{k}");
        let mut again = SseReader::open(&events_url, &alice, Some(&id)).await;
        let got = again.until_end().await;
        assert_equals_ledger(&segments(&got), &stored, &uid, k);
        assert_eq!(got.last().unwrap().event, "end", "after {k}");
    }
    // `?after=` is the same for curl; an id of another run starts this one from the start.
    let mut by_query = SseReader::open(&format!("{events_url}?after=3"), &alice, None).await;
    assert_equals_ledger(&segments(&by_query.until_end().await), &stored, &uid, 3);
    let mut stale = SseReader::open(&events_url, &alice, Some("another-uid:5")).await;
    assert_equals_ledger(&segments(&stale.until_end().await), &stored, &uid, 0);
    ns.cleanup().await;
}
