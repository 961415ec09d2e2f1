//! The stock `openai` SDK (tests/clients/responses_client.py, the clients venv's) against the
//! Responses API: a background response streamed across its worker's kill -9 and the
//! client's own reconnect with `starting_after`, each event once; a conversation of three
//! turns and its items; a conversation made from a thread, its turn and its deletion; a
//! cancel.

use super::clients::{
    SdkClient, next_run, slow_thread, stepping_answer, stepping_script, thread, work_if_claimed,
};
use baton::crd::v1alpha1::{AgentRun, AgentThread};
use baton_testkit::clients::{numbers_in, response_number};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::segments as ledger;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

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
    numbers_in(&body, response_number)
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
    let mut rules = run_user_rules();
    rules.push(rule(&["agentthreads"], &["delete"]));
    let alice = person(&ns, "alice", rules).await;
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
    for (i, line) in lines[..3].iter().enumerate() {
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["text"], format!("answer {}", i + 1), "{line}");
        assert_eq!(line["conversation"], "chat");
        assert_eq!(line["id"], started[i].as_str());
    }
    // The conversation's items, two a page: each turn's input, then its answer.
    let listed = &lines[3];
    assert_eq!(
        (&listed["object"], &listed["conversation_id"]),
        (&json!("conversation"), &json!("chat"))
    );
    let items: Vec<(String, String)> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i[1].as_str().unwrap().to_string(),
                i[2].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = (1..=3)
        .flat_map(|i| {
            [
                ("user".into(), format!("turn {i}")),
                ("assistant".into(), format!("answer {i}")),
            ]
        })
        .collect();
    assert_eq!(items, expected, "{listed}");
    assert_eq!(
        listed["items"][1][3],
        format!("{}:msg_3_0", started[0]),
        "{listed}"
    );

    conversation_from_a_thread(&ns, &base, &alice, &mut started).await;

    // The cancel's agent answers slowly: a worker that starts before the stop is stopped
    // mid-answer, so the response ends cancelled whichever comes first.
    threads
        .create(&PostParams::default(), &slow_thread())
        .await
        .unwrap();
    let mut client = SdkClient::start(
        "responses_client.py",
        &["cancel", &base, &alice, "thread/slow"],
    );
    let created = client.line_with("created").await;
    let id = created["created"].as_str().unwrap().to_string();
    client.line_with("cancel_answered").await;
    work_if_claimed(&ns, &id).await;
    let lines = client.finish().await;
    assert_eq!(lines.last().unwrap()["final"], "cancelled", "{lines:?}");
    ns.cleanup().await;
}

/// A conversation created with thread `chat`'s agent: its turn, its input items, its items,
/// and its deletion (refused to a caller who may not delete threads). A conversation named
/// wrong, or made without an agent, is refused naming why.
async fn conversation_from_a_thread(
    ns: &TestNamespace,
    base: &str,
    alice: &str,
    started: &mut Vec<String>,
) {
    let runs: Api<AgentRun> = ns.api();
    let mut client = SdkClient::start("responses_client.py", &["created", base, alice, "chat"]);
    let created = client.line_with("created").await;
    let id = created["created"].as_str().unwrap().to_string();
    assert!(id.starts_with("conv-"), "{created}");
    assert_eq!(
        created["metadata"],
        json!({"agent": "thread/chat", "topic": "bed"})
    );
    let thread = ns.api::<AgentThread>().get(&id).await.unwrap();
    let chat = ns.api::<AgentThread>().get("chat").await.unwrap();
    assert_eq!(
        serde_json::to_value(&thread.spec).unwrap(),
        serde_json::to_value(&chat.spec).unwrap()
    );
    let turn = next_run(&runs, started).await;
    let mut worker = run_pod(ns, &turn, 1).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    started.push(turn.clone());
    let lines = client.finish().await;
    let said = |key: &str| lines.iter().find(|l| l.get(key).is_some()).unwrap().clone();
    assert_eq!(
        (&said("turn")["turn"], &said("turn")["text"]),
        (&json!(turn), &json!("answer 1"))
    );
    assert_eq!(said("inputs")["inputs"], json!(["hello"]));
    let items = said("items")["items"].clone();
    assert_eq!(items.as_array().unwrap().len(), 2, "{items}");
    assert_eq!(said("deleted")["deleted"], true);
    let gone = || async {
        ns.api::<AgentThread>()
            .get_opt(&id)
            .await
            .unwrap()
            .is_none()
    };
    wait_until(T, "the conversation's thread deleted", gone).await;

    let bob = person(ns, "bob", run_user_rules()).await;
    let conversations = format!("{base}/conversations");
    let (code, body) = post(&conversations, &bob, json!({"metadata": {"topic": "x"}})).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("metadata.agent: required"),
        "{body}"
    );
    let answer = http()
        .delete(format!("{conversations}/chat"))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403, "bob may not delete threads");
    let (code, body) = get(&format!("{conversations}/nothing"), Some(&bob)).await;
    assert_eq!(
        (code, &body["error"]["type"]),
        (404, &json!("not_found_error")),
        "{body}"
    );
}
