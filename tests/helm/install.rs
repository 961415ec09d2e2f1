//! The chart installed into the real local API server with Helm's SDK (hack/helm.py), then its
//! RBAC proven, not assumed: `kubectl auth can-i --as=` the chart's controller ServiceAccount,
//! real requests with a token minted for it, and a run claimed by a controller that holds only
//! that token (its worker pod created as the run's own ServiceAccount). The whole run, with the
//! chart's controller pods and real worker pods, is tests/node_e2e.rs on the real node.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, Phase};
use baton::fence::Fence;
use baton::rbac::RunRbac;
use baton_testkit::common::TestNamespace;
use baton_testkit::helm::{CHART, helm};
use baton_testkit::rbac::{assert_checks, check, client_with_token, mint_token};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};

/// A release installed for one test, uninstalled (with its cluster-scoped RBAC) by `uninstall`.
struct Release {
    name: String,
    namespace: String,
}

impl Release {
    fn install(ns: &TestNamespace) -> Self {
        // Unique per test run: the ClusterRole and its binding are cluster-scoped.
        let name = format!("baton-{}", ns.name.rsplit('-').next().unwrap());
        // No webhook: the local control plane runs no pods to serve it, and its configuration is
        // cluster-wide (the webhook is proven on the real node, tests/node_e2e.rs).
        let values = serde_json::json!({
            "image": {"repository": "baton", "tag": "dev"},
            "webhook": {"enabled": false},
        })
        .to_string();
        let args = [
            "install",
            CHART,
            "--name",
            &name,
            "--namespace",
            &ns.name,
            "--values",
            &values,
            "--skip-crds",
        ];
        if let Err(err) = helm(&args) {
            panic!("helm install into {}: {err}", ns.name);
        }
        Self {
            name,
            namespace: ns.name.clone(),
        }
    }

    fn service_account(&self) -> String {
        self.name.clone()
    }

    fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    fn uninstall(self) {
        let _ = helm(&[
            "uninstall",
            "--name",
            &self.name,
            "--namespace",
            &self.namespace,
        ]);
    }
}

#[tokio::test]
async fn the_installed_chart_gives_the_controller_exactly_what_it_needs() {
    let ns = TestNamespace::new("helm_install_rbac").await;
    let elsewhere = TestNamespace::new("helm_install_elsewhere").await;
    let release = Release::install(&ns);
    let deploy = ns
        .api::<Deployment>()
        .get(&format!("{}-controller", release.name))
        .await
        .unwrap();
    assert_eq!(deploy.spec.unwrap().replicas, Some(2));
    ns.api::<ServiceAccount>()
        .get(&release.service_account())
        .await
        .unwrap();
    assert_eq!(
        pdb_api_version(&ns.name),
        "policy/v1beta1",
        "a 1.20 server gets the v1beta1 PDB"
    );

    let e = elsewhere.name.as_str();
    let yes = |verb, res: &str, sub| check(e, verb, res, sub, true);
    let no = |verb, res: &str, sub| check(e, verb, res, sub, false);
    assert_checks(
        &release.user(),
        &[
            yes("list", "agentruns.baton.dev", None),
            yes("watch", "agentruns.baton.dev", None),
            yes("delete", "agentruns.baton.dev", None),
            yes("update", "agentruns.baton.dev", Some("status")),
            yes("create", "ledgersegments.baton.dev", None),
            yes("list", "ledgersegments.baton.dev", None),
            yes("create", "leases.coordination.k8s.io", None),
            yes("update", "leases.coordination.k8s.io", None),
            yes("delete", "leases.coordination.k8s.io", None),
            yes("watch", "leases.coordination.k8s.io", None),
            yes("create", "pods", None),
            yes("delete", "pods", None),
            yes("patch", "pods", None),
            yes("watch", "pods", None),
            yes("create", "events.events.k8s.io", None),
            yes("create", "serviceaccounts", None),
            yes("create", "persistentvolumeclaims", None),
            yes("create", "roles.rbac.authorization.k8s.io", None),
            yes("create", "rolebindings.rbac.authorization.k8s.io", None),
            // Deletes, by UID, what a deleted run left behind for a namesake (leftovers.rs).
            yes("delete", "ledgersegments.baton.dev", None),
            yes("delete", "serviceaccounts", None),
            yes("delete", "roles.rbac.authorization.k8s.io", None),
            yes("delete", "rolebindings.rbac.authorization.k8s.io", None),
            // A turn's spec once, when it joins its thread, and `spec.stop` of a turn a newer
            // one interrupts (CAS writes; the webhook refuses any other change of a joined
            // turn's agent); threads read, and their status written.
            yes("update", "agentruns.baton.dev", None),
            yes("watch", "agentthreads.baton.dev", None),
            yes("update", "agentthreads.baton.dev", Some("status")),
            // Nothing more: no Secrets, no ledger rewrites, no patches, no escalation.
            no("get", "secrets", None),
            no("list", "secrets", None),
            no("update", "ledgersegments.baton.dev", None),
            no("patch", "ledgersegments.baton.dev", None),
            no("update", "agentthreads.baton.dev", None),
            no("patch", "agentruns.baton.dev", None),
            no("create", "agentruns.baton.dev", None),
            no("update", "pods", None),
            no("create", "pods", Some("exec")),
            no("escalate", "roles.rbac.authorization.k8s.io", None),
            no("bind", "roles.rbac.authorization.k8s.io", None),
            no("create", "serviceaccounts", Some("token")),
            no("create", "namespaces", None),
        ],
    );

    let token = mint_token(&ns.client, &ns.name, &release.service_account()).await;
    let controller = client_with_token(&token).await;
    controller_token_requests(&controller, &ns, &elsewhere).await;
    release.uninstall();
    ns.cleanup().await;
    elsewhere.cleanup().await;
}

