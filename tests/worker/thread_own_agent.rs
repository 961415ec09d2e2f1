//! A thread whose agent is its own container (`tests/agents/chat_agent.py`, the stock `openai`
//! SDK), with the real controller in this process and a real worker and executor for each pod
//! it creates (the test plays the kubelet): the second turn's agent is given the first turn's
//! conversation (`BATON_HISTORY_FILE`: its input and its answer, the answer taken from the
//! turn's `final` since an agent container records no assistant message), and its model sees
//! it before its own input. Killed (kill -9) after its call is recorded, the turn's next
//! attempt gets the same history, and its call is answered from the ledger.

use crate::threads::{T, conversation, create, pairs, start_controller, turn, wait_phase};
use baton::crd::v1alpha1::{AgentRun, AgentSpec, AgentThread, AgentThreadSpec, Phase};
use baton::fence::{Fence, worker_pod_name};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::own_agent::agent_container;
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::answer_stream;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

/// The thread `geo`: each turn's agent is chat_agent.py making one call of `server`.
fn own_agent_thread(server: &Server) -> AgentThread {
    let env = [("AGENT_CALLS", "1"), ("AGENT_MODEL", "local-model")];
    let agent = AgentSpec {
        model: server.openai_model(),
        system_prompt: None,
        max_steps: 10,
        tools: vec![],
        approval: None,
        container: Some(agent_container("chat_agent.py", &env)),
    };
    let spec: AgentThreadSpec = serde_json::from_value(serde_json::json!({
        "agent": agent,
        "lease": {"durationSeconds": 4, "renewSeconds": 1, "startupSeconds": 60},
    }))
    .expect("a thread spec");
    AgentThread::new("geo", spec)
}

/// Starts the worker (and the agent container's executor) of `run`'s pod at `fence` once the
/// controller made it, as a kubelet would.
async fn run_agent_pod(ns: &TestNamespace, run: &str, fence: i64) -> WorkerProc {
    let pod = worker_pod_name(run, Fence::new(fence));
    let pods: Api<Pod> = ns.api();
    wait_until(T, &format!("pod {pod}"), || async {
        pods.get_opt(&pod).await.ok().flatten().is_some()
    })
    .await;
    let runs: Api<AgentRun> = ns.api();
    let joined = runs.get(run).await.unwrap();
    spawn_agent_worker(&joined, fence, &pod, &[("BATON_MODEL_API_KEY", "sk-test")])
}

#[tokio::test]
async fn a_turn_of_an_own_agent_thread_is_given_the_earlier_turns_and_keeps_them_when_resumed() {
    let ns = TestNamespace::new("thread-own-agent").await;
    let server = Server::start(vec![
        Reply::sse(answer_stream("Paris.")),
        Reply::sse(answer_stream("About 2.1 million.")),
    ])
    .await;
    let _controller = start_controller(&ns);
    create(&ns, &own_agent_thread(&server)).await;

    create(&ns, &turn("geo-1", "geo", "What is the capital of France?")).await;
    let mut worker = run_agent_pod(&ns, "geo-1", 1).await;
    assert_eq!(
        worker.wait(crate::EXIT_TIMEOUT).await,
        0,
        "{}",
        worker.log_text()
    );
    let first = wait_phase(&ns, "geo-1", Phase::Succeeded).await;
    let answer = "answer after 1 calls: Paris.";
    assert_eq!(
        first.status.unwrap_or_default().output.as_deref(),
        Some(answer)
    );

    // The second turn's worker is killed once its call is recorded; the next attempt replays.
    create(&ns, &turn("geo-2", "geo", "And its population?")).await;
    let mut worker = run_agent_pod(&ns, "geo-2", 1).await;
    wait_until(T, "the second turn's call answered", || async {
        server.received().len() == 2
    })
    .await;
    let runs: Api<AgentRun> = ns.api();
    wait_until(T, "its call recorded", || async {
        let run = runs.get("geo-2").await.unwrap();
        let ledger = crate::threads::ledger(&ns, &run).await;
        let events = ledger.iter().flat_map(|s| s.spec.events.iter());
        events
            .into_iter()
            .any(|e| matches!(e, baton::crd::v1alpha1::LedgerEvent::GatewayCall { .. }))
    })
    .await;
    worker.kill9().await;
    let mut worker = run_agent_pod(&ns, "geo-2", 2).await;
    assert_eq!(
        worker.wait(crate::EXIT_TIMEOUT).await,
        0,
        "{}",
        worker.log_text()
    );
    let second = wait_phase(&ns, "geo-2", Phase::Succeeded).await;
    let st = second.status.unwrap_or_default();
    assert_eq!(
        st.output.as_deref(),
        Some("answer after 1 calls: About 2.1 million.")
    );
    assert!(st.attempt >= 2, "resumed: {st:?}");

    let received = server.received();
    assert_eq!(
        received.len(),
        2,
        "the resumed call came from the ledger: {received:?}"
    );
    let system = "You are a careful assistant. Answer briefly.";
    assert_eq!(
        conversation(&received[0]),
        pairs(&[
            ("system", system),
            ("user", "step 1 of 1: What is the capital of France?"),
        ])
    );
    assert_eq!(
        conversation(&received[1]),
        pairs(&[
            ("system", system),
            ("user", "What is the capital of France?"),
            ("assistant", answer),
            ("user", "step 1 of 1: And its population?"),
        ]),
        "the earlier turn's input and answer, then the turn's own"
    );
}
