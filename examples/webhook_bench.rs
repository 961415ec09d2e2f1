//! Webhook benchmark: what baton's admission webhook adds to an AgentRun create and to a
//! ledger segment append (the worker's one awaited round trip per step waits on its review),
//! against the real API server in KUBECONFIG. The same creates run in a namespace the webhook
//! watches and in one it does not, interleaved, and the figures are printed side by side.
//!
//!     cargo run --release --example webhook_bench [-- N [CONTROLLER_USER]]
//!
//! The webhook runs in this process on 127.0.0.1 (as in tests/controller/webhook.rs);
//! CONTROLLER_USER (default `admin`, the local control plane's) is the identity this process
//! appends as, admitted as the controller's.

#[allow(dead_code)]
#[path = "../tests/common/webhook.rs"]
mod webhook;

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, LEDGER_FORMAT_VERSION, LedgerSegment, LedgerSegmentSpec};
use baton::crd::{MANAGED_BY_LABEL, RUN_UID_LABEL};
use baton::fence::segment_name;
use k8s_openapi::api::core::v1::Namespace;
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
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &object)
            .await?;
    }
    let served = webhook::Served::start(&client, &watched, &user).await;
    let (plain_run, watched_run) = (
        running_run(&client, &plain).await?,
        running_run(&client, &watched).await?,
    );

    let mut segments = (Vec::new(), Vec::new());
    let mut runs = (Vec::new(), Vec::new());
    for i in 1..=n as i64 {
        segments
            .0
            .push(timed(append(&client, &plain, &plain_run, i)).await?);
        segments
            .1
            .push(timed(append(&client, &watched, &watched_run, i)).await?);
        runs.0.push(timed(create_run(&client, &plain, i)).await?);
        runs.1.push(timed(create_run(&client, &watched, i)).await?);
    }
    println!("admission webhook, {n} creates each, interleaved (milliseconds):");
    report("segment append", &mut segments.0, &mut segments.1);
    report("AgentRun create", &mut runs.0, &mut runs.1);

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

async fn append(client: &Client, ns: &str, run: &AgentRun, seq: i64) -> anyhow::Result<()> {
    let mut seg = LedgerSegment::new(
        &segment_name("r", seq),
        LedgerSegmentSpec {
            run: "r".into(),
            seq,
            fence: 1,
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
