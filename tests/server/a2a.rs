//! The official `a2a-sdk` client (tests/clients/a2a_client.py, the clients venv's) against a
//! thread's A2A agent: a task streamed across its worker's kill -9 and the client's own
//! resubscribe after the last event it had (the ledger-cursor extension), each event once; a
//! conversation of three turns; a cancel; a resubscribe's first event, the task as it stands.

use baton::crd::v1alpha1::{AgentRun, AgentThread};
use baton_testkit::clients::{numbers_in, task_event_number};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::segments as ledger;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::clients::{
    SdkClient, next_run, slow_thread, stepping_answer, stepping_script, thread, work_if_claimed,
};

/// The number of every event a `tasks/resubscribe` from before the first event carries.
async fn every_number(agent: &str, token: &str, task: &str) -> Vec<i64> {
    let request =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": task}});
    let body = http()
        .post(agent)
        .bearer_auth(token)
        .header("baton-starting-after", "0")
        .json(&request)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    numbers_in(&body, task_event_number)
}

#[tokio::test]
async fn the_a2a_sdk_follows_a_task_across_a_kill_and_its_own_resubscribe() {
    let ns = TestNamespace::new("server-a2a").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let script = stepping_script();
    let threads: Api<AgentThread> = ns.api();
    threads
        .create(&PostParams::default(), &thread("agent", script))
        .await
        .unwrap();
    let agent = format!("{url}/api/v1/namespaces/{}/a2a/threads/agent", ns.name);

    let mut client = SdkClient::start("a2a_client.py", &["stream", &agent, &alice, "6"]);
    let first = client.line_with("task").await;
    let task = first["task"].as_str().unwrap().to_string();
    assert_eq!(first["context"], "agent", "{first}");
    assert!(task.starts_with("agent-"), "a turn of the thread: {first}");
    let mut worker = run_pod(&ns, &task, 1).await;
    wait_until(T, "five positions", || async {
        ledger(&ns.client, &ns.name, &task).await.len() >= 5
    })
    .await;
    worker.kill9().await;
    let mut second = run_pod(&ns, &task, 2).await;
    assert_eq!(second.wait(T).await, 0, "{}", second.log_text());
    let lines = client.finish().await;
    assert!(
        lines.iter().any(|l| l.get("back_after").is_some()),
        "{lines:?}"
    );
    let numbers: Vec<i64> = lines.iter().filter_map(|l| l["seq"].as_i64()).collect();
    assert_eq!(
        numbers,
        every_number(&agent, &alice, &task).await,
        "each event once, none missing, in order, across the resubscribe"
    );
    let stored = ledger(&ns.client, &ns.name, &task).await;
    assert!(
        stored.iter().any(|s| s.spec.fence.get() == 2),
        "it went on at fence 2"
    );
    let want = stepping_answer();
    let last = lines.last().unwrap();
    assert_eq!(last["final"], "TASK_STATE_COMPLETED", "{last}");
    assert_eq!(last["text"], want.as_str(), "{last}");

    // A resubscribe without a cursor: first the task as it stands (ended here), nothing more.
    let again = SdkClient::start("a2a_client.py", &["resubscribe", &agent, &alice, &task]);
    let lines = again.finish().await;
    assert_eq!(lines[0]["seen"], "task", "{lines:?}");
    assert_eq!(lines[0]["state"], "TASK_STATE_COMPLETED", "{lines:?}");
    ns.cleanup().await;
}

#[tokio::test]
async fn a_conversation_of_three_turns_and_a_cancel_through_the_a2a_sdk() {
    let ns = TestNamespace::new("server-a2a-conv").await;
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
    let agent = format!("{url}/api/v1/namespaces/{}/a2a/threads/chat", ns.name);

    let client = SdkClient::start("a2a_client.py", &["conversation", &agent, &alice, "3"]);
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
        assert_eq!(line["state"], "TASK_STATE_COMPLETED", "{line}");
        assert_eq!(line["text"], format!("answer {}", i + 1), "{line}");
        assert_eq!(line["context"], "chat");
        assert_eq!(line["task"], started[i].as_str());
    }

    // The cancel's agent answers slowly: a worker that starts before the stop is stopped
    // mid-answer, so the task ends canceled whichever comes first.
    threads
        .create(&PostParams::default(), &slow_thread())
        .await
        .unwrap();
    let slow = agent.replace("/threads/chat", "/threads/slow");
    let mut client = SdkClient::start("a2a_client.py", &["cancel", &slow, &alice]);
    let created = client.line_with("created").await;
    let task = created["created"].as_str().unwrap().to_string();
    client.line_with("cancel_answered").await;
    work_if_claimed(&ns, &task).await;
    let lines = client.finish().await;
    assert_eq!(
        lines.last().unwrap()["final"],
        "TASK_STATE_CANCELED",
        "{lines:?}"
    );
    ns.cleanup().await;
}
