//! Controller benchmark (prints figures; asserts nothing).
//!
//! `cargo bench --bench controller -- --runs 1000 --window 100 [--passes 2]`
//!
//! Starts `baton controller` (the release binary, `$BATON_BIN` or target/release/baton) as its
//! own process on the control plane in KUBECONFIG, creates N runs, lets every run start (fence
//! 1; its Lease is moved but never renewed, so the startup allowance holds it), waits for the
//! start's Events to be published and reads every Lease once (as a worker does when it
//! starts), then renews run i's Lease once at t0 + i·window/N (a worker's steady-state
//! renewal: one write) and never again: the N leases expire spread evenly over the window.
//! Reports takeover lateness after expiry (claim seen by a watch minus renewal +
//! durationSeconds), controller RSS, API writes per takeover (Events excluded), reconciles
//! per second.
//!
//! `--passes K` runs the whole benchmark K times in a row, each with its own namespace and
//! controller process, and prints each pass's figures. The first pass on a freshly started
//! API server also measures that server growing into its load (heap, watch caches); later
//! passes measure it as a long-running server is.
//!
//! `BATON_CONTROLLER_ARGS` adds flags to `baton controller` (e.g. `--concurrency 128`).
//!
//! Each pass works in a fresh namespace and, whatever happens, deletes every run, segment,
//! Lease, pod, worker ServiceAccount/Role/RoleBinding and Event in it at the end (the local
//! control plane has no garbage collector and no namespace controller).
//!
//! Here: the pass itself (the runs created, started, renewed once, taken over). In
//! benches/controller_support/: the metrics read (`metrics`), what is printed (`report`), the
//! namespace's cleanup (`cleanup`).

/// The benchmark's own parts, in `controller_support/`.
mod controller_support {
    pub mod cleanup;
    pub mod report;
}
use controller_support::{cleanup, report};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::AgentRun;
use baton::fence::Fence;
use baton::lease::WorkerLease;
use baton_testkit::metrics::{rss_kib, scrape, scrape_apiserver, settle_events};
use cleanup::cleanup;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use report::{report, report_apiserver};

const DURATION: i32 = 10;
/// Label on every run the bench creates.
const BENCH_LABEL: &str = "baton.dev/bench";

struct Args {
    runs: usize,
    window: u64,
    /// Whole benchmarks in a row, each with its own namespace and controller process.
    passes: usize,
}

