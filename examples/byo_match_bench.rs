//! `make bench-byo`, its second part: for each agent style of tests/agents/ (the `openai` SDK's
//! own loop, the OpenAI Agents SDK on Chat Completions and on Responses, LangGraph, the
//! `anthropic` SDK's tool loop on Messages), unmodified, the fraction of its recorded model
//! calls a resumed agent asked again exactly (target 100 %: these agents are deterministic), and
//! how many calls reached the model twice. Each run is a 10-step agent, its worker killed
//! (kill -9) once 5 calls are recorded, then resumed with `onDivergence: Continue`, so a call
//! that does not match is counted, not fatal. Its model is the LiteLLM proxy's steps model
//! (tests/litellm/steps.yaml) on Chat Completions, and a server answering the 11 calls in order
//! on Responses and Messages, which the proxy's mock model calls no tool over.
//!
//!     cargo run --release --example byo_match_bench
//!
//! Against the real API server in KUBECONFIG; the worker is the release `baton worker`, the
//! agents run with the agents venv's Python (hack/setup.sh).

use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, OnDivergence, Phase, Provider};
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::namespace;
use baton_testkit::common::own_agent::{agent_container, lines, steps_run};
use baton_testkit::common::worker_proc::{scripted_run, shell_tool, spawn_agent_worker};
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::{
    messages_stream, messages_text, messages_tool_use, responses_answer, responses_call,
};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

const STEPS: usize = 10;
const KILL_AFTER_CALLS: usize = 5;
/// The model API an agent speaks, and so the model server that answers it.
#[derive(Clone, Copy)]
enum AgentApi {
    /// Chat Completions: the LiteLLM proxy's steps model, its calls counted at the proxy.
    Chat,
    /// Responses or Messages: a server answering the run's calls in order, counting them.
    Responses,
    Messages,
}

const AGENTS: [(&str, &str, AgentApi); 5] = [
    ("the openai SDK's own loop", "tool_agent.py", AgentApi::Chat),
    (
        "the OpenAI Agents SDK",
        "agents_sdk_agent.py",
        AgentApi::Chat,
    ),
    (
        "the Agents SDK, Responses",
        "agents_sdk_agent.py",
        AgentApi::Responses,
    ),
    ("LangGraph", "langgraph_agent.py", AgentApi::Chat),
    (
        "the anthropic SDK, Messages",
        "anthropic_agent.py",
        AgentApi::Messages,
    ),
];

