//! The pure parts of turns: joined or not, what a turn may not set, the thread's status.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::crd::v1alpha1::Phase;
use crate::fence::Fence;

fn turn(name: &str, at: i64, phase: Phase, fence: i64, tokens: i64) -> Arc<AgentRun> {
    let mut r = AgentRun::builder(name).build();
    r.spec.thread = Some("t".into());
    r.metadata.creation_timestamp = Some(Time(Timestamp::from_second(at).unwrap()));
    r.metadata.owner_references = Some(vec![OwnerReference {
        kind: "AgentThread".into(),
        name: "t".into(),
        uid: "thread-uid".into(),
        ..OwnerReference::default()
    }]);
    let mut status = r.status.take().unwrap_or_default();
    status.phase = phase;
    status.fence = Fence::new(fence);
    status.usage = Some(RunUsage {
        total_tokens: tokens,
        model_calls: 1,
        ..RunUsage::default()
    });
    r.status = Some(status);
    Arc::new(r)
}

#[test]
fn a_turn_has_joined_once_its_thread_owns_it() {
    let owned = turn("a", 1, Phase::Pending, 0, 0);
    assert!(owned.has_joined());
    let mut other = (*owned).clone();
    other.spec.thread = Some("another".into());
    assert!(!other.has_joined(), "owned by a thread it does not name");
    other.metadata.owner_references = None;
    other.spec.thread = Some("t".into());
    assert!(!other.has_joined());
}

/// The one definition of a thread's turns: a turn of a deleted thread of the same name is not
/// one of the new thread's; a turn that has not joined yet is.
#[test]
fn a_threads_turns_are_those_naming_it_and_owned_by_it_once_joined() {
    let joined = turn("a", 1, Phase::Succeeded, 1, 0);
    assert!(joined.is_turn_of("t", "thread-uid"));
    assert!(
        !joined.is_turn_of("t", "recreated-uid"),
        "a turn of the deleted namesake"
    );
    assert!(!joined.is_turn_of("other", "thread-uid"));
    let mut pending = (*joined).clone();
    pending.metadata.owner_references = None;
    assert!(pending.is_turn_of("t", "recreated-uid"), "not joined yet");
    pending.spec.thread = None;
    assert!(!pending.is_turn_of("t", "thread-uid"), "a run of no thread");
}

#[test]
fn the_thread_status_follows_its_turns() {
    let turns = vec![
        turn("t-1", 1, Phase::Succeeded, 1, 100),
        turn("t-2", 2, Phase::Running, 2, 40),
        turn("t-3", 3, Phase::Pending, 0, 0),
    ];
    let status = thread_status(&turns, None);
    assert_eq!(status.phase, ThreadPhase::Busy);
    assert_eq!(status.turns, 3);
    assert_eq!(
        status.last_turn.as_deref(),
        Some("t-2"),
        "the newest claimed"
    );
    assert_eq!(status.last_turn_phase, Some(Phase::Running));
    assert_eq!(
        (status.usage.total_tokens, status.usage.model_calls),
        (140, 3)
    );
    let busy = &status.conditions[0];
    assert_eq!(
        (busy.type_.as_str(), busy.status.as_str()),
        ("Busy", "True")
    );
    assert!(busy.message.contains("t-2"));
    // Computed again from the same turns, it is the same status: nothing to write.
    assert_eq!(thread_status(&turns, Some(&status)), status);
    let idle = thread_status(&turns[..1], Some(&status));
    assert_eq!(idle.phase, ThreadPhase::Idle);
    assert_eq!(idle.conditions[0].status, "False");
}

#[test]
fn turns_made_in_the_same_second_keep_the_order_they_joined_in() {
    let place = |t: &Arc<AgentRun>, n: i64| {
        let mut r = (**t).clone();
        r.annotations_mut()
            .insert(crate::crd::TURN_ANNOTATION.into(), n.to_string());
        Arc::new(r)
    };
    // Same creation second; the name alone would put "t-b" after "t-a".
    let later = place(&turn("t-a", 5, Phase::Succeeded, 1, 0), 2);
    let earlier = place(&turn("t-b", 5, Phase::Succeeded, 1, 0), 1);
    assert!(earlier.turn_order() < later.turn_order());
    let status = thread_status(&[later, earlier], None);
    assert_eq!(status.last_turn.as_deref(), Some("t-a"));
}

#[test]
fn a_turn_takes_only_the_thread_generation_it_was_admitted_at() {
    use crate::crd::THREAD_GENERATION_ANNOTATION;
    let mut thread = AgentThread::new(
        "conv",
        serde_json::from_value(serde_json::json!({"agent": {"model": {"provider": "scripted"}}}))
            .unwrap(),
    );
    thread.metadata.generation = Some(2);
    let mut turn = thread.new_turn("hi");
    assert_eq!(
        changed_since_admitted(&turn, &thread),
        None,
        "no stamp: the webhook is off"
    );
    turn.annotations_mut()
        .insert(THREAD_GENERATION_ANNOTATION.into(), "2".into());
    assert_eq!(changed_since_admitted(&turn, &thread), None);
    thread.metadata.generation = Some(3);
    let refusal = changed_since_admitted(&turn, &thread).unwrap();
    assert!(
        refusal.contains("thread conv changed after this turn was admitted (generation 2, now 3)"),
        "{refusal}"
    );
}
