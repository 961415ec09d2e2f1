//! The stock clients, unchanged, against the chart's own `baton server` pods on the real node:
//! the official `openai` SDK follows a background response and the official `a2a-sdk` client a
//! thread's task through one server pod; the run's worker is killed (kill -9, from the host)
//! and that server pod deleted mid-stream; each client comes back through the Service to the
//! other replica after the last event it had (`starting_after`; the ledger-cursor extension).
//! Each sees every event exactly once against a full replay, and the answer of an
//! uninterrupted run. Then a conversation of three turns through each protocol, the turns run
//! by the real controller and kubelet.

use std::time::Duration;

use baton::crd::v1alpha1::{AgentThread, AgentThreadSpec, ScriptTurn};
use baton_testkit::clients::{SdkClient, numbers_in, response_number, task_event_number};
use baton_testkit::e2e::{Script, lease, run_with};
use baton_testkit::node::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const TURNS: usize = 8;

/// A thread whose scripted agent runs `TURNS` tool turns recording their effects as `name`'s.
async fn thread(env: &NodeEnv, name: &str, script: &Script) {
    let agent = env.scripted(name, script).spec.agent;
    let spec: AgentThreadSpec =
        serde_json::from_value(json!({"agent": agent, "lease": lease()})).unwrap();
    env.api::<AgentThread>()
        .create(&PostParams::default(), &AgentThread::new(name, spec))
        .await
        .expect("creating the thread");
}

/// A thread whose scripted agent answers each of three turns, `answer 1` to `answer 3`.
async fn chat_thread(env: &NodeEnv, name: &str) {
    let turns = (1..=3)
        .map(|i| final_turn(&format!("answer {i}")))
        .collect();
    let agent = run_with(name, turns, vec![]).spec.agent;
    let spec: AgentThreadSpec =
        serde_json::from_value(json!({"agent": agent, "lease": lease()})).unwrap();
    env.api::<AgentThread>()
        .create(&PostParams::default(), &AgentThread::new(name, spec))
        .await
        .expect("creating the thread");
}

fn final_turn(text: &str) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        tool_calls: vec![],
        delay_milliseconds: Some(100),
        usage: None,
    }
}

fn answer(name: &str) -> String {
    let turns: String = (1..=TURNS).map(|t| format!("turn {t}: working")).collect();
    format!("{turns}{name}: all {TURNS} turns done")
}

