//! What the `cli` tests share: running the `baton` binary, and runs seeded for its verbs to show.

use std::process::{Command, Output};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Role};
use baton::fence::Fence;
use baton::ledger::SegmentStore;
use baton_testkit::common::TestNamespace;
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

pub const BATON: &str = env!("CARGO_BIN_EXE_baton");
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-baton");

fn baton(args: &[&str]) -> Output {
    Command::new(BATON)
        .args(args)
        .output()
        .expect("running baton")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

pub fn ok(args: &[&str]) -> String {
    let out = baton(args);
    assert!(
        out.status.success(),
        "baton {args:?} failed: {}",
        stderr(&out)
    );
    stdout(&out)
}

pub fn failure(args: &[&str]) -> String {
    let out = baton(args);
    assert!(
        !out.status.success(),
        "baton {args:?} should fail; printed {}",
        stdout(&out)
    );
    stderr(&out)
}

pub async fn create_run(ns: &TestNamespace, name: &str) -> AgentRun {
    let run = AgentRun::builder(name).input("tidy up").reply("ok").build();
    ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .unwrap()
}

pub async fn set_status(ns: &TestNamespace, name: &str, status: serde_json::Value) {
    let patch = serde_json::json!({ "status": status });
    ns.api::<AgentRun>()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A run two attempts deep, with a step whose effect is unknown, and a Warning Event.
pub async fn seeded_run(ns: &TestNamespace, name: &str) -> (AgentRun, SegmentStore) {
    let run = create_run(ns, name).await;
    let store = SegmentStore::for_run(ns.client.clone(), &run);
    let first = vec![
        LedgerEvent::Claimed {
            fence: Fence::new(1),
            pod: format!("{name}-w1"),
        },
        LedgerEvent::AttemptStarted {
            fence: Fence::new(1),
            pod: format!("{name}-w1"),
        },
        LedgerEvent::Message {
            role: Role::User,
            content: "tidy up".into(),
        },
        LedgerEvent::StepIntent {
            step: 1,
            tool: "sh".into(),
            call_id: "c1".into(),
            input: "rm -rf build".into(),
            idempotent: false,
        },
    ];
    let tail = store.append(0, Fence::new(1), first).await.unwrap().tail;
    let second = vec![
        LedgerEvent::Claimed {
            fence: Fence::new(2),
            pod: format!("{name}-w2"),
        },
        LedgerEvent::AttemptStarted {
            fence: Fence::new(2),
            pod: format!("{name}-w2"),
        },
        LedgerEvent::StepUnknown {
            step: 1,
            attempt: Fence::new(1),
        },
    ];
    store.append(tail, Fence::new(2), second).await.unwrap();
    set_status(ns, name, serde_json::json!({
        "phase": "Running", "attempt": 2, "fence": 2, "failedAttempts": 1, "steps": 1,
        "worker": format!("{name}-w2"), "unknownEffectCount": 1,
        "unknownEffects": [{"step": 1, "tool": "sh", "attempt": 1, "resolution": "unknown", "summary": "rm -rf build"}]
    }))
    .await;
    warning_event(ns, &run, "unknown", "baton-worker", "UnknownEffect").await;
    // Anyone who may create Events can post one about the run: describe leaves it out.
    warning_event(ns, &run, "forged", "someone-else", "ForgedByAnotherParty").await;
    (run, store)
}

async fn warning_event(
    ns: &TestNamespace,
    run: &AgentRun,
    name: &str,
    reporter: &str,
    reason: &str,
) {
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{name}", run.name_any())),
            ..Default::default()
        },
        reporting_component: Some(reporter.into()),
        reporting_instance: Some(format!("{reporter}-1")),
        involved_object: ObjectReference {
            api_version: Some("baton.dev/v1alpha1".into()),
            kind: Some("AgentRun".into()),
            name: Some(run.name_any()),
            namespace: Some(ns.name.clone()),
            uid: run.uid(),
            ..Default::default()
        },
        type_: Some("Warning".into()),
        reason: Some(reason.into()),
        message: Some("step 1 (sh) of attempt 1: its worker died".into()),
        ..Default::default()
    };
    Api::<Event>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}
