//! A run as a trace in a real backend (Arize Phoenix from PyPI, receiving OTLP): the first
//! worker killed with kill -9 while its tool runs, the second resuming; both attempts' spans in
//! the run's one tree, read back through Phoenix's API: the killed attempt's span and its open
//! tool call's, which it never exported, written by the second with an unknown-effect event;
//! the tool handed its call's span as `TRACEPARENT`.

use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent};
use baton::traces::RunTrace;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::phoenix::Phoenix;
use baton_testkit::common::trace_tree::{RunSpans, text};
use baton_testkit::common::worker_proc::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

const TIMEOUT: Duration = Duration::from_secs(60);

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
    let root = trace.root.to_string();
    let spans = phoenix
        .wait_for_span("the run's root span", |s| {
            text(s, &["context", "span_id"]) == root
        })
        .await;
    let usage = runs.get(name).await.unwrap().status.unwrap().usage;
    let tree = RunSpans::of(&spans, name, &trace);
    let tool = tree.check_killed_mid_tool(name, "sh", &trace, &usage.unwrap_or_default());
    assert_eq!(
        std::fs::read_to_string(&handed).unwrap_or_default(),
        format!(
            "00-{}-{}-01",
            trace.trace_id,
            text(tool, &["context", "span_id"])
        ),
        "the tool was handed its call's span as TRACEPARENT"
    );
    let _ = std::fs::remove_file(&handed);
}
