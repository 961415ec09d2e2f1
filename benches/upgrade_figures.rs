//! `make bench-upgrade`: an upgrade from the previous release with many runs in flight, on the
//! real node (prints figures; asserts nothing but that the figures could be taken).
//!
//! The previous release (`hack/previous-release`, `hack/images.sh previous`) is installed with
//! `BATON_UPGRADE_RUNS` (default 200) scripted runs, each mid tool call; then the upgrade of
//! docs/operations.md (the CRDs, then `helm upgrade` with the new image) at the chart's default pace of
//! handoffs (`controller.maxConcurrentHandoffs`, 1). Printed:
//! - runs in flight across the upgrade, runs lost (not Succeeded), effects run twice (counted
//!   by the effects server, outside baton);
//! - the takeover lateness of each handoff during the upgrade: from the run's `Handoff` phase
//!   to its next claim, both seen by a watch (p50, p99, max);
//! - the time from `helm upgrade` to the last worker of the old image gone, and how many runs
//!   moved to the new image by handoff before they ended;
//! - where the API server's time went meanwhile: each baton webhook as it timed its calls,
//!   and the calls that failed (a timeout is one), the LedgerSegment creates, and the wait of
//!   requests for a seat (priority and fairness);
//! - what each new controller replica timed of its own work: a claim's API calls, a reconcile.
//!
//! Runs in flight on the project's node are bounded by its 2 CPUs and its pod addresses: the
//! bench's runs request 2m CPU for their tools container (the default, 50m, fits about 30
//! runs beside the release's pods), and the node's kubelet takes up to 250 pods
//! (`hack/node.sh`) on a /24 of pod addresses. 200 runs fit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, Phase};
use baton_testkit::e2e::{Effects, Script};
use baton_testkit::metrics::{Samples, bucket_quantile, deltas, scrape, scrape_apiserver, sum};
use baton_testkit::node::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};

/// Long enough that most runs are still mid tool call when their handoff comes, one at a time,
/// and within the runs' 100 steps (`baton_testkit::e2e::run_with`): 90 turns, each tool call longer
/// as there are more runs (the last run's pod starts minutes after the first on 2 CPUs, and
/// 200 runs appending every few seconds, each append reviewed by the webhook, are more than
/// the node's API server answers in time).
fn script(runs: usize) -> Script {
    Script {
        turns: 90,
        think_ms: 200,
        tool_ms: (60 * runs as u64).max(2000),
    }
}

/// The tools container's requests for the bench's runs: 2m CPU (the least CPU weight a
/// container gets), so that 200 runs fit the node's 2 CPUs with room left for controller
/// replicas that request more (`BATON_UPGRADE_CONTROLLER_CPU`); their commands are `curl`s to
/// the effects server.
fn small_tools() -> ResourceRequirements {
    let quantity = |v: &str| Quantity(v.to_string());
    ResourceRequirements {
        requests: Some(
            [("cpu", "2m"), ("memory", "16Mi")]
                .map(|(k, v)| (k.to_string(), quantity(v)))
                .into(),
        ),
        limits: Some([("memory".to_string(), quantity("256Mi"))].into()),
        ..ResourceRequirements::default()
    }
}

