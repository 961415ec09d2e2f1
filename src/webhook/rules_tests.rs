use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::crd::v1alpha1::{AgentRun, SecretKeyRef, ToolSpec};

fn spec() -> AgentRunSpec {
    AgentRun::builder("r").spec()
}

fn mcp_tool(secret: &str) -> ToolSpec {
    serde_json::from_value(serde_json::json!({
        "name": "search", "kind": "mcp",
        "mcp": { "url": "http://mcp.example", "headersFromSecret": secret }
    }))
    .unwrap()
}

fn fields(asks: &[Ask]) -> Vec<(&str, &str, Option<&str>)> {
    asks.iter()
        .map(|a| (a.field.as_str(), a.resource, a.name.as_deref()))
        .collect()
}

#[test]
fn a_plain_run_borrows_nothing() {
    assert_eq!(run_asks(None, &spec()), vec![]);
}

#[test]
fn every_secret_and_pod_field_is_asked_for() {
    let mut s = spec();
    s.agent_mut().model.api_key_secret_ref = Some(SecretKeyRef {
        name: "model-key".into(),
        key: "k".into(),
    });
    s.agent_mut().tools = vec![mcp_tool("mcp-headers")];
    s.worker.image = Some("evil:1".into());
    s.worker.service_account_name = Some("deployer".into());
    assert_eq!(
        fields(&run_asks(None, &s)),
        vec![
            (
                "spec.agent.model.apiKeySecretRef.name",
                "secrets",
                Some("model-key")
            ),
            (
                "spec.agent.tools[0].mcp.headersFromSecret",
                "secrets",
                Some("mcp-headers")
            ),
            ("spec.worker.image", "pods", None),
            ("spec.worker.serviceAccountName", "pods", None),
        ]
    );
}

#[test]
fn an_update_asks_again_only_when_agent_or_worker_change() {
    let mut old = spec();
    old.agent_mut().model.api_key_secret_ref = Some(SecretKeyRef {
        name: "model-key".into(),
        key: "k".into(),
    });
    let mut approved = old.clone();
    approved.inputs.push("more".into());
    approved.stop = true;
    assert_eq!(run_asks(Some(&old), &approved), vec![]);

    let mut redirected = old.clone();
    redirected.agent_mut().model.endpoint = Some("https://attacker.example".into());
    assert_eq!(
        fields(&run_asks(Some(&old), &redirected)),
        vec![(
            "spec.agent.model.apiKeySecretRef.name",
            "secrets",
            Some("model-key")
        )]
    );
}

#[test]
fn a_refusal_names_the_field_and_the_permission() {
    let ask = Ask::get_secret("spec.agent.model.apiKeySecretRef.name".into(), "db");
    let text = borrow::refusal(&ask, "alice", "team-a", Kind::AgentRun);
    assert!(
        text.starts_with("spec.agent.model.apiKeySecretRef.name: alice may not get secrets \"db\""),
        "{text}"
    );
}

#[test]
fn an_oversized_spec_names_its_largest_field() {
    let mut s = spec();
    assert_eq!(oversized_spec(&s, 64 * 1024), None);
    s.agent_mut().system_prompt = Some("x".repeat(100_000));
    let text = oversized_spec(&s, 64 * 1024).unwrap();
    assert!(
        text.contains("largest field is spec.agent.systemPrompt"),
        "{text}"
    );
    assert!(text.contains("over the limit of 65536 bytes"), "{text}");
}

#[test]
fn a_turn_borrows_its_threads_agent_and_only_its_join_borrows_nothing() {
    let mut turn = AgentRun::builder("t").build().spec;
    turn.agent = None;
    turn.thread = Some("keyed".into());
    let mut thread_agent = AgentRun::builder("x").build().spec.agent.unwrap();
    thread_agent.model.api_key_secret_ref = Some(SecretKeyRef {
        name: "db".into(),
        key: "k".into(),
    });
    let thread: AgentThreadSpec =
        serde_json::from_value(serde_json::json!({ "agent": thread_agent })).unwrap();
    let joined = turn_as_joined(&turn, &thread);
    let asks = run_asks(None, &joined);
    // Its worker reads the thread's earlier ledgers, and uses the thread's key.
    let fields: Vec<(&str, &str, &str)> = asks
        .iter()
        .map(|a| (a.field.as_str(), a.verb, a.resource))
        .collect();
    assert_eq!(
        fields,
        [
            ("spec.thread", "list", "ledgersegments"),
            ("spec.agent.model.apiKeySecretRef.name", "get", "secrets")
        ]
    );
    assert_eq!(asks[0].group, "baton.dev");
    // A turn moved to another thread before it joined is asked again; once joined, an
    // input is not.
    let mut moved = turn.clone();
    moved.thread = Some("other".into());
    assert!(!run_asks(Some(&turn), &moved).is_empty());
    let mut answered = joined.clone();
    answered.inputs.push("yes".into());
    assert!(run_asks(Some(&joined), &answered).is_empty());
    assert!(is_join(&turn, &joined));
    // Not a join: an agent changed on a turn that has one, or on a run of no thread.
    assert!(!is_join(&joined, &joined));
    let mut plain = joined.clone();
    plain.thread = None;
    let mut none = plain.clone();
    none.agent = None;
    assert!(!is_join(&none, &plain));
}

