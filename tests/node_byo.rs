//! End to end on the real node, a run that brings its own agent: the agent image the project
//! builds offline (hack/images.sh agents: Debian's Python, the stock `openai` SDK from PyPI,
//! tests/agents/chat_agent.py unmodified), in a container of the run's pod as its own non-root
//! user with no token and no key, its model calls through the worker's gateway to the LiteLLM
//! proxy inside the node's network namespace, which counts the calls that reach the model.
//! The worker killed (kill -9) between two calls: the next pod runs the agent again, answers
//! its recorded calls from the ledger, and the model answers each of the run's calls once.
//! And the OpenAI Agents SDK and LangGraph from the same image, unmodified, each a 10-step
//! agent whose tool
//! (the run's shell tool, through baton's MCP server) records each step with the effects
//! server outside baton: its worker killed twice, once while a tool runs and once while a model
//! call is in flight at the model, it ends with the answer of an uninterrupted run, no effect
//! twice and no completed model call twice.

use std::time::Duration;

use baton::crd::v1alpha1::{
    AgentContainer, LedgerEvent, ModelSpec, PlainEnvVar, Provider, SecretKeyRef,
};
use baton_testkit::common::litellm::{KEY, LiteLlmInNode};
use baton_testkit::e2e::{Effects, Script};
use baton_testkit::model::{Reply, Server};
use baton_testkit::node::*;
use baton_testkit::worker::{messages_stream, messages_text, messages_tool_use};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

/// The agent image (hack/images.sh agents).
const AGENTS: &str = "docker.io/library/baton-agents:py";
const NETNS: &str = "/run/netns/baton-node";

/// The places of the run's recorded model calls, in ledger order.
async fn recorded_calls(env: &NodeEnv, name: &str) -> Vec<i64> {
    let segments = env.ledger(name).await;
    let events = segments.iter().flat_map(|s| s.spec.events.iter());
    let calls = events.filter_map(|e| match e {
        LedgerEvent::GatewayCall { call, .. } => Some(*call),
        _ => None,
    });
    calls.collect()
}

/// The proxy's key, as the run's model key Secret (`model-key`).
async fn model_key(env: &NodeEnv) {
    let secrets: Api<Secret> = env.api();
    let secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "model-key"},
        "stringData": {"key": KEY},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// `model` of the proxy in the node, its key from the `model-key` Secret.
fn proxy_model(proxy: &LiteLlmInNode, model: &str) -> ModelSpec {
    ModelSpec {
        provider: Provider::Openai,
        name: Some(model.into()),
        endpoint: Some(format!("{}/v1", proxy.url)),
        ..proxy_model_key()
    }
}

fn counted(file: &std::path::Path) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_an_own_agent_killed_between_calls_is_replayed_and_each_call_reaches_the_model_once() {
    let env = NodeEnv::start("byo").await;
    let calls = env.dir.join("model-calls.jsonl");
    let proxy = LiteLlmInNode::start(NODE_IP, NETNS, &calls);
    model_key(&env).await;
    let name = "own";
    let mut run = env.scripted(name, &Script::new(1, 100));
    run.spec.input = "count the steps".into();
    let agent = run.spec.agent_mut();
    agent.tools.clear();
    agent.model = proxy_model(&proxy, "mock-gpt");
    let var = |name: &str, value: &str| PlainEnvVar {
        name: name.into(),
        value: value.into(),
    };
    agent.container = Some(AgentContainer {
        image: AGENTS.into(),
        command: vec!["python".into(), "/opt/agents/app/chat_agent.py".into()],
        env: vec![var("AGENT_CALLS", "6"), var("AGENT_PAUSE_MS", "1200")],
        ..AgentContainer::default()
    });
    env.create(&run).await;

    let (pod, _) = env.wait_worker(name, 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while recorded_calls(&env, name).await.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "3 calls recorded: {}",
            env.pod_logs(name).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.signal_worker(&pod, libc::SIGKILL).await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(
        st.output.as_deref(),
        Some("answer after 6 calls: hello from the mock")
    );
    assert!(st.attempt >= 2, "resumed in another pod: {st:?}");
    // LiteLLM writes its count a moment after each answer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        counted(&calls),
        6,
        "each call reached the model once; the resumed agent's first 3 came from the ledger"
    );
    assert_eq!(recorded_calls(&env, name).await, [1, 2, 3, 4, 5, 6]);
    env.finish().await;
}

