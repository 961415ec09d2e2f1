//! A run that brings its own agent, on the console: its ledger holds the agent's model calls as
//! the gateway records them (`gatewayCall`: a whole Chat Completions answer, a Messages stream's
//! events, a Responses answer), the steps its tool gateway ran, and a divergence. In a real
//! browser the page shows each model call's text as an assistant entry naming the call and its
//! API, the step between them, and the divergence as a note (it used to show none of the calls);
//! a right-to-left override in an answer is shown as its `\u{202e}` escape, as every page shows
//! one (the live transcript used to put it on the page as it came).

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent};
use baton::fence::Fence;
use baton::ledger::{SEGMENT_BUDGET_BYTES, SegmentStore, encode_events};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use baton_testkit::worker::{messages_stream, messages_text};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::json;

const RUN: &str = "own";

/// The ledger of an agent container's run: three model calls, a step, a divergence.
fn ledger() -> Vec<LedgerEvent> {
    let call = |call: i64, api: &str, response: serde_json::Value| LedgerEvent::GatewayCall {
        call,
        api: api.into(),
        request: json!({"model": "local-model"}),
        response,
    };
    let chat = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message":
        {"role": "assistant", "content": "Let me count the files.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]}}]});
    // A streamed Messages answer, recorded as its events' data in order.
    let frames = messages_stream(&messages_text("There are 3 files."));
    let stream: Vec<serde_json::Value> = frames
        .iter()
        .filter_map(|f| f.split("data: ").nth(1))
        .map(|data| serde_json::from_str(data.trim()).unwrap())
        .collect();
    // A right-to-left override in the answer: shown as its escape, never obeyed.
    let responses = json!({"status": "completed", "output": [{"type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "Done: 3 files. rm \u{202E}fdp.exe"}]}]});
    vec![
        LedgerEvent::AttemptStarted {
            fence: Fence::new(1),
            pod: "own-w1".into(),
        },
        call(1, "chat.completions", chat),
        LedgerEvent::StepIntent {
            step: 1,
            tool: "sh".into(),
            call_id: "c1".into(),
            input: r#"{"command":"ls | wc -l"}"#.into(),
            idempotent: false,
        },
        LedgerEvent::StepResult {
            step: 1,
            output: "3".into(),
            is_error: false,
        },
        call(2, "messages", serde_json::Value::Array(stream)),
        LedgerEvent::GatewayDiverged {
            call: 3,
            field: "/messages/0/content".into(),
        },
        call(3, "responses", responses),
        LedgerEvent::Final {
            output: "Done: 3 files. rm \u{202E}fdp.exe".into(),
        },
    ]
}

#[tokio::test]
async fn the_console_shows_an_own_agents_model_calls_steps_and_divergence() {
    let ns = TestNamespace::new("server-own-agent").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    // No controller: the run stays as created, and the test writes its ledger.
    let run = scripted_run(RUN, vec![final_turn("-", 0)], vec![], LeaseSpec::default());
    let runs: Api<AgentRun> = ns.api();
    let created = runs.create(&PostParams::default(), &run).await.unwrap();
    let store = SegmentStore::for_run(ns.client.clone(), &created);
    let groups = encode_events(ledger(), SEGMENT_BUDGET_BYTES).unwrap();
    for (tail, group) in groups.into_iter().enumerate() {
        store
            .append(tail as i64, Fence::new(1), group)
            .await
            .expect("writing the ledger");
    }
    assert!(created.uid().is_some());

    let env = [
        ("CONSOLE_URL", url.as_str()),
        ("TOKEN", alice.as_str()),
        ("NS", ns.name.as_str()),
        ("RUN", RUN),
    ];
    browser_check("own_agent.mjs", &env).await;
    ns.cleanup().await;
}
