//! What the stream benchmarks share: `baton server`'s release binary as its own process, the
//! followers' one credential, runs claimed at fence 1, and the process figures they print.

#![allow(dead_code)]

use baton_testkit::common::proc;
use baton_testkit::sse;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use baton::crd::v1alpha1::AgentRun;
use baton::ledger::SegmentStore;

use crate::claim;

// Each benchmark uses some of these.
#[allow(unused_imports)]
pub use proc::*;
#[allow(unused_imports)]
pub use sse::{gauge, reads_in_order};

/// Waits until `count` streams are open and none reads its ledger any more: what follows is
/// the live tail alone.
pub async fn wait_followers(url: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("{url}/metrics")).await
            && let Ok(text) = r.text().await
            && gauge(&text, "baton_server_followers") >= count as f64
            && gauge(&text, "baton_server_streams_replaying") == 0.0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{count} followers never connected");
}

/// A run claimed at fence 1 (its `claimed` seal written), with its store for the appends; a
/// turn of thread `bench` by its spec (what an A2A agent's task is), never joined.
pub async fn started_run(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<(AgentRun, SegmentStore)> {
    let mut run = AgentRun::builder(name).input("bench").reply("ok").build();
    run.spec.thread = Some(BENCH_THREAD.into());
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    runs.create(&PostParams::default(), &run).await?;
    claim::claim(client, ns, name, 1).await;
    let run = runs.get(name).await?;
    let store = SegmentStore::for_run(client.clone(), &run);
    Ok((run, store))
}

/// The thread the bench's runs name (the A2A agent they are tasks of).
pub const BENCH_THREAD: &str = "bench";

pub fn start_server(flags: &[&str]) -> anyhow::Result<(Child, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let bin = std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into());
    let child = Command::new(bin)
        .args(["server", &format!("--addr=127.0.0.1:{port}")])
        .args(flags)
        .env("RUST_LOG", "warn")
        .spawn()?;
    Ok((child, format!("http://127.0.0.1:{port}")))
}

/// A ServiceAccount that may read runs and their ledgers in `ns`, and its token: the
/// followers' one credential.
pub async fn reader_token(client: &Client, ns: &str) -> anyhow::Result<String> {
    let meta = || ObjectMeta {
        name: Some("reader".into()),
        ..Default::default()
    };
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &ServiceAccount {
                metadata: meta(),
                ..Default::default()
            },
        )
        .await?;
    let rule = PolicyRule {
        api_groups: Some(vec!["baton.dev".into()]),
        resources: Some(vec!["agentruns".into(), "ledgersegments".into()]),
        verbs: vec!["get".into(), "list".into(), "watch".into()],
        ..Default::default()
    };
    Api::<Role>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &Role {
                metadata: meta(),
                rules: Some(vec![rule]),
            },
        )
        .await?;
    let binding = RoleBinding {
        metadata: meta(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &binding)
        .await?;
    let minted = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request("reader", &pp, &TokenRequest::default())
        .await?;
    Ok(minted.status.map(|s| s.token).unwrap_or_default())
}

pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}
