//! Threads under the one borrow rule (DESIGN §12), against the real API server with the
//! webhook served from this process and users impersonated as `kubectl --as=` does:
//! - Trudy may write AgentRuns and AgentThreads and nothing else. Her edit of a thread that
//!   lends a Secret (its endpoint re-pointed) is refused, as is a thread that would lend a
//!   Secret, an image or a placement she could not take herself; in a namespace the webhook
//!   does not watch, the same edit is first shown admitted.
//! - A turn joins only the thread generation its creator was asked about: a thread edited
//!   between a turn's admission and its join fails that turn, naming both generations.
//! - A run that carries a thread's owner reference or a turn's place is refused: only the
//!   controller joins a run to a thread.
//! - A thread whose agent is a container runs its image in every turn's pod: a turn's creator
//!   who may not create pods gets no turn of it.

use crate::webhook::{
    ALICE, MALLORY, Watched, as_user, create_as, keyed_thread, refusal, turn_of, users,
};
use baton::crd::v1alpha1::{AgentRun, AgentThread, Phase};
use baton::crd::{THREAD_GENERATION_ANNOTATION, TURN_ANNOTATION};
use baton_testkit::common::run_posing_as_a_turn;
use baton_testkit::controller::*;
use baton_testkit::rbac::grant_user;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// A user who may write AgentRuns and AgentThreads, and nothing else.
const TRUDY: &str = "trudy";

async fn grant_trudy(ns: &TestNamespace) {
    let rule = PolicyRule {
        api_groups: Some(vec!["baton.dev".into()]),
        resources: Some(vec!["agentruns".into(), "agentthreads".into()]),
        verbs: vec!["*".into()],
        ..PolicyRule::default()
    };
    grant_user(&ns.client, &ns.name, TRUDY, vec![rule]).await;
}

async fn threads_as(user: &str, ns: &TestNamespace) -> Api<AgentThread> {
    Api::namespaced(as_user(user).await, &ns.name)
}

fn repointed() -> serde_json::Value {
    json!({ "spec": { "agent": { "model": { "endpoint": "https://trudy.invalid/v1" } } } })
}

#[tokio::test]
async fn a_thread_lends_only_what_its_writer_may_take_themselves() {
    // Unwatched: Trudy re-points the thread Alice's turns send the key through.
    let open = TestNamespace::new("thread-borrow-open").await;
    users(&open).await;
    grant_trudy(&open).await;
    open.api::<AgentThread>()
        .create(&PostParams::default(), &keyed_thread("keyed"))
        .await
        .unwrap();
    let merge = PatchParams::default();
    threads_as(TRUDY, &open)
        .await
        .patch("keyed", &merge, &Patch::Merge(&repointed()))
        .await
        .expect("unwatched: the edit is admitted");
    open.cleanup().await;

    let w = Watched::new("thread-borrow").await;
    grant_trudy(&w.ns).await;
    w.ns.api::<AgentThread>()
        .create(&PostParams::default(), &keyed_thread("keyed"))
        .await
        .unwrap();
    let trudys = threads_as(TRUDY, &w.ns).await;
    let text = refusal(
        trudys
            .patch("keyed", &merge, &Patch::Merge(&repointed()))
            .await,
    );
    let expected = format!(
        "spec.agent.model.apiKeySecretRef.name: trudy may not get secrets \"model-key\" in \
         namespace {}, and the thread's turns do it on its writer's behalf",
        w.ns.name
    );
    assert!(text.contains(&expected), "{text}");
    // What lends nothing is hers to edit.
    let prompt = json!({ "spec": { "agent": { "systemPrompt": "Be brief." } } });
    trudys
        .patch("keyed", &merge, &Patch::Merge(&prompt))
        .await
        .expect("a system prompt borrows nothing");
    // Nor may she write a thread that lends the key, an image or a placement.
    let params = PostParams::default();
    let text = refusal(trudys.create(&params, &keyed_thread("hers")).await);
    assert!(text.contains("trudy may not get secrets"), "{text}");
    let mut shaped = keyed_thread("shaped");
    shaped.spec.agent.model.api_key_secret_ref = None;
    shaped.spec.worker.image = Some("trudy/miner:1".into());
    shaped.spec.worker.node_selector = [("pool".to_string(), "gpu".to_string())].into();
    shaped.spec.agent.container = Some(baton::crd::v1alpha1::AgentContainer {
        image: "trudy/agent:1".into(),
        command: vec!["/bin/agent".into()],
        ..Default::default()
    });
    let text = refusal(trudys.create(&params, &shaped).await);
    for field in [
        "spec.worker.image",
        "spec.worker.nodeSelector",
        "spec.agent.container",
    ] {
        assert!(
            text.contains(&format!("{field}: trudy may not create pods")),
            "{text}"
        );
    }
    let mut plain = keyed_thread("plain");
    plain.spec.agent.model.api_key_secret_ref = None;
    trudys
        .create(&params, &plain)
        .await
        .expect("a thread that lends nothing");
    // Threads are bounded like runs.
    let mut huge = plain.clone();
    huge.metadata = kube::api::ObjectMeta {
        name: Some("huge".into()),
        ..Default::default()
    };
    // Each field within the schema's bounds, the whole over the webhook's 256 KiB.
    let padded = |i: usize| {
        serde_json::from_value(json!({
            "name": format!("tool{i}"), "kind": "shell", "description": "x".repeat(60_000)
        }))
        .unwrap()
    };
    huge.spec.agent.tools = (0..5).map(padded).collect();
    let text = refusal(trudys.create(&params, &huge).await);
    assert!(
        text.contains("over the limit of 262144 bytes") && text.contains("spec.agent.tools"),
        "{}",
        &text[..text.len().min(400)]
    );
    w.cleanup().await;
}

