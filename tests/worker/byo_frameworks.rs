//! Agent frameworks from PyPI, unmodified, through the worker's gateways
//! (tests/agents/requirements.txt, the agent image's pins, in the agents venv): the OpenAI
//! Agents SDK (`tests/agents/agents_sdk_agent.py`: an Agent, its MCP server, the Runner) and
//! LangGraph (`tests/agents/langgraph_agent.py`: the prebuilt ReAct agent, `langchain-openai`,
//! `langchain-mcp-adapters`),
//! against the LiteLLM proxy with a model that calls the run's tool once per step
//! (tests/litellm/steps.yaml), counted at the server. Its worker killed (kill -9) while a tool
//! runs: the next attempt replays the recorded model and tool calls, the open step is told
//! unknown, and the run ends with the answer an uninterrupted run gives, no effect and no model
//! call twice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, AgentRunStatus, LeaseSpec, Phase, Provider};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::own_agent::{
    agent_container, counted, finish_attempt, lines, start_attempt, steps_run,
};
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::{
    messages_stream, messages_text, messages_tool_use, responses_answer, responses_call,
};
use kube::Api;
use kube::api::PostParams;

/// The worker's own key for the proxy (the agent never holds it).
const KEY: [(&str, &str); 1] = [("BATON_MODEL_API_KEY", litellm::KEY)];
/// The steps the model asks for before its final answer.
const STEPS: usize = 5;
/// The step during which the worker is killed (its tool sleeps).
const KILLED_IN: usize = 3;

/// The proxy whose model asks for [`STEPS`] calls of the run's shell tool, each appending its
/// step to `effects` (outside baton), step [`KILLED_IN`] then sleeping.
async fn steps_model(effects: &Path, calls: &Path) -> LiteLlm {
    let command = format!(
        "echo {{n}} >> {}; if [ {{n}} = {KILLED_IN} ]; then sleep 60; fi",
        effects.display()
    );
    LiteLlm::steps(calls, STEPS, "command", &command).await
}

fn files(ns: &TestNamespace) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir();
    (
        dir.join(format!("baton-{}-effects", ns.name)),
        dir.join(format!("baton-{}-model-calls", ns.name)),
    )
}

#[tokio::test]
async fn the_agents_sdk_killed_while_a_tool_runs_resumes_and_nothing_runs_twice() {
    killed_while_a_tool_runs("worker-byo-agents-sdk", "agents_sdk_agent.py").await;
}

#[tokio::test]
async fn langgraph_killed_while_a_tool_runs_resumes_and_nothing_runs_twice() {
    killed_while_a_tool_runs("worker-byo-langgraph", "langgraph_agent.py").await;
}

/// The agent `script` of tests/agents/ against the steps model, killed during step
/// [`KILLED_IN`]'s tool, then resumed to its end.
async fn killed_while_a_tool_runs(namespace: &str, script: &str) {
    let ns = TestNamespace::new(namespace).await;
    let (effects, calls) = files(&ns);
    let proxy = steps_model(&effects, &calls).await;
    let run = steps_run("sdk", &proxy, script, STEPS);
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    let mut worker = start_attempt(&ns, "sdk", 1, &KEY).await;
    wait_until(
        Duration::from_secs(120),
        "the killed step's effect",
        || async { lines(&effects).len() == KILLED_IN },
    )
    .await;
    worker.kill9().await;
    assert_eq!(
        counted(&calls).await,
        KILLED_IN,
        "the first attempt's model calls"
    );

    let st = finish_attempt(&ns, "sdk", 2, &KEY)
        .await
        .status
        .unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(
        st.output.as_deref(),
        Some(format!("done after {STEPS} steps").as_str()),
        "the answer of an uninterrupted run"
    );
    let expected: Vec<String> = (1..=STEPS).map(|n| n.to_string()).collect();
    assert_eq!(lines(&effects), expected, "each step's effect once");
    assert_eq!(
        counted(&calls).await,
        STEPS + 1,
        "each model call reached the model once: the resumed agent's first came from the ledger"
    );
    assert_eq!(st.steps, STEPS as i64, "{st:?}");
    let unknown: Vec<_> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [KILLED_IN as i64], "the step the worker died in");
}

