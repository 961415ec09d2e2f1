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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, LedgerSegment};
use baton::fence::Fence;
use baton::lease::WorkerLease;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

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

/// Deletes what the bench made (the local control plane has no garbage collector and no
/// namespace controller, so nothing else would): every object of these kinds in the bench's
/// own namespace, then the namespace.
async fn cleanup(client: &Client, ns: &str) {
    let t = Instant::now();
    let mut left = 0;
    left += purge::<AgentRun>(client, ns).await;
    left += purge::<LedgerSegment>(client, ns).await;
    left += purge::<Lease>(client, ns).await;
    left += purge::<Pod>(client, ns).await;
    left += purge::<ServiceAccount>(client, ns).await;
    left += purge::<Role>(client, ns).await;
    left += purge::<RoleBinding>(client, ns).await;
    left += purge::<CoreEvent>(client, ns).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
    println!(
        "bench: cleanup of namespace {ns} took {:.1} s ({left} objects left)",
        t.elapsed().as_secs_f64()
    );
}

/// `deletecollection` over the namespace until nothing is left (a large collection can
/// outlast one request's timeout). Returns how many objects are left.
async fn purge<K>(client: &Client, ns: &str) -> usize
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams::background().grace_period(0);
    let mut left = usize::MAX;
    for _ in 0..10 {
        if let Err(err) = api.delete_collection(&params, &ListParams::default()).await {
            eprintln!("bench: deleting {}: {err}", K::kind(&Default::default()));
        }
        left = api
            .list_metadata(&ListParams::default())
            .await
            .map_or(usize::MAX, |l| l.items.len());
        if left == 0 {
            break;
        }
    }
    left
}

/// Waits (at most a minute) until the controller has published the start's Events, so the
/// window measures live runs' takeovers, not the start's tail; prints what it found.
async fn settle_events(port: u16) -> anyhow::Result<()> {
    let t = Instant::now();
    let metric = |s: &Samples, name: &str| s.get(name).copied().unwrap_or(0.0);
    loop {
        let now = scrape(port).await?;
        let queued = metric(&now, "baton_events_queued");
        if queued == 0.0 || t.elapsed() > Duration::from_secs(60) {
            println!(
                "bench: start's Events published {:.1} s after the last run started \
                 ({queued} still queued, {} dropped)",
                t.elapsed().as_secs_f64(),
                metric(&now, "baton_events_dropped_total")
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The controller's counters: every sample line of the exposition, by series.
async fn scrape(port: u16) -> anyhow::Result<Samples> {
    let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .text()
        .await?;
    Ok(samples(&body))
}

/// The API server's own metrics (its Go runtime's garbage collections, its heap).
async fn scrape_apiserver(client: &Client) -> anyhow::Result<Samples> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(samples(&client.request_text(request).await?))
}

/// Every sample line of a Prometheus text exposition, by series.
fn samples(body: &str) -> Samples {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse::<f64>().ok()?))
        })
        .collect()
}

/// What the API server (sharing the machine's cores with etcd, the controller and the bench)
/// went through during the window: its garbage collections stall its requests.
fn report_apiserver(before: &Samples, after: &Samples) {
    let delta =
        |series: &str| after.get(series).unwrap_or(&0.0) - before.get(series).unwrap_or(&0.0);
    let heap = after.get("go_memstats_heap_alloc_bytes").unwrap_or(&0.0) / (1024.0 * 1024.0);
    println!(
        "API server during the window: {:.0} Go GC cycles, heap {heap:.0} MiB at the end",
        delta("go_gc_duration_seconds_count")
    );
    // A 1.20 server counts a GET of a missing custom resource as `LIST` with code 404.
    println!("API server requests during the window (all clients, by verb, resource and code):");
    for ((verb, resource, code), n) in requests_by_verb(before, after) {
        println!("  {verb:>6} {resource:<28} {code} {n:>7.0}");
    }
}

