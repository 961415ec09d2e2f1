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

mod stream_support;

use baton_testkit::common::claim;
use baton_testkit::common::namespace;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Role as MessageRole};
use baton::fence::Fence;
use baton::ledger::SegmentStore;
use stream_support::*;

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
    let (mut server, url) = start_server(&[])?;
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
