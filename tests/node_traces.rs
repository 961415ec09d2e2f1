//! A run as a trace on the real node: the chart's `tracing` values point the worker pods at
//! Arize Phoenix (PyPI), run by the test inside the node's network namespace. A run created
//! with a caller's `traceparent` has its worker killed with kill -9 while its tool runs; once
//! it succeeded in a new pod, Phoenix's API gives back the tree (both attempts in the caller's
//! trace, the dead attempt's open tool call ended with an unknown-effect event, the tokens
//! the run's, the controller's two claims), a client's stream of the run through the chart's
//! `baton server` is a span of the run, and Phoenix's own UI shows it in Chromium (a screenshot is kept in
//! target/trace-screenshots).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use baton::fence::Fence;
use baton::traces::{RunTrace, TRACEPARENT_ANNOTATION};
use baton_testkit::common::trace_tree::{RunSpans, attribute, text};
use baton_testkit::e2e::Script;
use baton_testkit::node::*;
use baton_testkit::rbac::{person, rule};
use baton_testkit::sse::SseReader;
use kube::ResourceExt;

/// The caller's span the run continues.
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_run_killed_mid_tool_is_one_trace_in_phoenix() {
    let env = NodeEnv::start("traces").await;
    let phoenix = NodePhoenix::start().await;
    let traced = Traced::switch(&env.client, &phoenix.endpoint).await;
    let name = "traced";
    let mut run = env.scripted(name, &Script::new(1, 15_000));
    run.annotations_mut()
        .insert(TRACEPARENT_ANNOTATION.into(), CALLER.into());
    env.create(&run).await;
    let (pod, _) = env.wait_worker(name, 1).await;
    env.wait_effect(name, 1).await;
    // The pod's exporter sends what ended every 5 s (the SDK's default): the model call,
    // ended before the tool began, has left the pod before it dies.
    tokio::time::sleep(Duration::from_secs(7)).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let status = env.wait_succeeded(name).await;
    assert_eq!(status.failed_attempts, 1, "{status:#?}");

    let trace = RunTrace::of(&env.runs().get(name).await.unwrap());
    assert_eq!(
        trace.trace_id.to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    let root = trace.root.to_string();
    phoenix
        .phoenix
        .wait_for_span("the run's root span", |s| {
            text(s, &["context", "span_id"]) == root
        })
        .await;
    // The controller exports within 5 s of the takeover's claim, maybe after the run's end.
    let takeover = trace.claim(Fence::new(2)).to_string();
    let spans = phoenix
        .phoenix
        .wait_for_span("the takeover's claim", |s| {
            text(s, &["context", "span_id"]) == takeover
        })
        .await;
    let tree = RunSpans::of(&spans, name, &trace);
    tree.check_killed_mid_tool(name, "sh", &trace, &status.usage.unwrap_or_default());
    // The controller's claims, each under the root at the id every process computes: the
    // first, and the takeover after the kill.
    for (fence, takeover) in [(1, false), (2, true)] {
        let claim = tree.named(&format!("claim {fence}"));
        let shown = &tree.shown;
        assert_eq!(
            text(claim, &["context", "span_id"]),
            trace.claim(Fence::new(fence)).to_string(),
            "{shown}"
        );
        assert_eq!(text(claim, &["parent_id"]), root, "{shown}");
        assert_eq!(
            attribute(claim, "baton.takeover"),
            Some(&serde_json::Value::Bool(takeover)),
            "{shown}"
        );
    }
    followed_through_the_server(&env, &phoenix, &trace, name).await;
    shown_in_phoenixs_ui(&phoenix, &trace, name);
    traced.switch_back(&env.client).await;
    env.finish().await;
}

/// A client follows the ended run through the chart's `baton server` (to its `end` event):
/// the server writes the stream's span under the run's root.
async fn followed_through_the_server(
    env: &NodeEnv,
    phoenix: &NodePhoenix,
    trace: &RunTrace,
    name: &str,
) {
    let reads = vec![
        rule(&["agentruns"], &["get", "list", "watch"]),
        rule(&["ledgersegments"], &["get", "list", "watch"]),
    ];
    let alice = person(&env.client, &env.ns, "alice", reads).await;
    let service = Relay::start(&format!("{}:80", server_cluster_ip(&env.client).await));
    let url = format!(
        "{}/api/v1/namespaces/{}/runs/{name}/events",
        service.url(),
        env.ns
    );
    let mut reader = SseReader::open(&url, &alice, None).await;
    while let Some(event) = reader.next().await {
        if event.event == "end" {
            break;
        }
    }
    let root = trace.root.to_string();
    let spans = phoenix
        .phoenix
        .wait_for_span("the stream's span", |s| {
            text(s, &["name"]) == "stream" && text(s, &["parent_id"]) == root
        })
        .await;
    let stream = spans
        .iter()
        .find(|s| text(s, &["name"]) == "stream" && text(s, &["parent_id"]) == root)
        .unwrap();
    assert_eq!(
        text(stream, &["context", "trace_id"]),
        trace.trace_id.to_string()
    );
    assert_eq!(
        attribute(stream, "baton.ended").and_then(|v| v.as_str()),
        Some("run"),
        "{stream}"
    );
}

/// tests/browser/phoenix.mjs: the trace's page in Phoenix's UI shows the run's spans.
fn shown_in_phoenixs_ui(phoenix: &NodePhoenix, trace: &RunTrace, name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shots = root.join("target/trace-screenshots");
    std::fs::create_dir_all(&shots).expect("a directory for the screenshot");
    let out = Command::new("node")
        .arg(root.join("tests/browser/phoenix.mjs"))
        .current_dir(root.join("tests/browser"))
        .env("PHOENIX_URL", &phoenix.phoenix.url)
        .env("TRACE_ID", trace.trace_id.to_string())
        .env("ROOT_SPAN", format!("run {name}"))
        .env("TOOL_SPAN", "execute_tool sh")
        .env("SHOTS", &shots)
        .output()
        .expect("running node tests/browser/phoenix.mjs (hack/setup.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{said}");
    assert!(out.status.success(), "the browser test failed:\n{said}");
    assert!(
        shots.join("trace.png").exists(),
        "no screenshot of the trace"
    );
}
