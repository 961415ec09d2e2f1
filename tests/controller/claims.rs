//! The claim protocol against a real API server, with the test playing the worker.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerEvent, Phase};
use baton::fence::Fence;
use baton::status::StatusError;
use baton_testkit::controller::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;

#[tokio::test]
async fn start_claims_fence_one_with_lease_pod_and_seal() {
    let ns = TestNamespace::new("ctl-start").await;
    let _c = start(&ns.client, config(&ns.name));
    create(&ns, agent_run("r", 10)).await;
    let run = wait_fence(&ns, "r", 1, T).await;
    let s = status(&run);
    assert_eq!((s.fence.get(), s.attempt, s.failed_attempts), (1, 1, 0));
    assert_eq!(s.worker.as_deref(), Some("r-w1"));
    wait_lease(&ns, "r", "r-w1", 1, T).await;
    let pod = wait_pod(&ns, "r-w1", T).await;
    let spec = pod.spec.unwrap();
    let worker = spec.containers.iter().find(|c| c.name == "worker").unwrap();
    let env = worker.env.clone().unwrap();
    assert!(
        env.iter()
            .any(|e| e.name == "BATON_FENCE" && e.value.as_deref() == Some("1"))
    );
    assert_eq!(seals(&ledger(&ns, "r").await), vec![(1, false)]);
    ns.cleanup().await;
}

