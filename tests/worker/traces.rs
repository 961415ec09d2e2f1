//! A run as a trace in a real backend (Arize Phoenix from PyPI, receiving OTLP): the first
//! worker killed with kill -9 while its tool runs, the second resuming; both attempts' spans in
//! the run's one tree, read back through Phoenix's API: the killed attempt's span and its open
//! tool call's, which it never exported, written by the second with an unknown-effect event;
//! the tool handed its call's span as `TRACEPARENT`.

use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent};
use baton::fence::Fence;
use baton::traces::RunTrace;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::phoenix::Phoenix;
use baton_testkit::common::worker_proc::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Attribute `key` (dotted) of a span as Phoenix gives it: flat, or nested by its dots.
fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let attributes = &span["attributes"];
    attributes.get(key).or_else(|| {
        key.split('.')
            .try_fold(attributes, |node, part| node.get(part))
    })
}

/// The span of `ours` named `name`.
fn named<'a>(ours: &[&'a Value], name: &str, shown: &str) -> &'a Value {
    ours.iter()
        .find(|s| text(s, &["name"]) == name)
        .unwrap_or_else(|| panic!("no span {name:?}: {shown}"))
}

fn text<'a>(span: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .fold(span, |node, part| &node[part])
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_run_killed_mid_tool_is_one_trace_across_its_attempts() {
    let phoenix = Phoenix::start().await;
    let mut env = phoenix.otlp_env();
    // A quiet log must not empty the trace: `RUST_LOG` filters the log lines alone.
    env.push(("RUST_LOG", "warn".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ns = TestNamespace::new("traces").await;
    let name = "traced";
    // The tool writes down the context it was handed, then runs until it is killed.
    let handed = std::env::temp_dir().join(format!("baton-{}-traceparent", ns.name));
    let command = format!(
        "printf %s \"$TRACEPARENT\" > {}; sleep 30",
        handed.display()
    );
    let run = scripted_run(
        name,
        vec![
            shell_turn("run it", "sh", &command, 0),
            final_turn("done", 0),
        ],
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    let runs: Api<AgentRun> = ns.api();
    let uid = runs
        .create(&PostParams::default(), &run)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let pod = claim(&ns.client, &ns.name, name, 1).await;
    let mut first = spawn_worker_env(&ns.name, name, 1, &pod, &[], &env);
    wait_until(TIMEOUT, "the step's intent", || async {
        let seen = events(&segments(&ns.client, &ns.name, name).await);
        seen.iter()
            .any(|(_, e)| matches!(e, LedgerEvent::StepIntent { .. }))
    })
    .await;
    // The first model call's span ended before the step began; its export is 100 ms away.
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.kill9().await;
    let pod = claim(&ns.client, &ns.name, name, 2).await;
    let mut second = spawn_worker_env(&ns.name, name, 2, &pod, &[], &env);
    assert_eq!(second.wait(TIMEOUT).await, 0, "{}", second.log_text());

    let trace = RunTrace::from_parts(&uid, None);
    let (trace_id, root) = (trace.trace_id.to_string(), trace.root.to_string());
    let spans = phoenix
        .wait_for_span("the run's root span", |s| {
            text(s, &["context", "span_id"]) == root
        })
        .await;
    let ours: Vec<&Value> = spans
        .iter()
        .filter(|s| {
            attribute(s, "baton.run").and_then(Value::as_str) == Some(name)
                || text(s, &["context", "trace_id"]) == trace_id
        })
        .collect();
    let shown = serde_json::to_string_pretty(&ours).unwrap();
    assert!(
        ours.iter()
            .all(|s| text(s, &["context", "trace_id"]) == trace_id),
        "every span of the run is in its one trace {trace_id}: {shown}"
    );
    let run_span = named(&ours, &format!("run {name}"), &shown);
    assert_eq!(text(run_span, &["context", "span_id"]), root, "{shown}");
    assert_eq!(
        attribute(run_span, "baton.phase").and_then(Value::as_str),
        Some("Succeeded"),
        "the last attempt wrote the run's root when it ended: {shown}"
    );
    assert!(
        run_span["parent_id"].is_null(),
        "no caller's traceparent, so the root is the trace's: {shown}"
    );
    let attempt = named(&ours, "attempt 2", &shown);
    assert_eq!(
        text(attempt, &["parent_id"]),
        root,
        "a child of the run's root: {shown}"
    );
    assert_eq!(
        attribute(attempt, "baton.exit").and_then(Value::as_str),
        Some("done"),
        "{shown}"
    );
    let second_id = text(attempt, &["context", "span_id"]);
    assert_eq!(second_id, trace.attempt(Fence::new(2)).to_string());
    // The killed attempt exported its model call and nothing else: its own span and its tool
    // call's were still open. The second attempt wrote both, under the ids the first had.
    let killed = named(&ours, "attempt 1", &shown);
    let first_id = trace.attempt(Fence::new(1)).to_string();
    assert_eq!(text(killed, &["context", "span_id"]), first_id, "{shown}");
    assert_eq!(text(killed, &["parent_id"]), root, "{shown}");
    assert_eq!(
        attribute(killed, "baton.exit").and_then(Value::as_str),
        Some("killed"),
        "{shown}"
    );
    let tool = named(&ours, "execute_tool sh", &shown);
    assert_eq!(text(tool, &["parent_id"]), first_id, "{shown}");
    assert_eq!(
        text(tool, &["context", "span_id"]),
        trace.tool(Fence::new(1), 1).to_string(),
        "{shown}"
    );
    assert_eq!(
        attribute(tool, "baton.outcome").and_then(Value::as_str),
        Some("unknown"),
        "{shown}"
    );
    assert_eq!(
        std::fs::read_to_string(&handed).unwrap_or_default(),
        format!("00-{trace_id}-{}-01", text(tool, &["context", "span_id"])),
        "the tool was handed its call's span as TRACEPARENT"
    );
    let _ = std::fs::remove_file(&handed);
    let events = tool["events"].as_array().cloned().unwrap_or_default();
    assert!(
        events
            .iter()
            .any(|e| text(e, &["name"]) == "baton.unknown_effect"),
        "the open tool call ended with an unknown-effect event: {shown}"
    );
    let chats: Vec<&&Value> = ours
        .iter()
        .filter(|s| attribute(s, "gen_ai.operation.name").and_then(Value::as_str) == Some("chat"))
        .collect();
    let of_first: Vec<&&&Value> = chats
        .iter()
        .filter(|s| text(s, &["parent_id"]) == first_id)
        .collect();
    assert_eq!(
        of_first.len(),
        1,
        "the killed attempt's model call: {shown}"
    );
    assert_eq!(
        attribute(of_first[0], "gen_ai.response.finish_reasons").and_then(Value::as_str),
        Some("tool_calls"),
        "{shown}"
    );
    assert!(
        chats
            .iter()
            .all(|s| [first_id.as_str(), second_id].contains(&text(s, &["parent_id"]))),
        "every model call under the attempt that made it: no orphan in the tree: {shown}"
    );
    assert!(
        chats.iter().any(|s| text(s, &["parent_id"]) == second_id),
        "the resumed attempt's model call, under its attempt: {shown}"
    );
    // The model calls' tokens, summed over both attempts, are the run's.
    let tokens = |key: &str| -> i64 {
        chats
            .iter()
            .filter_map(|s| attribute(s, key).and_then(Value::as_i64))
            .sum()
    };
    let usage = runs
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .usage
        .unwrap_or_default();
    assert_eq!(
        (
            tokens("gen_ai.usage.input_tokens"),
            tokens("gen_ai.usage.output_tokens")
        ),
        (usage.input_tokens, usage.output_tokens),
        "{shown}"
    );
}
