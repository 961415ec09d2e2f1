//! Safety without the election: two controllers racing make one claim per expiry and one pod
//! per attempt. With the election, only the leader writes.

use std::time::Duration;

use baton::controller::LEADER_LEASE_NAME;
use baton::lease::lease_holder;
use baton_testkit::controller::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;

#[tokio::test]
async fn two_controllers_without_election_make_one_claim_per_expiry() {
    let ns = TestNamespace::new("ctl-race").await;
    let (_w, seen) = watch_pods(&ns);
    let _a = start(&ns.client, config(&ns.name));
    let _b = start(&ns.client, config(&ns.name));
    let n = 6;
    for i in 0..n {
        create(&ns, agent_run(&format!("r{i}"), 4)).await;
    }
    for i in 0..n {
        let name = format!("r{i}");
        wait_lease(&ns, &name, &format!("{name}-w1"), 1, T).await;
        FakeWorker::new(&ns, &name, 1).renew().await.unwrap();
    }
    // Nobody renews again: every lease expires once; each run is claimed for fence 2 only.
    for i in 0..n {
        wait_fence(&ns, &format!("r{i}"), 2, T).await;
    }
    for i in 0..n {
        let name = format!("r{i}");
        wait_lease(&ns, &name, &format!("{name}-w2"), 2, T).await;
        FakeWorker::new(&ns, &name, 2).renew().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..n {
        let name = format!("r{i}");
        let s = status(&get(&ns, &name).await);
        assert_eq!((s.fence.get(), s.failed_attempts), (2, 1), "{name}");
        assert_eq!(
            seals(&ledger(&ns, &name).await),
            vec![(1, false), (2, false)],
            "{name}"
        );
    }
    for (name, uids) in seen.lock().unwrap().iter() {
        assert_eq!(uids.len(), 1, "pod {name} was created more than once");
    }
    ns.cleanup().await;
}

#[tokio::test]
async fn with_election_only_the_leader_writes_and_a_successor_takes_over() {
    let ns = TestNamespace::new("ctl-elect").await;
    let elected = |id: &str| {
        let mut c = config(&ns.name);
        c.leader_election = true;
        c.identity = id.into();
        c
    };
    let a = start(&ns.client, elected("ctl-a"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _b = start(&ns.client, elected("ctl-b"));
    // A long startup allowance: no run may expire while the test runs (a standby replica
    // watches the Leases too, so its clock for r0 starts when r0's Lease moved, not when it
    // comes to lead).
    create(&ns, agent_run("r0", 60)).await;
    wait_fence(&ns, "r0", 1, T).await;
    let leader = ns.api::<Lease>().get(LEADER_LEASE_NAME).await.unwrap();
    assert_eq!(lease_holder(&leader), Some("ctl-a"));
    // The leader dies; the other replica takes over once the leader Lease expires.
    drop(a);
    create(&ns, agent_run("r1", 60)).await;
    wait_fence(&ns, "r1", 1, T).await;
    let leader = ns.api::<Lease>().get(LEADER_LEASE_NAME).await.unwrap();
    assert_eq!(lease_holder(&leader), Some("ctl-b"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events = ns
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let by = |run: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(run))
            .filter_map(|e| e.reporting_instance.clone())
            .collect()
    };
    assert!(
        !by("r0").is_empty() && by("r0").iter().all(|i| i == "ctl-a"),
        "{:?}",
        by("r0")
    );
    assert!(
        !by("r1").is_empty() && by("r1").iter().all(|i| i == "ctl-b"),
        "{:?}",
        by("r1")
    );
    ns.cleanup().await;
}
