//! Per-run least privilege on the real API server: the ServiceAccount, Role and RoleBinding
//! built by `baton::rbac` for two runs, checked with `kubectl auth can-i --as=...` and with real
//! requests made with a worker's minted token.

use std::collections::BTreeMap;

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment, LedgerSegmentSpec};
use baton::fence::Fence;
use baton::rbac::{RunRbac, worker_username};
use baton_testkit::common::TestNamespace;
use baton_testkit::rbac::{assert_checks, check, client_with_token, mint_token};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, WatchParams};
use kube::{Api, Client, ResourceExt};

fn agent_run(name: &str) -> AgentRun {
    AgentRun::builder(name).build()
}

/// Creates a run and its worker RBAC (as the controller will), returning the stored run.
async fn run_with_rbac(ns: &TestNamespace, name: &str) -> AgentRun {
    let run = ns
        .api::<AgentRun>()
        .create(&PostParams::default(), &agent_run(name))
        .await
        .unwrap();
    let rbac = RunRbac::for_run(&run).unwrap();
    let pp = PostParams::default();
    ns.api::<ServiceAccount>()
        .create(&pp, &rbac.service_account)
        .await
        .unwrap();
    ns.api::<Role>().create(&pp, &rbac.role).await.unwrap();
    ns.api::<RoleBinding>()
        .create(&pp, &rbac.role_binding)
        .await
        .unwrap();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(baton::fence::run_lease_name(name)),
            ..Default::default()
        },
        spec: None,
    };
    ns.api::<Lease>().create(&pp, &lease).await.unwrap();
    run
}

fn segment(run: &AgentRun, seq: i64) -> LedgerSegment {
    let mut seg = LedgerSegment::new(
        &baton::fence::segment_name(&run.name_any(), seq),
        LedgerSegmentSpec {
            run: run.name_any(),
            seq,
            fence: Fence::new(1),
            format: 1,
            events: vec![LedgerEvent::Handoff],
        },
    );
    seg.metadata.labels = Some(BTreeMap::from([(
        baton::crd::RUN_UID_LABEL.to_string(),
        run.uid().unwrap(),
    )]));
    seg
}

#[tokio::test]
async fn a_worker_can_touch_its_own_run_and_nothing_else() {
    let ns = TestNamespace::new("rbac_worker_own_run").await;
    let other_ns = TestNamespace::new("rbac_worker_other_ns").await;
    let a = run_with_rbac(&ns, "a").await;
    let _b = run_with_rbac(&ns, "b").await;
    let _c = run_with_rbac(&other_ns, "a").await;
    let n = ns.name.as_str();
    let on = other_ns.name.as_str();
    let st = Some("status");
    let yes = |verb, res: &str, sub| check(n, verb, res, sub, true);
    let no = |verb, res: &str, sub| check(n, verb, res, sub, false);
    assert_checks(
        &worker_username(n, "a"),
        &[
            // Its own run, status and Lease; the ledger append-only; Warning Events.
            yes("get", "agentruns.baton.dev/a", None),
            yes("watch", "agentruns.baton.dev/a", None),
            yes("list", "agentruns.baton.dev/a", None),
            yes("get", "agentruns.baton.dev/a", st),
            yes("update", "agentruns.baton.dev/a", st),
            yes("get", "leases.coordination.k8s.io/run.a", None),
            yes("update", "leases.coordination.k8s.io/run.a", None),
            yes("create", "ledgersegments.baton.dev", None),
            yes("get", "ledgersegments.baton.dev/a-000001", None),
            yes("list", "ledgersegments.baton.dev", None),
            yes("create", "events.events.k8s.io", None),
            yes("patch", "events.events.k8s.io", None),
            // Not its own spec, not its run's deletion, not other runs' anything.
            no("update", "agentruns.baton.dev/a", None),
            no("patch", "agentruns.baton.dev/a", None),
            no("delete", "agentruns.baton.dev/a", None),
            no("patch", "agentruns.baton.dev/a", st),
            no("list", "agentruns.baton.dev", None),
            no("create", "agentruns.baton.dev", None),
            no("get", "agentruns.baton.dev/b", None),
            no("watch", "agentruns.baton.dev/b", None),
            no("update", "agentruns.baton.dev/b", st),
            no("get", "leases.coordination.k8s.io/run.b", None),
            no("update", "leases.coordination.k8s.io/run.b", None),
            no("create", "leases.coordination.k8s.io", None),
            no("delete", "leases.coordination.k8s.io/run.a", None),
            no("list", "leases.coordination.k8s.io", None),
            // The ledger is append-only: no update, patch or delete of any segment.
            no("update", "ledgersegments.baton.dev/a-000001", None),
            no("patch", "ledgersegments.baton.dev/a-000001", None),
            no("delete", "ledgersegments.baton.dev/a-000001", None),
            no("delete", "ledgersegments.baton.dev/b-000001", None),
            no("deletecollection", "ledgersegments.baton.dev", None),
            // No Secrets at all (the model key reaches it only through the pod's environment).
            no("get", "secrets", None),
            no("list", "secrets", None),
            no("watch", "secrets", None),
            no("create", "pods", None),
            // Its first attempt's pod only (a pod started ahead reads whether it was adopted).
            yes("get", "pods/a-w1", None),
            no("get", "pods/a-w2", None),
            no("get", "pods/b-w1", None),
            no("list", "pods", None),
            no("watch", "pods", None),
            no("update", "pods/a-w1", None),
            no("delete", "pods/a-w1", None),
            no("create", "serviceaccounts", Some("token")),
            // The same names in another namespace are someone else's.
            check(on, "get", "agentruns.baton.dev/a", None, false),
            check(
                on,
                "update",
                "leases.coordination.k8s.io/run.a",
                None,
                false,
            ),
            check(on, "create", "ledgersegments.baton.dev", None, false),
        ],
    );
    // Owned by the run: garbage-collected with it.
    let sa = ns.api::<ServiceAccount>().get("baton-run-a").await.unwrap();
    assert_eq!(sa.owner_references()[0].uid, a.uid().unwrap());
    ns.cleanup().await;
    other_ns.cleanup().await;
}

