//! A run that brings its own agent, with a real worker, a real executor for the agent
//! container, an agent written with the stock `openai` SDK (tests/agents/chat_agent.py) and
//! the LiteLLM proxy counting the calls that reach the model (tests/litellm/counted.yaml):
//! killed (kill -9) between two calls, the next attempt replays the recorded calls and the
//! model answers each call once; an agent whose prompt holds the time fails `ResumeDiverged`,
//! or goes on under `Continue`; a non-zero exit fails the run with its stderr; the gateway
//! answers nobody but the agent of its attempt.

use std::path::PathBuf;
use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, OnDivergence, Phase, Provider};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{events, segments};
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::own_agent::{
    agent_container, assert_diverged_at_the_prompt, counted, finish_attempt, start_attempt,
};
use baton_testkit::common::worker_proc::*;
use kube::Api;
use kube::api::PostParams;

/// A run of `tests/agents/chat_agent.py` against the proxy, with `env` for the agent.
fn agent_run(name: &str, proxy: &LiteLlm, env: &[(&str, &str)]) -> AgentRun {
    let mut run = scripted_run(name, vec![], vec![], LeaseSpec::default());
    run.spec.input = "count the steps".into();
    let agent = run.spec.agent_mut();
    agent.model = proxy.model(Provider::Openai, "mock-gpt");
    agent.container = Some(agent_container("chat_agent.py", env));
    run
}

/// The places of the run's recorded model calls, in ledger order.
async fn recorded_calls(ns: &TestNamespace, name: &str) -> Vec<i64> {
    let listed = segments(&ns.client, &ns.name, name).await;
    let calls = events(&listed).into_iter().filter_map(|(_, e)| match e {
        LedgerEvent::GatewayCall { call, .. } => Some(call),
        _ => None,
    });
    calls.collect()
}

fn calls_file(ns: &TestNamespace) -> PathBuf {
    std::env::temp_dir().join(format!("baton-{}-model-calls.jsonl", ns.name))
}

/// The worker's own key for the proxy (the agent never holds it).
const KEY: [(&str, &str); 1] = [("BATON_MODEL_API_KEY", litellm::KEY)];

/// Starts attempt `fence` of `name`: its worker, with the agent container's executor given the
/// container's `env` as the pod would.
async fn start(ns: &TestNamespace, name: &str, fence: i64) -> WorkerProc {
    start_attempt(ns, name, fence, &KEY).await
}

/// Runs attempt `fence` of `name` until `calls` model calls are recorded, then kills its
/// worker (kill -9): the agent is between two calls (each is followed by a pause).
async fn kill_after_calls(ns: &TestNamespace, name: &str, fence: i64, calls: usize) {
    let mut worker = start(ns, name, fence).await;
    wait_until(
        Duration::from_secs(120),
        "the agent's first calls recorded",
        || async { recorded_calls(ns, name).await.len() >= calls },
    )
    .await;
    worker.kill9().await;
}

/// Attempt `fence` of `name` to its end; the run as it ended.
async fn finish(ns: &TestNamespace, name: &str, fence: i64) -> AgentRun {
    finish_attempt(ns, name, fence, &KEY).await
}

#[tokio::test]
async fn an_agent_killed_between_calls_is_replayed_and_the_model_answers_each_call_once() {
    let ns = TestNamespace::new("worker-byo").await;
    let file = calls_file(&ns);
    let proxy = LiteLlm::counted(&file).await;
    let run = agent_run(
        "chat",
        &proxy,
        &[("AGENT_CALLS", "6"), ("AGENT_PAUSE_MS", "1500")],
    );
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    kill_after_calls(&ns, "chat", 1, 3).await;
    assert_eq!(counted(&file).await, 3, "the first attempt's calls");
    let ended = finish(&ns, "chat", 2).await;
    let st = ended.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(
        st.output.as_deref(),
        Some("answer after 6 calls: hello from the mock")
    );
    assert_eq!(
        counted(&file).await,
        6,
        "every call reached the model once: the resumed agent's first 3 were answered from the journal"
    );
    assert_eq!(recorded_calls(&ns, "chat").await, [1, 2, 3, 4, 5, 6]);
    let usage = st.usage.unwrap_or_default();
    assert_eq!(usage.model_calls, 6, "{usage:?}");
}

