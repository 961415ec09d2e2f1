//! Replay benchmark: `baton server` (the release binary, as its own process, with its default
//! bounds) against the real API server in KUBECONFIG, with 10 runs whose ledgers are large
//! (20 MB each by default), followed from their start by many clients with one credential.
//! Prints, in one run:
//! - 1,000 followers (100 per run) reading every ledger whole at once: the server's peak
//!   resident memory, its CPU time and the wall time, the most bytes its streams held for
//!   their clients (`baton_server_stream_bytes_held`), and how many followers got every
//!   segment once, in order;
//! - 1,000 followers that open their stream and read nothing: the server's resident memory
//!   while they stall, and the same after the server has cut them (`--slow-follower` aside,
//!   the default 60 s);
//! - the server's peak against the chart's memory limit (256 MiB).
//!
//!     make bench-replay    (cargo run --release --example replay_bench [-- FOLLOWERS MB])

mod stream_support;

use baton_testkit::common::claim;
use baton_testkit::common::large_ledger;
use baton_testkit::common::namespace;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};

use baton::crd::v1alpha1::AgentRun;
use stream_support::*;

const RUNS: usize = 10;
/// The chart's memory limit of a server replica.
const LIMIT_KIB: u64 = 256 * 1024;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let followers: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let megabytes: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    raise_fd_limit();
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("replay-bench-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;
    let result = bench(&client, &ns, followers, megabytes).await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    result
}

async fn bench(
    client: &Client,
    ns: &str,
    followers: usize,
    megabytes: usize,
) -> anyhow::Result<()> {
    let token = reader_token(client, ns).await?;
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(filled_run(client, ns, &format!("replay-{i}"), megabytes).await?);
    }
    println!(
        "replay bench: {RUNS} runs of {megabytes} MB ({} segments each), {followers} followers, one credential",
        runs[0].1
    );
    let (mut server, url) = start_server(&[])?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = server.id();
    println!("server RSS idle: {} KiB", rss_kib(pid));
    reading(&url, &token, &runs, followers, pid).await;
    stalled(&url, &token, &runs, followers, pid).await;
    let peak = peak_rss_kib(pid);
    println!(
        "server peak RSS over the whole run: {peak} KiB = {:.0} % of the chart's limit ({LIMIT_KIB} KiB)",
        peak as f64 * 100.0 / LIMIT_KIB as f64
    );
    let _ = server.kill();
    let _ = server.wait();
    Ok(())
}

/// A run claimed at fence 1 whose ledger holds `megabytes` MB of messages; its segment count.
async fn filled_run(
    client: &Client,
    ns: &str,
    name: &str,
    megabytes: usize,
) -> anyhow::Result<(AgentRun, i64)> {
    let (run, store) = started_run(client, ns, name).await?;
    let tail = store.list().await?.len() as i64;
    Ok((run, large_ledger::fill(&store, tail, megabytes).await?))
}

/// Every follower reads its run's ledger whole, all at once.
async fn reading(url: &str, token: &str, runs: &[(AgentRun, i64)], followers: usize, pid: u32) {
    let most_held = Arc::new(AtomicU64::new(0));
    let sampling = tokio::spawn(sample_held(url.to_string(), most_held.clone()));
    let cpu_before = cpu_ticks(pid);
    let started = Instant::now();
    let clients: Vec<_> = (0..followers)
        .map(|i| {
            let (run, segments) = &runs[i % runs.len()];
            tokio::spawn(reads_in_order(
                events_url(url, run),
                token.to_string(),
                *segments,
            ))
        })
        .collect();
    let (mut complete, mut reconnects) = (0, 0);
    for c in clients {
        match c.await {
            Ok(Ok(read)) => {
                complete += 1;
                reconnects += read.reconnects;
            }
            Ok(Err(e)) => eprintln!("a follower: {e}"),
            Err(e) => eprintln!("a follower: {e}"),
        }
    }
    let elapsed = started.elapsed();
    sampling.abort();
    println!(
        "{followers} followers reading whole: {complete}/{followers} got every segment once, in order, in {:.1} s \
         ({reconnects} reconnections with their cursor); \
         server peak RSS {} KiB, CPU {:.1} s; most event bytes held for clients: {} KiB",
        elapsed.as_secs_f64(),
        peak_rss_kib(pid),
        (cpu_ticks(pid) - cpu_before) as f64 / ticks_per_second(),
        most_held.load(Ordering::Relaxed) / 1024,
    );
}

/// Every follower opens its stream and reads nothing: what the server holds meanwhile.
async fn stalled(url: &str, token: &str, runs: &[(AgentRun, i64)], followers: usize, pid: u32) {
    let mut open = Vec::new();
    for i in 0..followers {
        let (run, _) = &runs[i % runs.len()];
        let response = reqwest::Client::new()
            .get(events_url(url, run))
            .bearer_auth(token)
            .send()
            .await;
        if let Ok(response) = response {
            open.push(response);
        }
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    let metrics = reqwest::get(format!("{url}/metrics")).await.ok();
    let metrics = match metrics {
        Some(m) => m.text().await.unwrap_or_default(),
        None => String::new(),
    };
    println!(
        "{} followers reading nothing, 20 s on: server RSS {} KiB; event bytes held {} KiB; streams open {}",
        open.len(),
        rss_kib(pid),
        gauge(&metrics, "baton_server_stream_bytes_held") / 1024.0,
        gauge(&metrics, "baton_server_followers"),
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let metrics = reqwest::get(format!("{url}/metrics")).await.ok();
    let metrics = match metrics {
        Some(m) => m.text().await.unwrap_or_default(),
        None => String::new(),
    };
    println!(
        "80 s on (cut after 60 s without taking an event): server RSS {} KiB; event bytes held {} KiB; streams open {}",
        rss_kib(pid),
        gauge(&metrics, "baton_server_stream_bytes_held") / 1024.0,
        gauge(&metrics, "baton_server_followers"),
    );
    drop(open);
}

fn events_url(url: &str, run: &AgentRun) -> String {
    format!(
        "{url}/api/v1/namespaces/{}/runs/{}/events",
        run.namespace().unwrap(),
        run.name_any()
    )
}

/// The most `baton_server_stream_bytes_held` seen, sampled every 100 ms.
async fn sample_held(url: String, most: Arc<AtomicU64>) {
    loop {
        if let Ok(r) = reqwest::get(format!("{url}/metrics")).await
            && let Ok(text) = r.text().await
        {
            let held = gauge(&text, "baton_server_stream_bytes_held");
            if held.is_finite() {
                most.fetch_max(held as u64, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