fn args() -> Args {
    let mut a = Args {
        runs: 1000,
        window: 100,
        passes: 1,
    };
    let argv: Vec<String> = std::env::args().collect();
    for pair in argv.windows(2) {
        match pair[0].as_str() {
            "--runs" => a.runs = pair[1].parse().expect("--runs N"),
            "--window" => a.window = pair[1].parse().expect("--window SECONDS"),
            "--passes" => a.passes = pair[1].parse().expect("--passes K"),
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
    for pass in 1..=args.passes {
        if args.passes > 1 {
            println!("bench: pass {pass} of {}", args.passes);
        }
        one_pass(&client, &args).await?;
    }
    Ok(())
}

/// One whole benchmark in a fresh namespace, with a controller process of its own.
async fn one_pass(client: &Client, args: &Args) -> anyhow::Result<()> {
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
    let result = bench(client, &ns, port, args, &mut controller).await;
    controller.kill().await.ok();
    cleanup(client, &ns).await;
    result
}

async fn bench(
    client: &Client,
    ns: &str,
    port: u16,
    args: &Args,
    controller: &mut tokio::process::Child,
) -> anyhow::Result<()> {
    let progress = watch_runs(client.clone(), ns);
    println!(
        "bench: {} runs in namespace {ns}, leases expiring over {} s",
        args.runs, args.window
    );
    let t = Instant::now();
    create_runs(client, ns, args.runs).await?;
    println!(
        "bench: {} runs created in {:.1} s",
        args.runs,
        t.elapsed().as_secs_f64()
    );
    let start_timeout = Duration::from_secs(120 + args.runs as u64 / 5);
    if !wait_started(&progress, args.runs, t, start_timeout).await {
        anyhow::bail!("not every run started within {start_timeout:?}");
    }
    settle_events(port).await?;
    let leases = held_leases(client, ns, args.runs).await?;
    let before = scrape(port).await?;
    let apiserver_before = scrape_apiserver(client).await?;
    let started = Instant::now();
    let ticker = tokio::spawn(tick(progress.clone(), args.runs, args.window, started));
    let expiries = renew_spread(leases, args).await;
    wait_claimed(&progress, args.runs, Duration::from_secs(args.window + 120)).await;
    ticker.abort();
    let elapsed = started.elapsed().as_secs_f64();
    // The last claims' Lease moves, pod creations and deletions are still in flight.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = scrape(port).await?;
    let apiserver_after = scrape_apiserver(client).await?;
    let rss = rss_kib(controller.id().unwrap_or_default());
    report(
        args,
        &expiries,
        &progress.lock().unwrap().claimed,
        &before,
        &after,
        elapsed,
        rss,
    );
    report_apiserver(&apiserver_before, &apiserver_after);
    Ok(())
}

fn spawn_controller(ns: &str, port: u16) -> anyhow::Result<tokio::process::Child> {
    let bin = std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into());
    Ok(tokio::process::Command::new(bin)
        .args(["controller", "--namespace", ns, "--leader-election=false"])
        .args(["--admin-addr", &format!("127.0.0.1:{port}")])
        .args(extra_args())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()?)
}

/// Extra flags for `baton controller` (`BATON_CONTROLLER_ARGS`, split on spaces), e.g.
/// `--concurrency 128`.
fn extra_args() -> Vec<String> {
    std::env::var("BATON_CONTROLLER_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn run_manifest(name: &str) -> AgentRun {
    AgentRun::builder(name)
        .label(BENCH_LABEL, "true")
        .input("bench")
        .lease(DURATION, 3, 3600)
        .reply("x")
        .build()
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
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// What the bench's own watch has seen of the runs.
#[derive(Default)]
struct Progress {
    /// Runs seen at fence >= 1.
    started: HashSet<String>,
    /// When each run was first seen claimed for fence 2.
    claimed: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Progress>>;

/// One watch on the runs (no polling lists: 5,000 runs listed twice a second would load the
/// API server the controller is measured against).
fn watch_runs(client: Client, ns: &str) -> Shared {
    let progress: Shared = Default::default();
    let out = progress.clone();
    let api: Api<AgentRun> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(
            watcher(api, Default::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(run)) = stream.next().await {
            let fence = run.status.as_ref().map_or(0, |s| s.fence.get());
            let mut p = out.lock().unwrap();
            if fence >= 1 {
                p.started.insert(run.name_any());
            }
            if fence >= 2 {
                p.claimed.entry(run.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    progress
}

async fn wait_started(progress: &Shared, n: usize, since: Instant, timeout: Duration) -> bool {
    loop {
        let started = progress.lock().unwrap().started.len();
        if started >= n {
            let secs = since.elapsed().as_secs_f64();
            println!(
                "bench: {n} runs started {secs:.1} s after the first was created ({:.1} runs/s)",
                n as f64 / secs
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
            return true;
        }
        if since.elapsed() > timeout {
            println!("bench: only {started} of {n} runs started");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Renews run i once at i·window/N; returns each run's expected expiry.
/// Every run's Lease as its worker holds it: read and verified once, as a worker does when
/// it starts, so that its renewals are the worker's steady-state ones (a single write).
async fn held_leases(client: &Client, ns: &str, n: usize) -> anyhow::Result<Vec<WorkerLease>> {
    futures::stream::iter(0..n)
        .map(|i| {
            let name = format!("r{i}");
            let lease = WorkerLease::new(
                client.clone(),
                ns,
                &name,
                &format!("{name}-w1"),
                Fence::new(1),
            );
            async move { lease.verify().await.map(|_| lease) }
        })
        .buffered(64)
        .try_collect()
        .await
        .map_err(Into::into)
}

/// Renews run i's Lease (`leases[i]`) once, at t0 + i·window/N.
async fn renew_spread(leases: Vec<WorkerLease>, args: &Args) -> HashMap<String, Instant> {
    let t0 = Instant::now();
    let step = Duration::from_secs_f64(args.window as f64 / args.runs as f64);
    let expiries: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    futures::stream::iter(leases.into_iter().enumerate())
        .map(|(i, lease)| {
            let expiries = expiries.clone();
            async move {
                tokio::time::sleep_until((t0 + step * i as u32).into()).await;
                if lease.renew().await.is_ok() {
                    let expiry = Instant::now() + Duration::from_secs(DURATION as u64);
                    expiries.lock().unwrap().insert(format!("r{i}"), expiry);
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

/// Every 10 s: how many leases should have expired by now, and how many were taken over.
async fn tick(progress: Shared, n: usize, window: u64, t0: Instant) {
    let step = window as f64 / n as f64;
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let t = t0.elapsed().as_secs_f64();
        let due = (((t - DURATION as f64) / step).floor().max(0.0) as usize).min(n);
        let claimed = progress.lock().unwrap().claimed.len();
        println!("bench: t={t:5.0} s  expired≈{due:5}  taken over {claimed:5}");
    }
}

async fn wait_claimed(progress: &Shared, n: usize, timeout: Duration) {
    let t = Instant::now();
    while progress.lock().unwrap().claimed.len() < n && t.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