/// The steps the model asks for; the kinds of place the worker is killed in: while the tool of
/// step [`TOOL_KILL`] runs (its intent recorded, no result; the tool sleeps after its effect
/// landed), and after step [`MODEL_KILL`]'s result, while the next model call is in flight at
/// the model (the proxy holds it, tests/litellm/steps_policy.py's BATON_HOLD_CALL).
const STEPS: usize = 10;
const TOOL_KILL: usize = 3;
const MODEL_KILL: usize = 7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_agents_sdk_killed_in_a_tool_and_in_a_model_call_ends_as_if_never_killed() {
    killed_in_a_tool_and_in_a_model_call("byo-sdk", "agents_sdk_agent.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_langgraph_killed_in_a_tool_and_in_a_model_call_ends_as_if_never_killed() {
    killed_in_a_tool_and_in_a_model_call("byo-langgraph", "langgraph_agent.py").await;
}

/// The agent `script` of the image (/opt/agents/app/) against the steps model in the node,
/// its worker killed while step [`TOOL_KILL`]'s tool runs, then during the model call after
/// step [`MODEL_KILL`]'s result.
async fn killed_in_a_tool_and_in_a_model_call(test: &str, script: &str) {
    let env = NodeEnv::start(test).await;
    let calls = env.dir.join("model-calls.jsonl");
    let arrivals = env.dir.join("model-held.txt");
    let (host, port) = env.effects.addr.rsplit_once(':').unwrap();
    let name = "sdk";
    // The model's command for step {n}: its effect recorded outside baton, then a pause in the
    // step the worker is killed in.
    let command = format!(
        "bash -c 'echo \"{name} {{n}} $BATON_STEP $BATON_FENCE\" > /dev/tcp/{host}/{port}'; \
         case {{n}} in {TOOL_KILL}) sleep 30;; esac; echo ok {{n}}"
    );
    let steps = STEPS.to_string();
    let held = MODEL_KILL.to_string();
    let arrivals_file = arrivals.display().to_string();
    let proxy = LiteLlmInNode::start_with(
        NODE_IP,
        NETNS,
        "tests/litellm/steps.yaml",
        &calls,
        &[
            ("BATON_STEPS", &steps),
            ("BATON_STEP_COMMAND", &command),
            ("BATON_HOLD_CALL", &held),
            ("BATON_MODEL_ARRIVALS", &arrivals_file),
        ],
    );
    model_key(&env).await;
    let mut run = env.scripted(name, &Script::new(1, 100));
    run.spec.input = format!("run the {STEPS} steps");
    let agent = run.spec.agent_mut();
    agent.tools.retain(|t| t.name == "sh");
    agent.model = proxy_model(&proxy, "mock-steps");
    agent.container = Some(AgentContainer {
        image: AGENTS.into(),
        command: vec!["python".into(), format!("/opt/agents/app/{script}")],
        ..AgentContainer::default()
    });
    env.create(&run).await;

    let (pod, _) = env.wait_worker(name, 1).await;
    env.wait_effect(name, TOOL_KILL).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let (pod, _) = env.wait_worker(name, 2).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while counted(&arrivals) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the model call after step {MODEL_KILL} held: {}",
            env.pod_logs(name).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_result(&env, name, MODEL_KILL).await;
    env.signal_worker(&pod, libc::SIGKILL).await;

    let st = env.wait_succeeded(name).await;
    assert_eq!(
        st.output.as_deref(),
        Some(format!("done after {STEPS} steps").as_str()),
        "the answer of an uninterrupted run"
    );
    let effects = Effects::read(&env.effects.file);
    for step in 1..=STEPS {
        assert_eq!(effects.count(name, step), 1, "step {step}'s effect once");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        counted(&calls),
        STEPS + 1,
        "each model call completed at the model once: the resumed agents' earlier calls came \
         from the ledger, and the call cut by the kill was never answered"
    );
    let held = std::fs::read_to_string(&arrivals).unwrap_or_default();
    assert_eq!(held, format!("held {MODEL_KILL}\n"), "one call held, once");
    let unknown: Vec<i64> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [TOOL_KILL as i64], "{st:?}");
    assert!(st.attempt >= 3, "two resumes: {st:?}");
    env.finish().await;
}

/// The place of the anthropic agent's model calls its worker is killed in: call 3 (streamed:
/// its stream cut after its first events), while step 6's tool runs, and call 10 (not
/// streamed: no answer yet).
const STREAM_CUT: usize = 3;
const ANTHROPIC_TOOL_KILL: usize = 6;
const CALL_HELD: usize = 10;

