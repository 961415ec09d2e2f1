//! Controller benchmark (prints figures; asserts nothing).
//!
//! `cargo bench --bench controller -- --runs 1000 --window 100`
//!
//! Starts `baton controller` (the release binary, `$BATON_BIN` or target/release/baton) as its
//! own process on the control plane in KUBECONFIG, creates N runs, lets every run start (fence
//! 1; its Lease is moved but never renewed, so the startup allowance holds it), then renews
//! run i's Lease once at t0 + i·window/N and never again: the N leases expire spread evenly
//! over the window. Reports takeover lateness after expiry (claim seen by a watch minus
//! renewal + durationSeconds), controller RSS, API writes per takeover (Events excluded),
//! reconciles per second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::AgentRun;
use baton::lease::WorkerLease;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

const DURATION: i32 = 10;

struct Args {
    runs: usize,
    window: u64,
}

fn args() -> Args {
    let mut a = Args {
        runs: 1000,
        window: 100,
    };
    let argv: Vec<String> = std::env::args().collect();
    for pair in argv.windows(2) {
        match pair[0].as_str() {
            "--runs" => a.runs = pair[1].parse().expect("--runs N"),
            "--window" => a.window = pair[1].parse().expect("--window SECONDS"),
            _ => {}
        }
    }
    a
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args();
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("bench-{}", rand::random::<u32>() % 1_000_000);
    let meta = ObjectMeta {
        name: Some(ns.clone()),
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta,
                ..Default::default()
            },
        )
        .await?;
    let port = 18000 + rand::random::<u16>() % 2000;
    let mut controller = spawn_controller(&ns, port)?;
    let claims = watch_claims(client.clone(), &ns);
    println!(
        "bench: {} runs in namespace {ns}, leases expiring over {} s",
        args.runs, args.window
    );
    create_runs(&client, &ns, args.runs).await?;
    wait_started(&client, &ns, args.runs).await;
    let before = scrape(port).await?;
    let started = Instant::now();
    let expiries = renew_spread(&client, &ns, &args).await;
    wait_claimed(&claims, args.runs, Duration::from_secs(args.window + 120)).await;
    let elapsed = started.elapsed().as_secs_f64();
    let after = scrape(port).await?;
    let rss = rss_kib(controller.id().unwrap_or_default());
    report(
        &args,
        &expiries,
        &claims.lock().unwrap(),
        &before,
        &after,
        elapsed,
        rss,
    );
    controller.kill().await.ok();
    Ok(())
}

fn spawn_controller(ns: &str, port: u16) -> anyhow::Result<tokio::process::Child> {
    let bin = std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into());
    Ok(tokio::process::Command::new(bin)
        .args(["controller", "--namespace", ns, "--leader-election=false"])
        .args(["--admin-addr", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()?)
}

fn run_manifest(name: &str) -> AgentRun {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"input": "bench",
                 "lease": {"durationSeconds": DURATION, "renewSeconds": 3, "startupSeconds": 3600},
                 "agent": {"model": {"script": [{"text": "x"}]}}}
    }))
    .expect("manifest")
}

async fn create_runs(client: &Client, ns: &str, n: usize) -> anyhow::Result<()> {
    let api: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &run_manifest(&format!("r{i}")))
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

async fn wait_started(client: &Client, ns: &str, n: usize) {
    let api: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    loop {
        let runs = api
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let started = runs
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|s| s.fence >= 1))
            .count();
        if started >= n {
            println!(
                "bench: {n} runs started in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

type Claims = Arc<Mutex<HashMap<String, Instant>>>;

/// When each run was first seen claimed for fence 2.
fn watch_claims(client: Client, ns: &str) -> Claims {
    let claims: Claims = Default::default();
    let out = claims.clone();
    let api: Api<AgentRun> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(
            watcher(api, Default::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(run)) = stream.next().await {
            if run.status.as_ref().is_some_and(|s| s.fence >= 2) {
                out.lock()
                    .unwrap()
                    .entry(run.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    claims
}

/// Renews run i once at i·window/N; returns each run's expected expiry.
async fn renew_spread(client: &Client, ns: &str, args: &Args) -> HashMap<String, Instant> {
    let t0 = Instant::now();
    let step = Duration::from_secs_f64(args.window as f64 / args.runs as f64);
    let expiries: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    futures::stream::iter(0..args.runs)
        .map(|i| {
            let (client, expiries) = (client.clone(), expiries.clone());
            let ns = ns.to_string();
            async move {
                tokio::time::sleep_until((t0 + step * i as u32).into()).await;
                let name = format!("r{i}");
                let lease = WorkerLease::new(client, &ns, &name, &format!("{name}-w1"), 1);
                if lease.renew().await.is_ok() {
                    let expiry = Instant::now() + Duration::from_secs(DURATION as u64);
                    expiries.lock().unwrap().insert(name, expiry);
                }
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    Arc::try_unwrap(expiries)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_default()
}

async fn wait_claimed(claims: &Claims, n: usize, timeout: Duration) {
    let t = Instant::now();
    while claims.lock().unwrap().len() < n && t.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sums of the controller's counters: (api writes, reconciles, takeovers).
async fn scrape(port: u16) -> anyhow::Result<(f64, f64, f64)> {
    let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .text()
        .await?;
    let sum = |prefix: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok((
        sum("baton_api_writes_total"),
        sum("baton_reconciles_total"),
        sum("baton_takeovers_total"),
    ))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn report(
    args: &Args,
    expiries: &HashMap<String, Instant>,
    claims: &HashMap<String, Instant>,
    before: &(f64, f64, f64),
    after: &(f64, f64, f64),
    elapsed: f64,
    rss: u64,
) {
    let mut late: Vec<f64> = expiries
        .iter()
        .filter_map(|(name, expiry)| {
            let at = claims.get(name)?;
            Some(at.saturating_duration_since(*expiry).as_secs_f64())
        })
        .collect();
    late.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        late.get(((late.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let takeovers = (after.2 - before.2).max(1.0);
    println!("runs:                      {}", args.runs);
    println!(
        "takeovers observed:        {} of {}",
        late.len(),
        expiries.len()
    );
    println!("takeover lateness p50:     {:.3} s", pct(0.50));
    println!("takeover lateness p99:     {:.3} s", pct(0.99));
    println!(
        "takeover lateness max:     {:.3} s",
        late.last().copied().unwrap_or(f64::NAN)
    );
    println!("controller RSS:            {:.1} MiB", rss as f64 / 1024.0);
    println!(
        "API writes per takeover:   {:.2} (Events excluded)",
        (after.0 - before.0) / takeovers
    );
    println!(
        "reconciles per second:     {:.1}",
        (after.1 - before.1) / elapsed
    );
}
