//! An own agent's tools through the worker's tool gateway: `tests/agents/tool_agent.py`, the
//! stock `openai` SDK and the stock `mcp` client, calling the run's shell tools on the MCP
//! server baton serves it, against a Chat Completions server that answers in a set order. A
//! worker killed (kill -9) while a tool runs: the next attempt answers the finished calls from
//! the ledger, tells the agent the open one's effect is unknown, and no effect runs twice. A
//! gated call makes the run wait for approval; once approved, the next attempt runs it once
//! and the replayed agent gets its result. An `askUser` call waits for the user, and the replayed
//! agent gets the answer.

use std::path::PathBuf;
use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, ApprovalPolicy, LeaseSpec, Phase, ToolKind, ToolSpec};
use baton::ledger::UNKNOWN_EFFECT_NOTICE;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::own_agent::{
    agent_container, approve, deny, finish_attempt, lines, start_attempt,
};
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::{chat_answer, chat_call, tool_messages};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// A Chat Completions answer (not streamed) that calls `tool` with `{"command": command}`.
fn calls(id: &str, tool: &str, command: &str) -> Reply {
    let answer = chat_call(id, tool, &json!({ "command": command }));
    Reply::json(200, &answer.to_string())
}

/// A Chat Completions answer (not streamed) with the final text.
fn answers(text: &str) -> Reply {
    Reply::json(200, &chat_answer(text).to_string())
}

/// A run of `tests/agents/tool_agent.py` against `server`, offered `tools`.
fn agent_run(name: &str, server: &Server, tools: Vec<baton::crd::v1alpha1::ToolSpec>) -> AgentRun {
    let mut run = scripted_run(name, vec![], tools, LeaseSpec::default());
    run.spec.input = "record three steps".into();
    let agent = run.spec.agent_mut();
    agent.model = server.openai_model();
    agent.container = Some(agent_container("tool_agent.py", &[]));
    run
}

/// The worker's own key for the model server (the agent never holds it).
const KEY: [(&str, &str); 1] = [("BATON_MODEL_API_KEY", "sk-local")];

async fn start(ns: &TestNamespace, name: &str, fence: i64) -> WorkerProc {
    start_attempt(ns, name, fence, &KEY).await
}

async fn finish(ns: &TestNamespace, name: &str, fence: i64) -> AgentRun {
    finish_attempt(ns, name, fence, &KEY).await
}

fn effects_file(ns: &TestNamespace) -> PathBuf {
    std::env::temp_dir().join(format!("baton-{}-effects", ns.name))
}

#[tokio::test]
async fn a_worker_killed_while_a_tool_runs_never_runs_an_effect_twice() {
    let ns = TestNamespace::new("worker-byo-tools").await;
    let file = effects_file(&ns);
    let step = |n: u32, then: &str| format!("echo {n} >> {}{then}", file.display());
    let server = Server::start(vec![
        calls("c1", "sh", &step(1, "")),
        calls("c2", "sh", &step(2, "; sleep 60")),
        calls("c3", "sh", &step(3, "")),
        answers("three steps recorded"),
    ])
    .await;
    let run = agent_run("tools", &server, vec![shell_tool("sh", false)]);
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    // Step 2 has run its effect and sleeps: its result is not recorded when the worker dies.
    let mut worker = start(&ns, "tools", 1).await;
    wait_until(Duration::from_secs(120), "step 2's effect", || async {
        lines(&file).len() == 2
    })
    .await;
    worker.kill9().await;
    assert_eq!(
        server.received().len(),
        2,
        "the first attempt's model calls"
    );

    let ended = finish(&ns, "tools", 2).await;
    let st = ended.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("three steps recorded"));
    assert_eq!(st.steps, 3, "{st:?}");
    assert_eq!(lines(&file), ["1", "2", "3"], "each effect once");
    let requests = server.received();
    assert_eq!(
        requests.len(),
        4,
        "the replayed calls never reached the model: {requests:?}"
    );
    // The agent was told step 2's effect is unknown, as the built-in loop tells its model.
    let told = tool_messages(&requests[2].body);
    assert_eq!(told.len(), 2, "{told:?}");
    assert_eq!(told[0].0, "c1");
    assert!(told[1].1.contains(UNKNOWN_EFFECT_NOTICE), "{told:?}");
    let unknown = st.unknown_effects;
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert_eq!((unknown[0].step, unknown[0].tool.as_str()), (2, "sh"));
}