#[tokio::test]
async fn a_workers_token_does_what_the_worker_does_and_is_refused_the_rest() {
    let ns = TestNamespace::new("rbac_worker_token").await;
    let a = run_with_rbac(&ns, "a").await;
    let b = run_with_rbac(&ns, "b").await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("model-key".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "key".to_string(),
            "sk-secret".to_string(),
        )])),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let token = mint_token(&ns.client, &ns.name, "baton-run-a").await;
    let worker = client_with_token(&token).await;
    own_run_reads(&worker, &ns.name).await;
    lease_and_status_writes(&worker, &ns).await;
    ledger_is_append_only(&worker, &ns, &a, &b).await;
    let secrets: Api<Secret> = Api::namespaced(worker.clone(), &ns.name);
    assert_forbidden(secrets.get("model-key").await, "get a Secret");
    assert_forbidden(secrets.list(&ListParams::default()).await, "list Secrets");
    ns.cleanup().await;
}

/// The worker's reads of its run, including the single-object watch it keeps on it.
async fn own_run_reads(worker: &Client, ns: &str) {
    let runs: Api<AgentRun> = Api::namespaced(worker.clone(), ns);
    runs.get("a").await.expect("get its own run");
    let own = ListParams::default().fields("metadata.name=a");
    assert_eq!(
        runs.list(&own)
            .await
            .expect("list its run by name")
            .items
            .len(),
        1
    );
    let _watch = runs
        .watch(&WatchParams::default().fields("metadata.name=a"), "0")
        .await
        .expect("watch its run by name");
    assert_forbidden(runs.get("b").await, "get run b");
    assert_forbidden(runs.list(&ListParams::default()).await, "list every run");
    let others = WatchParams::default().fields("metadata.name=b");
    assert_forbidden(runs.watch(&others, "0").await.map(|_| ()), "watch run b");
}

async fn lease_and_status_writes(worker: &Client, ns: &TestNamespace) {
    let leases: Api<Lease> = Api::namespaced(worker.clone(), &ns.name);
    let mut own = leases.get("run.a").await.expect("get its Lease");
    own.metadata.annotations = Some(BTreeMap::from([(
        baton::crd::FENCE_ANNOTATION.into(),
        "1".into(),
    )]));
    leases
        .replace("run.a", &PostParams::default(), &own)
        .await
        .expect("renew its Lease");
    assert_forbidden(leases.get("run.b").await, "get run b's Lease");
    let theirs = ns.api::<Lease>().get("run.b").await.unwrap();
    assert_forbidden(
        leases
            .replace("run.b", &PostParams::default(), &theirs)
            .await,
        "update run b's Lease",
    );
    assert_forbidden(
        leases
            .delete("run.a", &DeleteParams::default())
            .await
            .map(|_| ()),
        "delete its Lease",
    );

    let runs: Api<AgentRun> = Api::namespaced(worker.clone(), &ns.name);
    let mut run = runs.get_status("a").await.expect("get its status");
    run.status = Some(Default::default());
    runs.replace_status("a", &PostParams::default(), &run)
        .await
        .expect("write its status");
    let mut spec = runs.get("a").await.unwrap();
    spec.spec.stop = true;
    assert_forbidden(
        runs.replace("a", &PostParams::default(), &spec).await,
        "update its spec",
    );
    let mut theirs = ns.api::<AgentRun>().get("b").await.unwrap();
    theirs.status = Some(Default::default());
    assert_forbidden(
        runs.replace_status("b", &PostParams::default(), &theirs)
            .await,
        "write run b's status",
    );
}

async fn ledger_is_append_only(worker: &Client, ns: &TestNamespace, a: &AgentRun, b: &AgentRun) {
    let segments: Api<LedgerSegment> = Api::namespaced(worker.clone(), &ns.name);
    let created = segments
        .create(&PostParams::default(), &segment(a, 1))
        .await
        .expect("append");
    segments
        .get(&created.name_any())
        .await
        .expect("read its segment");
    let theirs = ns
        .api::<LedgerSegment>()
        .create(&PostParams::default(), &segment(b, 1))
        .await
        .unwrap();
    segments
        .list(&ListParams::default())
        .await
        .expect("list the namespace's ledger");
    let mut changed = created.clone();
    changed.spec.fence = Fence::new(9);
    assert_forbidden(
        segments
            .replace(&created.name_any(), &PostParams::default(), &changed)
            .await,
        "update a segment",
    );
    assert_forbidden(
        segments
            .delete(&created.name_any(), &DeleteParams::default())
            .await
            .map(|_| ()),
        "delete its segment",
    );
    assert_forbidden(
        segments
            .delete(&theirs.name_any(), &DeleteParams::default())
            .await
            .map(|_| ()),
        "delete run b's segment",
    );
    let all = segments
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    assert_forbidden(all.map(|_| ()), "delete every segment");
}

fn assert_forbidden<T>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(err) if baton::kube_util::is_forbidden(&err) => {}
        Err(err) => panic!("{what}: expected 403 Forbidden, got {err}"),
        Ok(_) => panic!("{what}: expected 403 Forbidden, but it was allowed"),
    }
}
