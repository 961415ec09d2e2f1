//! Nothing deleted or replaced on a guess, and no run kept alive by another: each test plays a
//! hostile party for real, another run's worker (its own ServiceAccount token, with exactly
//! the rights baton gives it) or whoever made a Lease that is not baton's.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerEvent, LedgerSegment, Phase};
use baton::fence::Fence;
use baton::fence::segment_name;
use baton::lease::lease_holder;
use baton_testkit::controller::*;
use baton_testkit::rbac::{forged_segment, worker_client};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Resource, ResourceExt};

/// Run `v`'s worker dies after one renewal; run `a`'s worker points its own Lease's controller
/// reference at `v` and touches it every half second. `v` is taken over all the same once its
/// Lease has not changed for its duration: a Lease speaks only for the run its name gives.
#[tokio::test]
async fn a_worker_that_points_its_lease_at_another_run_does_not_keep_it_alive() {
    let (ns, _c, victim) = started("trust-keepalive", agent_run("v", 3)).await;
    create(&ns, long_lease_run("a")).await;
    wait_lease(&ns, "a", "a-w1", 1, T).await;
    FakeWorker::new(&ns, "v", 1).renew().await.unwrap();

    let leases: Api<Lease> =
        Api::namespaced(worker_client(&ns.client, &ns.name, "a").await, &ns.name);
    let mut own = leases
        .get("run.a")
        .await
        .expect("the worker reads its Lease");
    let mut pointed = victim.controller_owner_ref(&()).unwrap();
    pointed.block_owner_deletion = None;
    own.metadata.owner_references = Some(vec![pointed]);
    let spoofing = tokio::spawn(async move {
        for i in 0.. {
            own.annotations_mut().insert("spoof".into(), i.to_string());
            own = leases
                .replace("run.a", &PostParams::default(), &own)
                .await
                .expect("a worker may update its own Lease");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let t0 = Instant::now();
    let run = wait_fence(&ns, "v", 2, Duration::from_secs(20)).await;
    spoofing.abort();
    assert_eq!(status(&run).reason.as_deref(), Some("LeaseExpired"));
    assert!(t0.elapsed() < Duration::from_secs(20));
    ns.cleanup().await;
}

/// Another run's worker plants `x-000001` carrying the UID of live run `v`, then a run `x` is
/// created: its first claim takes the segment for a deleted namesake's leftover. Nothing of
/// `v`'s ledger is deleted, and neither is the planted segment (it is not a leftover).
#[tokio::test]
async fn a_planted_leftover_deletes_nothing_of_a_live_run() {
    let (ns, _c, victim) = started("trust-leftover", long_lease_run("v")).await;
    let mut w = FakeWorker::new(&ns, "v", 1);
    w.resume().await;
    w.renew().await.unwrap();
    let pod = w.pod.clone();
    w.append(vec![LedgerEvent::AttemptStarted {
        fence: Fence::new(1),
        pod,
    }])
    .await
    .unwrap();
    let before = ledger(&ns, "v").await;
    assert_eq!(before.len(), 2);

    create(&ns, long_lease_run("a")).await;
    wait_lease(&ns, "a", "a-w1", 1, T).await;
    let segments: Api<LedgerSegment> =
        Api::namespaced(worker_client(&ns.client, &ns.name, "a").await, &ns.name);
    let planted = forged_segment("x", &victim, vec![]);
    segments
        .create(&PostParams::default(), &planted)
        .await
        .expect("a worker may create segments");
    create(&ns, long_lease_run("x")).await;
    // The first claim of x looks at its position 1 within a pass or two.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let after = ledger(&ns, "v").await;
    assert_eq!(
        after.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        before.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        "the live run's ledger is whole"
    );
    let admin: Api<LedgerSegment> = ns.api();
    assert!(
        admin
            .get_opt(&segment_name("x", 1))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        status(&get(&ns, "x").await).fence,
        Fence::new(0),
        "x is not claimed over it"
    );
    wait_event(&ns, "x", "ForeignLedgerSegment", T).await;
    ns.cleanup().await;
}

/// A Lease `run.x` that something else made (no owner, its own holder) is never replaced: the
/// run `x` ends Failed, naming it, and the Lease is as it was.
#[tokio::test]
async fn a_lease_of_the_runs_name_made_by_something_else_is_left_alone() {
    let ns = TestNamespace::new("trust-lease").await;
    let _c = start(&ns.client, config(&ns.name));
    let theirs = Lease {
        metadata: ObjectMeta {
            name: Some("run.x".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("someone-else".into()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    };
    let theirs = ns
        .api::<Lease>()
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    create(&ns, long_lease_run("x")).await;
    let run = wait_run(&ns, "x", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(
        (s.phase, s.reason.as_deref()),
        (Phase::Failed, Some("LeaseNotOwned")),
        "{s:#?}"
    );
    let message = s.message.unwrap_or_default();
    assert!(message.contains("run.x"), "{message}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = lease(&ns, "x").await.unwrap();
    assert_eq!(
        now.resource_version(),
        theirs.resource_version(),
        "untouched"
    );
    assert_eq!(lease_holder(&now), Some("someone-else"));
    assert!(now.owner_references().is_empty());
    ns.cleanup().await;
}

/// Another worker's segment that claims run `v` (its UID label) under a name of its own is
/// never folded into `v`'s ledger: a claim that lists the ledger (a controller without memory
/// of the run) reports it in a Warning Event naming it, and goes on.
#[tokio::test]
async fn a_segment_that_claims_the_run_is_reported_not_folded_in() {
    let (ns, first, victim) = started("trust-claimant", agent_run("v", 3)).await;
    create(&ns, long_lease_run("a")).await;
    wait_lease(&ns, "a", "a-w1", 1, T).await;
    Api::<LedgerSegment>::namespaced(worker_client(&ns.client, &ns.name, "a").await, &ns.name)
        .create(
            &PostParams::default(),
            &forged_segment("a-claims", &victim, vec![]),
        )
        .await
        .expect("without the webhook, any worker may create a segment");
    drop(first);
    let _second = start(&ns.client, config(&ns.name));
    let run = wait_fence(&ns, "v", 2, Duration::from_secs(20)).await;
    assert_eq!(status(&run).reason.as_deref(), Some("LeaseExpired"));
    let event = wait_event(&ns, "v", "ForeignLedgerSegment", T).await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&segment_name("a-claims", 1)), "{note}");
    let condition = status(&get(&ns, "v").await)
        .conditions
        .into_iter()
        .find(|c| c.type_ == "ForeignLedgerSegments")
        .expect("the claim's status names them too");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "ForeignLedgerSegment")
    );
    assert!(condition.message.contains(&segment_name("a-claims", 1)));
    let seqs: Vec<i64> = ledger(&ns, "v").await.iter().map(|s| s.spec.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "contiguous, its own only"
    );
    ns.cleanup().await;
}
