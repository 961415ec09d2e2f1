//! A real `baton worker` drives the OpenAI-compatible provider end to end against a local
//! Chat Completions server: a streamed tool call, the tool run once, the final answer, and
//! the API key nowhere but in the request's Authorization header.

use crate::EXIT_TIMEOUT;
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, ModelSpec, Phase, Provider};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::*;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};

const KEY: &str = "sk-live-7c1e4b9a2f6d8e0a3b5c7d9e1f2a4b6c";

fn assert_no_key(what: &str, text: &str) {
    for piece in [KEY, &KEY[8..24], &KEY[KEY.len() - 16..]] {
        assert!(
            !text.contains(piece),
            "the API key leaked into {what}:\n{text}"
        );
    }
}

#[tokio::test]
async fn a_worker_drives_an_openai_compatible_model_end_to_end() {
    let ns = TestNamespace::new("worker-openai").await;
    let counter = counter_file("openai");
    // The command also tries to read the key: from its own environment and its parent's
    // (the executor's: the worker is another process tree, in the pod another container).
    let command = format!(
        "echo ran >> {}; echo key=${{BATON_MODEL_API_KEY:-unset}}; \
         tr '\\0' '\\n' < /proc/$PPID/environ | grep MODEL_API || true",
        counter.display()
    );
    let server = Server::start(vec![
        Reply::sse(tool_call_stream("call_1", "sh", &command)),
        Reply::sse(answer_stream("The answer is 42.")),
    ])
    .await;
    let mut run = scripted_run(
        "oai",
        vec![],
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    run.spec.agent_mut().model = ModelSpec {
        provider: Provider::Openai,
        name: Some("local-model".into()),
        endpoint: Some(format!("{}/v1", server.url)),
        ..ModelSpec::default()
    };
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    let pod = claim(&ns.client, &ns.name, "oai", 1).await;
    let mut worker = spawn_worker_env(
        &ns.name,
        "oai",
        1,
        &pod,
        &["--log-format=json", "--admin-addr=none"],
        &[
            ("BATON_MODEL_API_KEY", KEY),
            ("RUST_LOG", "debug,hyper=info,h2=info,rustls=info"),
        ],
    );
    let code = worker.wait(EXIT_TIMEOUT).await;
    let log = worker.log_text();
    assert_eq!(code, 0, "{log}");

    // The run finished with the model's answer; the tool ran once.
    let run = runs.get("oai").await.unwrap();
    let st = run.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Phase::Finishing, "{st:?}\n{log}");
    assert_eq!(st.outcome, Some(Phase::Succeeded));
    assert_eq!(st.output.as_deref(), Some("The answer is 42."));
    assert_eq!(st.steps, 1);
    assert_eq!(count(&counter), 1, "the tool ran once");

    // The server saw the key only in the header, and the tool's result in the second call.
    let requests = server.received();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for r in &requests {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.header("authorization"), Some(&*format!("Bearer {KEY}")));
        assert_no_key("a request body", &r.body.to_string());
    }
    let results = tool_messages(&requests[1].body);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, "call_1");
    assert!(results[0].1.contains("key=unset"), "{}", results[0].1);
    // The parent's environment, read through /proc, has no key to give.
    assert!(!results[0].1.contains("MODEL_API_KEY="), "{}", results[0].1);

    // The ledger holds the call and its result, and never the key.
    let listed = segments(&ns.client, &ns.name, "oai").await;
    let evs = events(&listed);
    let intent = evs.iter().find_map(|(_, e)| match e {
        LedgerEvent::StepIntent { tool, call_id, .. } => Some((tool.clone(), call_id.clone())),
        _ => None,
    });
    assert_eq!(intent, Some(("sh".to_string(), "call_1".to_string())));
    assert!(matches!(
        &evs.last().unwrap().1,
        LedgerEvent::Final { output } if output == "The answer is 42."
    ));
    assert_no_key("the ledger", &serde_json::to_string(&listed).unwrap());
    assert_no_key("the AgentRun", &serde_json::to_string(&run).unwrap());
    let events: Api<Event> = ns.api();
    let listed_events = events.list(&ListParams::default()).await.unwrap();
    assert_no_key("Events", &serde_json::to_string(&listed_events).unwrap());

    // The log is JSON, one object per line, and never holds the key.
    assert_no_key("the worker log", &log);
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in lines {
        let parsed: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
    ns.cleanup().await;
}