/// Increase of `apiserver_request_total` summed per (verb, resource[/subresource], code).
fn requests_by_verb(before: &Samples, after: &Samples) -> Vec<((String, String, String), f64)> {
    let mut out: HashMap<(String, String, String), f64> = HashMap::new();
    for (series, n) in deltas(before, after, "apiserver_request_total{") {
        let label = |name: &str| {
            let key = format!("{name}=\"");
            series
                .split(&format!(",{key}"))
                .nth(1)
                .or_else(|| series.split(&format!("{{{key}")).nth(1))
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let mut resource = label("resource");
        let sub = label("subresource");
        if !sub.is_empty() {
            resource = format!("{resource}/{sub}");
        }
        *out.entry((label("verb"), resource, label("code")))
            .or_default() += n;
    }
    let mut out: Vec<_> = out.into_iter().collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

type Samples = HashMap<String, f64>;

/// Sum of the series whose name starts with `prefix`.
fn sum(samples: &Samples, prefix: &str) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

/// Per-series increase of the series starting with `prefix`, nonzero only.
fn deltas(before: &Samples, after: &Samples, prefix: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = after
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The upper bound of the histogram bucket holding quantile `q` of the observations made
/// between the two scrapes.
fn bucket_quantile(before: &Samples, after: &Samples, prefix: &str, q: f64) -> String {
    let mut buckets: Vec<(f64, f64)> = after
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(k, v)| {
            let le = k.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, v - before.get(k).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return "n/a".into();
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map_or("n/a".into(), |(le, _)| format!("{le}"))
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
    before: &Samples,
    after: &Samples,
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
    dump_lateness(expiries, claims);
    late.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        late.get(((late.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let delta = |prefix: &str| sum(after, prefix) - sum(before, prefix);
    let takeovers = delta("baton_takeovers_total").max(1.0);
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
    // With the baseline in it: the 1,000- and 5,000-run figures side by side give the margin.
    println!(
        "controller RSS per run:    {:.1} KiB",
        rss as f64 / args.runs.max(1) as f64
    );
    println!(
        "API writes per takeover:   {:.2} (Events excluded)",
        delta("baton_api_writes_total") / takeovers
    );
    for (series, d) in deltas(before, after, "baton_api_writes_total") {
        println!("  {series}: {d}");
    }
    println!(
        "reconciles per second:     {:.1}",
        delta("baton_reconciles_total") / elapsed
    );
    let quantiles = |histogram: &str| {
        let bucket = format!("{histogram}_bucket");
        (
            bucket_quantile(before, after, &bucket, 0.50),
            bucket_quantile(before, after, &bucket, 0.99),
        )
    };
    let (p50, p99) = quantiles("baton_takeover_lateness_seconds");
    println!("controller's own lateness: p50 <= {p50} s, p99 <= {p99} s (histogram bucket bounds)");
    // The claim's own API round trips, of that lateness: the rest is the wait for the expiry's
    // reconcile to start (the controller's queueing) and the watch's delay.
    let (p50, p99) = quantiles("baton_claim_api_seconds");
    println!("  of it, the claim's API calls: p50 <= {p50} s, p99 <= {p99} s");
    let dropped = delta("baton_events_dropped_total");
    if dropped > 0.0 {
        println!("events dropped:            {dropped}");
    }
    let errors = deltas(before, after, "baton_errors_total");
    if !errors.is_empty() {
        println!("reconcile errors during the window:");
        for (series, d) in errors {
            println!("  {series}: {d}");
        }
    }
}

/// `BATON_BENCH_DUMP=FILE`: one line per takeover, "<expiry, s after the first> <lateness, s>",
/// to see when in the window late takeovers happened.
fn dump_lateness(expiries: &HashMap<String, Instant>, claims: &HashMap<String, Instant>) {
    let Ok(path) = std::env::var("BATON_BENCH_DUMP") else {
        return;
    };
    let Some(first) = expiries.values().min().copied() else {
        return;
    };
    let mut lines: Vec<(f64, f64)> = expiries
        .iter()
        .filter_map(|(name, expiry)| {
            let at = claims.get(name)?;
            let offset = expiry.duration_since(first).as_secs_f64();
            Some((offset, at.saturating_duration_since(*expiry).as_secs_f64()))
        })
        .collect();
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    let wall = std::time::SystemTime::now() - first.elapsed();
    let unix = wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let header = format!("# first expiry at unix {:.3}\n", unix.as_secs_f64());
    let body: String = lines
        .iter()
        .map(|(t, l)| format!("{t:.3} {l:.3}\n"))
        .collect();
    let text = header + &body;
    if let Err(err) = std::fs::write(&path, text) {
        eprintln!("bench: cannot write {path}: {err}");
    }
}
