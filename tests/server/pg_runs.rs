//! Runs kept in PostgreSQL on the bed, as the chart sets them up: the ledger server admitting
//! a test ServiceAccount as baton's controller, the controller writing through it, and a real
//! `baton worker` per attempt with its pod's ledger token.

use crate::ledger::pod_token;
use baton::crd::v1alpha1::LedgerBackend;
use baton::fence::{Fence, worker_pod_name};
use baton::ledger::served::LEDGER_AUDIENCE;
use baton::rbac::worker_service_account_name;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::in_process::{controller_config, start_controller_with};
use baton_testkit::common::worker_proc::*;
use baton_testkit::rbac::{mint_token_for, rule};
use baton_testkit::server::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use std::process::Stdio;
use tokio::process::{Child, Command};

/// The ledger server for `ns`, admitting a test ServiceAccount as baton's controller; its
/// base URL, its task, and that controller's ledger token.
pub(crate) async fn ledger_server_and_controller(ns: &TestNamespace) -> (String, Running, String) {
    let url = std::env::var("BATON_TEST_POSTGRES_URL").expect("BATON_TEST_POSTGRES_URL");
    ledger_server_and_controller_at(ns, &url).await
}

/// [`ledger_server_and_controller`] with the PostgreSQL at `url`.
pub(crate) async fn ledger_server_and_controller_at(
    ns: &TestNamespace,
    url: &str,
) -> (String, Running, String) {
    let (controller_user, token) = test_controller(ns).await;
    let (base, server) = start_ledger_server_at(url, vec![controller_user]).await;
    (base, server, token)
}

/// The ServiceAccount the tests' controller acts as: its user name (which the ledger server
/// admits as the controller's) and its ledger token (its seals).
pub(crate) async fn test_controller(ns: &TestNamespace) -> (String, String) {
    let controller = "baton-test-controller";
    // As the chart's controller role: the server reads a ledger kept in PostgreSQL with the
    // reader's right to read its segments (the claim reads the tail through it).
    let reads_segments = rule(&["ledgersegments"], &["get", "list"]);
    person(ns, controller, vec![reads_segments]).await;
    let token = mint_token_for(&ns.client, &ns.name, controller, LEDGER_AUDIENCE, None).await;
    let user = format!("system:serviceaccount:{}:{controller}", ns.name);
    (user, token)
}

/// The value of `name` in the environment of `pod`'s worker container.
pub(crate) fn worker_env(pod: &Pod, name: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let worker = spec.containers.iter().find(|c| c.name == "worker")?;
    let var = worker.env.iter().flatten().find(|e| e.name == name)?;
    var.value.clone()
}

/// The controller scoped to `ns`, keeping new runs' ledgers in PostgreSQL through `server`,
/// its seals sent with `token`.
pub(crate) fn start_pg_controller(ns: &TestNamespace, server: &str, token: String) -> Running {
    use baton::ledger::{LedgerClient, LedgerToken};
    start_pg_controller_with(ns, LedgerClient::new(server, LedgerToken::Fixed(token)))
}

/// [`start_pg_controller`] reaching the ledger server as `server` says (its CA, say).
pub(crate) fn start_pg_controller_with(
    ns: &TestNamespace,
    server: baton::ledger::LedgerClient,
) -> Running {
    let config = baton::controller::Config {
        ledger_server: Some(server),
        new_runs_ledger: LedgerBackend::PostgreSQL,
        ..controller_config(ns)
    };
    start_controller_with(ns, config)
}

