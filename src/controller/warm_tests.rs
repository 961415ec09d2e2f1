//! The pure parts of a turn started ahead: the name a thread offers, when it wants a pod, and
//! which pod a turn may adopt.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::controller::pod::CONTAINER_NAME;

use super::*;
use crate::controller::pod::worker_pod;
use crate::crd::THREAD_GENERATION_ANNOTATION;
use crate::crd::v1alpha1::{AgentThreadStatus, WarmSpec};
use crate::rbac::RunRbac;

const IMAGE: &str = "baton:test";

fn thread(warm: bool) -> AgentThread {
    let spec = serde_json::json!({
        "agent": {"model": {"provider": "openai", "name": "m",
            "apiKeySecretRef": {"name": "key", "key": "k"}}},
    });
    let mut thread = AgentThread::new("conv", serde_json::from_value(spec).unwrap());
    thread.metadata.namespace = Some("team".into());
    thread.metadata.uid = Some("thread-uid".into());
    thread.metadata.generation = Some(4);
    thread.spec.warm = warm.then_some(WarmSpec { idle_seconds: 60 });
    thread
}

fn with_status(
    mut thread: AgentThread,
    next: Option<&str>,
    busy: bool,
    since: Timestamp,
) -> AgentThread {
    thread.status = Some(AgentThreadStatus {
        next_turn: next.map(String::from),
        conditions: vec![Condition {
            type_: "Busy".into(),
            status: if busy { "True" } else { "False" }.into(),
            reason: "r".into(),
            message: "m".into(),
            observed_generation: None,
            last_transition_time: Time(since),
        }],
        ..AgentThreadStatus::default()
    });
    thread
}

/// The turn `name` as the API server and the join leave it: created by a user under the
/// offered name, stamped by the webhook, joined (the thread owns it, its settings copied).
fn joined_turn(thread: &AgentThread, name: &str) -> AgentRun {
    let mut turn = thread.new_turn("hello");
    turn.metadata.name = Some(name.into());
    turn.metadata.namespace = Some("team".into());
    turn.metadata.uid = Some("turn-uid".into());
    turn.annotations_mut()
        .insert(THREAD_GENERATION_ANNOTATION.into(), "4".into());
    thread.lend_to(&mut turn, 7);
    turn
}

/// The pod started ahead for turn `name` of `thread`.
fn made_ahead_for(name: &str, thread: &AgentThread) -> Pod {
    ahead(
        worker_pod(&prospective_turn(thread, name), FIRST, IMAGE),
        thread,
    )
}

#[test]
fn a_warm_thread_offers_one_name_until_a_run_takes_it() {
    let now = Timestamp::now();
    assert_eq!(offered_name(&thread(false), |_| false, || "x".into()), None);
    let fresh = offered_name(&thread(true), |_| false, || fresh_name("conv")).unwrap();
    assert!(
        fresh.starts_with("conv-") && fresh.len() == "conv-".len() + 5,
        "{fresh}"
    );
    assert!(
        fresh["conv-".len()..]
            .bytes()
            .all(|b| ALPHABET.contains(&b)),
        "{fresh}"
    );
    let offering = with_status(thread(true), Some("conv-abcde"), false, now);
    let kept = offered_name(&offering, |_| false, || "conv-other".into());
    assert_eq!(kept.as_deref(), Some("conv-abcde"));
    let taken = offered_name(&offering, |n| n == "conv-abcde", || "conv-other".into());
    assert_eq!(taken.as_deref(), Some("conv-other"));
    let long = "c".repeat(300);
    assert_eq!(
        offered_name(&thread(true), |_| false, || long.clone()),
        None
    );
}

#[test]
fn a_turn_takes_the_offered_name_only_while_the_thread_is_warm() {
    let now = Timestamp::now();
    let offering = with_status(thread(true), Some("conv-abcde"), false, now);
    assert_eq!(
        offering.new_turn("hi").metadata.name.as_deref(),
        Some("conv-abcde")
    );
    let mut cold = offering.clone();
    cold.spec.warm = None;
    let turn = cold.new_turn("hi");
    assert_eq!(turn.metadata.name, None);
    assert_eq!(turn.metadata.generate_name.as_deref(), Some("conv-"));
    let fallback = offering.named_by_server(offering.new_turn("hi"));
    assert_eq!(
        (
            fallback.metadata.name,
            fallback.metadata.generate_name.as_deref()
        ),
        (None, Some("conv-"))
    );
}

#[test]
fn the_pod_is_wanted_while_a_turn_is_live_and_for_idle_seconds_after() {
    let now = Timestamp::now();
    let ago = |s: i64| now - SignedDuration::from_secs(s);
    let want = |t: &AgentThread| wanted(t, now);
    assert_eq!(
        want(&with_status(thread(true), None, true, ago(3600))),
        Want::WhileLive
    );
    assert_eq!(
        want(&with_status(thread(true), None, false, ago(50))),
        Want::For(Duration::from_secs(10))
    );
    assert_eq!(
        want(&with_status(thread(true), None, false, ago(61))),
        Want::No
    );
    assert_eq!(want(&with_status(thread(false), None, true, now)), Want::No);
    assert_eq!(
        want(&thread(true)),
        Want::No,
        "a thread no turn ever ran on"
    );
}