/// Kills the run's first worker from the host once its second effect is in, and deletes
/// server pod `doomed` (a grace period of 1 s) once the next attempt's fourth is.
async fn kill_then_delete(env: &NodeEnv, run: &str, tag: &str, doomed: &str) {
    let (pod, _) = env.wait_worker(run, 1).await;
    env.wait_effect(tag, 2).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    env.wait_worker(run, 2).await;
    env.wait_effect(tag, 4).await;
    // A grace period shorter than the server's own linger and drain (15 s): its streams are
    // cut mid-run, as a replica that dies is.
    Api::<Pod>::namespaced(env.client.clone(), SYSTEM_NS)
        .delete(doomed, &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
}

/// A relay to one server pod (the doomed one) and one to the Service.
async fn relays(env: &NodeEnv) -> (String, Relay, Relay) {
    let servers = servers_ready(&env.client).await;
    let doomed = &servers[0];
    let pod_ip = doomed
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let direct = Relay::start(&format!("{pod_ip}:8080"));
    let service = Relay::start(&format!("{}:80", server_cluster_ip(&env.client).await));
    (doomed.metadata.name.clone().unwrap(), direct, service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stock_clients_follow_across_a_worker_kill_and_a_server_pod_deletion() {
    let env = NodeEnv::start("protocols").await;
    let alice = person(
        &env.client,
        &env.ns,
        "alice",
        vec![
            rule(
                &["agentruns", "agentthreads"],
                &["get", "list", "watch", "create", "patch", "update"],
            ),
            rule(&["ledgersegments"], &["get", "list", "watch"]),
        ],
    )
    .await;
    let script = Script::new(TURNS, 800);
    thread(&env, "via-responses", &script).await;
    thread(&env, "via-a2a", &script).await;
    let http = reqwest::Client::new();

    // The Responses API, through the openai SDK.
    let (doomed, direct, service) = relays(&env).await;
    let base = |relay: &Relay| format!("{}/api/v1/namespaces/{}/openai/v1", relay.url(), env.ns);
    let args = [
        "node",
        &base(&direct),
        &base(&service),
        &alice,
        "thread/via-responses",
    ];
    let mut client = SdkClient::start("responses_client.py", &args);
    let id = client.line_with("created").await["created"]
        .as_str()
        .unwrap()
        .to_string();
    kill_then_delete(&env, &id, "via-responses", &doomed).await;
    let lines = client.finish().await;
    assert!(
        lines.iter().any(|l| l.get("cut").is_some()),
        "the stream was cut: {lines:?}"
    );
    let full = http
        .get(format!("{}/responses/{id}?stream=true", base(&service)))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let got: Vec<i64> = lines.iter().filter_map(|l| l["seq"].as_i64()).collect();
    assert_eq!(got, numbers_in(&full, response_number), "each event once");
    let last = lines.last().unwrap();
    assert_eq!(last["final"], "completed", "{last}");
    assert_eq!(last["text"], answer("via-responses").as_str(), "{last}");
    drop((direct, service));
    wait_only_current_pods(&env.client, SERVER, Duration::from_secs(180)).await;

    // A2A, through the a2a-sdk client.
    let (doomed, direct, service) = relays(&env).await;
    let agent = |relay: &Relay| {
        format!(
            "{}/api/v1/namespaces/{}/a2a/threads/via-a2a",
            relay.url(),
            env.ns
        )
    };
    let args = ["node", &agent(&direct), &agent(&service), &alice];
    let mut client = SdkClient::start("a2a_client.py", &args);
    let task = client.line_with("task").await["task"]
        .as_str()
        .unwrap()
        .to_string();
    kill_then_delete(&env, &task, "via-a2a", &doomed).await;
    let lines = client.finish().await;
    assert!(
        lines.iter().any(|l| l.get("cut").is_some()),
        "the stream was cut: {lines:?}"
    );
    let replay =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": task}});
    let full = http
        .post(agent(&service))
        .bearer_auth(&alice)
        .header("baton-starting-after", "0")
        .json(&replay)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let got: Vec<i64> = lines.iter().filter_map(|l| l["seq"].as_i64()).collect();
    assert_eq!(got, numbers_in(&full, task_event_number), "each event once");
    let last = lines.last().unwrap();
    assert_eq!(last["final"], "TASK_STATE_COMPLETED", "{last}");
    assert_eq!(last["text"], answer("via-a2a").as_str(), "{last}");

    // Three turns through each protocol, run by the controller and the kubelet.
    let responses = format!("{}/api/v1/namespaces/{}/openai/v1", service.url(), env.ns);
    let talk = format!(
        "{}/api/v1/namespaces/{}/a2a/threads/talk-a2a",
        service.url(),
        env.ns
    );
    chat_thread(&env, "talk-responses").await;
    chat_thread(&env, "talk-a2a").await;
    let conversations = [
        SdkClient::start(
            "responses_client.py",
            &["conversation", &responses, &alice, "talk-responses", "3"],
        ),
        SdkClient::start("a2a_client.py", &["conversation", &talk, &alice, "3"]),
    ];
    for client in conversations {
        let lines = client.finish().await;
        let turns: Vec<_> = lines.iter().filter(|l| l.get("turn").is_some()).collect();
        assert_eq!(turns.len(), 3, "{lines:?}");
        for (i, line) in turns.iter().enumerate() {
            let state = line["status"].as_str().or(line["state"].as_str());
            assert!(
                matches!(state, Some("completed" | "TASK_STATE_COMPLETED")),
                "{line}"
            );
            assert_eq!(line["text"], format!("answer {}", i + 1), "{line}");
        }
        // The Responses client lists the conversation's items too: each turn's input, then
        // its answer.
        if let Some(listed) = lines.iter().find(|l| l.get("items").is_some()) {
            let texts: Vec<&str> = listed["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| i[2].as_str())
                .collect();
            let expected: Vec<String> = (1..=3)
                .flat_map(|i| [format!("turn {i}"), format!("answer {i}")])
                .collect();
            assert_eq!(texts, expected, "{listed}");
        }
    }
    drop((direct, service));
    env.finish().await;
}
