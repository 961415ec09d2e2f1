//! Thread admission: two runs on one thread key run strictly one after the other; turns of
//! an AgentThread under two controllers, one killed, are live one at a time.

use baton_testkit::controller::*;
use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Phase};
use kube::ResourceExt;

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

/// Turns of one AgentThread under two controllers at once (no election: both act), one of
/// them killed after the first turn: one turn live at a time, always, in creation order, and
/// each turn's history the turns before it.
#[tokio::test]
async fn turns_of_a_thread_under_two_controllers_one_killed_are_live_one_at_a_time() {
    use baton::crd::v1alpha1::AgentThread;
    use kube::api::PostParams;

    let ns = TestNamespace::new("ctl-turns").await;
    let agent = agent_run("x", 10).spec.agent;
    let thread: AgentThread = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentThread",
        "metadata": {"name": "conv"},
        "spec": {"agent": agent, "lease": {"durationSeconds": 30, "renewSeconds": 10, "startupSeconds": 10}},
    }))
    .unwrap();
    ns.api::<AgentThread>()
        .create(&PostParams::default(), &thread)
        .await
        .unwrap();
    let first = start(&ns.client, config(&ns.name));
    let _second = start(&ns.client, config(&ns.name));
    let names = ["conv-1", "conv-2", "conv-3", "conv-4"];
    for name in names {
        let turn: AgentRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"input": format!("message {name}"), "thread": "conv"},
        }))
        .unwrap();
        create(&ns, turn).await;
        // Distinct creation times: turns run in creation order.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let mut first = Some(first);
    for (i, name) in names.iter().enumerate() {
        wait_fence(&ns, name, 1, T).await;
        let runs: Vec<AgentRun> = ns
            .api::<AgentRun>()
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let live: Vec<String> = runs
            .iter()
            .filter(|r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.fence.get() > 0 && !s.phase.is_terminal())
            })
            .map(|r| r.name_any())
            .collect();
        assert_eq!(live, [name.to_string()], "one live turn, in creation order");
        let mut w = FakeWorker::new(&ns, name, 1);
        let ledger = w.resume().await;
        let history = ledger[0].spec.events.iter().find_map(|e| match e {
            LedgerEvent::History { turns, .. } => {
                Some(turns.iter().map(|t| t.run.clone()).collect::<Vec<_>>())
            }
            _ => None,
        });
        assert_eq!(
            history,
            Some(names[..i].iter().map(|n| n.to_string()).collect())
        );
        w.renew().await.unwrap();
        w.finish(vec![]).await;
        match w.lease.release().await {
            Ok(_) | Err(baton::lease::LeaseError::Lost { holder: None, .. }) => {}
            Err(err) => panic!("releasing the lease: {err}"),
        }
        wait_run(&ns, name, T, |s| s.phase == Phase::Succeeded).await;
        // One controller dies after the first turn (mid-admission of the next, perhaps).
        drop(first.take());
    }
    // Turns deleted at once: each deletion recounts the thread from a cache the others race;
    // the thread's status still ends counting what is left.
    let runs = ns.api::<AgentRun>();
    let params = kube::api::DeleteParams::default();
    let deletions = names[..3].iter().map(|n| runs.delete(n, &params));
    for deleted in futures::future::join_all(deletions).await {
        deleted.unwrap();
    }
    let threads = ns.api::<AgentThread>();
    let deadline = std::time::Instant::now() + T;
    loop {
        let status = threads
            .get("conv")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        if status.turns == 1 && status.last_turn.as_deref() == Some("conv-4") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ns.cleanup().await;
}
