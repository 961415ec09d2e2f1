//! End to end on the real node, a run that brings its own agent: the agent image the project
//! builds offline (hack/images.sh agents: Debian's Python, the stock `openai` SDK from PyPI,
//! tests/agents/chat_agent.py unmodified), in a container of the run's pod as its own non-root
//! user with no token and no key, its model calls through the worker's gateway to the LiteLLM
//! proxy inside the node's network namespace, which counts the calls that reach the model.
//! The worker killed (kill -9) between two calls: the next pod runs the agent again, answers
//! its recorded calls from the ledger, and the model answers each of the run's calls once.

use std::time::Duration;

use baton::crd::v1alpha1::{
    AgentContainer, LedgerEvent, ModelSpec, PlainEnvVar, Provider, SecretKeyRef,
};
use baton_testkit::common::litellm::{KEY, LiteLlmInNode};
use baton_testkit::e2e::Script;
use baton_testkit::node::*;
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
    let name = "own";
    let mut run = env.scripted(name, &Script::new(1, 100));
    run.spec.input = "count the steps".into();
    let agent = run.spec.agent_mut();
    agent.tools.clear();
    agent.model = ModelSpec {
        provider: Provider::Openai,
        name: Some("mock-gpt".into()),
        endpoint: Some(format!("{}/v1", proxy.url)),
        api_key_secret_ref: Some(SecretKeyRef {
            name: "model-key".into(),
            key: "key".into(),
        }),
        idle_timeout_seconds: Some(60),
        ..ModelSpec::default()
    };
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