/// The `anthropic` SDK's tool loop from the image (odd calls streamed), a 10-step agent against
/// a scripted Messages server inside the node's namespace (LiteLLM's mock calls no tool over
/// the Messages API), killed during a model stream, while a tool runs and while a call waits
/// for its answer: it ends as if never killed, the server asked each completed call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_anthropic_sdk_killed_in_a_stream_a_tool_and_a_call_ends_as_if_never_killed() {
    let env = NodeEnv::start("byo-anthropic").await;
    let (host, port) = env.effects.addr.rsplit_once(':').unwrap();
    let name = "claude";
    let step = |n: usize| {
        let pause = if n == ANTHROPIC_TOOL_KILL {
            "sleep 30; "
        } else {
            ""
        };
        let effect =
            format!("echo \"{name} {n} $BATON_STEP $BATON_FENCE\" > /dev/tcp/{host}/{port}");
        format!("bash -c '{effect}'; {pause}echo ok {n}")
    };
    let answer = |call: usize| match call {
        n if n <= STEPS => messages_tool_use(&format!("toolu_{n}"), "sh", &step(n)),
        _ => messages_text(&format!("done after {STEPS} steps")),
    };
    let reply = |call: usize| match call % 2 {
        1 => Reply::sse(messages_stream(&answer(call))),
        _ => Reply::json(200, &answer(call).to_string()),
    };
    let mut replies = Vec::new();
    for call in 1..=STEPS + 1 {
        if call == STREAM_CUT {
            replies.push(Reply::stall(messages_stream(&answer(call))[..2].to_vec()));
        }
        if call == CALL_HELD {
            replies.push(Reply::silent());
        }
        replies.push(reply(call));
    }
    let server = Server::start_in_netns(NETNS, NODE_IP, replies).await;
    model_key(&env).await;
    let mut run = env.scripted(name, &Script::new(1, 100));
    run.spec.input = format!("run the {STEPS} steps");
    run.spec.max_attempts = 4;
    let agent = run.spec.agent_mut();
    agent.tools.retain(|t| t.name == "sh");
    agent.model = ModelSpec {
        provider: Provider::Anthropic,
        name: Some("local-model".into()),
        endpoint: Some(server.url.clone()),
        ..proxy_model_key()
    };
    agent.container = Some(AgentContainer {
        image: AGENTS.into(),
        command: vec!["python".into(), "/opt/agents/app/anthropic_agent.py".into()],
        env: vec![PlainEnvVar {
            name: "AGENT_MODEL".into(),
            value: "local-model".into(),
        }],
        ..AgentContainer::default()
    });
    env.create(&run).await;

    // Killed once the server has the call it cuts or holds, and in the tool's pause.
    let (pod, _) = env.wait_worker(name, 1).await;
    wait_received(&env, &server, STREAM_CUT).await;
    wait_result(&env, name, STREAM_CUT - 1).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let (pod, _) = env.wait_worker(name, 2).await;
    env.wait_effect(name, ANTHROPIC_TOOL_KILL).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let (pod, _) = env.wait_worker(name, 3).await;
    wait_received(&env, &server, CALL_HELD + 1).await;
    wait_result(&env, name, CALL_HELD - 1).await;
    env.signal_worker(&pod, libc::SIGKILL).await;

    let st = env.wait_succeeded(name).await;
    assert_eq!(
        st.output.as_deref(),
        Some(format!("done after {STEPS} steps").as_str()),
        "the answer of an uninterrupted run"
    );
    let effects = Effects::read(&env.effects.file);
    for step in 1..=STEPS {
        assert_eq!(effects.count(name, step), 1, "step {step}'s effect once");
    }
    // Each of the 11 calls answered once, and the two the kills cut asked again.
    server.assert_received(STEPS + 1 + 2, "/v1/messages");
    let unknown: Vec<i64> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [ANTHROPIC_TOOL_KILL as i64], "{st:?}");
    assert!(st.attempt >= 4, "three resumes: {st:?}");
    env.finish().await;
}

/// The model spec's key: the `model-key` Secret.
fn proxy_model_key() -> ModelSpec {
    ModelSpec {
        api_key_secret_ref: Some(SecretKeyRef {
            name: "model-key".into(),
            key: "key".into(),
        }),
        idle_timeout_seconds: Some(60),
        ..ModelSpec::default()
    }
}

/// Waits until `server` has received `count` requests (the last one's answer then cut or held
/// by its reply).
async fn wait_received(env: &NodeEnv, server: &Server, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while server.received().len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "{count} model calls received: {}",
            env.pod_logs("claude").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until step `step`'s result is in `name`'s ledger. The agent has it at once; the worker
/// makes it durable with its next append or within its flush interval, so a kill is "after a
/// result" only once it is there (before, the step would be told unknown, never run again).
async fn wait_result(env: &NodeEnv, name: &str, step: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let has_result = |segments: &[baton::crd::v1alpha1::LedgerSegment]| {
        let events = segments.iter().flat_map(|s| s.spec.events.iter());
        events
            .into_iter()
            .any(|e| matches!(e, LedgerEvent::StepResult { step: s, .. } if *s == step as i64))
    };
    while !has_result(&env.ledger(name).await) {
        assert!(
            std::time::Instant::now() < deadline,
            "step {step}'s result recorded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