/// The controller replicas' CPU request, from `BATON_UPGRADE_CONTROLLER_CPU` (e.g. `500m`);
/// unset, the chart's default. The replicas serve the webhook every append goes through, and
/// on a node whose CPUs the runs saturate a replica gets CPU time in proportion to its request.
fn controller_values() -> serde_json::Value {
    match std::env::var("BATON_UPGRADE_CONTROLLER_CPU") {
        Ok(cpu) if !cpu.is_empty() => {
            serde_json::json!({"resources": {"requests": {"cpu": cpu}}})
        }
        _ => serde_json::json!({}),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("BATON_UPGRADE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let previous = PreviousRelease::with_chart();
    let env = NodeEnv::start("bench-upgrade").await;
    let values = controller_values();
    println!("upgrade figures: the release's values besides its image: {values}");
    let on_previous = OnPreviousRelease::install(&env.client, &previous, &values).await;
    let names: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    let script = script(n);
    for name in &names {
        let mut run = env.scripted(name, &script);
        run.spec.worker.tools_resources = Some(small_tools());
        // The default Lease (30 s, renewed every 10 s, 300 s to start): the tests' 5 s and
        // 30 s to start are too short for 200 pods starting at once on 2 CPUs, where the
        // last pod's containers start minutes after its claim, and every claim of a pod
        // that had not started would count as a death.
        run.spec.lease = LeaseSpec::default();
        env.create(&run).await;
    }
    wait_all_started(&env, &names).await;
    let in_flight = live(&env, &names).await;
    let handoffs = Handoffs::watch(&env);
    let images = ImageSampler::start(&env);
    let apiserver_before = scrape_apiserver(&env.client).await.unwrap_or_default();
    let upgraded_at = Instant::now();
    on_previous.upgrade(&values);
    for name in &names {
        env.wait_run(name, Duration::from_secs(3600), "ended", |s| {
            s.phase.is_terminal()
        })
        .await;
    }
    let old_gone = images.stop();
    let apiserver_after = scrape_apiserver(&env.client).await.unwrap_or_default();
    let (lateness, claims) = handoffs.stop();
    print_figures(
        &env,
        &names,
        in_flight,
        &images,
        &lateness,
        old_gone.map(|t| t - upgraded_at),
    )
    .await;
    let by_reason: Vec<String> = claims.iter().map(|(r, n)| format!("{r} {n}")).collect();
    println!(
        "  claims seen after helm upgrade, by reason: {}",
        by_reason.join(", ")
    );
    print_api_server_figures(&apiserver_before, &apiserver_after);
    print_controller_figures(&env.client).await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    env.finish().await;
}

/// Waits until every run's first tool call ran (at most [`START_WAIT`], printing how many).
async fn wait_all_started(env: &NodeEnv, names: &[String]) {
    let deadline = Instant::now() + START_WAIT;
    loop {
        let effects = Effects::read(&env.effects.file);
        let started = names.iter().filter(|n| effects.count(n, 1) > 0).count();
        if started == names.len() || Instant::now() > deadline {
            println!(
                "upgrade figures: {started} of {} runs past their first tool call",
                names.len()
            );
            return;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// How many of `names` have not ended.
async fn live(env: &NodeEnv, names: &[String]) -> usize {
    let phases = phases(env).await;
    names
        .iter()
        .filter(|n| phases.get(*n).is_some_and(|p| !p.is_terminal()))
        .count()
}

/// Each run's phase, from one list of the namespace's runs: read one by one, 200 runs took
/// 7 minutes on the loaded node, and the upgrade waited on them while the runs ran out.
async fn phases(env: &NodeEnv) -> BTreeMap<String, Phase> {
    let runs = env.runs().list(&ListParams::default()).await;
    let runs = runs.expect("listing the bench's runs");
    runs.items
        .iter()
        .map(|r| (r.name_any(), r.status.clone().unwrap_or_default().phase))
        .collect()
}

/// How long the runs may take to start, together: 200 pods on 2 CPUs take minutes.
const START_WAIT: Duration = Duration::from_secs(1200);

async fn print_figures(
    env: &NodeEnv,
    names: &[String],
    in_flight: usize,
    images: &ImageSampler,
    lateness: &[Duration],
    old_gone: Option<Duration>,
) {
    let phases = phases(env).await;
    let succeeded = |n: &String| phases.get(n) == Some(&Phase::Succeeded);
    let lost = names.iter().filter(|n| !succeeded(n)).count();
    let effects = Effects::read(&env.effects.file);
    let twice: usize = names
        .iter()
        .map(|name| effects.per_turn(name).values().filter(|n| **n > 1).count())
        .sum();
    let moved = names.iter().filter(|name| images.ran_new(name)).count();
    println!(
        "upgrade figures: {in_flight} runs in flight across the upgrade (of {} created), {lost} lost, {twice} effects run twice",
        names.len()
    );
    println!(
        "  takeover lateness of {} handoffs (Handoff phase -> next claim): p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        lateness.len(),
        percentile(lateness, 50),
        percentile(lateness, 99),
        percentile(lateness, 100),
    );
    println!(
        "  helm upgrade -> last worker of the old image gone: {:.1} s; {moved} runs moved to the \
         new image by handoff, {} ended on their old worker",
        old_gone.unwrap_or_default().as_secs_f64(),
        names.len() - moved
    );
}

/// Where the API server's time went after `helm upgrade`: each webhook as it timed its calls
/// (p50, p99, calls, calls that failed: a timeout is one), the ledger appends, and how long
/// requests queued for a seat (priority and fairness), as bucket bounds.
fn print_api_server_figures(before: &Samples, after: &Samples) {
    let hist = |metric: &str, needles: &[&str]| {
        let (b, a) = (only(before, needles), only(after, needles));
        let bucket = format!("{metric}_bucket");
        let count = sum(&a, &format!("{metric}_count")) - sum(&b, &format!("{metric}_count"));
        format!(
            "p50 ≤ {} s, p99 ≤ {} s of {count}",
            bucket_quantile(&b, &a, &bucket, 0.50),
            bucket_quantile(&b, &a, &bucket, 0.99),
        )
    };
    for hook in ["segments", "leases", "runs"] {
        let name = format!("name=\"{hook}.baton.dev\"");
        let failed: f64 = deltas(before, after, "apiserver_admission_webhook_rejection_count")
            .iter()
            .filter(|(k, _)| k.contains(&name) && k.contains("calling_webhook_error"))
            .map(|(_, n)| n)
            .sum();
        println!(
            "  webhook {hook}.baton.dev as the API server timed it: {}; {failed} calls failed",
            hist(
                "apiserver_admission_webhook_admission_duration_seconds",
                &[&name]
            ),
        );
    }
    let appends = ["resource=\"ledgersegments\"", "verb=\"POST\""];
    println!(
        "  LedgerSegment creates: {}",
        hist("apiserver_request_duration_seconds", &appends)
    );
    println!(
        "  requests' wait for a seat (priority and fairness): {}",
        hist("apiserver_flowcontrol_request_wait_duration_seconds", &[])
    );
}

/// What each controller replica (started by the upgrade) timed of its own work since: the API
/// calls of each claim it made, and every reconcile (bucket bounds, p50 / p99, and how many).
async fn print_controller_figures(client: &kube::Client) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), SYSTEM_NS);
    let params = ListParams::default().labels("app.kubernetes.io/component=controller");
    let Ok(list) = pods.list(&params).await else {
        return println!("  the controllers could not be listed");
    };
    for pod in list {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let relay = Relay::start(&format!("{ip}:8080"));
        let mut metrics = None;
        for _ in 0..20 {
            metrics = scrape(relay.port).await.ok();
            if metrics.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let Some(after) = metrics else {
            println!("  controller {}: no metrics", pod.name_any());
            continue;
        };
        let none = Samples::default();
        let timed = |name: &str| {
            let bucket = format!("{name}_bucket");
            format!(
                "p50 ≤ {} s, p99 ≤ {} s of {}",
                bucket_quantile(&none, &after, &bucket, 0.50),
                bucket_quantile(&none, &after, &bucket, 0.99),
                sum(&after, &format!("{name}_count")),
            )
        };
        println!(
            "  controller {}: a claim's API calls {}; a reconcile {}",
            pod.name_any(),
            timed("baton_claim_api_seconds"),
            timed("baton_reconcile_duration_seconds"),
        );
    }
}

/// The series of `samples` whose name holds every one of `needles`.
fn only(samples: &Samples, needles: &[&str]) -> Samples {
    samples
        .iter()
        .filter(|(k, _)| needles.iter().all(|n| k.contains(n)))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// The `p`th percentile of `samples`, in seconds (nearest rank; 0 when there are none).
fn percentile(samples: &[Duration], p: usize) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64()
}

/// Each run's handoffs as a watch sees them: when it entered `Handoff` at a fence, and how
/// long until its status named a later fence; and every claim seen after the upgrade began,
/// by its reason (a claim beyond one per handoff is an attempt the upgrade cost: a pod that
/// never came up, a lease that expired under load).
struct Handoffs {
    lateness: Arc<Mutex<Vec<Duration>>>,
    claims: Arc<Mutex<BTreeMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Handoffs {
    fn watch(env: &NodeEnv) -> Self {
        let lateness = Arc::new(Mutex::new(Vec::new()));
        let claims = Arc::new(Mutex::new(BTreeMap::new()));
        let (into, claims_into) = (lateness.clone(), claims.clone());
        let runs = env.runs();
        let task = tokio::spawn(async move {
            // Run → (the fence it handed off at, when that was seen).
            let mut waiting: BTreeMap<String, (i64, Instant)> = BTreeMap::new();
            // Run → the last fence seen.
            let mut fences: BTreeMap<String, i64> = BTreeMap::new();
            let mut events = watcher(runs, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(run) = event else { continue };
                if let Some(reason) = new_claim(&mut fences, &run) {
                    *claims_into.lock().unwrap().entry(reason).or_default() += 1;
                }
                if let Some(late) = observe(&mut waiting, &run) {
                    into.lock().unwrap().push(late);
                }
            }
        });
        Self {
            lateness,
            claims,
            task,
        }
    }

    /// The lateness of every handoff, and the claims seen by reason.
    fn stop(self) -> (Vec<Duration>, BTreeMap<String, usize>) {
        self.task.abort();
        let lateness = self.lateness.lock().unwrap().clone();
        (lateness, self.claims.lock().unwrap().clone())
    }
}

/// The reason of a claim `run`'s status shows at a fence later than the last one seen (none
/// at the first sight of a run: it was claimed before the watch began).
fn new_claim(fences: &mut BTreeMap<String, i64>, run: &AgentRun) -> Option<String> {
    let status = run.status.as_ref()?;
    let fence = status.fence.get();
    let before = fences.insert(run.name_any(), fence)?;
    (fence > before).then(|| status.reason.clone().unwrap_or_default())
}

/// Notes `run`'s handoff, or the claim that ends one: then its lateness.
fn observe(waiting: &mut BTreeMap<String, (i64, Instant)>, run: &AgentRun) -> Option<Duration> {
    let status = run.status.as_ref()?;
    let (name, fence) = (run.name_any(), status.fence.get());
    if status.phase == Phase::Handoff {
        waiting.entry(name).or_insert((fence, Instant::now()));
        return None;
    }
    match waiting.get(&name) {
        Some((handed_off_at, seen)) if fence > *handed_off_at => {
            let late = seen.elapsed();
            waiting.remove(&name);
            Some(late)
        }
        _ => None,
    }
}
