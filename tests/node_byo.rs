//! End to end on the real node, a run that brings its own agent: the agent image the project
//! builds offline (hack/images.sh agents: Debian's Python, the stock `openai` SDK from PyPI,
//! tests/agents/chat_agent.py unmodified), in a container of the run's pod as its own non-root
//! user with no token and no key, its model calls through the worker's gateway to the LiteLLM
//! proxy inside the node's network namespace, which counts the calls that reach the model.
//! The worker killed (kill -9) between two calls: the next pod runs the agent again, answers
//! its recorded calls from the ledger, and the model answers each of the run's calls once.
//! And the OpenAI Agents SDK, LangGraph and the `anthropic` SDK's tool loop from the same image,
//! unmodified, each a 10-step agent whose tool (the run's shell tool, through baton's MCP
//! server) records each step with the effects server outside baton, against a model server
//! inside the node's namespace that answers the calls in order and counts them: its worker
//! killed at each kind of boundary (during a model stream, while a tool runs, after a result
//! while the next call waits), it ends with the answer of an uninterrupted run, no effect twice
//! and no completed model call twice.

use std::time::Duration;

use baton::crd::v1alpha1::{LedgerEvent, ModelSpec, Provider, SecretKeyRef};
use baton_testkit::common::litellm::{KEY, LiteLlmInNode};
use baton_testkit::common::own_agent::{image_agent_container, lines};
use baton_testkit::e2e::{Effects, Script};
use baton_testkit::model::{Reply, Server};
use baton_testkit::node::*;
use baton_testkit::worker::{
    answer_stream, messages_stream, messages_text, messages_tool_use, responses_answer,
    responses_call, responses_stream, tool_call_stream,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

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
    let env_vars = [("AGENT_CALLS", "6"), ("AGENT_PAUSE_MS", "1200")];
    agent.container = Some(image_agent_container("chat_agent.py", &env_vars));
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
        lines(&calls).len(),
        6,
        "each call reached the model once; the resumed agent's first 3 came from the ledger"
    );
    assert_eq!(recorded_calls(&env, name).await, [1, 2, 3, 4, 5, 6]);
    env.finish().await;
}

/// The steps the model asks for, and where the worker is killed: during call
/// [`STREAM_CUT`] (streamed: its stream cut after its first events), while step
/// [`TOOL_KILL`]'s tool runs (its intent recorded, no result; the tool sleeps after its effect
/// landed), and during call [`CALL_HELD`] (no answer yet), once step `CALL_HELD - 1`'s result
/// is durable.
const STEPS: usize = 10;
const STREAM_CUT: usize = 3;
const TOOL_KILL: usize = 6;
const CALL_HELD: usize = 10;

