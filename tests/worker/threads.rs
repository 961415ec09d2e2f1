//! Threads end to end on the API server: the real controller in this process, a real
//! `baton worker` process for each pod it creates (the test plays the kubelet), and the
//! OpenAI-compatible test server recording every request the model gets.
//! - the second turn's request carries the first turn's conversation, in order, tool call and
//!   result included, then its own input;
//! - a turn whose worker is killed -9 mid-step is resumed with the very same history;
//! - a turn whose earlier turn is deleted before it runs fails `HistoryUnavailable`, naming it;
//! - `onBusy: Reject` ends a new turn `ThreadBusy`; `onBusy: Interrupt` stops the live turn
//!   (`Stopped`, reason `Interrupted`) and the new turn's model sees what it recorded.

use std::time::Duration;

use crate::EXIT_TIMEOUT;
use baton::crd::v1alpha1::{
    AgentRun, AgentSpec, AgentThread, AgentThreadSpec, HistoryTurn, LedgerEvent, LedgerSegment,
    ModelSpec, Phase, Provider, ThreadPhase,
};
use baton::fence::{Fence, worker_pod_name};
use baton::ledger::SegmentStore;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Received, Reply, Server};
use baton_testkit::worker::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::Value;

pub(crate) const T: Duration = Duration::from_secs(60);

pub(crate) use baton_testkit::common::in_process::start_controller;

/// A thread whose model is the test server, with a shell tool, and short leases.
pub(crate) fn thread(name: &str, server: &Server) -> AgentThread {
    thread_busy(name, server, "Enqueue")
}

/// [`thread`] with the busy policy `on_busy`.
pub(crate) fn thread_busy(name: &str, server: &Server, on_busy: &str) -> AgentThread {
    let agent = AgentSpec {
        model: ModelSpec {
            provider: Provider::Openai,
            name: Some("local-model".into()),
            endpoint: Some(format!("{}/v1", server.url)),
            ..ModelSpec::default()
        },
        system_prompt: Some("You answer geography questions.".into()),
        max_steps: 10,
        tools: vec![shell_tool("sh", false)],
        approval: None,
        container: None,
    };
    let spec: AgentThreadSpec = serde_json::from_value(serde_json::json!({
        "agent": agent,
        "lease": {"durationSeconds": 4, "renewSeconds": 1, "startupSeconds": 60},
        "onBusy": on_busy,
    }))
    .expect("a thread spec");
    AgentThread::new(name, spec)
}

/// A turn of `thread`, as a user writes it: its input and its thread, nothing else.
pub(crate) fn turn(name: &str, thread: &str, input: &str) -> AgentRun {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"input": input, "thread": thread},
    }))
    .expect("a turn")
}

pub(crate) async fn create<K>(ns: &TestNamespace, object: &K)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let api: Api<K> = ns.api();
    api.create(&PostParams::default(), object)
        .await
        .expect("creating an object");
}

/// Waits for the controller to create the worker pod of `run` at `fence`, then starts the
/// worker it names (as a kubelet would).
pub(crate) async fn run_pod(ns: &TestNamespace, run: &str, fence: i64) -> WorkerProc {
    let pod = worker_pod_name(run, Fence::new(fence));
    let pods: Api<Pod> = ns.api();
    wait_until(T, &format!("pod {pod}"), || async {
        pods.get_opt(&pod).await.ok().flatten().is_some()
    })
    .await;
    spawn_worker_env(
        &ns.name,
        run,
        fence,
        &pod,
        &["--admin-addr=none"],
        &[("BATON_MODEL_API_KEY", "sk-test")],
    )
}

pub(crate) async fn wait_phase(ns: &TestNamespace, run: &str, phase: Phase) -> AgentRun {
    let runs: Api<AgentRun> = ns.api();
    wait_until(T, &format!("{run} {phase}"), || async {
        let got = runs.get(run).await.unwrap();
        got.status.is_some_and(|s| s.phase == phase)
    })
    .await;
    runs.get(run).await.unwrap()
}

/// A turn from creation to `Succeeded`, its one worker run to the end.
pub(crate) async fn whole_turn(ns: &TestNamespace, name: &str, input: &str) -> AgentRun {
    create(ns, &turn(name, "geo", input)).await;
    let mut worker = run_pod(ns, name, 1).await;
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", worker.log_text());
    wait_phase(ns, name, Phase::Succeeded).await
}

/// The messages of a recorded Chat Completions request, as (role, text) pairs; a tool call is
/// `assistant` with `call <name> <arguments>`, a tool result is `tool` with its content.
pub(crate) fn conversation(request: &Received) -> Vec<(String, String)> {
    let messages = request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    messages
        .iter()
        .flat_map(|m| {
            let role = m["role"].as_str().unwrap_or_default().to_string();
            let mut out = vec![(
                role.clone(),
                m["content"].as_str().unwrap_or_default().into(),
            )];
            for call in m["tool_calls"].as_array().into_iter().flatten() {
                let f = &call["function"];
                let text = format!(
                    "call {} {}",
                    f["name"].as_str().unwrap_or_default(),
                    f["arguments"].as_str().unwrap_or_default()
                );
                out.push((role.clone(), text));
            }
            out
        })
        .collect()
}

