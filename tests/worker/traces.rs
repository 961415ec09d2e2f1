//! A run as a trace in a real backend (Arize Phoenix from PyPI, receiving OTLP): the first
//! worker killed with kill -9 while its tool runs, the second resuming; both attempts' spans in
//! the run's one tree, read back through Phoenix's API: the killed attempt's span and its open
//! tool call's, which it never exported, written by the second with an unknown-effect event;
//! the tool handed its call's span as `TRACEPARENT`. A call's wait for an approval, between
//! two attempts, is a span from its request to its decision. An own agent's model calls,
//! through the worker's gateway, are spans of its attempt. What was said is on the spans only
//! when asked for, scrubbed of the worker's secrets.

use std::str::FromStr;
use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, Phase, Provider};
use baton::fence::Fence;
use baton::traces::RunTrace;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, claim_because, events, segments};
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::own_agent::{agent_container, finish_attempt};
use baton_testkit::common::phoenix::Phoenix;
use baton_testkit::common::trace_tree::{RunSpans, attribute, text};
use baton_testkit::common::worker_proc::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::Value;

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

#[tokio::test]
async fn a_calls_wait_for_approval_is_a_span_from_its_request_to_its_decision() {
    let phoenix = Phoenix::start().await;
    let env = phoenix.otlp_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ns = TestNamespace::new("traces-wait").await;
    let counter = counter_file("traces-wait");
    crate::approval::gated_run(&ns, &counter, 0).await;
    let runs: Api<AgentRun> = ns.api();
    for (fence, reason) in [(1, None), (2, Some("ApprovalDecided"))] {
        if fence == 2 {
            crate::approval::approve(&ns, Some(1))
                .await
                .expect("approving step 1");
        }
        let pod = claim_because(&ns.client, &ns.name, "gated", fence, reason).await;
        let mut worker = spawn_worker_env(&ns.name, "gated", fence, &pod, &[], &env);
        assert_eq!(worker.wait(TIMEOUT).await, 0, "{}", worker.log_text());
    }
    let run = runs.get("gated").await.unwrap();
    let st = run.status.clone().unwrap();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    let requested = events(&segments(&ns.client, &ns.name, "gated").await)
        .into_iter()
        .find_map(|(_, e)| match e {
            LedgerEvent::ApprovalRequested { requested_at, .. } => Some(requested_at),
            _ => None,
        })
        .expect("the ledger's approvalRequested");

    let trace = RunTrace::of(&run);
    let wait = trace.approval_wait(1).to_string();
    let spans = phoenix
        .wait_for_span("the wait's span", |s| {
            text(s, &["context", "span_id"]) == wait
        })
        .await;
    let tree = RunSpans::of(&spans, "gated", &trace);
    let shown = &tree.shown;
    let span = tree.named("wait approval");
    assert_eq!(text(span, &["context", "span_id"]), wait, "{shown}");
    assert_eq!(
        text(span, &["parent_id"]),
        trace.root.to_string(),
        "between the attempts, under the run's root: {shown}"
    );
    assert_eq!(
        attribute(span, "baton.decision").and_then(|v| v.as_str()),
        Some("approved"),
        "{shown}"
    );
    assert_eq!(
        attribute(span, "baton.step").and_then(|v| v.as_i64()),
        Some(1),
        "{shown}"
    );
    // It starts when the call asked (the ledger's time, to the second as the API keeps it).
    let start = k8s_openapi::jiff::Timestamp::from_str(text(span, &["start_time"]))
        .unwrap_or_else(|e| panic!("start_time: {e}: {shown}"));
    let asked = requested.0;
    assert!(
        start.duration_since(asked).as_secs().abs() <= 1,
        "the wait starts at the request ({asked}), not at {start}: {shown}"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn an_own_agents_model_calls_through_the_gateway_are_spans_of_its_attempt() {
    let phoenix = Phoenix::start().await;
    let proxy = LiteLlm::start().await;
    let mut env = phoenix.otlp_env();
    env.push(("BATON_MODEL_API_KEY", litellm::KEY.into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ns = TestNamespace::new("traces-own-agent").await;
    let mut run = scripted_run("own", vec![], vec![], LeaseSpec::default());
    run.spec.input = "count the steps".into();
    let agent = run.spec.agent_mut();
    agent.model = proxy.model(Provider::Openai, "mock-gpt");
    agent.container = Some(agent_container(
        "chat_agent.py",
        &[("AGENT_CALLS", "3"), ("AGENT_PAUSE_MS", "0")],
    ));
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    let ended = finish_attempt(&ns, "own", 1, &env).await;
    let st = ended.status.clone().unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");

    let trace = RunTrace::of(&ended);
    let root = trace.root.to_string();
    let spans = phoenix
        .wait_for_span("the run's root span", |s| {
            text(s, &["context", "span_id"]) == root
        })
        .await;
    let tree = RunSpans::of(&spans, "own", &trace);
    let shown = &tree.shown;
    let attempt = trace.attempt(Fence::new(1)).to_string();
    let chats = tree.chats();
    let mut places: Vec<i64> = chats
        .iter()
        .map(|s| {
            assert_eq!(
                text(s, &["parent_id"]),
                attempt,
                "under its attempt: {shown}"
            );
            assert_eq!(
                attribute(s, "gen_ai.request.model").and_then(Value::as_str),
                Some("mock-gpt"),
                "the model the agent asked for: {shown}"
            );
            attribute(s, "baton.gateway.call")
                .and_then(Value::as_i64)
                .unwrap_or_else(|| panic!("a gateway call's place: {shown}"))
        })
        .collect();
    places.sort();
    assert_eq!(places, [1, 2, 3], "one span per call: {shown}");
    let usage = st.usage.unwrap_or_default();
    tree.check_tokens(&usage, "the gateway calls' tokens");
    assert!(
        usage.input_tokens > 0,
        "the mock says what it used: {usage:?}"
    );
}

#[tokio::test]
async fn content_asked_for_is_on_the_spans_without_the_workers_secrets() {
    const KEY: &str = "sk-baton-trace-secret-4711";
    let phoenix = Phoenix::start().await;
    let mut env = phoenix.otlp_env();
    env.push(("BATON_TRACE_CONTENT", "true".into()));
    env.push(("BATON_MODEL_API_KEY", KEY.into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ns = TestNamespace::new("traces-content").await;
    // The tool is asked to say the key, and says it: neither reaches a span.
    let script = vec![
        shell_turn(
            "listing",
            "sh",
            &format!("echo the key is {KEY}; echo listed"),
            0,
        ),
        final_turn("all listed", 0),
    ];
    let run = scripted_run(
        "said",
        script,
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    let pod = claim(&ns.client, &ns.name, "said", 1).await;
    let mut worker = spawn_worker_env(&ns.name, "said", 1, &pod, &[], &env);
    assert_eq!(worker.wait(TIMEOUT).await, 0, "{}", worker.log_text());

    let trace = RunTrace::of(&runs.get("said").await.unwrap());
    let root = trace.root.to_string();
    let spans = phoenix
        .wait_for_span("the run's root span", |s| {
            text(s, &["context", "span_id"]) == root
        })
        .await;
    let tree = RunSpans::of(&spans, "said", &trace);
    let shown = &tree.shown;
    assert!(!shown.contains(KEY), "a span holds the model key: {shown}");
    let said = |span: &Value, key: &str| -> String {
        attribute(span, key)
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .unwrap_or_else(|| panic!("no {key}: {shown}"))
    };
    let chats = tree.chats();
    assert_eq!(chats.len(), 2, "{shown}");
    let inputs: Vec<String> = chats
        .iter()
        .map(|c| said(c, "gen_ai.input.messages"))
        .collect();
    assert!(inputs.iter().all(|i| i.contains("do the thing")), "{shown}");
    let second = inputs
        .iter()
        .find(|i| i.contains("tool_call_response"))
        .expect(shown);
    assert!(
        second.contains("listed") && second.contains("[REDACTED]"),
        "{second}"
    );
    let outputs: Vec<String> = chats
        .iter()
        .map(|c| said(c, "gen_ai.output.messages"))
        .collect();
    assert!(outputs.iter().any(|o| o.contains("all listed")), "{shown}");
    let tool = tree.named("execute_tool sh");
    assert!(
        said(tool, "gen_ai.tool.call.arguments").contains("echo the key is [REDACTED]"),
        "{shown}"
    );
    let result = said(tool, "gen_ai.tool.call.result");
    assert!(
        result.contains("listed") && result.contains("[REDACTED]"),
        "{result}"
    );
}