/// What one framework's resumed run showed.
struct Matched {
    recorded: usize,
    asked_again_exactly: usize,
    sent_twice: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("bench-byo-match-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;
    let counted = std::env::temp_dir().join(format!("baton-{ns}-calls.jsonl"));
    let proxy = LiteLlm::steps(&counted, STEPS, "command", "echo step {n}").await;
    println!(
        "bring your own agent, resumed: {STEPS} steps, killed after {KILL_AFTER_CALLS} recorded calls, release build"
    );
    for (i, (label, script, api)) in AGENTS.into_iter().enumerate() {
        let before = lines(&counted).len();
        let name = format!("match-{i}");
        let (run, server) = match api {
            AgentApi::Chat => (steps_run(&name, &proxy, script, STEPS), None),
            _ => {
                let server = Server::start(scripted_replies(api)).await;
                (scripted_agent(&name, &server, api, script), Some(server))
            }
        };
        let m = measure(&client, &ns, run).await?;
        let reached = match &server {
            None => lines(&counted).len() - before,
            Some(server) => server.received().len(),
        };
        println!(
            "  {label:<28} recorded calls asked again exactly: {}/{} ({:.0} %); re-sent after a divergence: {}; calls the model answered: {reached} for the {} the run needed",
            m.asked_again_exactly,
            m.recorded,
            100.0 * m.asked_again_exactly as f64 / m.recorded.max(1) as f64,
            m.sent_twice,
            STEPS + 1,
        );
    }
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    Ok(())
}

/// Runs `script`'s run: killed after [`KILL_AFTER_CALLS`] recorded calls, then to its end.
async fn measure(client: &Client, ns: &str, mut run: AgentRun) -> anyhow::Result<Matched> {
    let name = &run.metadata.name.clone().unwrap_or_default();
    if let Some(container) = run.spec.agent_mut().container.as_mut() {
        container.on_divergence = OnDivergence::Continue;
    }
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let run = runs.create(&PostParams::default(), &run).await?;
    let key = [("BATON_MODEL_API_KEY", litellm::KEY)];

    let pod = claim(client, ns, name, 1).await;
    let mut worker = spawn_agent_worker(&run, 1, &pod, &key);
    while recorded(client, ns, name, 1).await < KILL_AFTER_CALLS {
        if let Ok(Some(status)) = worker.child.try_wait() {
            let st = runs.get(name).await?.status.unwrap_or_default();
            anyhow::bail!("{name}: the first worker ended ({status}) early: {st:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.kill9().await;
    let recorded_first = recorded(client, ns, name, 1).await;

    let pod = claim(client, ns, name, 2).await;
    let mut worker = spawn_agent_worker(&run, 2, &pod, &key);
    let code = worker.wait(Duration::from_secs(600)).await;
    anyhow::ensure!(code == 0, "{name}: the resumed worker exited {code}");
    let st = runs.get(name).await?.status.unwrap_or_default();
    anyhow::ensure!(st.outcome == Some(Phase::Succeeded), "{name} ended {st:?}");
    let listed = segments(client, ns, name).await;
    // A divergence at place p re-sends the recorded places from p on.
    let diverged_at = events(&listed)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LedgerEvent::GatewayDiverged { call, .. } => Some(call as usize),
            _ => None,
        })
        .min();
    let asked_again_exactly = diverged_at.map_or(recorded_first, |p| p - 1);
    Ok(Matched {
        recorded: recorded_first,
        asked_again_exactly,
        sent_twice: recorded_first - asked_again_exactly,
    })
}

/// The model calls attempt `fence` of `name` recorded.
async fn recorded(client: &Client, ns: &str, name: &str, fence: i64) -> usize {
    let listed = segments(client, ns, name).await;
    events(&listed)
        .iter()
        .filter(|(f, e)| *f == fence && matches!(e, LedgerEvent::GatewayCall { .. }))
        .count()
}

/// The answers of a [`STEPS`]-step agent on `api`, in order: a call of the shell tool `sh`
/// per step, then the final text (on Messages, odd calls streamed, as the agent asks them).
fn scripted_replies(api: AgentApi) -> Vec<Reply> {
    let command = |n: usize| format!("echo step {n}");
    let done = format!("done after {STEPS} steps");
    let reply = |n: usize| match api {
        AgentApi::Responses if n <= STEPS => {
            json(responses_call(&format!("call_{n}"), "sh", &command(n)))
        }
        AgentApi::Responses => json(responses_answer(&done)),
        _ => {
            let message = match n <= STEPS {
                true => messages_tool_use(&format!("toolu_{n}"), "sh", &command(n)),
                false => messages_text(&done),
            };
            match n % 2 {
                1 => Reply::sse(messages_stream(&message)),
                _ => json(message),
            }
        }
    };
    (1..=STEPS + 1).map(reply).collect()
}

fn json(value: serde_json::Value) -> Reply {
    Reply::json(200, &value.to_string())
}

/// A run `name` of the agent `script` with the shell tool `sh`, its model `server` over `api`.
fn scripted_agent(name: &str, server: &Server, api: AgentApi, script: &str) -> AgentRun {
    let tools = vec![shell_tool("sh", false)];
    let mut run = scripted_run(name, vec![], tools, LeaseSpec::default());
    run.spec.input = format!("run the {STEPS} steps");
    let agent = run.spec.agent_mut();
    agent.model = server.openai_model();
    let mut env = vec![("AGENT_MODEL", "local-model")];
    match api {
        AgentApi::Messages => {
            agent.model.provider = Provider::Anthropic;
            agent.model.endpoint = Some(server.url.clone());
        }
        _ => env.push(("AGENT_API", "responses")),
    }
    agent.container = Some(agent_container(script, &env));
    run
}
