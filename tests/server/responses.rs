//! The stock `openai` SDK (tests/clients/responses_client.py, the clients venv's) against the
//! Responses API: a background response streamed across its worker's kill -9 and the
//! client's own reconnect with `starting_after`, each event once; a conversation of three
//! turns; a cancel.

use super::clients::{
    SdkClient, next_run, stepping_answer, stepping_script, thread, work_if_claimed,
};
use baton::crd::v1alpha1::{AgentRun, AgentThread};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::segments as ledger;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;

/// The `sequence_number` of every event a full stream of `id` from the start carries.
async fn every_number(base: &str, token: &str, id: &str) -> Vec<i64> {
    let body = http()
        .get(format!("{base}/responses/{id}?stream=true"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["sequence_number"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

#[tokio::test]
async fn the_openai_sdk_follows_a_background_response_across_a_kill_and_its_own_reconnect() {
    let ns = TestNamespace::new("server-responses").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let script = stepping_script();
    let threads: Api<AgentThread> = ns.api();
    threads
        .create(&PostParams::default(), &thread("agent", script))
        .await
        .unwrap();
    let base = format!("{url}/api/v1/namespaces/{}/openai/v1", ns.name);

    let mut client = SdkClient::start(
        "responses_client.py",
        &["stream", &base, &alice, "thread/agent", "6"],
    );
    let created = client.line_with("created").await;
    let id = created["created"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp-"), "{created}");
    assert_eq!(created["status"], "queued");
    let mut first = run_pod(&ns, &id, 1).await;
    wait_until(T, "five positions", || async {
        ledger(&ns.client, &ns.name, &id).await.len() >= 5
    })
    .await;
    first.kill9().await;
    let mut second = run_pod(&ns, &id, 2).await;
    assert_eq!(second.wait(T).await, 0, "{}", second.log_text());
    let lines = client.finish().await;

    let numbers: Vec<i64> = lines.iter().filter_map(|l| l["seq"].as_i64()).collect();
    assert!(
        lines.iter().any(|l| l.get("left_after").is_some()),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.get("back_after").is_some()),
        "{lines:?}"
    );
    assert_eq!(
        numbers,
        every_number(&base, &alice, &id).await,
        "each event once, none missing, in order, across the reconnects"
    );
    let stored = ledger(&ns.client, &ns.name, &id).await;
    assert!(
        stored.iter().any(|s| s.spec.fence.get() == 2),
        "it went on at fence 2"
    );
    let want = stepping_answer();
    let end = lines
        .iter()
        .find(|l| l["seen"] == "response.completed")
        .unwrap();
    assert_eq!(end["text"], want.as_str(), "{end}");
    let last = lines.last().unwrap();
    assert_eq!(
        (last["final"].as_str(), last["text"].as_str()),
        (Some("completed"), Some(want.as_str()))
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_conversation_of_three_turns_and_a_cancel_through_the_sdk() {
    let ns = TestNamespace::new("server-responses-conv").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let script = (1..=3)
        .map(|i| final_turn(&format!("answer {i}"), 50))
        .collect();
    let threads: Api<AgentThread> = ns.api();
    threads
        .create(&PostParams::default(), &thread("chat", script))
        .await
        .unwrap();
    let base = format!("{url}/api/v1/namespaces/{}/openai/v1", ns.name);

    // Each create waits for its turn's end: the test plays the kubelet for each turn.
    let client = SdkClient::start(
        "responses_client.py",
        &["conversation", &base, &alice, "chat", "3"],
    );
    let runs: Api<AgentRun> = ns.api();
    let mut started = Vec::new();
    while started.len() < 3 {
        let turn = next_run(&runs, &started).await;
        let mut worker = run_pod(&ns, &turn, 1).await;
        assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
        started.push(turn);
    }
    let lines = client.finish().await;
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["text"], format!("answer {}", i + 1), "{line}");
        assert_eq!(line["conversation"], "chat");
        assert_eq!(line["id"], started[i].as_str());
    }

    let mut client = SdkClient::start(
        "responses_client.py",
        &["cancel", &base, &alice, "thread/chat"],
    );
    let created = client.line_with("created").await;
    let id = created["created"].as_str().unwrap().to_string();
    client.line_with("cancel_answered").await;
    work_if_claimed(&ns, &id).await;
    let lines = client.finish().await;
    assert_eq!(lines.last().unwrap()["final"], "cancelled", "{lines:?}");
    ns.cleanup().await;
}
