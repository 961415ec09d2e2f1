//! The server tests' bed: `baton server`'s router served in this process on 127.0.0.1, the
//! real controller, ServiceAccounts with exactly the rights a test gives them (their tokens
//! minted by the TokenRequest API), and a small Server-Sent Events reader.

use std::sync::Arc;
use std::time::Duration;

use baton::fence::{Fence, worker_pod_name};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::Api;
use serde_json::Value;

use crate::common::TestNamespace;
use crate::common::worker_proc::{WorkerProc, spawn_worker_env, wait_until};
use baton::serving::Stop::WithTheProcess;
use baton::serving::Tls::Plain;

pub const T: Duration = Duration::from_secs(60);

pub use crate::common::in_process::{Running, start_controller};

/// `baton server` on a free loopback port; its base URL. Its own credentials (the test's
/// kubeconfig) are dropped by the server: it only learns where the API server is.
pub async fn start_server() -> (String, Running) {
    start_server_with(|state| state).await
}

/// [`start_server`] with what `adjust` makes of the server's state (its bounds, its keys).
pub async fn start_server_with(
    adjust: impl FnOnce(baton::server::ServerState) -> baton::server::ServerState,
) -> (String, Running) {
    let config = kube::Config::infer().await.expect("a kubeconfig");
    let state = baton::server::ServerState::new(config, Default::default());
    serve_state(adjust(state)).await
}

/// Serves `state` as `baton server` does, on a free loopback port; its base URL.
pub async fn serve_state(state: baton::server::ServerState) -> (String, Running) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = baton::server::router(Arc::new(state));
    let task = Running::spawn(async move {
        let _ = baton::serving::serve("test", listener, app, Plain, WithTheProcess).await;
    });
    (url, task)
}

/// `baton server` serving the PostgreSQL ledger at `BATON_TEST_POSTGRES_URL` (the bed starts
/// it), its own identity the test's kubeconfig user (for token and access reviews), admitting
/// seals from `controller_users`; its base URL.
pub async fn start_ledger_server(controller_users: Vec<String>) -> (String, Running) {
    let url = std::env::var("BATON_TEST_POSTGRES_URL").expect(
        "BATON_TEST_POSTGRES_URL is not set: run the tests through hack/with-control-plane.sh, \
         which starts PostgreSQL (hack/postgres.sh)",
    );
    start_ledger_server_at(&url, controller_users).await
}

/// [`start_ledger_server`] with the PostgreSQL at `url`.
pub async fn start_ledger_server_at(url: &str, controller_users: Vec<String>) -> (String, Running) {
    let db = baton::ledger::postgres::PgLedger::connect(url, 4)
        .await
        .expect("the test PostgreSQL");
    let config = kube::Config::infer().await.expect("a kubeconfig");
    let own = kube::Client::try_from(config.clone()).expect("a client");
    let service = baton::server::LedgerService::new(db, own, controller_users);
    let state = baton::server::ServerState::new(config, Default::default()).with_ledger(service);
    serve_state(state).await
}

/// A ServiceAccount `name` in the test's namespace with a Role of `rules`; its token.
pub async fn person(ns: &TestNamespace, name: &str, rules: Vec<PolicyRule>) -> String {
    crate::rbac::person(&ns.client, &ns.name, name, rules).await
}

pub use crate::rbac::rule;

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
    run_pod_env(ns, run, fence, &[]).await
}

/// [`run_pod`], with `env` added to the worker's environment.
pub async fn run_pod_env(
    ns: &TestNamespace,
    run: &str,
    fence: i64,
    env: &[(&str, &str)],
) -> WorkerProc {
    let pod = worker_pod_name(run, Fence::new(fence));
    let pods: Api<Pod> = ns.api();
    wait_until(T, &format!("pod {pod}"), || async {
        pods.get_opt(&pod).await.ok().flatten().is_some()
    })
    .await;
    spawn_worker_env(&ns.name, run, fence, &pod, &["--admin-addr=none"], env)
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

/// The requests the server at `base` has answered so far, by every code, as its metrics count
/// them (a scrape is counted once it is answered: the next scrape sees it).
pub async fn answered(base: &str) -> u64 {
    let text = http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("the server's metrics")
        .text()
        .await
        .expect("the server's metrics");
    text.lines()
        .filter(|l| l.starts_with("baton_server_responses_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
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

pub mod own_postgres;
pub use own_postgres::OwnPostgres;

/// Runs the browser check `tests/browser/<script>` (playwright-core driving Debian's Chromium;
/// hack/setup.sh installs it) with `env`, and asserts it passed, its output in the failure.
/// Awaited, not blocking: the server it visits is served from the test's own runtime.
pub async fn browser_check(script: &str, env: &[(&str, &str)]) {
    let dir = crate::repo_root().join("tests/browser");
    let out = tokio::process::Command::new("node")
        .arg(dir.join(script))
        .current_dir(&dir)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("running node tests/browser/{script} (hack/setup.sh installs it): {e}")
        });
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test {script} failed:\n{said}"
    );
}
