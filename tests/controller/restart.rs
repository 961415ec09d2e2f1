//! A controller that dies between the steps of a claim completes it on its next pass and
//! never creates two pods for one fence.

use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Phase};
use baton::fence::{CloseReason, Fence};
use baton::lease::{LeaseClient, lease_holder};
use baton::ledger::SegmentStore;
use baton::status::cas_status;
use baton_testkit::controller::*;
use kube::{Resource, ResourceExt};

/// Does the first steps of a claim for fence 1 by hand, as a controller that then died.
async fn partial_claim(ns: &TestNamespace, name: &str, move_lease: bool) -> AgentRun {
    let run = create(ns, agent_run(name, 4)).await;
    let pod = baton::fence::worker_pod_name(name, Fence::new(1));
    let store = SegmentStore::for_run(ns.client.clone(), &run);
    store
        .append(
            0,
            Fence::new(1),
            vec![LedgerEvent::Claimed {
                fence: Fence::new(1),
                pod: pod.clone(),
            }],
        )
        .await
        .unwrap();
    let mut status = status(&run);
    status.phase = Phase::Running;
    status.fence = Fence::new(1);
    status.attempt = 1;
    status.worker = Some(pod.clone());
    let run = cas_status(&ns.api(), &run, status).await.unwrap();
    if move_lease {
        let owner = run.controller_owner_ref(&()).unwrap();
        LeaseClient::new(ns.client.clone(), &ns.name)
            .move_to(name, owner, &pod, Fence::new(1), 3)
            .await
            .unwrap();
    }
    run
}

#[tokio::test]
async fn status_ahead_of_the_lease_is_completed_with_the_same_fence() {
    let ns = TestNamespace::new("ctl-rs-status").await;
    partial_claim(&ns, "r", false).await;
    let _c = start(&ns.client, config(&ns.name));
    wait_lease(&ns, "r", "r-w1", 1, T).await;
    wait_pod(&ns, "r-w1", T).await;
    assert_eq!(status(&get(&ns, "r").await).fence, Fence::new(1));
    ns.cleanup().await;
}

#[tokio::test]
async fn a_lease_moved_without_its_pod_ends_that_attempt_instead_of_recreating_it() {
    let ns = TestNamespace::new("ctl-rs-lease").await;
    let (_w, seen) = watch_pods(&ns);
    partial_claim(&ns, "r", true).await;
    let _c = start(&ns.client, config(&ns.name));
    let run = wait_fence(&ns, "r", 2, Duration::from_secs(30)).await;
    let s = status(&run);
    assert_eq!(s.reason.as_deref(), Some("PodGone"));
    assert_eq!(
        s.failed_attempts, 0,
        "an attempt that never ran is not a failed one"
    );
    wait_pod(&ns, "r-w2", T).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !seen.lock().unwrap().contains_key("r-w1"),
        "pod of fence 1 must never be created"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn restarting_the_controller_repeatedly_never_makes_two_pods_per_fence() {
    let ns = TestNamespace::new("ctl-rs-loop").await;
    let (_w, seen) = watch_pods(&ns);
    for i in 0..4 {
        create(&ns, agent_run(&format!("r{i}"), 4)).await;
    }
    // Kill and restart the controller at varying moments while runs start and expire.
    for round in 0..12u64 {
        let c = start(&ns.client, config(&ns.name));
        tokio::time::sleep(Duration::from_millis(150 + (round * 97) % 600)).await;
        drop(c);
    }
    let _c = start(&ns.client, config(&ns.name));
    for i in 0..4 {
        let name = format!("r{i}");
        wait_run(&ns, &name, Duration::from_secs(40), |s| {
            s.fence >= Fence::new(2) || s.phase.is_terminal()
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (name, uids) in seen.lock().unwrap().iter() {
        assert_eq!(uids.len(), 1, "pod {name} was created more than once");
    }
    for i in 0..4 {
        let run = get(&ns, &format!("r{i}")).await;
        let sealed = seals(&ledger(&ns, &run.name_any()).await);
        // A run that reached its end within the test has its terminal claim's two seals,
        // `claimed` and `closed`, at one fence: only `claimed` is one per fence.
        let claimed: Vec<i64> = sealed.iter().filter(|s| !s.1).map(|s| s.0).collect();
        let mut once = claimed.clone();
        once.dedup();
        assert_eq!(
            claimed,
            once,
            "one claim per fence in {}: {sealed:?}",
            run.name_any()
        );
        let closed: Vec<i64> = sealed.iter().filter(|s| s.1).map(|s| s.0).collect();
        assert!(
            closed.is_empty() || closed == [*claimed.last().unwrap()],
            "at most one record of the end, at the last claim's fence, in {}: {sealed:?}",
            run.name_any()
        );
    }
    ns.cleanup().await;
}

/// A terminal claim whose `closed` seal landed but whose status write did not (the controller
/// stopped between the two) is completed as the seal records, even once the trigger that
/// decided it no longer holds: here `spec.stop` was never set (as if set and then cleared), and
/// the pod of fence 1 is gone, so every pass decides a claim, not a close.
#[tokio::test]
async fn a_closed_seal_without_its_status_ends_the_run_as_the_seal_records() {
    let ns = TestNamespace::new("ctl-rs-closed").await;
    let (_w, seen) = watch_pods(&ns);
    let run = partial_claim(&ns, "r", true).await;
    // The controller's terminal claim for fence 2, as written by `claim::close`, up to its
    // seal: then it stopped.
    let sealed = SegmentStore::for_run(ns.client.clone(), &run)
        .append(
            1,
            Fence::new(2),
            vec![LedgerEvent::Closed {
                fence: Fence::new(2),
                reason: CloseReason::StopRequested,
            }],
        )
        .await
        .unwrap();
    assert_eq!(sealed.tail, 2);
    assert!(!run.spec.stop, "no trigger for a close remains");
    let _c = start(&ns.client, config(&ns.name));
    let run = wait_run(&ns, "r", Duration::from_secs(30), |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(s.phase, Phase::Stopped);
    assert_eq!(s.reason.as_deref(), Some("StopRequested"));
    assert_eq!(s.fence, Fence::new(2), "the end is at the seal's fence");
    let complete = s.conditions.iter().find(|c| c.type_ == "Complete");
    assert_eq!(complete.map(|c| c.status.as_str()), Some("True"));
    let released = async {
        while lease(&ns, "r")
            .await
            .as_ref()
            .and_then(lease_holder)
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(T, released)
        .await
        .expect("the run's Lease is released");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !seen.lock().unwrap().contains_key("r-w2"),
        "a closed run gets no pod for the seal's fence"
    );
    assert_eq!(
        ledger(&ns, "r").await.len(),
        2,
        "nothing appended after the seal"
    );
    ns.cleanup().await;
}
