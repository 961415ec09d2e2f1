//! Operating the controller: its admin endpoints and ttlSecondsAfterFinished retention,
//! against a real API server, with the test playing the worker.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, Phase};
use baton::fence::Fence;
use baton_testkit::controller::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

/// A free loopback port for the admin server.
fn free_addr() -> std::net::SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Plain HTTP/1.1 GET on loopback; returns (status line, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

/// Polls `path` until it answers 200 (the server starts with the controller); returns the body.
async fn wait_http_ok(addr: std::net::SocketAddr, path: &str) -> String {
    let deadline = Instant::now() + T;
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(2), get(addr, path)).await;
        if let Ok(Ok((status, body))) = &answer
            && status.contains(" 200 ")
        {
            return body.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered 200: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn admin_endpoints_serve_health_and_metrics_with_claims_counted() {
    let ns = TestNamespace::new("ctl-admin").await;
    let addr = free_addr();
    let mut cfg = config(&ns.name);
    cfg.admin_addr = Some(addr);
    let _c = start(&ns.client, cfg);
    wait_http_ok(addr, "/livez").await;
    wait_http_ok(addr, "/readyz").await;

    create(&ns, agent_run("r", 10)).await;
    finish_first_attempt(&ns, "r").await;

    let metrics = wait_http_ok(addr, "/metrics").await;
    for name in [
        "baton_claims_total",
        "baton_runs",
        "baton_reconciles_total",
        "baton_api_writes_total",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    assert!(
        metrics.lines().any(|l| l.starts_with("baton_claims_total{")
            && l.contains("Start")
            && l.ends_with(" 1")),
        "one Start claim counted:\n{metrics}"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_finished_run_is_deleted_after_its_ttl() {
    let ns = TestNamespace::new("ctl-ttl").await;
    let _c = start(&ns.client, config(&ns.name));
    let mut run = agent_run("r", 10);
    run.spec.ttl_seconds_after_finished = Some(2);
    create(&ns, run).await;
    finish_first_attempt(&ns, "r").await;
    let finished = Instant::now();

    let deadline = finished + T;
    while ns.api::<AgentRun>().get_opt("r").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the run outlived its ttlSecondsAfterFinished"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Deleted no earlier than the TTL after completion (completionTime is second-granular).
    assert!(
        finished.elapsed() >= Duration::from_secs(1),
        "deleted before its TTL"
    );
    ns.cleanup().await;
}

/// A run deleted and re-created under the same name before its objects were garbage-collected
/// (the local control plane has no garbage collector at all, so they stay): the new run starts
/// at fence 1 on a Lease, ledger, pod and RBAC of its own, the old ones removed by UID, and
/// the old run's worker can no longer renew that Lease or write that status.
#[tokio::test]
async fn a_run_recreated_under_a_deleted_runs_name_starts_clean() {
    use baton::fence::{Fence, RunHolder};
    use baton::lease::WorkerLease;
    use baton::status::{StatusError, fenced_update};
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use kube::ResourceExt;
    use kube::api::DeleteParams;

    let (ns, _c, old) = started("ctl-recreate", agent_run("r", 60)).await;
    wait_pod(&ns, "r-w1", T).await;
    let old_uid = old.uid().unwrap();
    ns.api::<AgentRun>()
        .delete("r", &DeleteParams::default())
        .await
        .unwrap();
    let new = create(&ns, agent_run("r", 60)).await;
    let new_uid = new.uid().unwrap();
    assert_ne!(old_uid, new_uid);

    let run = wait_fence(&ns, "r", 1, T).await;
    let s = status(&run);
    assert_eq!((s.fence.get(), s.attempt, s.failed_attempts), (1, 1, 0));
    let owned_by_new =
        |owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            owners.iter().any(|o| o.uid == new_uid)
        };
    let deadline = Instant::now() + T;
    loop {
        let lease = lease(&ns, "r").await;
        let pod = ns.api::<Pod>().get_opt("r-w1").await.unwrap();
        let fresh = lease
            .as_ref()
            .is_some_and(|l| owned_by_new(l.owner_references()))
            && pod
                .as_ref()
                .is_some_and(|p| owned_by_new(p.owner_references()));
        if fresh {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lease {lease:?} / pod {pod:?} still the old run's"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_lease(&ns, "r", "r-w1", 1, T).await;
    assert_eq!(seals(&ledger(&ns, "r").await), vec![(1, false)]);
    let every_segment = ns
        .api::<baton::crd::v1alpha1::LedgerSegment>()
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        every_segment
            .iter()
            .all(|s| owned_by_new(s.owner_references())),
        "the old run's segments are gone: {every_segment:?}"
    );
    let account = ns
        .api::<ServiceAccount>()
        .get(&baton::rbac::worker_service_account_name("r"))
        .await
        .unwrap();
    assert!(owned_by_new(account.owner_references()), "{account:?}");

    // The old run's worker (pod r-w1 at fence 1, like the new one's) is refused everywhere.
    let zombie = RunHolder {
        namespace: ns.name.clone(),
        run: "r".into(),
        uid: old_uid.clone(),
        pod: "r-w1".into(),
        fence: Fence::new(1),
    };
    let refused = fenced_update(&ns.api::<AgentRun>(), &zombie, |s| {
        s.phase = Phase::Finishing
    })
    .await
    .unwrap_err();
    assert!(
        matches!(refused, StatusError::Replaced { .. }),
        "{refused:?}"
    );
    let lease =
        WorkerLease::new(ns.client.clone(), &ns.name, "r", "r-w1", Fence::new(1)).of_run(&old_uid);
    assert!(lease.renew().await.unwrap_err().is_lost());
    assert_eq!(
        status(&baton_testkit::controller::get(&ns, "r").await).phase,
        Phase::Running
    );
    ns.cleanup().await;
}

/// Who the API server recorded as the writers of an object (`managedFields` managers).
fn managers(fields: Option<Vec<ManagedFieldsEntry>>) -> Vec<String> {
    fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect()
}

/// `baton controller` as users run it (the binary, its flags, its client from KUBECONFIG): it
/// starts a run, and the API server records `baton-controller` (its User-Agent) as the field
/// manager of what it wrote, not `unknown`.
#[tokio::test]
async fn the_controller_binary_names_itself_as_the_writer() {
    let ns = TestNamespace::new("ctl-binary").await;
    let admin = free_addr().to_string();
    let mut controller = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args([
            "controller",
            "--namespace",
            &ns.name,
            "--leader-election=false",
        ])
        .args(["--admin-addr", &admin])
        .kill_on_drop(true)
        .spawn()
        .expect("starting baton controller");
    create(&ns, agent_run("r", 10)).await;
    wait_lease(&ns, "r", "r-w1", 1, T).await;
    let pod = wait_pod(&ns, "r-w1", T).await;
    let run = baton_testkit::controller::get(&ns, "r").await;
    let lease = lease(&ns, "r").await.expect("the run's Lease");
    // The test created the run (its spec's field manager); the controller wrote its status.
    let of_run = managers(run.metadata.managed_fields);
    assert!(of_run.iter().any(|m| m == "baton-controller"), "{of_run:?}");
    // The controller alone wrote the Lease and the pod.
    assert_eq!(
        managers(lease.metadata.managed_fields),
        ["baton-controller"]
    );
    assert_eq!(managers(pod.metadata.managed_fields), ["baton-controller"]);
    controller.kill().await.ok();
    ns.cleanup().await;
}

/// `baton_remembered_runs` as the admin server reports it now.
async fn remembered_runs(addr: std::net::SocketAddr) -> i64 {
    let metrics = wait_http_ok(addr, "/metrics").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("baton_remembered_runs "))
        .unwrap_or_else(|| panic!("/metrics lacks baton_remembered_runs:\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// The controller's memory of a run (Lease sightings, seals) goes with the run, whoever
/// deletes it: runs deleted by a user leave no entries behind, and their Leases (which the
/// local control plane, with no garbage collector, keeps) renewed after the deletion bring
/// none back.
#[tokio::test]
async fn the_memory_of_runs_deleted_by_a_user_is_dropped() {
    let ns = TestNamespace::new("ctl-memory").await;
    let addr = free_addr();
    let mut cfg = config(&ns.name);
    cfg.admin_addr = Some(addr);
    let _c = start(&ns.client, cfg);
    let names: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    for name in &names {
        create(&ns, long_lease_run(name)).await;
    }
    for name in &names {
        wait_lease(
            &ns,
            name,
            &baton::fence::worker_pod_name(name, Fence::new(1)),
            1,
            T,
        )
        .await;
    }
    let before = remembered_runs(addr).await;
    assert_eq!(before, 5, "one entry per live run");
    for name in &names {
        ns.api::<AgentRun>()
            .delete(name, &Default::default())
            .await
            .unwrap();
    }
    for name in &names {
        FakeWorker::new(&ns, name, 1).renew().await.unwrap();
    }
    let deadline = Instant::now() + T;
    let mut left = remembered_runs(addr).await;
    while left != 0 {
        assert!(
            Instant::now() < deadline,
            "{left} entries left for deleted runs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = remembered_runs(addr).await;
    }
    // The renewals' watch events have long arrived by now: they brought nothing back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(remembered_runs(addr).await, 0);
    ns.cleanup().await;
}
