//! An own agent on the OpenAI Responses API (`tests/agents/chat_agent.py` with
//! `AGENT_API=responses`: the stock `openai` SDK's `client.responses.create`, streamed and
//! not) through the worker's gateway, against a server that answers in a set order: killed
//! (kill -9) between two calls, the next attempt answers the recorded calls from the ledger,
//! streamed as they were, and the server answers each call once.

use std::time::Duration;

use crate::EXIT_TIMEOUT;
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{events, segments};
use baton_testkit::common::own_agent::{agent_container, start_attempt};
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::{responses_answer, responses_stream};
use kube::Api;
use kube::api::PostParams;

fn agent_run(server: &Server) -> AgentRun {
    let mut run = scripted_run("responses", vec![], vec![], LeaseSpec::default());
    run.spec.input = "count the steps".into();
    let agent = run.spec.agent_mut();
    agent.model = server.openai_model();
    let env = [
        ("AGENT_API", "responses"),
        ("AGENT_CALLS", "4"),
        ("AGENT_MODEL", "local-model"),
        ("AGENT_PAUSE_MS", "1500"),
    ];
    agent.container = Some(agent_container("chat_agent.py", &env));
    run
}

async fn recorded(ns: &TestNamespace) -> Vec<(i64, String)> {
    let listed = segments(&ns.client, &ns.name, "responses").await;
    let calls = events(&listed).into_iter().filter_map(|(_, e)| match e {
        LedgerEvent::GatewayCall { call, api, .. } => Some((call, api)),
        _ => None,
    });
    calls.collect()
}

async fn start(ns: &TestNamespace, fence: i64) -> WorkerProc {
    start_attempt(
        ns,
        "responses",
        fence,
        &[("BATON_MODEL_API_KEY", "sk-local")],
    )
    .await
}

#[tokio::test]
async fn an_agent_on_the_responses_api_is_replayed_streamed_or_not() {
    let ns = TestNamespace::new("worker-byo-responses").await;
    let server = Server::start(vec![
        Reply::sse(responses_stream(&responses_answer("one is streamed"))),
        Reply::json(200, &responses_answer("two is whole").to_string()),
        Reply::sse(responses_stream(&responses_answer("three is streamed"))),
        Reply::json(200, &responses_answer("four is whole").to_string()),
    ])
    .await;
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &agent_run(&server))
        .await
        .unwrap();

    let mut worker = start(&ns, 1).await;
    wait_until(Duration::from_secs(120), "two calls recorded", || async {
        recorded(&ns).await.len() >= 2
    })
    .await;
    worker.kill9().await;

    let mut worker = start(&ns, 2).await;
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", worker.log_text());
    let st = runs
        .get("responses")
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(
        st.output.as_deref(),
        Some("answer after 4 calls: four is whole")
    );
    server.assert_received(4, "/v1/responses");
    let apis: Vec<_> = recorded(&ns).await;
    let expected: Vec<_> = (1..=4)
        .map(|call| (call, "responses".to_string()))
        .collect();
    assert_eq!(apis, expected);
    let usage = st.usage.unwrap_or_default();
    assert_eq!(
        (usage.model_calls, usage.total_tokens),
        (4, 60),
        "{usage:?}"
    );
}
