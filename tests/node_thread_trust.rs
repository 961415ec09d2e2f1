//! Threads on the real node (`hack/node.sh`), baton installed by its chart, each refusal coming
//! back through the node's API server from the webhook behind its Service (reached with the
//! API server's client certificate). The attacker is `kubectl --as=` a user with only the rights
//! the test gives. `tests/controller/thread_trust.rs` shows the same edits admitted where no
//! webhook watches, and holds the race's window open (no controller yet); here the race is
//! run as it comes, against the chart's controllers.

use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, AgentThread, Phase};
use baton::crd::{THREAD_GENERATION_ANNOTATION, TURN_ANNOTATION};
use baton_testkit::common::run_posing_as_a_turn;
use baton_testkit::node::rbac::grant_user;
use baton_testkit::node::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// A user who may write AgentRuns and AgentThreads in the namespace, and nothing else.
const TRUDY: &str = "trudy";

async fn trudy_may_write_runs_and_threads(env: &NodeEnv) {
    let rule = PolicyRule {
        api_groups: Some(vec!["baton.dev".into()]),
        resources: Some(vec!["agentruns".into(), "agentthreads".into()]),
        verbs: vec!["*".into()],
        ..PolicyRule::default()
    };
    grant_user(&env.client, &env.ns, TRUDY, vec![rule]).await;
    key_secret(env, "model-key").await;
}

/// A Secret `name` holding a model key, made by the admin.
async fn key_secret(env: &NodeEnv, name: &str) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        string_data: Some([("key".to_string(), "sk-live-secret".to_string())].into()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// A thread whose turns send the key `model-key` to its endpoint, written by the admin.
fn keyed_thread(name: &str) -> AgentThread {
    AgentThread::new(
        name,
        serde_json::from_value(json!({ "agent": { "model": {
            "provider": "openai", "name": "m", "endpoint": "https://models.example/v1",
            "apiKeySecretRef": { "name": "model-key", "key": "key" },
        }}}))
        .unwrap(),
    )
}

/// The API server's answer to a refused write, with the webhook's words.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_thread_edit_lends_nothing_and_a_fake_turn_is_refused() {
    let env = NodeEnv::start("thread-trust").await;
    trudy_may_write_runs_and_threads(&env).await;
    let threads: Api<AgentThread> = Api::namespaced(env.client.clone(), &env.ns);
    let thread = threads
        .create(&PostParams::default(), &keyed_thread("conv"))
        .await
        .unwrap();
    let trudy = client_as(TRUDY).await;
    let trudys: Api<AgentThread> = Api::namespaced(trudy.clone(), &env.ns);

    // Re-pointing where the thread's turns send the key: refused, naming what it borrows.
    let repoint =
        json!({ "spec": { "agent": { "model": { "endpoint": "https://trudy.invalid/v1" } } } });
    let text = refusal(
        trudys
            .patch("conv", &PatchParams::default(), &Patch::Merge(&repoint))
            .await,
    );
    assert!(
        text.contains(
            "spec.agent.model.apiKeySecretRef.name: trudy may not get secrets \"model-key\""
        ),
        "{text}"
    );
    let image = json!({ "spec": { "worker": { "image": "trudy/miner:1", "serviceAccountName": "default" } } });
    let text = refusal(
        trudys
            .patch("conv", &PatchParams::default(), &Patch::Merge(&image))
            .await,
    );
    for field in ["spec.worker.image", "spec.worker.serviceAccountName"] {
        assert!(
            text.contains(&format!("{field}: trudy may not create pods")),
            "{text}"
        );
    }
    let unchanged = threads.get("conv").await.unwrap();
    assert_eq!(
        unchanged.spec.agent.model.endpoint.as_deref(),
        Some("https://models.example/v1")
    );

    // A run posing as a turn of the thread: its owner reference and a turn's place.
    let fake = run_posing_as_a_turn(&thread, "fake");
    let trudys_runs: Api<AgentRun> = Api::namespaced(trudy, &env.ns);
    let text = refusal(trudys_runs.create(&PostParams::default(), &fake).await);
    assert!(
        text.contains("trudy may not make this run a turn of AgentThread \"conv\""),
        "{text}"
    );
    let status = threads
        .get("conv")
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(status.turns, 0, "no turn was counted");
    env.finish().await;
}

/// A user with thread rights sends 200 threads of 1.2 MiB each: every one is refused by the
/// size bound (256 KiB of spec), nothing reaches etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_two_hundred_oversized_threads_are_refused() {
    let env = NodeEnv::start("thread-flood").await;
    trudy_may_write_runs_and_threads(&env).await;
    let trudys: Api<AgentThread> = Api::namespaced(client_as(TRUDY).await, &env.ns);
    // Each field within the schema's bounds, the whole over the webhook's 256 KiB.
    let tools: Vec<serde_json::Value> = (0..20)
        .map(|i| json!({ "name": format!("tool{i}"), "kind": "shell", "description": "x".repeat(60_000) }))
        .collect();
    let mut refused = 0;
    for i in 0..200 {
        let thread: AgentThread = serde_json::from_value(json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentThread",
            "metadata": { "name": format!("flood-{i}") },
            "spec": { "agent": { "model": { "provider": "openai", "name": "m" }, "tools": tools } },
        }))
        .unwrap();
        let text = refusal(trudys.create(&PostParams::default(), &thread).await);
        assert!(
            text.contains("over the limit of 262144 bytes"),
            "{}",
            &text[..text.len().min(300)]
        );
        refused += 1;
    }
    assert_eq!(refused, 200);
    let left = Api::<AgentThread>::namespaced(env.client.clone(), &env.ns)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(left.items.is_empty(), "a flood thread was stored");
    env.finish().await;
}