/// A worker renews from the Lease as it last wrote it: one request while nobody else writes
/// the Lease; any other write (here a label) refuses that one, and it reads and verifies again.
#[tokio::test]
async fn a_steady_renewal_is_one_write_until_someone_else_writes_the_lease() {
    use baton::lease::WorkerLease;
    use baton::worker::api_count::{ApiCounters, counted_client};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::ResourceExt;
    use kube::api::{Patch, PatchParams};

    let (ns, _c, _) = started("ctl-renew", long_lease_run("r")).await;
    let counters = std::sync::Arc::new(ApiCounters::default());
    let client = counted_client(counters.clone()).await.unwrap();
    let lease = WorkerLease::new(client, &ns.name, "r", "r-w1", Fence::new(1));
    lease.verify().await.unwrap();
    for _ in 0..3 {
        lease.renew().await.unwrap();
    }
    let c = counters.snapshot();
    assert_eq!((c.get, c.update), (1, 3), "{c:?}");

    let label = serde_json::json!({"metadata": {"labels": {"touched": "yes"}}});
    ns.api::<Lease>()
        .patch("run.r", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let renewed = lease.renew().await.unwrap();
    assert!(renewed.labels().contains_key("touched"));
    let c = counters.snapshot();
    // The refused write, the read, the write that landed.
    assert_eq!((c.get, c.update), (2, 5), "{c:?}");
    ns.cleanup().await;
}

#[tokio::test]
async fn expiry_takeover_moves_the_fence_by_one_and_fences_out_the_zombie() {
    let (ns, _c, _) = started("ctl-expiry", agent_run("r", 10)).await;
    let mut zombie = FakeWorker::new(&ns, "r", 1);
    zombie.resume().await;
    zombie
        .append(vec![LedgerEvent::AttemptStarted {
            fence: Fence::new(1),
            pod: "r-w1".into(),
        }])
        .await
        .unwrap();
    zombie.renew_for(3, Duration::from_millis(800)).await;
    // The worker stops renewing (paused): the lease expires on the controller's clock.
    let run = wait_fence(&ns, "r", 2, T).await;
    let s = status(&run);
    assert_eq!((s.fence.get(), s.attempt, s.failed_attempts), (2, 2, 1));
    assert_eq!(s.reason.as_deref(), Some("LeaseExpired"));
    wait_lease(&ns, "r", "r-w2", 2, T).await;
    wait_pod(&ns, "r-w2", T).await;
    // The zombie wakes: its renewal, its status write and its next append are all refused.
    assert!(zombie.renew().await.unwrap_err().is_lost());
    let refused = zombie
        .write_status(|s| s.phase = Phase::Finishing)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, StatusError::FenceMoved { current, .. } if current.get() == 2),
        "{refused:?}"
    );
    let collided = zombie
        .append(vec![LedgerEvent::ModelDelta {
            text: "late".into(),
        }])
        .await
        .unwrap_err();
    assert!(
        matches!(
            collided,
            baton::ledger::LedgerError::Superseded { theirs, .. } if theirs.get() == 2
        ),
        "{collided:?}"
    );
    // The new worker renews: the fence stays at 2 (exactly one claim for one expiry).
    let next = FakeWorker::new(&ns, "r", 2);
    next.renew_for(4, Duration::from_millis(700)).await;
    assert_eq!(status(&get(&ns, "r").await).fence, Fence::new(2));
    assert_eq!(seals(&ledger(&ns, "r").await), vec![(1, false), (2, false)]);
    // Every claim has its Event, naming its fence; a takeover's is a Warning.
    let start = wait_event(&ns, "r", "ClaimedStart", T).await;
    assert_eq!(
        start.note.as_deref(),
        Some("attempt 1 claimed for pod r-w1 (Start)")
    );
    assert_eq!(start.type_.as_deref(), Some("Normal"));
    let takeover = wait_event(&ns, "r", "ClaimedLeaseExpired", T).await;
    assert_eq!(
        takeover.note.as_deref(),
        Some("attempt 2 claimed for pod r-w2 (LeaseExpired)")
    );
    assert_eq!(takeover.type_.as_deref(), Some("Warning"));
    assert_eq!(
        takeover.reporting_controller.as_deref(),
        Some("baton-controller")
    );
    assert!(
        ns.api::<Pod>().get_opt("r-w1").await.unwrap().is_none(),
        "old pod deleted"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_terminated_pod_is_taken_over_without_waiting_for_the_lease() {
    let (ns, _c, _) = started("ctl-podterm", long_lease_run("r")).await;
    wait_pod(&ns, "r-w1", T).await;
    FakeWorker::new(&ns, "r", 1).renew().await.unwrap();
    let t0 = Instant::now();
    terminate_pod(&ns, "r-w1").await;
    let run = wait_fence(&ns, "r", 2, Duration::from_secs(15)).await;
    assert!(t0.elapsed() < Duration::from_secs(15));
    assert_eq!(status(&run).reason.as_deref(), Some("PodTerminated"));
    assert_eq!(status(&run).failed_attempts, 1);
    ns.cleanup().await;
}

#[tokio::test]
async fn a_force_deleted_pod_is_never_recreated_the_run_moves_to_the_next_fence() {
    let ns = TestNamespace::new("ctl-forcedel").await;
    let (_w, seen) = watch_pods(&ns);
    let _c = start(&ns.client, config(&ns.name));
    create(&ns, long_lease_run("r")).await;
    wait_pod(&ns, "r-w1", T).await;
    wait_lease(&ns, "r", "r-w1", 1, T).await;
    FakeWorker::new(&ns, "r", 1).renew().await.unwrap();
    ns.api::<Pod>()
        .delete("r-w1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let run = wait_fence(&ns, "r", 2, T).await;
    assert_eq!(status(&run).reason.as_deref(), Some("PodGone"));
    wait_pod(&ns, "r-w2", T).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pod_names(&ns).await, vec!["r-w2".to_string()]);
    for (name, uids) in seen.lock().unwrap().iter() {
        assert_eq!(uids.len(), 1, "pod {name} was created more than once");
    }
    ns.cleanup().await;
}

#[tokio::test]
async fn max_attempts_ends_interrupted_with_salvage_and_unknown_effects() {
    let ns = TestNamespace::new("ctl-giveup").await;
    let _c = start(&ns.client, config(&ns.name));
    let mut r = agent_run("r", 10);
    r.spec.max_attempts = 2;
    create(&ns, r).await;
    wait_lease(&ns, "r", "r-w1", 1, T).await;
    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    w1.append(died_mid_step(1, "r-w1")).await.unwrap();
    w1.renew().await.unwrap();
    wait_lease(&ns, "r", "r-w2", 2, T).await;
    let w2 = FakeWorker::new(&ns, "r", 2);
    w2.renew().await.unwrap();
    let run = wait_run(&ns, "r", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(s.phase, Phase::Interrupted);
    assert_eq!(s.reason.as_deref(), Some("MaxAttemptsExceeded"));
    assert_eq!((s.fence.get(), s.failed_attempts), (3, 2));
    assert!(
        s.output
            .as_deref()
            .unwrap_or_default()
            .contains("partial answer"),
        "{:?}",
        s.output
    );
    assert!(s.output_partial);
    assert_eq!(s.unknown_effects.len(), 1);
    assert_eq!(s.unknown_effects[0].step, 1);
    assert!(s.completion_time.is_some());
    // The terminal claim seals like a claim, then records the end.
    assert_eq!(
        seals(&ledger_recorded(&ns, "r").await),
        vec![(1, false), (2, false), (3, false), (3, true)]
    );
    // Released after the status and the record: waited for, not read at once.
    wait_lease_released(&ns, "r", 3, T).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn handoff_is_claimed_at_once_and_costs_no_attempt() {
    let (ns, _c, _) = started("ctl-handoff", long_lease_run("r")).await;
    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    w1.renew().await.unwrap();
    w1.append(vec![LedgerEvent::Handoff]).await.unwrap();
    w1.write_status(|s| s.phase = Phase::Handoff).await.unwrap();
    // The controller claims a Handoff at once: it may move the Lease before this release.
    match w1.lease.release().await {
        Ok(_) | Err(baton::lease::LeaseError::Lost { .. }) => {}
        Err(err) => panic!("releasing the lease: {err}"),
    }
    let t0 = Instant::now();
    let run = wait_fence(&ns, "r", 2, Duration::from_secs(10)).await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    let s = status(&run);
    assert_eq!((s.fence.get(), s.failed_attempts), (2, 0));
    assert_eq!(s.reason.as_deref(), Some("Handoff"));
    wait_pod(&ns, "r-w2", T).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn finishing_is_completed_even_when_the_worker_died_after_writing_it() {
    let (ns, _c, _) = started("ctl-finish", agent_run("r", 10)).await;
    let mut w1 = FakeWorker::new(&ns, "r", 1);
    w1.resume().await;
    w1.renew().await.unwrap();
    w1.append(vec![LedgerEvent::Final {
        output: "done".into(),
    }])
    .await
    .unwrap();
    w1.write_status(|s| {
        s.phase = Phase::Finishing;
        s.outcome = Some(Phase::Succeeded);
        s.output = Some("done".into());
    })
    .await
    .unwrap();
    // The worker dies here: no release.
    let run = wait_run(&ns, "r", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(s.phase, Phase::Succeeded);
    assert_eq!(s.output.as_deref(), Some("done"));
    assert!(s.completion_time.is_some());
    assert!(
        s.conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
    );
    wait_lease_released(&ns, "r", 1, T).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn waiting_input_is_claimed_again_when_an_input_arrives() {
    let (ns, _c, _) = started("ctl-input", agent_run("r", 10)).await;
    let w1 = FakeWorker::new(&ns, "r", 1);
    w1.renew().await.unwrap();
    w1.write_status(|s| s.phase = Phase::WaitingInput)
        .await
        .unwrap();
    w1.lease.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(status(&get(&ns, "r").await).phase, Phase::WaitingInput);
    patch_spec(&ns, "r", serde_json::json!({"inputs": ["yes"]})).await;
    let run = wait_fence(&ns, "r", 2, T).await;
    assert_eq!(status(&run).failed_attempts, 0);
    assert_eq!(status(&run).reason.as_deref(), Some("InputReceived"));
    ns.cleanup().await;
}

/// A run that waits (here for an approval; the same rule holds for input) past its budget
/// deadline has no worker to notice: the controller ends it Failed/DeadlineExceeded with a
/// terminal claim.
#[tokio::test]
async fn a_run_waiting_past_its_deadline_ends_failed_by_a_terminal_claim() {
    let mut r = agent_run("r", 10);
    r.spec.budget = Some(baton::crd::v1alpha1::BudgetSpec {
        deadline_seconds: Some(6),
        ..Default::default()
    });
    let (ns, _c, _) = started("ctl-deadline", r).await;
    let w1 = FakeWorker::new(&ns, "r", 1);
    w1.renew().await.unwrap();
    w1.write_status(|s| s.phase = Phase::WaitingApproval)
        .await
        .unwrap();
    w1.lease.release().await.unwrap();
    let run = wait_run(&ns, "r", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(
        (s.phase, s.reason.as_deref()),
        (Phase::Failed, Some("DeadlineExceeded")),
        "{s:?}"
    );
    assert!(
        s.message
            .unwrap_or_default()
            .contains("spec.budget.deadlineSeconds"),
        "the message names the limit"
    );
    assert_eq!(
        seals(&ledger_recorded(&ns, "r").await),
        vec![(1, false), (2, false), (2, true)]
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn an_invalid_spec_fails_with_a_message_naming_the_field() {
    let ns = TestNamespace::new("ctl-invalid").await;
    let _c = start(&ns.client, config(&ns.name));
    let mut r = agent_run("r", 10);
    r.spec.lease.renew_seconds = 3;
    create(&ns, r).await;
    let run = wait_run(&ns, "r", T, |s| s.phase.is_terminal()).await;
    let s = status(&run);
    assert_eq!(s.phase, Phase::Failed);
    assert_eq!(s.reason.as_deref(), Some("InvalidSpec"));
    assert_eq!(
        s.message.as_deref(),
        Some("spec.lease.renewSeconds (3) must be less than spec.lease.durationSeconds (3)")
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_stop_no_worker_carries_out_ends_the_run_stopped() {
    let (ns, _c, _) = started("ctl-stop", agent_run("r", 30)).await;
    let w1 = FakeWorker::new(&ns, "r", 1);
    w1.renew().await.unwrap();
    patch_spec(&ns, "r", serde_json::json!({"stop": true})).await;
    // The worker keeps renewing but ignores the stop.
    let renewing = tokio::spawn(async move { w1.renew_for(20, Duration::from_millis(500)).await });
    let run = wait_run(&ns, "r", T, |s| s.phase.is_terminal()).await;
    renewing.abort();
    let s = status(&run);
    assert_eq!(s.phase, Phase::Stopped);
    assert_eq!(s.fence, Fence::new(2));
    assert_eq!(
        seals(&ledger_recorded(&ns, "r").await),
        vec![(1, false), (2, false), (2, true)]
    );
    ns.cleanup().await;
}