/// The Agents SDK's Responses model class (its default), against a server that answers in a
/// set order, since the proxy's mock model does not call tools through the Responses API.
#[tokio::test]
async fn the_agents_sdk_on_the_responses_api_resumes_and_nothing_runs_twice() {
    let ns = TestNamespace::new("worker-byo-agents-sdk-responses").await;
    let (effects, _) = files(&ns);
    let step = |n: u32, then: &str| format!("echo {n} >> {}{then}", effects.display());
    let answer = |value: serde_json::Value| Reply::json(200, &value.to_string());
    let server = Server::start(vec![
        answer(responses_call("call_1", "sh", &step(1, ""))),
        answer(responses_call("call_2", "sh", &step(2, "; sleep 60"))),
        answer(responses_answer("done after 2 steps")),
    ])
    .await;
    let env = [("AGENT_API", "responses"), ("AGENT_MODEL", "local-model")];
    let run = two_step_run(&server, Provider::Openai, "agents_sdk_agent.py", &env);
    killed_in_step_two(&ns, &run, &effects).await;
    server.assert_received(3, "/v1/responses");
}

/// The `anthropic` SDK's tool loop over the Messages API (streamed and not), its tools through
/// baton's MCP server, against a server that answers in a set order (the proxy's mock model
/// calls no tool over the Messages API).
#[tokio::test]
async fn the_anthropic_sdk_killed_while_a_tool_runs_resumes_and_nothing_runs_twice() {
    let ns = TestNamespace::new("worker-byo-anthropic").await;
    let (effects, _) = files(&ns);
    let step = |n: u32, then: &str| format!("echo {n} >> {}{then}", effects.display());
    let first = messages_tool_use("toolu_1", "sh", &step(1, ""));
    let second = messages_tool_use("toolu_2", "sh", &step(2, "; sleep 60"));
    let server = Server::start(vec![
        Reply::sse(messages_stream(&first)),
        Reply::json(200, &second.to_string()),
        Reply::sse(messages_stream(&messages_text("done after 2 steps"))),
    ])
    .await;
    let env = [("AGENT_MODEL", "local-model")];
    let run = two_step_run(&server, Provider::Anthropic, "anthropic_agent.py", &env);
    let st = killed_in_step_two(&ns, &run, &effects).await;
    server.assert_received(3, "/v1/messages");
    let usage = st.usage.unwrap_or_default();
    assert_eq!(
        (usage.model_calls, usage.total_tokens),
        (3, 45),
        "{usage:?}"
    );
}

/// A run of the agent `script` with the shell tool `sh`, its model `server` through
/// `provider`'s API.
fn two_step_run(
    server: &Server,
    provider: Provider,
    script: &str,
    env: &[(&str, &str)],
) -> AgentRun {
    let mut run = scripted_run(
        "two",
        vec![],
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    run.spec.input = "run the 2 steps".into();
    let agent = run.spec.agent_mut();
    agent.model = server.openai_model();
    if provider == Provider::Anthropic {
        agent.model.provider = provider;
        agent.model.endpoint = Some(server.url.clone());
    }
    agent.container = Some(agent_container(script, env));
    run
}

/// Creates `run`, kills its first worker while step 2's tool runs (its effect in `effects`),
/// runs the next attempt to its end and checks what any framework must give: the answer of an
/// uninterrupted run, each effect once, step 2 reported unknown. The status.
async fn killed_in_step_two(ns: &TestNamespace, run: &AgentRun, effects: &Path) -> AgentRunStatus {
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), run).await.unwrap();
    let local = [("BATON_MODEL_API_KEY", "sk-local")];
    let mut worker = start_attempt(ns, "two", 1, &local).await;
    wait_until(Duration::from_secs(120), "step 2's effect", || async {
        lines(effects).len() == 2
    })
    .await;
    worker.kill9().await;
    let st = finish_attempt(ns, "two", 2, &local)
        .await
        .status
        .unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("done after 2 steps"));
    assert_eq!(lines(effects), ["1", "2"], "each step's effect once");
    let unknown: Vec<_> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [2], "the step the worker died in");
    st
}