pub(crate) fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(r, t)| (r.to_string(), t.to_string()))
        .collect()
}

pub(crate) async fn ledger(ns: &TestNamespace, run: &AgentRun) -> Vec<LedgerSegment> {
    SegmentStore::for_run(ns.client.clone(), run)
        .list()
        .await
        .expect("the turn's ledger")
}

#[tokio::test]
async fn the_second_turn_sends_the_first_turns_conversation_then_its_own_input() {
    let ns = TestNamespace::new("thread-history").await;
    let server = Server::start(vec![
        Reply::sse(tool_call_stream("call_1", "sh", "echo Paris")),
        Reply::sse(answer_stream("The capital of France is Paris.")),
        Reply::sse(answer_stream("About 2.1 million people.")),
    ])
    .await;
    let _controller = start_controller(&ns);
    create(&ns, &thread("geo", &server)).await;

    let first = whole_turn(&ns, "geo-1", "What is the capital of France?").await;
    let second = whole_turn(&ns, "geo-2", "And its population?").await;

    let received = server.received();
    assert_eq!(received.len(), 3, "{received:?}");
    // The first turn's first request: the system prompt and its input, nothing before.
    assert_eq!(
        conversation(&received[0]),
        pairs(&[
            ("system", "You answer geography questions."),
            ("user", "What is the capital of France?"),
        ])
    );
    assert_eq!(
        conversation(&received[2]),
        pairs(&[
            ("system", "You answer geography questions."),
            ("user", "What is the capital of France?"),
            ("assistant", "Let me check."),
            ("assistant", r#"call sh {"command":"echo Paris"}"#),
            ("tool", "Paris\n[exit code: 0]"),
            ("assistant", "The capital of France is Paris."),
            ("user", "And its population?"),
        ])
    );
    // The second turn took its thread's agent, is owned by the thread, and its first seal
    // fixed the first turn up to the end of its ledger.
    assert_eq!(second.spec.agent.as_ref().unwrap().max_steps, 10);
    assert!(
        second
            .owner_references()
            .iter()
            .any(|o| o.kind == "AgentThread" && o.name == "geo")
    );
    let first_len = ledger(&ns, &first).await.len() as i64;
    let seal = &ledger(&ns, &second).await[0].spec.events;
    assert_eq!(
        seal.get(1),
        Some(&LedgerEvent::History {
            thread: "geo".into(),
            turns: vec![HistoryTurn {
                run: "geo-1".into(),
                uid: first.uid().unwrap(),
                up_to: first_len,
                ledger_backend: Some(baton::crd::v1alpha1::LedgerBackend::LedgerSegments),
            }],
            context: None,
        }),
        "{seal:?}"
    );
    // The thread's status follows its turns.
    let threads: Api<AgentThread> = ns.api();
    wait_until(T, "the thread's status", || async {
        let t = threads.get("geo").await.unwrap();
        t.status.is_some_and(|s| {
            s.turns == 2
                && s.phase == ThreadPhase::Idle
                && s.last_turn.as_deref() == Some("geo-2")
                && s.last_turn_phase == Some(Phase::Succeeded)
                && s.usage.model_calls == 3
        })
    })
    .await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_turn_killed_mid_step_is_resumed_with_the_very_same_history() {
    let ns = TestNamespace::new("thread-resume").await;
    let counter = counter_file("thread-resume");
    let slow = format!("echo ran >> {}; sleep 30", counter.display());
    let server = Server::start(vec![
        Reply::sse(answer_stream("Paris.")),
        Reply::sse(tool_call_stream("call_2", "sh", &slow)),
        Reply::sse(answer_stream("I could not tell; the count is unknown.")),
    ])
    .await;
    let _controller = start_controller(&ns);
    create(&ns, &thread("geo", &server)).await;
    whole_turn(&ns, "geo-1", "Capital of France?").await;

    create(&ns, &turn("geo-2", "geo", "Count its museums.")).await;
    let mut first_worker = run_pod(&ns, "geo-2", 1).await;
    wait_until(T, "the slow step to start", || async {
        count(&counter) == 1
    })
    .await;
    first_worker.kill9().await;
    let mut second_worker = run_pod(&ns, "geo-2", 2).await;
    let code = second_worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", second_worker.log_text());
    wait_phase(&ns, "geo-2", Phase::Succeeded).await;
    assert_eq!(
        count(&counter),
        1,
        "the step whose effect is unknown ran again"
    );

    let received = server.received();
    assert_eq!(received.len(), 3, "{received:?}");
    let before: Vec<Value> = received[1].body["messages"].as_array().unwrap().clone();
    let after: Vec<Value> = received[2].body["messages"].as_array().unwrap().clone();
    // The resumed attempt sends, byte for byte, what the killed one sent, then its step.
    assert_eq!(
        serde_json::to_string(&after[..before.len()]).unwrap(),
        serde_json::to_string(&before).unwrap()
    );
    assert_eq!(
        conversation(&received[1])[1..],
        pairs(&[
            ("user", "Capital of France?"),
            ("assistant", "Paris."),
            ("user", "Count its museums."),
        ])[..]
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_turn_whose_earlier_turn_is_deleted_fails_naming_it() {
    let ns = TestNamespace::new("thread-gone").await;
    let server = Server::start(vec![Reply::sse(answer_stream("Paris."))]).await;
    let _controller = start_controller(&ns);
    create(&ns, &thread("geo", &server)).await;
    let first = whole_turn(&ns, "geo-1", "Capital of France?").await;

    create(&ns, &turn("geo-2", "geo", "And its population?")).await;
    // Sealed (its history fixed) and not started yet: the first turn is deleted, with its
    // ledger, as the garbage collector would delete it.
    wait_phase(&ns, "geo-2", Phase::Running).await;
    let runs: Api<AgentRun> = ns.api();
    runs.delete("geo-1", &DeleteParams::default())
        .await
        .unwrap();
    let segments: Api<LedgerSegment> = ns.api();
    let of_first = ListParams::default().labels(&format!(
        "{}={}",
        baton::crd::RUN_UID_LABEL,
        first.uid().unwrap()
    ));
    segments
        .delete_collection(&DeleteParams::default(), &of_first)
        .await
        .unwrap();

    let mut worker = run_pod(&ns, "geo-2", 1).await;
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", worker.log_text());
    let failed = wait_phase(&ns, "geo-2", Phase::Failed).await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("HistoryUnavailable"));
    let message = status.message.unwrap_or_default();
    assert!(message.contains("geo-1"), "{message}");
    // The model was never asked anything with a history other than the one fixed.
    assert_eq!(server.received().len(), 1);
    ns.cleanup().await;
}

#[tokio::test]
async fn a_turn_of_a_busy_thread_that_rejects_ends_thread_busy_at_once() {
    let ns = TestNamespace::new("thread-reject").await;
    let server = Server::start(vec![]).await;
    let _controller = start_controller(&ns);
    create(&ns, &thread_busy("geo", &server, "Reject")).await;
    // The first turn is claimed and stays live (no worker is started for it).
    create(&ns, &turn("geo-1", "geo", "Capital of France?")).await;
    wait_phase(&ns, "geo-1", Phase::Running).await;
    create(&ns, &turn("geo-2", "geo", "And its population?")).await;
    let refused = wait_phase(&ns, "geo-2", Phase::Failed).await;
    let status = refused.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("ThreadBusy"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("geo-1") && message.contains("Reject"),
        "{message}"
    );
    let runs: Api<AgentRun> = ns.api();
    let live = runs.get("geo-1").await.unwrap();
    assert_eq!(live.status.unwrap().phase, Phase::Running);
    assert!(!live.spec.stop);
    ns.cleanup().await;
}

#[tokio::test]
async fn a_turn_of_a_busy_thread_that_interrupts_stops_the_live_turn_and_carries_it_on() {
    let ns = TestNamespace::new("thread-interrupt").await;
    let counter = counter_file("thread-interrupt");
    let slow = format!("echo ran >> {}; sleep 30", counter.display());
    let server = Server::start(vec![
        Reply::sse(tool_call_stream("call_1", "sh", &slow)),
        Reply::sse(answer_stream("Stopped that; here is the short answer.")),
    ])
    .await;
    let _controller = start_controller(&ns);
    create(&ns, &thread_busy("geo", &server, "Interrupt")).await;
    create(&ns, &turn("geo-1", "geo", "List every museum of Paris.")).await;
    let mut first = run_pod(&ns, "geo-1", 1).await;
    wait_until(T, "the slow step to start", || async {
        count(&counter) == 1
    })
    .await;

    create(&ns, &turn("geo-2", "geo", "Never mind, just the Louvre.")).await;
    let stopped = wait_phase(&ns, "geo-1", Phase::Stopped).await;
    let code = first.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", first.log_text());
    let status = stopped.status.clone().unwrap();
    assert_eq!(status.reason.as_deref(), Some("Interrupted"));
    assert!(status.message.unwrap_or_default().contains("geo-2"));
    let mut second = run_pod(&ns, "geo-2", 1).await;
    let code = second.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", second.log_text());
    wait_phase(&ns, "geo-2", Phase::Succeeded).await;
    assert_eq!(count(&counter), 1);

    // The new turn's model sees the stopped turn up to where it stopped: its call answered
    // (never a call without its result), then the new input.
    let received = server.received();
    assert_eq!(received.len(), 2, "{received:?}");
    let seen = conversation(&received[1]);
    let roles: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "assistant", "tool", "user"],
        "{seen:?}"
    );
    assert_eq!(seen[1].1, "List every museum of Paris.");
    assert_eq!(seen[5].1, "Never mind, just the Louvre.");
    ns.cleanup().await;
}
