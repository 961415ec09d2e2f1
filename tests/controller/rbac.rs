//! Per-run least privilege against a real API server: before a run's first worker pod, the
//! controller creates the run's own ServiceAccount, Role and RoleBinding, owned by the run, and
//! the pod runs as that ServiceAccount; a takeover does not create them again.

use std::time::Duration;

use baton::crd::controlled_by_run;
use baton::rbac::{RunRbac, worker_rules};
use baton_testkit::controller::*;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;

#[tokio::test]
async fn the_first_claim_gives_the_run_its_own_account_and_a_takeover_reuses_it() {
    let (ns, _c, created) = started("ctl-rbac", agent_run("r", 10)).await;
    let uid = created.uid().unwrap();
    let pod = wait_pod(&ns, "r-w1", T).await;
    let spec = pod.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("baton-run-r"));
    // Every container (the tools one too) under the restricted context.
    for c in &spec.containers {
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
    }
    assert_eq!(spec.automount_service_account_token, Some(false));

    // All three exist, named after the run, owned by it, and the Role is exactly the worker's.
    let sa = ns.api::<ServiceAccount>().get("baton-run-r").await.unwrap();
    let role = ns.api::<Role>().get("baton-run-r").await.unwrap();
    let binding = ns.api::<RoleBinding>().get("baton-run-r").await.unwrap();
    assert!(controlled_by_run(&sa, &uid), "{:?}", sa.metadata);
    assert!(controlled_by_run(&role, &uid), "{:?}", role.metadata);
    assert!(controlled_by_run(&binding, &uid), "{:?}", binding.metadata);
    assert_eq!(role.rules.clone().unwrap(), worker_rules("r"));
    let expected = RunRbac::for_run(&get(&ns, "r").await).unwrap();
    assert_eq!(binding.role_ref, expected.role_binding.role_ref);
    assert_eq!(binding.subjects, expected.role_binding.subjects);

    // A takeover: the next pod runs as the same account, and nothing was created again.
    let w1 = FakeWorker::new(&ns, "r", 1);
    w1.renew().await.unwrap();
    wait_fence(&ns, "r", 2, T).await;
    let pod2 = wait_pod(&ns, "r-w2", T).await;
    assert_eq!(
        pod2.spec.unwrap().service_account_name.as_deref(),
        Some("baton-run-r")
    );
    let again = |o: &kube::api::ObjectMeta| (o.uid.clone(), o.resource_version.clone());
    let sa2 = ns.api::<ServiceAccount>().get("baton-run-r").await.unwrap();
    let binding2 = ns.api::<RoleBinding>().get("baton-run-r").await.unwrap();
    assert_eq!(again(&sa2.metadata), again(&sa.metadata));
    assert_eq!(again(&binding2.metadata), again(&binding.metadata));
    ns.cleanup().await;
}

#[tokio::test]
async fn a_run_naming_its_own_service_account_gets_no_per_run_objects() {
    let ns = TestNamespace::new("ctl-rbac-custom").await;
    let _c = start(&ns.client, config(&ns.name));
    let mut r = agent_run("r", 10);
    r.spec.worker.service_account_name = Some("team-worker".into());
    create(&ns, r).await;
    let pod = wait_pod(&ns, "r-w1", T).await;
    assert_eq!(
        pod.spec.unwrap().service_account_name.as_deref(),
        Some("team-worker")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        ns.api::<ServiceAccount>()
            .get_opt("baton-run-r")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        ns.api::<Role>()
            .get_opt("baton-run-r")
            .await
            .unwrap()
            .is_none()
    );
    assert!(ns.api::<Pod>().get_opt("r-w1").await.unwrap().is_some());
    ns.cleanup().await;
}

#[tokio::test]
async fn existing_objects_of_the_run_count_as_created() {
    // A controller that died after creating them (or a retried pass) finds them in place.
    let ns = TestNamespace::new("ctl-rbac-exists").await;
    let created = create(&ns, agent_run("r", 10)).await;
    let rbac = RunRbac::for_run(&created).unwrap();
    let pp = kube::api::PostParams::default();
    ns.api::<ServiceAccount>()
        .create(&pp, &rbac.service_account)
        .await
        .unwrap();
    ns.api::<Role>().create(&pp, &rbac.role).await.unwrap();
    let _c = start(&ns.client, config(&ns.name));
    let pod = wait_pod(&ns, "r-w1", T).await;
    assert_eq!(
        pod.spec.unwrap().service_account_name.as_deref(),
        Some("baton-run-r")
    );
    let binding = ns.api::<RoleBinding>().get("baton-run-r").await.unwrap();
    assert!(controlled_by_run(&binding, &created.uid().unwrap()));
    ns.cleanup().await;
}

/// A run that ended keeps no identity: once its pod is gone, its ServiceAccount, Role and
/// RoleBinding are removed, and a token its worker held while it ran (a leaked one, say) is
/// refused by the API server from then on, soon not even authenticated.
#[tokio::test]
async fn an_ended_run_keeps_no_worker_identity_and_its_token_dies() {
    use baton_testkit::rbac::worker_client;
    use k8s_openapi::api::coordination::v1::Lease;

    let (ns, _c, _) = started("ctl-rbac-end", agent_run("r", 10)).await;
    wait_pod(&ns, "r-w1", T).await;
    let leaked: kube::Api<Lease> =
        kube::Api::namespaced(worker_client(&ns.client, &ns.name, "r").await, &ns.name);
    leaked
        .get("run.r")
        .await
        .expect("while the run lives its worker reads its Lease");

    finish_first_attempt(&ns, "r").await;
    let deadline = std::time::Instant::now() + T;
    loop {
        let left = (
            ns.api::<ServiceAccount>()
                .get_opt("baton-run-r")
                .await
                .unwrap(),
            ns.api::<Role>().get_opt("baton-run-r").await.unwrap(),
            ns.api::<RoleBinding>()
                .get_opt("baton-run-r")
                .await
                .unwrap(),
        );
        if matches!(left, (None, None, None)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "left: {left:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ns.api::<Pod>().get_opt("r-w1").await.unwrap().is_none());
    // Refused at once (its RoleBinding is gone), then not even authenticated once the API
    // server's cache of tokens it authenticated (10 s) lets go of it.
    let refused = |answer: Result<Lease, kube::Error>| match answer {
        Err(kube::Error::Api(e)) if e.code == 401 || e.code == 403 => e.code,
        other => panic!("the ended run's token is refused, got {other:?}"),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while refused(leaked.get("run.r").await) != 401 {
        assert!(
            std::time::Instant::now() < deadline,
            "the token still authenticates"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ns.cleanup().await;
}