/// The property the whole scheme rests on: the pod started ahead from the thread alone is the
/// pod the turn's own first claim would create, spec for spec.
#[test]
fn the_pod_started_ahead_is_the_one_the_turns_first_claim_would_create() {
    let thread = with_status(thread(true), Some("conv-abcde"), true, Timestamp::now());
    let made = made_ahead_for("conv-abcde", &thread);
    let turn = joined_turn(&thread, "conv-abcde");
    let desired = worker_pod(&turn, FIRST, IMAGE);
    assert_eq!(made.name_any(), desired.name_any());
    assert_eq!(pod_digest(&made), Some(&spec_digest(&desired)));
    assert!(adoptable(&made, &turn, &desired));
    let spec = made.spec.as_ref().unwrap();
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("baton-run-conv-abcde")
    );
    let owners = made.metadata.owner_references.as_ref().unwrap();
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].controller),
        ("AgentThread", Some(true))
    );
    let worker = spec
        .containers
        .iter()
        .find(|c| c.name == CONTAINER_NAME)
        .unwrap();
    let value = |n: &str| {
        let vars = worker.env.as_ref().unwrap();
        vars.iter()
            .find(|v| v.name == n)
            .and_then(|v| v.value.clone())
    };
    assert_eq!(value(env::WARM_THREAD_UID).as_deref(), Some("thread-uid"));
    assert_eq!(value(env::WARM_THREAD_GENERATION).as_deref(), Some("4"));
    assert_eq!(value(env::WARM_IDLE_SECONDS).as_deref(), Some("3660"));
}

#[test]
fn a_turn_adopts_no_pod_of_another_thread_other_settings_or_that_ended() {
    let thread = with_status(thread(true), Some("conv-abcde"), true, Timestamp::now());
    let made = made_ahead_for("conv-abcde", &thread);
    let turn = joined_turn(&thread, "conv-abcde");
    let desired = worker_pod(&turn, FIRST, IMAGE);

    let mut other_thread = turn.clone();
    other_thread.owner_references_mut()[0].uid = "another-thread".into();
    assert!(
        !adoptable(&made, &other_thread, &desired),
        "a turn of another thread"
    );
    let mut plain = turn.clone();
    plain.spec.thread = None;
    assert!(
        !adoptable(&made, &plain, &desired),
        "a run of that name that is no turn"
    );

    let mut edited = thread.clone();
    edited.metadata.generation = Some(5);
    let mut later = joined_turn(&edited, "conv-abcde");
    later
        .annotations_mut()
        .insert(THREAD_GENERATION_ANNOTATION.into(), "5".into());
    assert_eq!(
        spec_digest(&worker_pod(&later, FIRST, IMAGE)),
        spec_digest(&desired)
    );
    assert!(
        !adoptable(&made, &later, &desired),
        "a turn admitted at a later generation"
    );
    let mut secret = thread.clone();
    secret
        .spec
        .agent
        .model
        .api_key_secret_ref
        .as_mut()
        .unwrap()
        .name = "other-key".into();
    let secret_turn = joined_turn(&secret, "conv-abcde");
    let key_moved = worker_pod(&secret_turn, FIRST, IMAGE);
    assert!(
        !adoptable(&made, &secret_turn, &key_moved),
        "another Secret"
    );
    assert!(
        !adoptable(&made, &turn, &worker_pod(&turn, FIRST, "baton:newer")),
        "another image"
    );

    let mut ended = made.clone();
    ended.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    assert!(!adoptable(&ended, &turn, &desired), "a pod that exited");
    let mut deleting = made.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    assert!(
        !adoptable(&deleting, &turn, &desired),
        "a pod being deleted"
    );
    let mut relabelled = made;
    relabelled
        .labels_mut()
        .insert(WARM_THREAD_LABEL.into(), "another-thread".into());
    assert!(
        !adoptable(&relabelled, &turn, &desired),
        "the label of another thread"
    );
}

#[test]
fn only_what_a_thread_made_ahead_is_taken_or_removed_and_only_if_it_grants_the_runs_own() {
    let thread = with_status(thread(true), Some("conv-abcde"), true, Timestamp::now());
    let made = made_ahead_for("conv-abcde", &thread);
    assert!(made_ahead(&made) && made_ahead_by(&made, "thread-uid"));
    assert!(!made_ahead_by(&made, "other-thread"));
    let mut foreign = made.clone();
    foreign.metadata.owner_references = None;
    assert!(!made_ahead(&foreign), "labelled, but no thread controls it");
    let mut mislabelled = made;
    mislabelled
        .labels_mut()
        .insert(WARM_THREAD_LABEL.into(), "other-thread".into());
    assert!(
        !made_ahead(&mislabelled),
        "labelled for a thread that does not control it"
    );

    let turn = joined_turn(&thread, "conv-abcde");
    let own = RunRbac::for_run(&turn).unwrap();
    let meta = kube::api::ObjectMeta {
        name: Some("baton-run-conv-abcde".into()),
        namespace: Some("team".into()),
        ..Default::default()
    };
    let early = RunRbac::with_meta("conv-abcde", meta);
    assert!(grants_the_same(&early.role, &own.role));
    assert!(grants_the_same(&early.role_binding, &own.role_binding));
    assert!(grants_the_same(
        &early.service_account,
        &own.service_account
    ));
    let mut wider = early.role.clone();
    wider.rules.as_mut().unwrap()[0].resource_names = None;
    assert!(!grants_the_same(&wider, &own.role), "every run's AgentRuns");
    let mut rebound = early.role_binding.clone();
    rebound.subjects.as_mut().unwrap()[0].name = "someone-else".into();
    assert!(!grants_the_same(&rebound, &own.role_binding));
    let mut other_role = early.role_binding;
    other_role.role_ref.name = "admin".into();
    assert!(!grants_the_same(&other_role, &own.role_binding));
}
