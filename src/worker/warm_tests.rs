//! What a pod started ahead makes of the run of its name: it serves only the turn of its
//! thread, admitted at its generation, claimed for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::crd::v1alpha1::{AgentRunStatus, Phase};

const POD: &str = "conv-abcde-1";

fn warm() -> Warm {
    Warm {
        thread_uid: "thread-uid".into(),
        thread_generation: Some(4),
        pod_uid: "pod-uid".into(),
        idle: Duration::from_secs(60),
    }
}

fn turn(thread_uid: Option<&str>, generation: &str) -> AgentRun {
    let mut run = AgentRun::builder("conv-abcde").build();
    run.spec.thread = Some("conv".into());
    run.metadata.owner_references = thread_uid.map(|uid| {
        vec![OwnerReference {
            kind: "AgentThread".into(),
            name: "conv".into(),
            uid: uid.into(),
            ..OwnerReference::default()
        }]
    });
    run.annotations_mut()
        .insert(THREAD_GENERATION_ANNOTATION.into(), generation.into());
    run
}

fn claimed(mut run: AgentRun, fence: i64, worker: &str) -> AgentRun {
    run.status = Some(AgentRunStatus {
        phase: Phase::Running,
        fence: Fence::new(fence),
        worker: Some(worker.into()),
        ..AgentRunStatus::default()
    });
    run
}

fn seen(run: Option<&AgentRun>) -> Sighting {
    sighting(run, &warm(), Fence::new(1), POD)
}

#[test]
fn it_waits_for_the_turn_to_exist_join_and_be_claimed_for_it() {
    assert_eq!(seen(None), Sighting::Wait);
    assert_eq!(
        seen(Some(&turn(None, "4"))),
        Sighting::Wait,
        "not joined yet"
    );
    let joined = turn(Some("thread-uid"), "4");
    assert_eq!(seen(Some(&joined)), Sighting::Wait, "not claimed yet");
    assert_eq!(seen(Some(&claimed(joined, 1, POD))), Sighting::Start);
}

#[test]
fn it_serves_no_run_of_its_name_but_the_turn_it_was_made_for() {
    let mut plain = turn(None, "4");
    plain.spec.thread = None;
    let refused = |run: &AgentRun| matches!(seen(Some(run)), Sighting::Refuse(_));
    assert!(refused(&claimed(plain, 1, POD)), "a plain run of that name");
    let other = claimed(turn(Some("another-thread"), "4"), 1, POD);
    assert!(refused(&other), "a turn of another thread");
    let later = claimed(turn(Some("thread-uid"), "5"), 1, POD);
    let Sighting::Refuse(why) = seen(Some(&later)) else {
        panic!("a turn admitted at another generation is served");
    };
    assert!(
        why.contains("generation 5") && why.contains("generation 4"),
        "{why}"
    );
    let elsewhere = claimed(turn(Some("thread-uid"), "4"), 2, "conv-abcde-2");
    assert!(refused(&elsewhere), "claimed for another pod");
}

/// The pod `t-w1` of UID `uid`, controlled by an owner of `kind` and UID `owner`.
fn pod(uid: &str, kind: &str, owner: &str) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("t-w1".into());
    pod.metadata.uid = Some(uid.into());
    pod.metadata.owner_references = Some(vec![OwnerReference {
        kind: kind.into(),
        uid: owner.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    pod
}

/// Once the status names it, the pod waits while its thread still controls it, starts once its
/// run does, and exits for anything else: a namesake made since (another UID), its own
/// deletion, another run's or anyone else's control, no pod at all.
#[test]
fn it_acts_only_once_its_run_has_adopted_this_very_pod() {
    let own = "pod-uid";
    let of_thread = pod(own, "AgentThread", "thread-uid");
    assert_eq!(adoption(Some(&of_thread), own, "run-uid"), Sighting::Wait);
    let adopted = pod(own, "AgentRun", "run-uid");
    assert_eq!(adoption(Some(&adopted), own, "run-uid"), Sighting::Start);
    let refused = |p: Option<&Pod>| matches!(adoption(p, own, "run-uid"), Sighting::Refuse(_));
    assert!(refused(Some(&pod("another-uid", "AgentRun", "run-uid"))));
    assert!(refused(Some(&pod(own, "AgentRun", "another-run"))));
    assert!(refused(Some(&pod(own, "ReplicaSet", "rs"))));
    assert!(refused(None));
    let mut deleting = adopted.clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    assert!(refused(Some(&deleting)));
}