fn pdb_api_version(namespace: &str) -> String {
    let out = std::process::Command::new("kubectl")
        .args([
            "get",
            "poddisruptionbudgets.v1beta1.policy",
            "-n",
            namespace,
            "-o",
            "jsonpath={.items[0].apiVersion}",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Real requests with the controller's token: what it does works, Secrets are refused, and
/// it can give a run its own Role without `escalate` (it holds every permission it grants).
async fn controller_token_requests(
    controller: &Client,
    ns: &TestNamespace,
    elsewhere: &TestNamespace,
) {
    Api::<AgentRun>::all(controller.clone())
        .list(&ListParams::default())
        .await
        .expect("list runs");
    Api::<Pod>::all(controller.clone())
        .list(&ListParams::default())
        .await
        .expect("list pods");
    let leases: Api<Lease> = Api::namespaced(controller.clone(), &ns.name);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("probe".into()),
            ..Default::default()
        },
        spec: None,
    };
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create a Lease");
    leases
        .delete("probe", &DeleteParams::default())
        .await
        .expect("delete a Lease");
    let secrets: Api<Secret> = Api::namespaced(controller.clone(), &elsewhere.name);
    let refused = secrets.list(&ListParams::default()).await.unwrap_err();
    assert!(baton::kube_util::is_forbidden(&refused), "{refused}");

    let run = elsewhere
        .api::<AgentRun>()
        .create(&PostParams::default(), &scripted("owned"))
        .await
        .unwrap();
    create_run_rbac(controller, &run).await;
}

/// Waits until the run's worker RoleBinding (created last of the three) exists.
async fn wait_run_rbac(ns: &TestNamespace, name: &str, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while ns
        .api::<RoleBinding>()
        .get_opt(name)
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the controller never bound {name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a run's worker ServiceAccount, Role and RoleBinding as `client` (the controller).
async fn create_run_rbac(client: &Client, run: &AgentRun) -> RunRbac {
    let rbac = RunRbac::for_run(run).unwrap();
    let ns = run.metadata.namespace.clone().unwrap();
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&pp, &rbac.service_account)
        .await
        .expect("create the worker SA");
    Api::<Role>::namespaced(client.clone(), &ns)
        .create(&pp, &rbac.role)
        .await
        .expect("create the worker Role (no escalate needed)");
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .create(&pp, &rbac.role_binding)
        .await
        .expect("bind the worker Role (no bind needed)");
    rbac
}

fn scripted(name: &str) -> AgentRun {
    let script = serde_json::from_value(serde_json::json!([
        {"text": "Counting.", "toolCalls": [{"tool": "sh", "arguments": {"command": "echo 3 files"}}]},
        {"text": "There are 3 files."}
    ]))
    .unwrap();
    let tools =
        serde_json::from_value(serde_json::json!([{"name": "sh", "kind": "shell"}])).unwrap();
    AgentRun::builder(name)
        .input("count the files")
        .lease(10, 2, 60)
        .script(script)
        .tools(tools)
        .build()
}

#[tokio::test]
async fn a_controller_holding_only_the_charts_token_claims_a_run_for_its_own_identity() {
    let ns = TestNamespace::new("helm_install_full_run").await;
    let release = Release::install(&ns);
    let token = mint_token(&ns.client, &ns.name, &release.service_account()).await;
    let controller_client = client_with_token(&token).await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin_addr = admin.local_addr().unwrap();
    drop(admin);
    let config = baton::controller::Config {
        namespace: Some(ns.name.clone()),
        leader_election: true,
        leader_namespace: ns.name.clone(),
        leader_lease: Duration::from_secs(3),
        admin_addr: Some(admin_addr),
        ..Default::default()
    };
    let controller = tokio::spawn(baton::controller::run(controller_client.clone(), config));

    // The controller, with nothing but the chart's token, gives the run its own ServiceAccount,
    // Role and RoleBinding before its pod; the worker then runs as that identity.
    ns.api::<AgentRun>()
        .create(&PostParams::default(), &scripted("full"))
        .await
        .unwrap();
    wait_run_rbac(&ns, "baton-run-full", Duration::from_secs(30)).await;
    let worker_token = mint_token(&ns.client, &ns.name, "baton-run-full").await;
    let kubeconfig = worker_kubeconfig(&ns.name, &worker_token);
    assert_eq!(
        can_i_with(&kubeconfig, &ns.name, &["list", "secrets"]),
        "no",
        "the worker's kubeconfig is the run's identity"
    );
    assert_eq!(
        can_i_with(&kubeconfig, &ns.name, &["update", "leases/run.full"]),
        "yes"
    );
    // The claim goes as far as this server goes (nothing runs pods here): the worker pod is
    // created, as the run's own ServiceAccount. The whole run, with the chart's controller pods
    // and real worker pods, is tests/node_e2e.rs on the real node.
    let pod = wait_pod(&ns, "full-w1", Duration::from_secs(60)).await;
    let metrics = reqwest_get(&format!("http://{admin_addr}/metrics")).await;
    controller.abort();
    let spec = pod.spec.clone().unwrap_or_default();
    assert_eq!(spec.service_account_name.as_deref(), Some("baton-run-full"));
    let run = ns.api::<AgentRun>().get("full").await.unwrap();
    let status = run.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Running, "{status:?}");
    assert_eq!(status.fence, Fence::new(1), "{status:?}");
    assert!(
        !metrics.to_lowercase().contains("forbidden"),
        "a forbidden error:\n{metrics}"
    );
    assert!(
        !metrics.contains("baton_errors_total{kind=\"kube\"}"),
        "controller API errors:\n{metrics}"
    );
    release.uninstall();
    ns.cleanup().await;
}

async fn wait_pod(ns: &TestNamespace, name: &str, timeout: Duration) -> Pod {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(pod) = ns.api::<Pod>().get_opt(name).await.unwrap() {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} was not created in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `kubectl auth can-i ARGS` as the identity of `kubeconfig`.
fn can_i_with(kubeconfig: &std::path::Path, namespace: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["auth", "can-i", "-n", namespace])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A kubeconfig for the local API server that authenticates as the run's worker token only.
fn worker_kubeconfig(namespace: &str, token: &str) -> std::path::PathBuf {
    let mut config = kube::config::Kubeconfig::read().expect("reading KUBECONFIG");
    for named in &mut config.auth_infos {
        named.auth_info =
            Some(serde_json::from_value(serde_json::json!({ "token": token })).unwrap());
    }
    let dir = std::env::temp_dir().join("baton-helm-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{namespace}-worker.kubeconfig"));
    // The token must survive serialization (kube hides secrets when printing).
    let mut yaml = serde_yaml::to_value(&config).unwrap();
    for user in yaml["users"].as_sequence_mut().unwrap() {
        user["user"] = serde_yaml::to_value(serde_json::json!({ "token": token })).unwrap();
    }
    std::fs::write(&path, serde_yaml::to_string(&yaml).unwrap()).unwrap();
    path
}

async fn reqwest_get(url: &str) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match reqwest::get(url).await {
        Ok(resp) => resp.text().await.unwrap_or_default(),
        Err(err) => format!("(metrics unavailable: {err})"),
    }
}