#[tokio::test]
async fn an_agent_that_asks_otherwise_when_resumed_fails_naming_the_field_or_goes_on() {
    let ns = TestNamespace::new("worker-byo-diverge").await;
    let file = calls_file(&ns);
    let proxy = LiteLlm::counted(&file).await;
    let env = [
        ("AGENT_CALLS", "2"),
        ("AGENT_PAUSE_MS", "1500"),
        ("AGENT_DIVERGE", "1"),
    ];
    let runs: Api<AgentRun> = ns.api();
    let fails = agent_run("strict", &proxy, &env);
    let mut goes_on = agent_run("lenient", &proxy, &env);
    if let Some(container) = goes_on.spec.agent_mut().container.as_mut() {
        container.on_divergence = OnDivergence::Continue;
    }
    for run in [&fails, &goes_on] {
        runs.create(&PostParams::default(), run).await.unwrap();
        kill_after_calls(&ns, &run.metadata.name.clone().unwrap(), 1, 1).await;
    }
    let st = finish(&ns, "strict", 2).await.status.unwrap_or_default();
    assert_diverged_at_the_prompt(&st);
    let st = finish(&ns, "lenient", 2).await.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    let listed = segments(&ns.client, &ns.name, "lenient").await;
    let diverged: Vec<_> = events(&listed)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LedgerEvent::GatewayDiverged { call, field } => Some((call, field)),
            _ => None,
        })
        .collect();
    assert_eq!(diverged, [(1, "/messages/0/content".to_string())]);
    // strict: 1 call, then none; lenient: 1, then 2 live.
    assert_eq!(counted(&file).await, 1 + 1 + 2);
}

#[tokio::test]
async fn an_agent_that_exits_non_zero_fails_the_run_with_the_end_of_its_stderr() {
    let ns = TestNamespace::new("worker-byo-exit").await;
    let proxy = LiteLlm::start().await;
    let mut run = agent_run("doomed", &proxy, &[]);
    let script =
        "for i in $(seq 1 500); do echo noise $i >&2; done; echo 'Traceback: boom' >&2; exit 3";
    if let Some(container) = run.spec.agent_mut().container.as_mut() {
        container.command = vec!["sh".into(), "-c".into(), script.into()];
    }
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    let st = finish(&ns, "doomed", 1).await.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Failed), "{st:?}");
    assert_eq!(st.reason.as_deref(), Some("AgentExited"), "{st:?}");
    let message = st.message.unwrap_or_default();
    assert!(
        message.contains("code 3") && message.ends_with("Traceback: boom"),
        "the exit code and the end of stderr: {message}"
    );
}

/// The gateway's address, from the worker's log (`listening`, listener `gateway`).
fn gateway_addr(log: &str) -> Option<String> {
    let line = log
        .lines()
        .find(|l| l.contains("listening") && l.contains("gateway"))?;
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let addr = value
        .pointer("/fields/addr")
        .or_else(|| value.get("addr"))?;
    addr.as_str().map(str::to_string)
}

/// Sends `head` (and no body) on a fresh connection; the status line of the answer, read
/// within `within` (a server that waited for the body would answer nothing).
async fn answer_to_head(addr: &str, head: &str, within: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(within, stream.read(&mut answer)).await;
    let n = read.expect("answered without the body").unwrap();
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    text.lines().next().unwrap_or_default().to_string()
}

/// The tools container shares the pod's loopback: whatever runs there (a model-chosen
/// command) finds the gateway's port, but without the attempt's key it is refused before a
/// byte of its body is read, spends nothing and calls no tool.
#[tokio::test]
async fn the_gateway_answers_no_one_but_the_agent_of_its_attempt() {
    let ns = TestNamespace::new("worker-byo-key").await;
    let file = calls_file(&ns);
    let proxy = LiteLlm::counted(&file).await;
    let run = agent_run(
        "guarded",
        &proxy,
        &[("AGENT_CALLS", "2"), ("AGENT_PAUSE_MS", "20000")],
    );
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    let mut worker = start(&ns, "guarded", 1).await;
    wait_until(
        Duration::from_secs(120),
        "the agent's first call recorded",
        || async { !recorded_calls(&ns, "guarded").await.is_empty() },
    )
    .await;
    let addr = gateway_addr(&worker.log_text()).expect("the gateway's address in the log");
    let body = r#"{"model":"mock-gpt","messages":[{"role":"user","content":"spend"}]}"#;
    // The model gateway's three APIs and the tool gateway (the run's tools, as an MCP server)
    // alike, whichever header carries the guess.
    for path in [
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/mcp",
    ] {
        for auth in [
            "",
            "Authorization: Bearer \r\n",
            "Authorization: Bearer sk-guess\r\n",
            "x-api-key: sk-guess\r\n",
        ] {
            // The whole body is announced and never sent: only a refusal before reading answers.
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len() + 1_000_000
            );
            let status = answer_to_head(&addr, &head, Duration::from_secs(5)).await;
            assert!(status.contains(" 401 "), "{path} {auth:?}: {status}");
        }
    }
    // The proxy's own key is not the gateway's either.
    let refused = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .bearer_auth(litellm::KEY)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(
        counted(&file).await,
        1,
        "only the agent's own call reached the model"
    );
    worker.kill9().await;
}