/// The worker of `run` at `fence`, as its pod would start it: the ledger server's address
/// from the pod's env, its pod-bound ledger token in a file.
pub(crate) async fn start_pg_worker(ns: &TestNamespace, run: &str, fence: i64) -> WorkerProc {
    let pod_name = worker_pod_name(run, Fence::new(fence));
    let pods: Api<Pod> = ns.api();
    wait_until(T, &format!("pod {pod_name}"), || async {
        pods.get_opt(&pod_name).await.ok().flatten().is_some()
    })
    .await;
    let pod = pods.get(&pod_name).await.unwrap();
    let spec = pod.spec.clone().unwrap();
    let server = worker_env(&pod, "BATON_LEDGER_SERVER")
        .expect("the pod of a run kept in PostgreSQL is given the ledger server");
    let projected = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .any(|t| t.audience.as_deref() == Some(LEDGER_AUDIENCE));
    assert!(projected, "the pod projects a ledger token: {spec:?}");
    let account = worker_service_account_name(run);
    let token = pod_token(ns, &account, &pod_name).await;
    let file = std::env::temp_dir().join(format!("baton-{}-{pod_name}.token", ns.name));
    std::fs::write(&file, token).unwrap();
    let file = file.to_string_lossy().to_string();
    let ca = worker_env(&pod, "BATON_LEDGER_SERVER_CA");
    let mut env = vec![
        ("BATON_LEDGER_SERVER", server.as_str()),
        ("BATON_LEDGER_TOKEN_FILE", file.as_str()),
    ];
    if let Some(ca) = &ca {
        env.push(("BATON_LEDGER_SERVER_CA", ca));
    }
    spawn_worker_env(
        &ns.name,
        run,
        fence,
        &pod_name,
        &["--admin-addr=none"],
        &env,
    )
}

/// The real `baton server` at `addr`, serving the bed's PostgreSQL ledger and admitting
/// seals from `controller`; killed (SIGKILL, by its handle) when dropped.
pub(crate) async fn server_process(addr: &str, controller: &str) -> Child {
    server_process_with(addr, controller, None).await
}

/// [`server_process`] serving HTTPS with `tls` (its certificate and key; ready once it answers
/// a client trusting its CA alone).
pub(crate) async fn server_process_with(
    addr: &str,
    controller: &str,
    tls: Option<&TlsFiles>,
) -> Child {
    let url = std::env::var("BATON_TEST_POSTGRES_URL").expect("BATON_TEST_POSTGRES_URL");
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    command
        .args(["server", "--addr", addr, "--controller-user", controller])
        .env("BATON_LEDGER_POSTGRES_URL", url)
        .stdout(Stdio::null())
        .kill_on_drop(true);
    let mut http = reqwest::Client::builder();
    if let Some(tls) = tls {
        command.args(["--tls-cert-file", &tls.cert, "--tls-key-file", &tls.key]);
        let ca = reqwest::Certificate::from_pem(tls.ca_pem.as_bytes()).unwrap();
        http = http.tls_certs_only([ca]);
    }
    let child = command.spawn().expect("baton server");
    let http = http.build().unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let ready = format!("{scheme}://{addr}/readyz");
    wait_until(T, "baton server ready", || async {
        let answer = http.get(&ready).send().await;
        answer.is_ok_and(|r| r.status().is_success())
    })
    .await;
    child
}

/// A server certificate for 127.0.0.1 and its CA, written to files in the temp dir.
pub(crate) struct TlsFiles {
    pub cert: String,
    pub key: String,
    pub ca: String,
    pub ca_pem: String,
}

impl TlsFiles {
    /// A new CA and a certificate for 127.0.0.1 it signed (baton's own issuer, the webhook's),
    /// named after `name`.
    pub(crate) fn issue(name: &str) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let hosts = ["127.0.0.1".to_string()];
        let bundle = baton::webhook::cert::issue(&hosts, now, 3600, None).unwrap();
        let dir = std::env::temp_dir();
        let write = |what: &str, pem: &str| {
            let path = dir.join(format!("baton-{name}-{what}.pem"));
            std::fs::write(&path, pem).unwrap();
            path.to_string_lossy().into_owned()
        };
        Self {
            cert: write("cert", &bundle.cert_pem),
            key: write("key", &bundle.key_pem),
            ca: write("ca", &bundle.ca_pem),
            ca_pem: bundle.ca_pem,
        }
    }
}

/// A free loopback address (bound, then let go: the server binds it next).
pub(crate) async fn free_addr() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}
