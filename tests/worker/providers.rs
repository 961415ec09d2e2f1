//! A real `baton worker` with each HTTP provider against model servers nobody here wrote and
//! one that misbehaves: through the LiteLLM proxy (whose Messages endpoint answers a streamed
//! request with a whole JSON message: the run stayed `Running` with no model call, for as long
//! as one waited), each run succeeds with its usage recorded; a server that answers an HTML
//! page fails its run for good with `ProviderError`, its message on the run and in the ledger;
//! one that never answers makes the attempt give up, saying why in an Event.

use crate::EXIT_TIMEOUT;
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, ModelSpec, Phase, Provider};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::events::notes;
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;

/// Runs `name` with `model` through one real worker to its end; the run as it ended.
async fn run_with(ns: &TestNamespace, name: &str, model: ModelSpec, key: &str) -> AgentRun {
    let mut run = scripted_run(name, vec![], vec![], LeaseSpec::default());
    run.spec.agent_mut().model = model;
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    let pod = claim(&ns.client, &ns.name, name, 1).await;
    let args = ["--log-format=json", "--admin-addr=none"];
    let mut worker = spawn_worker_env(
        &ns.name,
        name,
        1,
        &pod,
        &args,
        &[("BATON_MODEL_API_KEY", key)],
    );
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{name}: {}", worker.log_text());
    runs.get(name).await.unwrap()
}

fn model(provider: Provider, name: &str, endpoint: String) -> ModelSpec {
    ModelSpec {
        provider,
        name: Some(name.into()),
        endpoint: Some(endpoint),
        idle_timeout_seconds: Some(30),
        ..ModelSpec::default()
    }
}

#[tokio::test]
async fn each_provider_through_the_litellm_proxy_ends_its_run_with_its_answer() {
    let ns = TestNamespace::new("worker-litellm").await;
    let proxy = LiteLlm::start().await;
    let cases = [
        ("through-messages", Provider::Anthropic, proxy.url.clone()),
        (
            "through-chat",
            Provider::Openai,
            format!("{}/v1", proxy.url),
        ),
    ];
    for (name, provider, endpoint) in cases {
        let spec = model(provider, "mock-claude", endpoint);
        let run = run_with(&ns, name, spec, litellm::KEY).await;
        let st = run.status.unwrap_or_default();
        assert_eq!(st.phase, Phase::Finishing, "{name}: {st:?}");
        assert_eq!(st.outcome, Some(Phase::Succeeded), "{name}: {st:?}");
        assert_eq!(st.output.as_deref(), Some("hello from the mock"), "{name}");
        let usage = st.usage.expect("the run's usage");
        assert_eq!(usage.model_calls, 1, "{name}: {usage:?}");
        assert_eq!(usage.unknown_model_calls, 0, "{name}: {usage:?}");
        assert!(
            usage.input_tokens > 0 && usage.output_tokens > 0,
            "{name}: {usage:?}"
        );
    }
}

#[tokio::test]
async fn a_page_instead_of_an_answer_fails_the_run_saying_what_came() {
    let ns = TestNamespace::new("worker-page").await;
    let page = "<html><body>Please sign in to the gateway</body></html>";
    let server = Server::start(vec![Reply::page(200, "text/html", page)]).await;
    let spec = model(Provider::Anthropic, "claude", server.url.clone());
    let run = run_with(&ns, "paged", spec, "sk-ant-unused-key-0000").await;
    let st = run.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Failed), "{st:?}");
    assert_eq!(st.reason.as_deref(), Some("ProviderError"), "{st:?}");
    let message = st.message.unwrap_or_default();
    for said in ["HTTP 200", "content type text/html", "Please sign in"] {
        assert!(
            message.contains(said),
            "{said:?} not in the run's message: {message}"
        );
    }
    let listed = segments(&ns.client, &ns.name, "paged").await;
    let recorded = events(&listed).into_iter().find_map(|(_, e)| match e {
        LedgerEvent::Failed { reason, message } => Some((reason.as_str().to_string(), message)),
        _ => None,
    });
    let (reason, in_ledger) = recorded.expect("a failed event in the ledger");
    assert_eq!(reason, "ProviderError");
    assert_eq!(in_ledger, message, "the ledger and the run say the same");
    assert_eq!(
        server.received().len(),
        1,
        "no retry: the same request gets the same page"
    );
}

/// A server that fails every call with a retryable error: the worker calls it 8 times, then
/// ends its attempt without a decision (the next attempt may get through), and a Warning
/// Event on the run says why, the last error in it.
#[tokio::test]
async fn an_attempt_whose_model_never_answers_says_why_it_gave_up() {
    let ns = TestNamespace::new("worker-gave-up").await;
    // With no replies scripted, every request gets a 500.
    let server = Server::start(vec![]).await;
    let mut run = scripted_run("unanswered", vec![], vec![], LeaseSpec::default());
    run.spec.agent_mut().model = model(Provider::Openai, "m", format!("{}/v1", server.url));
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();
    let pod = claim(&ns.client, &ns.name, "unanswered", 1).await;
    let args = ["--log-format=json", "--admin-addr=none"];
    let mut worker = spawn_worker_env(&ns.name, "unanswered", 1, &pod, &args, &[]);
    // 8 calls, backing off 1, 2, 4 … 60 s (half of each at random) between them.
    let code = worker.wait(Duration::from_secs(240)).await;
    assert_ne!(
        code,
        0,
        "an attempt that gave up dies: {}",
        worker.log_text()
    );
    assert_eq!(server.received().len(), 8, "the worker's budget of calls");
    let said = notes(&ns.api(), "unanswered", "AttemptGaveUp").await;
    assert_eq!(said.len(), 1, "{said:?}");
    for words in ["HTTP 500", "no more replies", "gave up after 8 attempts"] {
        assert!(said[0].contains(words), "{words:?} not in {said:?}");
    }
    let st = runs
        .get("unanswered")
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert!(
        !st.phase.is_terminal(),
        "no decision: another attempt may get through: {st:?}"
    );
}
