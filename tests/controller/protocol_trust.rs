//! The protocols clients speak (`baton server`'s Responses API and A2A agents) under the one
//! borrow rule (DESIGN §12): a response or a task is an AgentRun its caller creates with its
//! own token, so what it takes from its thread is asked of that caller, the webhook served from
//! this process. A ServiceAccount that may write runs and threads (and read their ledgers) asks for a
//! response of a thread whose agent sends the model key to an endpoint of the thread's choice:
//! where the webhook does not watch, it is shown admitted (the run would carry the key); where it
//! watches, the Responses API answers 403 and A2A a JSON-RPC error, each naming the field and the
//! Secret, and nothing is created. A conversation made from that thread (an AgentThread copying
//! its agent) is refused the same way. A caller who may read the Secret is admitted.

use crate::webhook::{Watched, keyed_thread, users};
use baton::crd::v1alpha1::{AgentRun, AgentThread};
use baton_testkit::controller::*;
use baton_testkit::server::{person, post, rule, start_server};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// Runs, threads and their transcripts, nothing else.
fn writer_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &["agentruns", "agentthreads"],
            &["get", "list", "watch", "create", "patch", "update"],
        ),
        rule(&["ledgersegments"], &["get", "list", "watch"]),
    ]
}

/// The answer refuses the thread's key: a 403 naming the field that borrows it and the Secret.
fn assert_refused_the_key(code: u16, body: &Value) {
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(code, 403, "{body}");
    assert!(
        message.contains("spec.agent.model.apiKeySecretRef.name")
            && message.contains("may not get secrets \"model-key\""),
        "{body}"
    );
}

fn a_response() -> Value {
    json!({"model": "thread/keyed", "input": "hi", "background": true})
}

fn a_conversation() -> Value {
    json!({"metadata": {"agent": "thread/keyed"}})
}

async fn threads_in(ns: &TestNamespace) -> usize {
    let threads = ns.api::<AgentThread>().list(&Default::default()).await;
    threads.unwrap().items.len()
}

fn a_message() -> Value {
    json!({"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {
        "message": {"kind": "message", "messageId": "m1", "role": "user", "parts": [{"kind": "text", "text": "hi"}]},
        "configuration": {"blocking": false},
    }})
}

async fn runs_in(ns: &TestNamespace) -> usize {
    ns.api::<AgentRun>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len()
}

#[tokio::test]
async fn a_response_or_a_task_borrows_only_what_its_caller_may_take_themselves() {
    let (url, _server) = start_server().await;
    let base = |ns: &str| format!("{url}/api/v1/namespaces/{ns}");

    // Unwatched: the writer's response is admitted, the thread's key lent to it.
    let open = TestNamespace::new("protocol-borrow-open").await;
    users(&open).await;
    open.api::<AgentThread>()
        .create(&PostParams::default(), &keyed_thread("keyed"))
        .await
        .unwrap();
    let writer = person(&open, "writer", writer_rules()).await;
    let (code, body) = post(
        &format!("{}/openai/v1/responses", base(&open.name)),
        &writer,
        a_response(),
    )
    .await;
    assert_eq!(code, 200, "unwatched, admitted: {body}");
    let conversations = format!("{}/openai/v1/conversations", base(&open.name));
    let (code, body) = post(&conversations, &writer, a_conversation()).await;
    assert_eq!(code, 200, "unwatched, admitted: {body}");
    open.cleanup().await;

    let w = Watched::new("protocol-borrow").await;
    let threads: Api<AgentThread> = w.ns.api();
    threads
        .create(&PostParams::default(), &keyed_thread("keyed"))
        .await
        .unwrap();
    let writer = person(&w.ns, "writer", writer_rules()).await;
    let responses = format!("{}/openai/v1/responses", base(&w.ns.name));
    let (code, body) = post(&responses, &writer, a_response()).await;
    assert_refused_the_key(code, &body);
    let agent = format!("{}/a2a/threads/keyed", base(&w.ns.name));
    let (code, body) = post(&agent, &writer, a_message()).await;
    assert_eq!((code, &body["id"]), (200, &json!(7)), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("may not get secrets \"model-key\""),
        "{body}"
    );
    let conversations = format!("{}/openai/v1/conversations", base(&w.ns.name));
    let (code, body) = post(&conversations, &writer, a_conversation()).await;
    assert_refused_the_key(code, &body);
    assert_eq!(runs_in(&w.ns).await, 0, "nothing was created");
    assert_eq!(threads_in(&w.ns).await, 1, "no thread but the template");

    // A caller who may read the Secret gets both.
    let mut rules = writer_rules();
    rules.push(PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["secrets".into()]),
        verbs: vec!["get".into()],
        ..PolicyRule::default()
    });
    let reader = person(&w.ns, "reader", rules).await;
    let (code, body) = post(&responses, &reader, a_response()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "queued", "{body}");
    let (_, body) = post(&agent, &reader, a_message()).await;
    assert_eq!(body["result"]["kind"], "task", "{body}");
    assert_eq!(runs_in(&w.ns).await, 2);
    let (code, body) = post(&conversations, &reader, a_conversation()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(threads_in(&w.ns).await, 2);
    w.cleanup().await;
}