/// Alice may create AgentRuns, read her threads' ledgers and the key `model-key`, not
/// `other-key`.
const ALICE: &str = "alice";
/// Turns raced against an edit of their thread.
const RACES: usize = 16;

fn uses_key(name: &str) -> serde_json::Value {
    json!({ "spec": { "agent": { "model": { "apiKeySecretRef": { "name": name, "key": "key" } } } } })
}

/// How a raced turn ended up.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Joined the generation its creator was asked about, with that generation's key.
    JoinedAsAdmitted,
    /// Refused at its join: the thread changed after its admission (the race's window).
    RefusedAtJoin,
}

/// The race without a deterministic window: Alice creates a turn of a thread that lends
/// `model-key` (which she may read), and the moment her create returns the thread's writer
/// re-points it to `other-key` (which she may not). Whichever of the edit and the controller's
/// join comes first, the turn never joins with `other-key`: either it joined before the edit,
/// or its join sees a generation other than the one its creator was asked about and fails,
/// naming both. Each turn asks to stop, so it ends right after its join with no pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_turn_raced_by_a_thread_edit_never_joins_what_its_creator_was_not_asked_about() {
    let env = NodeEnv::start("thread-race").await;
    key_secret(&env, "model-key").await;
    key_secret(&env, "other-key").await;
    let secrets = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["secrets".into()]),
        resource_names: Some(vec!["model-key".into()]),
        verbs: vec!["get".into()],
        ..PolicyRule::default()
    };
    let rules = vec![
        rule(&["agentruns"], &["*"]),
        rule(&["ledgersegments"], &["list"]),
        secrets,
    ];
    grant_user(&env.client, &env.ns, ALICE, rules).await;
    let threads: Api<AgentThread> = Api::namespaced(env.client.clone(), &env.ns);
    threads
        .create(&PostParams::default(), &keyed_thread("conv"))
        .await
        .unwrap();
    let alices: Api<AgentRun> = Api::namespaced(client_as(ALICE).await, &env.ns);
    let edit = PatchParams::default();
    let mut outcomes = Vec::new();
    for i in 0..RACES {
        // A turn names its thread and no agent of its own (it borrows the thread's).
        let turn: AgentRun = serde_json::from_value(json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": { "name": format!("turn-{i}") },
            "spec": { "input": "hi", "thread": "conv", "stop": true },
        }))
        .unwrap();
        let admitted = alices.create(&PostParams::default(), &turn).await.unwrap();
        threads
            .patch("conv", &edit, &Patch::Merge(&uses_key("other-key")))
            .await
            .unwrap();
        let stamp = admitted.annotations()[THREAD_GENERATION_ANNOTATION].clone();
        outcomes.push(raced_outcome(&env, &format!("turn-{i}"), &stamp).await);
        threads
            .patch("conv", &edit, &Patch::Merge(&uses_key("model-key")))
            .await
            .unwrap();
    }
    let refused = outcomes
        .iter()
        .filter(|o| **o == Outcome::RefusedAtJoin)
        .count();
    println!(
        "{RACES} races: {refused} turns refused at their join, {} joined as admitted",
        RACES - refused
    );
    // Without a turn in the window the test would prove nothing: the edit lands within a
    // round trip of the create, the join only after the controller's watch, read and write.
    assert!(refused > 0, "no race hit the window: {outcomes:?}");
    env.finish().await;
}

/// Waits for turn `name` (stamped `stamp`) to end (refused, or stopped after its join); how,
/// checked.
async fn raced_outcome(env: &NodeEnv, name: &str, stamp: &str) -> Outcome {
    let status = env
        .wait_run(name, Duration::from_secs(60), "ended", |s| {
            s.phase.is_terminal()
        })
        .await;
    let run = env.runs().get(name).await.unwrap();
    if run.annotations().contains_key(TURN_ANNOTATION) {
        let key = run
            .spec
            .agent
            .as_ref()
            .and_then(|a| a.model.api_key_secret_ref.clone());
        assert_eq!(
            key.map(|k| k.name).as_deref(),
            Some("model-key"),
            "{name} joined with a key its creator was not asked about"
        );
        return Outcome::JoinedAsAdmitted;
    }
    let message = status.message.unwrap_or_default();
    assert_eq!(status.phase, Phase::Failed, "{name}: {message}");
    assert!(
        message.contains(&format!(
            "thread conv changed after this turn was admitted (generation {stamp}, now"
        )),
        "{name}: {message}"
    );
    assert!(
        run.spec.agent.is_none(),
        "{name} took nothing of the thread"
    );
    Outcome::RefusedAtJoin
}