#[tokio::test]
async fn a_turn_never_joins_a_thread_that_changed_after_its_admission() {
    let w = Watched::new("thread-stamp").await;
    let threads = w.ns.api::<AgentThread>();
    threads
        .create(&PostParams::default(), &keyed_thread("conv"))
        .await
        .unwrap();
    // Alice may read the key: her turn is admitted at the thread's generation 1.
    let early = create_as(ALICE, &w.ns.name, &turn_of("early", "conv"))
        .await
        .expect("alice's turn");
    let stamp = |run: &AgentRun| run.annotations().get(THREAD_GENERATION_ANNOTATION).cloned();
    assert_eq!(stamp(&early).as_deref(), Some("1"));
    // The thread changes before the turn joins (no controller runs yet: the race's window,
    // held open).
    let merge = PatchParams::default();
    threads
        .patch("conv", &merge, &Patch::Merge(&repointed()))
        .await
        .unwrap();
    // A stamp the creator writes is the webhook's to overwrite.
    let mut forged = turn_of("late", "conv");
    forged
        .annotations_mut()
        .insert(THREAD_GENERATION_ANNOTATION.into(), "999".into());
    let late = create_as(ALICE, &w.ns.name, &forged).await.unwrap();
    assert_eq!(stamp(&late).as_deref(), Some("2"));

    let _controller = start(&w.ns.client, config(&w.ns.name));
    let failed = wait_run(&w.ns, "early", T, |s| s.phase == Phase::Failed).await;
    let message = status(&failed).message.unwrap_or_default();
    assert!(
        message.contains("thread conv changed after this turn was admitted (generation 1, now 2)"),
        "{message}"
    );
    assert!(failed.spec.agent.is_none(), "it took nothing of the thread");
    let joined = wait_until_joined(&w.ns, "late").await;
    let endpoint = joined.spec.agent.and_then(|a| a.model.endpoint);
    assert_eq!(endpoint.as_deref(), Some("https://trudy.invalid/v1"));
    w.cleanup().await;
}

async fn wait_until_joined(ns: &TestNamespace, name: &str) -> AgentRun {
    let deadline = std::time::Instant::now() + T;
    loop {
        let run = get(ns, name).await;
        if run.has_joined() {
            return run;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never joined: {:?}",
            run.status
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_run_that_poses_as_a_turn_is_refused() {
    let w = Watched::new("thread-fake-turn").await;
    let mut thread = keyed_thread("conv");
    thread.spec.agent.model.api_key_secret_ref = None;
    let thread =
        w.ns.api::<AgentThread>()
            .create(&PostParams::default(), &thread)
            .await
            .unwrap();
    let mut fake = run_posing_as_a_turn(&thread, "fake");
    let text = refusal(create_as(MALLORY, &w.ns.name, &fake).await);
    assert!(
        text.contains(
            "metadata.ownerReferences: mallory may not make this run a turn of AgentThread \"conv\""
        ),
        "{text}"
    );
    // Nor a place alone, at creation or later.
    fake.metadata.owner_references = None;
    fake.spec.thread = None;
    let text = refusal(create_as(MALLORY, &w.ns.name, &fake).await);
    assert!(
        text.contains("metadata.annotations[baton.dev/turn]"),
        "{text}"
    );
    fake.annotations_mut().remove(TURN_ANNOTATION);
    create_as(MALLORY, &w.ns.name, &fake)
        .await
        .expect("a plain run");
    let place = json!({ "metadata": { "annotations": { TURN_ANNOTATION: "1" } } });
    let mallorys = Api::<AgentRun>::namespaced(as_user(MALLORY).await, &w.ns.name);
    let text = refusal(
        mallorys
            .patch("fake", &PatchParams::default(), &Patch::Merge(&place))
            .await,
    );
    assert!(text.contains("may not place a run in a thread"), "{text}");
    w.cleanup().await;
}

#[tokio::test]
async fn a_turn_of_a_thread_whose_agent_is_a_container_needs_the_right_to_create_pods() {
    let w = Watched::new("thread-own-agent-borrow").await;
    let mut own = keyed_thread("own");
    own.spec.agent.model.api_key_secret_ref = None;
    own.spec.agent.container = Some(baton::crd::v1alpha1::AgentContainer {
        image: "team/agent:1".into(),
        command: vec!["/bin/agent".into()],
        ..Default::default()
    });
    w.ns.api::<AgentThread>()
        .create(&PostParams::default(), &own)
        .await
        .unwrap();
    // Mallory may write AgentRuns and nothing else: her turn would run the thread's image.
    let text = refusal(create_as(MALLORY, &w.ns.name, &turn_of("t1", "own")).await);
    assert!(
        text.contains("spec.agent.container: mallory may not create pods"),
        "{text}"
    );
    create_as(ALICE, &w.ns.name, &turn_of("t2", "own"))
        .await
        .expect("alice may create pods and read the ledgers: her turn is admitted");
    w.cleanup().await;
}