/// The model API an agent speaks, and so the answers the model server gives.
#[derive(Clone, Copy)]
enum Speaks {
    /// Chat Completions, every call streamed (the agent runs with AGENT_STREAM=1).
    ChatStreamed,
    /// Responses, every call streamed (AGENT_API=responses, AGENT_STREAM=1).
    ResponsesStreamed,
    /// Messages, odd calls streamed (the `anthropic` agent's own choice).
    Messages,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_agents_sdk_killed_at_each_boundary_ends_as_if_never_killed() {
    killed_at_each_boundary("byo-sdk", "agents_sdk_agent.py", Speaks::ChatStreamed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_agents_sdk_on_responses_killed_at_each_boundary_ends_as_if_never_killed() {
    let speaks = Speaks::ResponsesStreamed;
    killed_at_each_boundary("byo-sdk-responses", "agents_sdk_agent.py", speaks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_langgraph_killed_at_each_boundary_ends_as_if_never_killed() {
    killed_at_each_boundary("byo-langgraph", "langgraph_agent.py", Speaks::ChatStreamed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_anthropic_sdk_killed_at_each_boundary_ends_as_if_never_killed() {
    killed_at_each_boundary("byo-anthropic", "anthropic_agent.py", Speaks::Messages).await;
}

/// The agent `script` of the image (/opt/agents/app/), a [`STEPS`]-step agent against a model
/// server inside the node's namespace (LiteLLM's mock model calls no tool in a stream nor over
/// the Messages API), its worker killed three times: it ends as if never killed, the server
/// asked each completed call once.
async fn killed_at_each_boundary(test: &str, script: &str, speaks: Speaks) {
    let env = NodeEnv::start(test).await;
    let name = "byo";
    let server = Server::start_in_netns(NETNS, NODE_IP, replies(&env, name, speaks)).await;
    model_key(&env).await;
    let mut run = env.scripted(name, &Script::new(1, 100));
    run.spec.input = format!("run the {STEPS} steps");
    run.spec.max_attempts = 4;
    let agent = run.spec.agent_mut();
    agent.tools.retain(|t| t.name == "sh");
    let (provider, endpoint, stream, api) = match speaks {
        Speaks::ChatStreamed => (Provider::Openai, format!("{}/v1", server.url), "1", "chat"),
        Speaks::ResponsesStreamed => {
            let endpoint = format!("{}/v1", server.url);
            (Provider::Openai, endpoint, "1", "responses")
        }
        Speaks::Messages => (Provider::Anthropic, server.url.clone(), "0", "messages"),
    };
    agent.model = ModelSpec {
        provider,
        name: Some("local-model".into()),
        endpoint: Some(endpoint),
        ..proxy_model_key()
    };
    let env_vars = [
        ("AGENT_MODEL", "local-model"),
        ("AGENT_STREAM", stream),
        ("AGENT_API", api),
    ];
    agent.container = Some(image_agent_container(script, &env_vars));
    env.create(&run).await;

    let (pod, _) = env.wait_worker(name, 1).await;
    wait_received(&env, name, &server, STREAM_CUT).await;
    wait_result(&env, name, STREAM_CUT - 1).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let (pod, _) = env.wait_worker(name, 2).await;
    env.wait_effect(name, TOOL_KILL).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let (pod, _) = env.wait_worker(name, 3).await;
    // The stream cut at call 3 was asked again: the held call is the server's request 11.
    wait_received(&env, name, &server, CALL_HELD + 1).await;
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
    let path = match speaks {
        Speaks::ChatStreamed => "/v1/chat/completions",
        Speaks::ResponsesStreamed => "/v1/responses",
        Speaks::Messages => "/v1/messages",
    };
    server.assert_received(STEPS + 1 + 2, path);
    let streamed = server
        .received()
        .iter()
        .filter(|r| r.body["stream"] == true)
        .count();
    let want = match speaks {
        Speaks::ChatStreamed | Speaks::ResponsesStreamed => STEPS + 1 + 2,
        // Odd calls: 1, 3 (twice), 5, 7, 9, 11.
        Speaks::Messages => 7,
    };
    assert_eq!(streamed, want, "the calls made as streams");
    let unknown: Vec<i64> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [TOOL_KILL as i64], "{st:?}");
    assert!(st.attempt >= 4, "three resumes: {st:?}");
    env.finish().await;
}

/// The server's answers, in order: a call of the shell tool `sh` for each step (its effect
/// sent to the effects server; step [`TOOL_KILL`] then sleeps), then the final text; before
/// call [`STREAM_CUT`]'s answer, the same stream cut before its last event (after two events,
/// or a Responses stream's `response.created`: a call's has no text deltas); before call
/// [`CALL_HELD`]'s, no answer at all.
fn replies(env: &NodeEnv, name: &str, speaks: Speaks) -> Vec<Reply> {
    let (host, port) = env.effects.addr.rsplit_once(':').unwrap();
    let step = |n: usize| {
        let pause = if n == TOOL_KILL { "sleep 30; " } else { "" };
        let effect =
            format!("echo \"{name} {n} $BATON_STEP $BATON_FENCE\" > /dev/tcp/{host}/{port}");
        format!("bash -c '{effect}'; {pause}echo ok {n}")
    };
    let done = format!("done after {STEPS} steps");
    let pieces = |call: usize| match speaks {
        Speaks::ChatStreamed if call <= STEPS => {
            tool_call_stream(&format!("call_{call}"), "sh", &step(call))
        }
        Speaks::ChatStreamed => answer_stream(&done),
        Speaks::ResponsesStreamed if call <= STEPS => {
            responses_stream(&responses_call(&format!("call_{call}"), "sh", &step(call)))
        }
        Speaks::ResponsesStreamed => responses_stream(&responses_answer(&done)),
        Speaks::Messages if call <= STEPS => messages_stream(&messages_tool_use(
            &format!("toolu_{call}"),
            "sh",
            &step(call),
        )),
        Speaks::Messages => messages_stream(&messages_text(&done)),
    };
    let whole = |call: usize| match (speaks, call % 2) {
        (Speaks::Messages, 0) if call <= STEPS => {
            let message = messages_tool_use(&format!("toolu_{call}"), "sh", &step(call));
            Reply::json(200, &message.to_string())
        }
        (Speaks::Messages, 0) => Reply::json(200, &messages_text(&done).to_string()),
        _ => Reply::sse(pieces(call)),
    };
    let mut replies = Vec::new();
    for call in 1..=STEPS + 1 {
        if call == STREAM_CUT {
            let pieces = pieces(call);
            let cut = 2.min(pieces.len() - 1);
            replies.push(Reply::stall(pieces[..cut].to_vec()));
        }
        if call == CALL_HELD {
            replies.push(Reply::silent());
        }
        replies.push(whole(call));
    }
    replies
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
async fn wait_received(env: &NodeEnv, name: &str, server: &Server, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while server.received().len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "{count} model calls received: {}",
            env.pod_logs(name).await
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
