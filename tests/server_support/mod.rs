//! The server tests' bed: `baton server`'s router served in this process on 127.0.0.1, the
//! real controller, ServiceAccounts with exactly the rights a test gives them (their tokens
//! minted by the TokenRequest API), and a small Server-Sent Events reader.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use baton::controller::{self, Config};
use baton::fence::{Fence, worker_pod_name};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::common::TestNamespace;
use crate::common::worker_proc::{WorkerProc, spawn_worker, wait_until};
use crate::rbac::mint_token;

pub const T: Duration = Duration::from_secs(60);

/// A task that is aborted when the test lets go of it.
pub struct Running(JoinHandle<()>);

impl Running {
    pub fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The controller, scoped to the test's namespace.
pub fn start_controller(ns: &TestNamespace) -> Running {
    let config = Config {
        namespace: Some(ns.name.clone()),
        leader_election: false,
        leader_namespace: ns.name.clone(),
        admin_addr: None,
        ..Config::default()
    };
    let client = ns.client.clone();
    Running(tokio::spawn(async move {
        if let Err(err) = controller::run(client, config).await {
            eprintln!("controller stopped: {err}");
        }
    }))
}

/// `baton server` on a free loopback port; its base URL. Its own credentials (the test's
/// kubeconfig) are dropped by the server: it only learns where the API server is.
pub async fn start_server() -> (String, Running) {
    let config = kube::Config::infer().await.expect("a kubeconfig");
    let state = Arc::new(baton::server::ServerState::new(config, Default::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = baton::server::router(state);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, Running(task))
}

/// `baton server` serving the PostgreSQL ledger at `BATON_TEST_POSTGRES_URL` (the bed starts
/// it), its own identity the test's kubeconfig user (for token and access reviews), admitting
/// seals from `controller_users`; its base URL.
pub async fn start_ledger_server(controller_users: Vec<String>) -> (String, Running) {
    let url = std::env::var("BATON_TEST_POSTGRES_URL").expect(
        "BATON_TEST_POSTGRES_URL is not set: run the tests through hack/with-control-plane.sh, \
         which starts PostgreSQL (hack/postgres.sh)",
    );
    let db = baton::ledger::postgres::PgLedger::connect(&url, 4)
        .await
        .expect("the test PostgreSQL");
    let config = kube::Config::infer().await.expect("a kubeconfig");
    let own = kube::Client::try_from(config.clone()).expect("a client");
    let service = baton::server::LedgerService::new(db, own, controller_users);
    let state = baton::server::ServerState::new(config, Default::default()).with_ledger(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = baton::server::router(Arc::new(state));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, Running(task))
}

/// A ServiceAccount `name` in the test's namespace with a Role of `rules`; its token.
pub async fn person(ns: &TestNamespace, name: &str, rules: Vec<PolicyRule>) -> String {
    let meta = || ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    };
    let params = PostParams::default();
    Api::<ServiceAccount>::namespaced(ns.client.clone(), &ns.name)
        .create(
            &params,
            &ServiceAccount {
                metadata: meta(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<Role>::namespaced(ns.client.clone(), &ns.name)
        .create(
            &params,
            &Role {
                metadata: meta(),
                rules: Some(rules),
            },
        )
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: meta(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(ns.name.clone()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(ns.client.clone(), &ns.name)
        .create(&params, &binding)
        .await
        .unwrap();
    mint_token(&ns.client, &ns.name, name).await
}

pub fn rule(resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec!["baton.dev".into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..PolicyRule::default()
    }
}

/// What a person who works with runs has: runs, threads and their transcripts.
pub fn run_user_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &["agentruns", "agentthreads"],
            &["get", "list", "watch", "create", "patch", "update"],
        ),
        rule(&["ledgersegments"], &["get", "list", "watch"]),
    ]
}

/// Waits for the controller's worker pod of `run` at `fence`, then starts its worker (as a
/// kubelet would).
pub async fn run_pod(ns: &TestNamespace, run: &str, fence: i64) -> WorkerProc {
    let pod = worker_pod_name(run, Fence::new(fence));
    let pods: Api<Pod> = ns.api();
    wait_until(T, &format!("pod {pod}"), || async {
        pods.get_opt(&pod).await.ok().flatten().is_some()
    })
    .await;
    spawn_worker(&ns.name, run, fence, &pod, &["--admin-addr=none"])
}

/// A POST of `body` with `token`; the status code and the JSON answer.
pub async fn post(url: &str, token: &str, body: Value) -> (u16, Value) {
    let response = http()
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = response.status().as_u16();
    (code, response.json().await.unwrap_or(Value::Null))
}

/// A GET with `token` (none: no Authorization header).
pub async fn get(url: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = http().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let code = response.status().as_u16();
    (code, response.json().await.unwrap_or(Value::Null))
}

pub use crate::sse::*;
