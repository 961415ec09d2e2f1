//! Stream benchmark: `baton server` (the release binary, as its own process) against the real
//! API server in KUBECONFIG, followed by many Server-Sent Events clients while this process
//! appends to 10 runs' ledgers as their workers would (a fenced append at fence 1). Prints, in
//! one run:
//! - the latency from the start of an append (its create request: one round trip) to each
//!   client's receipt of that segment, p50/p99,
//!   with 10 followers (one per run) and with 1,000 (100 per run);
//! - the server's resident memory idle and with 1,000 followers, its CPU time over the
//!   appends, and the API watches it holds (target: independent of the followers);
//! - that every follower got every segment once, in order.
//!
//!     make bench-stream    (cargo run --release --example stream_bench [-- FOLLOWERS APPENDS])

#[allow(dead_code)]
#[path = "../tests/common/claim.rs"]
mod claim;
#[path = "../tests/common/namespace.rs"]
mod namespace;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Role as MessageRole};
use baton::fence::Fence;
use baton::ledger::SegmentStore;

const RUNS: usize = 10;

/// When the append of each (run UID, position) started.
type Appended = Arc<Mutex<HashMap<(String, i64), Instant>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let followers: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let appends: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    raise_fd_limit();
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("stream-bench-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;
    let result = bench(&client, &ns, followers, appends).await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    result
}

async fn bench(client: &Client, ns: &str, followers: usize, appends: usize) -> anyhow::Result<()> {
    let token = reader_token(client, ns).await?;
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(started_run(client, ns, &format!("bench-{i}")).await?);
    }
    let (mut server, url) = start_server()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = rss_kib(server.id());
    println!(
        "stream bench: {RUNS} runs, {appends} appends each per phase, server pid {}",
        server.id()
    );
    println!("server RSS idle: {} KiB", idle_rss);
    for count in [RUNS, followers] {
        phase(client, &url, &token, &runs, count, appends, server.id()).await?;
    }
    let _ = server.kill();
    let _ = server.wait();
    Ok(())
}

/// `count` followers spread over the runs; `appends` segments per run; the figures.
async fn phase(
    client: &Client,
    url: &str,
    token: &str,
    runs: &[(AgentRun, SegmentStore)],
    count: usize,
    appends: usize,
    pid: u32,
) -> anyhow::Result<()> {
    let appended: Appended = Arc::default();
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let mut tails = Vec::new();
    for (run, _) in runs {
        tails.push(
            SegmentStore::for_run(client.clone(), run)
                .list()
                .await?
                .len() as i64,
        );
    }
    let mut clients = Vec::new();
    for i in 0..count {
        let (run, _) = &runs[i % runs.len()];
        let after = format!("{}:{}", run.uid().unwrap(), tails[i % runs.len()]);
        let events = format!(
            "{url}/api/v1/namespaces/{}/runs/{}/events",
            run.namespace().unwrap(),
            run.name_any()
        );
        clients.push(tokio::spawn(follow(
            events,
            token.to_string(),
            after,
            appends,
            appended.clone(),
            latencies.clone(),
        )));
    }
    wait_followers(url, count).await;
    // What the server holds while they all follow.
    let metrics = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let rss_before = rss_kib(pid);
    let cpu_before = cpu_ticks(pid);
    let started = Instant::now();
    append_all(runs, &mut tails, appends, &appended).await?;
    let mut complete = 0;
    for c in clients {
        if c.await? {
            complete += 1;
        }
    }
    let elapsed = started.elapsed();
    let cpu = cpu_ticks(pid) - cpu_before;
    let mut l = latencies.lock().unwrap().clone();
    l.sort_by(f64::total_cmp);
    println!(
        "{count} followers: latency from an append's start to its receipt: p50 {:.1} ms, p99 {:.1} ms over {} receipts; \
         {complete}/{count} got every segment once, in order; server RSS {} KiB (with them), \
         CPU {:.2} s over {:.1} s of appends; API watches held: {} (hubs {})",
        pct(&l, 0.50),
        pct(&l, 0.99),
        l.len(),
        rss_before,
        cpu as f64 / ticks_per_second(),
        elapsed.as_secs_f64(),
        gauge(&metrics, "baton_server_api_watches"),
        gauge(&metrics, "baton_server_hubs"),
    );
    Ok(())
}

/// Appends `appends` segments to every run, round robin, 20 ms apart, as its worker would.
async fn append_all(
    runs: &[(AgentRun, SegmentStore)],
    tails: &mut [i64],
    appends: usize,
    appended: &Appended,
) -> anyhow::Result<()> {
    for _ in 0..appends {
        for (i, (run, store)) in runs.iter().enumerate() {
            let events = vec![LedgerEvent::Message {
                role: MessageRole::Assistant,
                content: "x".repeat(512),
            }];
            appended
                .lock()
                .unwrap()
                .insert((run.uid().unwrap(), tails[i] + 1), Instant::now());
            let done = store.append(tails[i], Fence::new(1), events).await?;
            tails[i] = done.tail;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One SSE client: reads until it has `appends` segments after its cursor; records each
/// receipt's latency; true if they came once each, in order.
async fn follow(
    url: String,
    token: String,
    after: String,
    appends: usize,
    appended: Appended,
    latencies: Arc<Mutex<Vec<f64>>>,
) -> bool {
    let response = match reqwest::Client::new()
        .get(&url)
        .bearer_auth(&token)
        .header("Last-Event-ID", &after)
        .send()
        .await
    {
        Ok(r) if r.status() == 200 => r,
        _ => return false,
    };
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut expected = after.rsplit_once(':').unwrap().1.parse::<i64>().unwrap() + 1;
    let mut got = 0;
    while got < appends {
        let Ok(Some(Ok(chunk))) = tokio::time::timeout(Duration::from_secs(60), body.next()).await
        else {
            return false;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) else {
                continue;
            };
            let now = Instant::now();
            let (uid, seq) = id.rsplit_once(':').unwrap();
            let seq: i64 = seq.parse().unwrap();
            if seq != expected {
                return false;
            }
            expected += 1;
            got += 1;
            let sent = appended
                .lock()
                .unwrap()
                .get(&(uid.to_string(), seq))
                .copied();
            let ms = sent.map_or(0.0, |t| {
                now.saturating_duration_since(t).as_secs_f64() * 1e3
            });
            latencies.lock().unwrap().push(ms);
        }
    }
    true
}

async fn wait_followers(url: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("{url}/metrics")).await
            && let Ok(text) = r.text().await
            && gauge(&text, "baton_server_followers") >= count as f64
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{count} followers never connected");
}

/// A run claimed at fence 1 (its `claimed` seal written), with its store for the appends.
async fn started_run(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<(AgentRun, SegmentStore)> {
    let run = AgentRun::builder(name).input("bench").reply("ok").build();
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    runs.create(&PostParams::default(), &run).await?;
    claim::claim(client, ns, name, 1).await;
    let run = runs.get(name).await?;
    let store = SegmentStore::for_run(client.clone(), &run);
    Ok((run, store))
}

fn start_server() -> anyhow::Result<(Child, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let bin = std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into());
    let child = Command::new(bin)
        .args(["server", &format!("--addr=127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .spawn()?;
    Ok((child, format!("http://127.0.0.1:{port}")))
}

/// A ServiceAccount that may read runs and their ledgers in `ns`, and its token: the
/// followers' one credential.
async fn reader_token(client: &Client, ns: &str) -> anyhow::Result<String> {
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

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")?
                    .trim()
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
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

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// 1,000 followers need 1,000 sockets here and in the server (which inherits this limit).
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one plain struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
