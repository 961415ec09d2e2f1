//! The platform behaviour baton's protocol relies on, proven against a real API server:
//! round trips, 409 on stale writes, AlreadyExists on create, schema validation of bad
//! manifests, and the fenced ledger append.

use baton_testkit::common::TestNamespace;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec as K8sLeaseSpec};
use kube::api::{ApiResource, DynamicObject, ObjectMeta, PostParams};
use kube::{Api, CustomResourceExt, ResourceExt};
use serde::Deserialize;
use serde_json::json;

use baton::crd::v1alpha1::*;
use baton::fence::Fence;
use baton::kube_util::{is_already_exists, is_conflict};
use baton::ledger::{LedgerError, SegmentStore};
use baton::status::{StatusError, cas_status};

fn minimal_run(name: &str) -> AgentRun {
    AgentRun::builder(name)
        .input("say hello")
        .reply("hello")
        .build()
}

#[tokio::test]
async fn agent_run_round_trips_with_server_side_defaults() {
    let ns = TestNamespace::new("round-trip").await;
    let runs: Api<AgentRun> = ns.api();
    let created = runs
        .create(&PostParams::default(), &minimal_run("hello"))
        .await
        .unwrap();
    let fetched = runs.get("hello").await.unwrap();
    assert_eq!(fetched.spec, created.spec);
    assert_eq!(fetched.spec.input, "say hello");
    assert_eq!(fetched.spec.max_attempts, 3, "default from the schema");
    assert_eq!(
        fetched.spec.lease,
        LeaseSpec {
            duration_seconds: 30,
            renew_seconds: 10,
            startup_seconds: 300
        }
    );
    assert_eq!(fetched.spec.agent().unwrap().max_steps, 50);
    assert_eq!(
        fetched.spec.agent().unwrap().model.script[0]
            .text
            .as_deref(),
        Some("hello")
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_status_write_with_a_stale_resource_version_gets_409() {
    let ns = TestNamespace::new("status-409").await;
    let runs: Api<AgentRun> = ns.api();
    let run = runs
        .create(&PostParams::default(), &minimal_run("cas"))
        .await
        .unwrap();
    let first = AgentRunStatus {
        phase: Phase::Running,
        fence: Fence::new(1),
        attempt: 1,
        ..Default::default()
    };
    let updated = cas_status(&runs, &run, first).await.unwrap();
    assert_eq!(updated.status.as_ref().unwrap().fence, Fence::new(1));

    // A second writer still holding the first read must be refused, not overwrite.
    let stale = AgentRunStatus {
        phase: Phase::Handoff,
        fence: Fence::new(1),
        ..Default::default()
    };
    let err = cas_status(&runs, &run, stale).await.unwrap_err();
    assert!(matches!(err, StatusError::Conflict { .. }), "got {err:?}");
    assert_eq!(
        runs.get("cas").await.unwrap().status.unwrap().phase,
        Phase::Running
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn creating_a_segment_whose_name_exists_gets_already_exists() {
    let ns = TestNamespace::new("segment-exists").await;
    let segments: Api<LedgerSegment> = ns.api();
    let seg = LedgerSegment::new(
        "run-000001",
        LedgerSegmentSpec {
            run: "run".into(),
            seq: 1,
            fence: Fence::new(1),
            format: 1,
            events: vec![LedgerEvent::Handoff],
        },
    );
    segments.create(&PostParams::default(), &seg).await.unwrap();
    let err = segments
        .create(&PostParams::default(), &seg)
        .await
        .unwrap_err();
    assert!(is_already_exists(&err), "got {err:?}");
    ns.cleanup().await;
}

#[tokio::test]
async fn a_lease_update_with_a_stale_resource_version_gets_409() {
    let ns = TestNamespace::new("lease-409").await;
    let leases: Api<Lease> = ns.api();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("l".into()),
            ..Default::default()
        },
        spec: Some(K8sLeaseSpec {
            holder_identity: Some("a".into()),
            ..Default::default()
        }),
    };
    let read = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut first = read.clone();
    first.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("l", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = read;
    stale.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let err = leases
        .replace("l", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(is_conflict(&err), "got {err:?}");
    ns.cleanup().await;
}

/// Each malformed manifest and the field the API server's refusal must name.
fn malformed_manifests() -> Vec<(&'static str, serde_json::Value, &'static str)> {
    let model = json!({ "provider": "scripted", "script": [{ "text": "x" }] });
    vec![
        (
            "unknown provider",
            json!({ "input": "x", "agent": { "model": { "provider": "gemini" } } }),
            "spec.agent.model.provider",
        ),
        (
            "missing input",
            json!({ "agent": { "model": model } }),
            "spec.input",
        ),
        (
            "empty input",
            json!({ "input": "", "agent": { "model": model } }),
            "spec.input",
        ),
        ("missing agent", json!({ "input": "x" }), "spec.agent"),
        (
            "negative lease duration",
            json!({ "input": "x", "agent": { "model": model }, "lease": { "durationSeconds": -5 } }),
            "spec.lease.durationSeconds",
        ),
        (
            "wrong type",
            json!({ "input": "x", "agent": { "model": model }, "maxAttempts": "three" }),
            "spec.maxAttempts",
        ),
        (
            "zero max attempts",
            json!({ "input": "x", "agent": { "model": model }, "maxAttempts": 0 }),
            "spec.maxAttempts",
        ),
        (
            "wrong tool kind",
            json!({ "input": "x", "agent": { "model": model, "tools": [{ "name": "t", "kind": "ftp" }] } }),
            "spec.agent.tools.kind",
        ),
        (
            "tool without a kind",
            json!({ "input": "x", "agent": { "model": model, "tools": [{ "name": "t" }] } }),
            "spec.agent.tools.kind",
        ),
        (
            "bad thread key",
            json!({ "input": "x", "agent": { "model": model }, "threadKey": "Not A Key" }),
            "spec.threadKey",
        ),
        (
            "negative token budget",
            json!({ "input": "x", "agent": { "model": model }, "budget": { "maxTokens": -1 } }),
            "spec.budget.maxTokens",
        ),
        (
            "zero deadline",
            json!({ "input": "x", "agent": { "model": model }, "budget": { "deadlineSeconds": 0 } }),
            "spec.budget.deadlineSeconds",
        ),
        (
            "zero approval timeout",
            json!({ "input": "x", "agent": { "model": model }, "approvalTimeoutSeconds": 0 }),
            "spec.approvalTimeoutSeconds",
        ),
        (
            "a decision that is neither Approve nor Deny",
            json!({ "input": "x", "agent": { "model": model }, "approvals": [{ "step": 1, "callId": "c", "decision": "Maybe" }] }),
            "spec.approvals.decision",
        ),
        (
            "a decision without its call",
            json!({ "input": "x", "agent": { "model": model }, "approvals": [{ "step": 1, "decision": "Approve" }] }),
            "spec.approvals.callId",
        ),
        (
            "an approval policy that does not exist",
            json!({ "input": "x", "agent": { "model": model, "approval": "Sometimes" } }),
            "spec.agent.approval",
        ),
        (
            "bad runtime class",
            json!({ "input": "x", "agent": { "model": model }, "worker": { "runtimeClassName": "No Such" } }),
            "spec.worker.runtimeClassName",
        ),
        (
            "workspace without a size",
            json!({ "input": "x", "agent": { "model": model }, "workspace": { "storageClassName": "x" } }),
            "spec.workspace.size",
        ),
        (
            "wrong workspace access mode",
            json!({ "input": "x", "agent": { "model": model }, "workspace": { "size": "1Gi", "accessModes": ["ReadOnlyMany"] } }),
            "spec.workspace.accessModes",
        ),
    ]
}

#[tokio::test]
async fn malformed_agent_runs_are_refused_with_a_message_naming_the_field() {
    let ns = TestNamespace::new("malformed").await;
    let ar = ApiResource::erase::<AgentRun>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &ar);
    for (i, (what, spec, field)) in malformed_manifests().into_iter().enumerate() {
        let mut obj = DynamicObject::new(&format!("bad-{i}"), &ar);
        obj.data = json!({ "spec": spec });
        let err = api
            .create(&PostParams::default(), &obj)
            .await
            .expect_err(what);
        // Newer servers name list items (`tools[0].kind`), 1.20 does not (`tools.kind`).
        let message = without_indices(&err.to_string());
        assert!(
            message.contains(field),
            "{what}: refusal does not name {field}: {message}"
        );
        assert!(
            message.contains("Invalid") || message.contains("invalid"),
            "{what}: {message}"
        );
    }
    ns.cleanup().await;
}

/// Drops list indices (`[0]`) from field paths; keeps every other bracket (the server lists
/// several causes as `[a, b]`).
fn without_indices(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && after[digits..].starts_with(']') {
            rest = &after[digits + 1..];
        } else {
            out.push('[');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn list_indices_are_dropped_from_field_paths_only() {
    assert_eq!(
        without_indices("x [spec.tools[0].kind: bad, y[12]]"),
        "x [spec.tools.kind: bad, y]"
    );
}

fn store_for(run: &AgentRun, client: kube::Client) -> SegmentStore {
    SegmentStore::for_run(client, run)
}

#[tokio::test]
async fn fenced_append_follows_the_protocol_on_a_real_server() {
    let ns = TestNamespace::new("fenced-append").await;
    let runs: Api<AgentRun> = ns.api();
    let run = runs
        .create(&PostParams::default(), &minimal_run("ledger"))
        .await
        .unwrap();
    let store = store_for(&run, ns.client.clone());

    // Fence 1 appends at 1; a retry of the same write at 1 is its own, and succeeds.
    let started = vec![LedgerEvent::AttemptStarted {
        fence: Fence::new(1),
        pod: "ledger-w1".into(),
    }];
    assert_eq!(
        store
            .append(0, Fence::new(1), started.clone())
            .await
            .unwrap()
            .tail,
        1
    );
    let retried = store.append(0, Fence::new(1), started).await.unwrap();
    assert_eq!((retried.tail, retried.slipped.len()), (1, 0));

    // The controller seals for fence 2 at position 2.
    let seal = vec![LedgerEvent::Claimed {
        fence: Fence::new(2),
        pod: "ledger-w2".into(),
    }];
    store.append(1, Fence::new(2), seal).await.unwrap();

    // The old owner's next append collides with the seal: it lost the run.
    let late = vec![LedgerEvent::ModelDelta {
        text: "zombie".into(),
    }];
    let err = store.append(1, Fence::new(1), late).await.unwrap_err();
    assert!(
        matches!(
            err,
            LedgerError::Superseded { seq: 2, ours, theirs }
                if ours == Fence::new(1) && theirs == Fence::new(2)
        ),
        "got {err:?}"
    );
    assert!(err.is_lost());

    // A writer with a newer fence that thought the tail was 1 replays what slipped in.
    let appended = store
        .append(1, Fence::new(3), vec![LedgerEvent::Handoff])
        .await
        .unwrap();
    assert_eq!(appended.tail, 3);
    assert_eq!(appended.slipped.len(), 1);
    assert_eq!(appended.slipped[0].spec.fence, Fence::new(2));

    let all = store.list().await.unwrap();
    assert_eq!(
        all.iter().map(|s| s.spec.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(
        all.iter()
            .all(|s| s.owner_references().iter().any(|o| o.name == "ledger"))
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn an_event_too_large_for_one_segment_is_split_and_replayed_whole() {
    let ns = TestNamespace::new("split").await;
    let runs: Api<AgentRun> = ns.api();
    let run = runs
        .create(&PostParams::default(), &minimal_run("big"))
        .await
        .unwrap();
    let store = store_for(&run, ns.client.clone()).with_budget(4096);
    let big = "y".repeat(20_000);
    let events = vec![
        LedgerEvent::AttemptStarted {
            fence: Fence::new(1),
            pod: "big-w1".into(),
        },
        LedgerEvent::Message {
            role: Role::Assistant,
            content: big.clone(),
        },
    ];
    let appended = store.append(0, Fence::new(1), events).await.unwrap();
    assert!(
        appended.tail > 2,
        "split over several segments, got {}",
        appended.tail
    );
    let replay = baton::ledger::Replay::from_segments(&store.list().await.unwrap()).unwrap();
    assert_eq!(replay.salvage(), big);
    ns.cleanup().await;
}

#[test]
fn crd_names_and_short_names_are_as_documented() {
    assert_eq!(AgentRun::crd_name(), "agentruns.baton.dev");
    assert_eq!(AgentRun::shortnames(), &["ar"]);
    assert_eq!(LedgerSegment::crd_name(), "ledgersegments.baton.dev");
    let _ = ResourceExt::name_any(&minimal_run("x"));
}

/// Every manifest in examples/ is accepted by the API server as it stands (a server-side dry
/// run against the generated CRD) and passes the controller's own checks: a run's spec, a
/// thread's agent as its turns get it; a turn names a thread of its file and sets no agent.
#[tokio::test]
async fn every_example_is_a_valid_agent_run() {
    let ns = TestNamespace::new("examples").await;
    let api_of = |kind: &str| {
        let ar = match kind {
            "AgentThread" => ApiResource::erase::<AgentThread>(&()),
            _ => ApiResource::erase::<AgentRun>(&()),
        };
        Api::<DynamicObject>::namespaced_with(ns.client.clone(), &ns.name, &ar)
    };
    let mut threads = std::collections::BTreeMap::new();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let obj: DynamicObject = serde_json::from_value(value.clone()).unwrap();
            let dry = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let kind = obj
                .types
                .as_ref()
                .map(|t| t.kind.clone())
                .unwrap_or_default();
            api_of(&kind)
                .create(&dry, &obj)
                .await
                .unwrap_or_else(|e| panic!("{}: refused: {e}", path.display()));
            let spec = if kind == "AgentThread" {
                let thread: AgentThread = serde_json::from_value(value).unwrap();
                let spec = AgentRun::builder("turn").spec();
                threads.insert(thread.name_any(), thread.spec.agent.clone());
                AgentRunSpec {
                    agent: Some(thread.spec.agent),
                    ..spec
                }
            } else {
                let mut run: AgentRun = serde_json::from_value(value).unwrap();
                if let Some(thread) = &run.spec.thread {
                    assert!(
                        run.spec.agent.is_none(),
                        "{}: a turn with an agent",
                        path.display()
                    );
                    let agent = threads.get(thread).cloned();
                    assert!(
                        agent.is_some(),
                        "{}: no thread {thread} before it",
                        path.display()
                    );
                    run.spec.agent = agent;
                }
                run.spec
            };
            baton::controller::validate::validate(&spec)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 8, "read {checked} examples");
    ns.cleanup().await;
}