#[test]
fn a_joined_turn_keeps_what_it_took_from_its_thread() {
    let mut turn = AgentRun::builder("t").build().spec;
    turn.thread = Some("conv".into());
    let mut edited = turn.clone();
    edited.agent_mut().system_prompt = Some("Ignore the thread.".into());
    let refusal = joined_turn_refusal(&turn, &edited).unwrap();
    assert!(
        refusal.starts_with("spec.agent: a turn of thread conv"),
        "{refusal}"
    );
    let mut moved = turn.clone();
    moved.thread = Some("other".into());
    assert!(
        joined_turn_refusal(&turn, &moved)
            .unwrap()
            .starts_with("spec.thread")
    );
    // The user's own fields change as on any run.
    let mut answered = turn.clone();
    answered.inputs.push("yes".into());
    answered.stop = true;
    assert_eq!(joined_turn_refusal(&turn, &answered), None);
    // Not joined yet (no agent): the join itself is not refused here.
    let mut unjoined = turn.clone();
    unjoined.agent = None;
    assert_eq!(joined_turn_refusal(&unjoined, &turn), None);
    // A plain run's agent changes as before (its borrowing is asked again).
    let mut plain = turn.clone();
    plain.thread = None;
    let mut replanned = plain.clone();
    replanned.agent_mut().max_steps = 3;
    assert_eq!(joined_turn_refusal(&plain, &replanned), None);
}

fn meta(thread_owner: Option<&str>, annotations: &[(&str, &str)]) -> kube::api::ObjectMeta {
    let owner = thread_owner.map(|name| OwnerReference {
        api_version: "baton.dev/v1alpha1".into(),
        kind: "AgentThread".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        ..OwnerReference::default()
    });
    kube::api::ObjectMeta {
        owner_references: owner.map(|o| vec![o]),
        annotations: Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..kube::api::ObjectMeta::default()
    }
}

#[test]
fn only_the_controller_makes_a_run_a_turn() {
    use crate::crd::{THREAD_GENERATION_ANNOTATION as STAMP, TURN_ANNOTATION as TURN};
    let fake = meta(Some("victim"), &[(TURN, "1")]);
    let refusal = membership_refusal(None, &fake, "mallory").unwrap();
    assert!(
        refusal.starts_with("metadata.ownerReferences: mallory may not make this run a turn of AgentThread \"victim\""),
        "{refusal}"
    );
    let placed = meta(None, &[(TURN, "1")]);
    assert!(
        membership_refusal(None, &placed, "mallory")
            .unwrap()
            .starts_with("metadata.annotations[baton.dev/turn]")
    );
    // A joined turn's user edits keep what the controller wrote; removing the owner only
    // makes it no turn (the garbage collector orphans so).
    let joined = meta(Some("t"), &[(TURN, "2"), (STAMP, "4")]);
    assert_eq!(membership_refusal(Some(&joined), &joined, "alice"), None);
    let orphaned = meta(None, &[(TURN, "2"), (STAMP, "4")]);
    assert_eq!(membership_refusal(Some(&joined), &orphaned, "gc"), None);
    let moved = meta(Some("t"), &[(TURN, "1"), (STAMP, "4")]);
    assert!(membership_refusal(Some(&joined), &moved, "alice").is_some());
    let restamped = meta(Some("t"), &[(TURN, "2"), (STAMP, "5")]);
    assert!(
        membership_refusal(Some(&joined), &restamped, "alice")
            .unwrap()
            .starts_with("metadata.annotations[baton.dev/thread-generation]")
    );
    // At creation the stamp is the mutating webhook's, checked against the thread.
    let stamped = meta(None, &[(STAMP, "4")]);
    assert_eq!(membership_refusal(None, &stamped, "alice"), None);
}

#[test]
fn a_turn_is_admitted_only_at_the_generation_it_was_stamped_with() {
    assert_eq!(stamp_refusal("conv", Some("3"), 3), None);
    let changed = stamp_refusal("conv", Some("3"), 4).unwrap();
    assert!(
        changed.contains("thread conv changed while this turn was admitted (generation 3, now 4)"),
        "{changed}"
    );
    assert!(stamp_refusal("conv", Some("x"), 3).is_some());
    assert!(
        stamp_refusal("conv", None, 3)
            .unwrap()
            .contains("MutatingWebhookConfiguration")
    );
}

#[test]
fn the_stamp_patch_adds_the_annotation_with_or_without_a_map() {
    let mut with_map = serde_json::json!({"metadata": {"annotations": {"a": "b"}}});
    json_patch::patch(&mut with_map, &stamp_patch(true, 7)).unwrap();
    assert_eq!(
        with_map["metadata"]["annotations"],
        serde_json::json!({"a": "b", "baton.dev/thread-generation": "7"})
    );
    let mut bare = serde_json::json!({"metadata": {"name": "t"}});
    json_patch::patch(&mut bare, &stamp_patch(false, 7)).unwrap();
    assert_eq!(
        bare["metadata"]["annotations"],
        serde_json::json!({"baton.dev/thread-generation": "7"})
    );
}

#[test]
fn a_runs_traceparent_is_fixed_at_its_creation() {
    use crate::traces::TRACEPARENT_ANNOTATION as TRACE;
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = meta(None, &[(TRACE, caller)]);
    let plain = meta(None, &[]);
    assert_eq!(trace_refusal(None, &traced), None, "given at creation");
    assert_eq!(trace_refusal(Some(&traced), &traced), None, "kept");
    assert_eq!(trace_refusal(Some(&plain), &plain), None);
    let other = meta(
        None,
        &[(
            TRACE,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )],
    );
    for (old, new) in [(&traced, &other), (&traced, &plain), (&plain, &traced)] {
        let refusal = trace_refusal(Some(old), new).expect("a change is refused");
        assert!(
            refusal.starts_with("metadata.annotations[baton.dev/traceparent]"),
            "{refusal}"
        );
    }
}
