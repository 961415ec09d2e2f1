//! A client's trace continued into a run: a turn posted with a W3C `traceparent` header is in
//! the client's trace, its root span a child of the client's span, as a real Arize Phoenix
//! (PyPI, receiving the worker's OTLP) shows it. A malformed header is ignored. The thread's
//! turns, each a trace of its own, are one session.

use baton::crd::v1alpha1::{AgentThread, AgentThreadSpec, LeaseSpec};
use baton::traces::{RunTrace, TRACEPARENT_ANNOTATION, parse_traceparent};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::phoenix::Phoenix;
use baton_testkit::common::trace_tree::attribute;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const CLIENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn post_turn(url: &str, token: &str, traceparent: &str) -> (u16, Value) {
    let response = http()
        .post(url)
        .bearer_auth(token)
        .header("traceparent", traceparent)
        .json(&json!({"input": "hello"}))
        .send()
        .await
        .unwrap();
    let code = response.status().as_u16();
    (code, response.json().await.unwrap())
}

#[tokio::test]
async fn a_turn_posted_with_a_traceparent_continues_the_clients_trace() {
    let ns = TestNamespace::new("server-traces").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let phoenix = Phoenix::start().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let agent = scripted_run(
        "t",
        vec![final_turn("traced", 0)],
        vec![],
        LeaseSpec::default(),
    )
    .spec
    .agent;
    let spec: AgentThreadSpec = serde_json::from_value(json!({"agent": agent})).unwrap();
    let threads: Api<AgentThread> = ns.api();
    threads
        .create(&PostParams::default(), &AgentThread::new("chat", spec))
        .await
        .unwrap();
    let turns = format!("{url}/api/v1/namespaces/{}/threads/chat/turns", ns.name);

    let (code, body) = post_turn(&turns, &alice, CLIENT).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        body["metadata"]["annotations"][TRACEPARENT_ANNOTATION], CLIENT,
        "{body}"
    );
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    let uid = body["metadata"]["uid"].as_str().unwrap().to_string();
    let env = phoenix.otlp_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut worker = run_pod_env(&ns, &name, 1, &env).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());

    let (client_trace, client_span) = parse_traceparent(CLIENT).unwrap();
    let trace = RunTrace::of(&ns.api().get(&name).await.unwrap());
    assert_eq!(
        trace,
        RunTrace::from_parts(&uid, Some((client_trace, client_span)))
    );
    let root = trace.root.to_string();
    let spans = phoenix
        .wait_for_span("the turn's root span", |s| {
            s["context"]["span_id"] == root.as_str()
        })
        .await;
    let shown = serde_json::to_string_pretty(&spans).unwrap();
    let run_span = spans
        .iter()
        .find(|s| s["context"]["span_id"] == root.as_str())
        .unwrap();
    assert_eq!(
        run_span["context"]["trace_id"],
        client_trace.to_string(),
        "the client's trace: {shown}"
    );
    assert_eq!(
        run_span["parent_id"],
        client_span.to_string(),
        "a child of the client's span: {shown}"
    );
    assert!(
        spans
            .iter()
            .filter(|s| s["name"] == "attempt 1")
            .all(|s| s["context"]["trace_id"] == client_trace.to_string()
                && s["parent_id"] == root.as_str()),
        "{shown}"
    );

    // A header the W3C format does not take is ignored: the next turn is a trace of its own.
    let (code, body) = post_turn(&turns, &alice, "00-not-a-trace-01").await;
    assert_eq!(code, 201, "{body}");
    let next: baton::crd::v1alpha1::AgentRun = serde_json::from_value(body).unwrap();
    assert!(
        !next.annotations().contains_key(TRACEPARENT_ANNOTATION),
        "{:?}",
        next.annotations()
    );

    // The thread's two turns are two traces, one session: each root span names the thread
    // and carries its UID as `session.id`, as Phoenix groups traces into a session.
    let mut worker = run_pod_env(&ns, &next.name_any(), 1, &env).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    let second = RunTrace::of(&ns.api().get(&next.name_any()).await.unwrap());
    assert_ne!(second.trace_id, trace.trace_id);
    let second_root = second.root.to_string();
    let spans = phoenix
        .wait_for_span("the second turn's root span", |s| {
            s["context"]["span_id"] == second_root.as_str()
        })
        .await;
    let shown = serde_json::to_string_pretty(&spans).unwrap();
    let thread_uid = threads.get("chat").await.unwrap().uid().unwrap();
    for root in [&root, &second_root] {
        let span = spans
            .iter()
            .find(|s| s["context"]["span_id"] == root.as_str())
            .unwrap();
        assert_eq!(
            attribute(span, "session.id").and_then(Value::as_str),
            Some(thread_uid.as_str()),
            "{shown}"
        );
        assert_eq!(
            attribute(span, "baton.thread").and_then(Value::as_str),
            Some("chat"),
            "{shown}"
        );
    }
}
