//! Webhook benchmark: what baton's admission webhook adds to an AgentRun create, to a ledger
//! segment append (the worker's one awaited round trip per step waits on its review) and to a
//! worker's Lease renewal, against the real API server in KUBECONFIG. The same writes run in a
//! namespace the webhook watches and in one it does not, interleaved, and the figures are
//! printed side by side, with the runs the webhook read per renewal (the API server's own
//! request count): renewals are its busiest traffic, one per live run every few seconds.
//!
//!     cargo run --release --example webhook_bench [-- N [CONTROLLER_USER]]
//!
//! The webhook runs in this process on 127.0.0.1 (as in tests/controller/webhook.rs);
//! CONTROLLER_USER (default `admin`, the local control plane's) is the identity this process
//! appends as, admitted as the controller's.

use baton_testkit::common::namespace;
use baton_testkit::common::webhook;
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, LEDGER_FORMAT_VERSION, LedgerSegment, LedgerSegmentSpec};
use baton::crd::{MANAGED_BY_LABEL, RUN_UID_LABEL};
use baton::fence::Fence;
use baton::fence::segment_name;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(300);
    let user = args.next().unwrap_or_else(|| "admin".into());
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let suffix = rand::random::<u32>() % 1_000_000;
    let (plain, watched) = (
        format!("bench-plain-{suffix}"),
        format!("bench-hook-{suffix}"),
    );
    for ns in [&plain, &watched] {
        namespace::create_namespace(&client, ns).await?;
    }
    let served = webhook::Served::start(&client, &watched, &user).await;
    let (plain_run, watched_run) = (
        running_run(&client, &plain).await?,
        running_run(&client, &watched).await?,
    );

    let (plain_worker, watched_worker) = (
        worker_leases(&client, &plain).await?,
        worker_leases(&client, &watched).await?,
    );
    let mut renewals = (Vec::new(), Vec::new());
    let reads_before = run_reads(&client).await?;
    for _ in 0..n {
        renewals.0.push(timed(renew(&plain_worker)).await?);
        renewals.1.push(timed(renew(&watched_worker)).await?);
    }
    let renewal_reads = run_reads(&client).await? - reads_before;
    let mut segments = (Vec::new(), Vec::new());
    let reads_before = run_reads(&client).await?;
    for i in 1..=n as i64 {
        segments
            .0
            .push(timed(append(&client, &plain, &plain_run, i)).await?);
        segments
            .1
            .push(timed(append(&client, &watched, &watched_run, i)).await?);
    }
    let append_reads = run_reads(&client).await? - reads_before;
    let mut runs = (Vec::new(), Vec::new());
    for i in 1..=n as i64 {
        runs.0.push(timed(create_run(&client, &plain, i)).await?);
        runs.1.push(timed(create_run(&client, &watched, i)).await?);
    }
    println!("admission webhook, {n} writes each, interleaved (milliseconds):");
    report("segment append", &mut segments.0, &mut segments.1);
    report("AgentRun create", &mut runs.0, &mut runs.1);
    report("Lease renewal", &mut renewals.0, &mut renewals.1);
    println!("runs read by the webhook (the API server's count of AgentRun reads):");
    for (what, reads) in [
        ("segment append", append_reads),
        ("Lease renewal", renewal_reads),
    ] {
        println!(
            "  per {what:<16} {:.2} ({reads} reads, {n} writes)",
            reads as f64 / n as f64
        );
    }

    served.stop(&client).await;
    for ns in [&plain, &watched] {
        let _ = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::default())
            .await;
    }
    Ok(())
}

/// A run whose status names fence 1, as after its first claim.
async fn running_run(client: &Client, ns: &str) -> anyhow::Result<AgentRun> {
    let api = Api::<AgentRun>::namespaced(client.clone(), ns);
    let run = api
        .create(
            &PostParams::default(),
            &AgentRun::builder("r").input("bench").build(),
        )
        .await?;
    let status = serde_json::json!({ "status": { "phase": "Running", "fence": 1, "attempt": 1 } });
    api.patch_status("r", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(run)
}

/// Run `r`'s Lease in `ns`, and a handle on it as the run's own worker identity would hold it
/// (`baton-run-r`, impersonated with the masters group so that RBAC admits it: the webhook
/// decides by the user name).
async fn worker_leases(client: &Client, ns: &str) -> anyhow::Result<Api<Lease>> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("run.r".into()),
            labels: Some([(MANAGED_BY_LABEL.to_string(), "baton".to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("r-w1".into()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &lease)
        .await?;
    let mut config = kube::Config::infer().await?;
    config.auth_info.impersonate = Some(baton::rbac::worker_username(ns, "r"));
    config.auth_info.impersonate_groups = Some(vec!["system:masters".into()]);
    Ok(Api::namespaced(Client::try_from(config)?, ns))
}

/// A renewal as the worker makes it: its renew time moved.
async fn renew(leases: &Api<Lease>) -> anyhow::Result<()> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let patch = serde_json::json!({ "spec": { "renewTime": now } });
    leases
        .patch("run.r", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// How many reads of AgentRuns the API server has answered since it started (its
/// `apiserver_request_total` counter, summed over codes). It files a GET of one custom
/// resource under the verb LIST (seen on this bed's API server), so both verbs count; this
/// process lists no AgentRuns while it measures.
async fn run_reads(client: &Client) -> anyhow::Result<u64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"agentruns\""))
        .filter(|l| l.contains("verb=\"GET\"") || l.contains("verb=\"LIST\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

async fn append(client: &Client, ns: &str, run: &AgentRun, seq: i64) -> anyhow::Result<()> {
    let mut seg = LedgerSegment::new(
        &segment_name("r", seq),
        LedgerSegmentSpec {
            run: "r".into(),
            seq,
            fence: Fence::new(1),
            format: LEDGER_FORMAT_VERSION,
            events: vec![],
        },
    );
    seg.metadata.labels = Some(
        [
            (RUN_UID_LABEL.to_string(), run.uid().unwrap_or_default()),
            (MANAGED_BY_LABEL.to_string(), "baton".to_string()),
        ]
        .into(),
    );
    Api::<LedgerSegment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &seg)
        .await?;
    Ok(())
}

async fn create_run(client: &Client, ns: &str, i: i64) -> anyhow::Result<()> {
    let run = AgentRun::builder(&format!("r{i}")).input("bench").build();
    Api::<AgentRun>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &run)
        .await?;
    Ok(())
}

async fn timed(work: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    work.await?;
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

fn report(what: &str, without: &mut [f64], with: &mut [f64]) {
    let (p50, p99) = (percentile(without, 0.50), percentile(without, 0.99));
    let (hp50, hp99) = (percentile(with, 0.50), percentile(with, 0.99));
    println!(
        "  {what:<16} without webhook p50 {p50:6.2}  p99 {p99:6.2} | with webhook p50 {hp50:6.2}  p99 {hp99:6.2} | added p50 {:+.2}  p99 {:+.2}",
        hp50 - p50,
        hp99 - p99
    );
}

fn percentile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples.get(i).copied().unwrap_or(f64::NAN)
}
