//! A thread over HTTP: turns posted, the thread's stream carrying each turn in its place.

use baton::crd::v1alpha1::{AgentThread, AgentThreadSpec, LeaseSpec, ScriptTurn, ThreadPhase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// A thread whose scripted agent plays `script` across its turns.
fn thread(name: &str, script: Vec<ScriptTurn>, on_busy: &str) -> AgentThread {
    let agent = scripted_run(name, script, vec![], LeaseSpec::default())
        .spec
        .agent;
    let spec: AgentThreadSpec = serde_json::from_value(json!({
        "agent": agent,
        "lease": {"durationSeconds": 4, "renewSeconds": 1, "startupSeconds": 60},
        "onBusy": on_busy,
    }))
    .unwrap();
    AgentThread::new(name, spec)
}

async fn post_turn(url: &str, token: &str, input: &str) -> (u16, Value) {
    let response = http()
        .post(url)
        .bearer_auth(token)
        .json(&json!({"input": input}))
        .send()
        .await
        .unwrap();
    let code = response.status().as_u16();
    (code, response.json().await.unwrap())
}

/// Events until the `end` of turn `name`.
async fn turn_events(stream: &mut SseReader, name: &str) -> Vec<Sse> {
    let mut out = Vec::new();
    loop {
        let e = stream.next().await.expect("the thread's stream");
        let done = e.event == "end" && e.data["run"] == name;
        out.push(e);
        if done {
            return out;
        }
    }
}

#[tokio::test]
async fn turns_posted_over_http_stream_in_their_places_on_the_threads_stream() {
    let ns = TestNamespace::new("server-thread").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let threads: Api<AgentThread> = ns.api();
    let script = vec![final_turn("answer one", 200), final_turn("answer two", 200)];
    threads
        .create(&PostParams::default(), &thread("chat", script, "Enqueue"))
        .await
        .unwrap();
    let base = format!("{url}/api/v1/namespaces/{}/threads/chat", ns.name);
    let mut stream = SseReader::open(&format!("{base}/events"), &alice, None).await;

    let (code, body) = post_turn(&format!("{base}/turns"), &alice, "first").await;
    assert_eq!(code, 201, "{body}");
    let one = body["metadata"]["name"].as_str().unwrap().to_string();
    assert!(one.starts_with("chat-"), "{one}");
    let mut worker = run_pod(&ns, &one, 1).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    let first = turn_events(&mut stream, &one).await;
    assert_eq!(
        first.last().unwrap().data["phase"],
        "Succeeded",
        "{first:?}"
    );
    let text = serde_json::to_string(&segments(&first).iter().map(|e| &e.data).collect::<Vec<_>>())
        .unwrap();
    assert!(
        text.contains("answer one") && text.contains("first"),
        "{text}"
    );

    let (code, body) = post_turn(&format!("{base}/turns"), &alice, "second").await;
    assert_eq!(code, 201, "{body}");
    let two = body["metadata"]["name"].as_str().unwrap().to_string();
    let mut worker = run_pod(&ns, &two, 1).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    let second = turn_events(&mut stream, &two).await;
    assert!(
        segments(&second)
            .iter()
            .all(|e| e.data["run"] == two.as_str())
    );
    let text = serde_json::to_string(
        &segments(&second)
            .iter()
            .map(|e| &e.data)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(text.contains("answer two"), "{text}");

    // A reconnect after turn one's last segment gets turn two, whole, and nothing of one.
    let last_of_one = segments(&first).last().unwrap().id.clone().unwrap();
    let mut again = SseReader::open(&format!("{base}/events"), &alice, Some(&last_of_one)).await;
    let replayed = turn_events(&mut again, &two).await;
    let ids = |events: &[Sse]| {
        segments(events)
            .iter()
            .map(|e| e.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&replayed), ids(&second));
    let (code, body) = http()
        .get(format!("{base}/events"))
        .bearer_auth(&alice)
        .header("Last-Event-ID", "no-such-turn:3")
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(code, 400, "{:?}", body.text().await);
    ns.cleanup().await;
}

#[tokio::test]
async fn a_busy_thread_under_reject_answers_409_and_creates_nothing() {
    let ns = TestNamespace::new("server-busy").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let threads: Api<AgentThread> = ns.api();
    let script = vec![final_turn("slow answer", 30_000)];
    threads
        .create(&PostParams::default(), &thread("strict", script, "Reject"))
        .await
        .unwrap();
    let base = format!("{url}/api/v1/namespaces/{}/threads/strict", ns.name);
    let (code, body) = post_turn(&format!("{base}/turns"), &alice, "first").await;
    assert_eq!(code, 201, "{body}");
    let one = body["metadata"]["name"].as_str().unwrap().to_string();
    let mut worker = run_pod(&ns, &one, 1).await;
    wait_until(T, "the thread busy", || async {
        threads
            .get("strict")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.phase == ThreadPhase::Busy)
    })
    .await;
    let runs: Api<baton::crd::v1alpha1::AgentRun> = ns.api();
    let before = runs.list(&Default::default()).await.unwrap().items.len();
    let (code, body) = post_turn(&format!("{base}/turns"), &alice, "second").await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("ThreadBusy")),
        "{body}"
    );
    assert!(body["message"].as_str().unwrap().contains(&one), "{body}");
    assert_eq!(
        runs.list(&Default::default()).await.unwrap().items.len(),
        before
    );
    let (code, body) = post_turn(&format!("{base}/turns"), &alice, "  ").await;
    assert_eq!(code, 400, "{body}");
    let stop = format!("{url}/api/v1/namespaces/{}/runs/{one}/stop", ns.name);
    let response = http().post(stop).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    ns.cleanup().await;
}
