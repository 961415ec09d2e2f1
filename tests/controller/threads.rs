//! Thread admission: two runs on one thread run strictly one after the other.

use crate::controller_support::*;
use baton::crd::v1alpha1::{LedgerEvent, Phase};

#[tokio::test]
async fn two_runs_on_one_thread_are_strictly_sequential() {
    let ns = TestNamespace::new("ctl-thread").await;
    let _c = start(&ns.client, config(&ns.name));
    let mut first = agent_run("first", 10);
    first.spec.thread_key = Some("t1".into());
    create(&ns, first).await;
    wait_fence(&ns, "first", 1, T).await;
    let mut second = agent_run("second", 10);
    second.spec.thread_key = Some("t1".into());
    create(&ns, second).await;
    let queued = wait_run(&ns, "second", T, |s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Admitted" && c.status == "False")
    })
    .await;
    let s = status(&queued);
    assert_eq!(s.phase, Phase::Pending);
    let admitted = s.conditions.iter().find(|c| c.type_ == "Admitted").unwrap();
    assert!(admitted.message.contains("first"), "{}", admitted.message);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(status(&get(&ns, "second").await).phase, Phase::Pending);

    let mut w = FakeWorker::new(&ns, "first", 1);
    w.resume().await;
    w.renew().await.unwrap();
    w.append(vec![LedgerEvent::Final {
        output: "one".into(),
    }])
    .await
    .unwrap();
    w.write_status(|s| {
        s.phase = Phase::Finishing;
        s.outcome = Some(Phase::Succeeded);
    })
    .await
    .unwrap();
    // The controller may complete the run (and clear the Lease's holder) before this release.
    match w.lease.release().await {
        Ok(_) | Err(baton::lease::LeaseError::Lost { holder: None, .. }) => {}
        Err(err) => panic!("releasing the lease: {err}"),
    }
    let done = wait_run(&ns, "first", T, |s| s.phase == Phase::Succeeded).await;
    let started = wait_fence(&ns, "second", 1, T).await;
    let finished_at = status(&done).completion_time.unwrap().0;
    let started_at = status(&started).start_time.unwrap().0;
    assert!(finished_at <= started_at, "{finished_at} vs {started_at}");
    ns.cleanup().await;
}

#[tokio::test]
async fn runs_without_a_thread_key_are_admitted_at_once() {
    let ns = TestNamespace::new("ctl-nothread").await;
    let _c = start(&ns.client, config(&ns.name));
    create(&ns, agent_run("a", 10)).await;
    create(&ns, agent_run("b", 10)).await;
    wait_fence(&ns, "a", 1, T).await;
    wait_fence(&ns, "b", 1, T).await;
    ns.cleanup().await;
}