/// A run `name` whose gated `deploy` call (its effect a line in the returned file) is waiting
/// for a decision after its first attempt, nothing run; its model then answers `answer`.
async fn waiting_deploy(ns: &TestNamespace, name: &str, answer: &str) -> (Server, PathBuf) {
    let file = effects_file(ns);
    let server = Server::start(vec![
        calls(
            "c1",
            "deploy",
            &format!("echo deployed >> {}", file.display()),
        ),
        answers(answer),
    ])
    .await;
    let mut deploy = shell_tool("deploy", false);
    deploy.approval = Some(ApprovalPolicy::Required);
    let run = agent_run(name, &server, vec![deploy]);
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    let st = finish(ns, name, 1).await.status.unwrap_or_default();
    assert_eq!(st.phase, Phase::WaitingApproval, "{st:?}");
    let pending = st.pending_approval.expect("status.pendingApproval");
    assert_eq!((pending.step, pending.tool.as_str()), (1, "deploy"));
    assert!(lines(&file).is_empty(), "nothing runs before the decision");
    (server, file)
}

#[tokio::test]
async fn a_gated_call_waits_for_approval_then_runs_once_and_the_agent_gets_its_result() {
    let ns = TestNamespace::new("worker-byo-approval").await;
    let (server, file) = waiting_deploy(&ns, "gated", "deployed once").await;
    approve(&ns, "gated", "looks right").await;

    let st = finish(&ns, "gated", 2).await.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("deployed once"));
    assert_eq!(lines(&file), ["deployed"], "run once, after the decision");
    let requests = server.received();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let told = tool_messages(&requests[1].body);
    let result = ("c1".to_string(), "[exit code: 0]".to_string());
    assert_eq!(told, [result], "the recorded result of the run it approved");
}

/// A gated call the user denies never runs: the next attempt replays the agent up to it and
/// answers its call with the denial and its reason, as baton's own loop tells its model.
#[tokio::test]
async fn a_denied_call_never_runs_and_the_agent_is_told_why() {
    let ns = TestNamespace::new("worker-byo-deny").await;
    let (server, file) = waiting_deploy(&ns, "denied", "not deployed").await;
    deny(&ns, "denied", "not on a Friday").await;

    let st = finish(&ns, "denied", 2).await.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert!(lines(&file).is_empty(), "a denied call never runs");
    let requests = server.received();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let told = tool_messages(&requests[1].body);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].1.contains("not on a Friday"),
        "the reason reached the agent: {told:?}"
    );
}

/// An `askUser` call makes the run wait for input; once `spec.inputs` answers it, the next
/// attempt replays the agent, whose call is answered with the user's words.
#[tokio::test]
async fn an_ask_waits_for_the_users_answer_and_the_replayed_agent_gets_it() {
    let ns = TestNamespace::new("worker-byo-ask").await;
    let question = chat_call("c1", "ask", &json!({"question": "which environment?"}));
    let server = Server::start(vec![
        Reply::json(200, &question.to_string()),
        answers("deploying to staging"),
    ])
    .await;
    let ask = ToolSpec {
        kind: ToolKind::AskUser,
        ..shell_tool("ask", false)
    };
    let run = agent_run("ask", &server, vec![ask]);
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    let st = finish(&ns, "ask", 1).await.status.unwrap_or_default();
    assert_eq!(st.phase, Phase::WaitingInput, "{st:?}");
    assert_eq!(st.message.as_deref(), Some("which environment?"));

    let patch = json!({"spec": {"inputs": ["staging"]}});
    runs.patch("ask", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let st = finish(&ns, "ask", 2).await.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("deploying to staging"));
    assert_eq!(st.inputs_consumed, 1);
    let requests = server.received();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let told = tool_messages(&requests[1].body);
    assert_eq!(told, [("c1".to_string(), "staging".to_string())]);
}
