//! End-to-end figures on the real node (prints them; asserts nothing).
//!
//! `make bench-node` (it starts the node and prints its warm start first), or
//! `cargo bench --bench node_figures` with `BATON_NODE_KUBECONFIG` set; `BATON_FIGURES_SAMPLES`
//! (default 5) samples per figure, one at a time; `BATON_FIGURES=approvals` for (f) alone.
//! baton runs as the chart's pods, the workers as real pods; the faults are real.
//!
//! (a) SIGTERM (pod deleted) and eviction (what a drain does to each pod) → the next worker's
//!     first ledger write (its `attemptStarted` segment, seen by a watch, client clock);
//! (b) kill -9 of the worker container's process from the host → the next worker's first write
//!     (the kubelet reports the death); a frozen worker (SIGSTOP, death not reported) → the
//!     same, after the lease expired; the node lost (kubelet stopped, worker frozen) → claimed
//!     again, and → resumed once the kubelet is back;
//! (c) work lost per fault: effects run zero or twice, steps unknown, model turns repeated;
//! (d) the same kill on a Job-style restart from zero;
//! (e) the worker pod's start (created → container running), the controller rollout (time
//!     with no leader, a run created meanwhile: created → claimed), the image's size;
//! (f) approvals: `baton approve` (its patch landed) → the next worker's first write, and →
//!     the approved step starting (its `approvalDecided`, appended right before the tool runs);
//! (g) warm turns: [`WARM_TURNS`] turns of a thread one after another, with and without
//!     `spec.warm`: created → model request and → Succeeded (p50, p95, max); what an idle
//!     warm thread holds (`BATON_FIGURES=warm` for (g) alone).
//!
//! Here: the samples' shape and the table. In benches/node_figures_support/: the faults of
//! (a)–(d) (`faults`), the rollout and image of (e) (`rollout`), the approvals of (f)
//! (`approvals`), the warm turns of (g) (`warm`).

/// The figures' own parts, in `node_figures_support/`.
mod node_figures_support {
    pub mod approvals;
    pub mod faults;
    pub mod rollout;
    pub mod warm;
}
use node_figures_support::{approvals, faults, rollout, warm};

use std::time::Duration;

use approvals::approval_figures;
use baton_testkit::e2e::{Script, lease};
use baton_testkit::node::{IMAGE, NodeEnv};
use faults::{job_style, sample};
use rollout::{controller_rollout, image_size};
use warm::warm_figures;

/// Turns per thread in (g): issue 46 asks for at least 20.
const WARM_TURNS: usize = 20;

/// The script of every sample: 6 tool turns; the fault comes once the effect of turn 3 landed.
fn script() -> Script {
    Script {
        turns: 6,
        think_ms: 1500,
        tool_ms: 100,
    }
}
const FAULT_AFTER_TURN: usize = 3;

#[derive(Default)]
struct Sample {
    /// The sample's first worker pod: created → container running.
    pod_start: Option<f64>,
    resume: Duration,
    claimed: Duration,
    total: Duration,
    lost: usize,
    doubled: usize,
    unknown: usize,
    repeated_model: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Term,
    Evict,
    Kill,
    Freeze,
    NodeLost,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let samples: usize = std::env::var("BATON_FIGURES_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let env = NodeEnv::start("figures").await;
    if std::env::var("BATON_FIGURES").as_deref() == Ok("approvals") {
        approval_figures(&env, samples).await;
        env.finish().await;
        return;
    }
    if std::env::var("BATON_FIGURES").as_deref() == Ok("warm") {
        warm_figures(&env, WARM_TURNS).await;
        env.finish().await;
        return;
    }
    let lease = lease();
    println!(
        "node figures: {samples} samples each; lease {} s / renew {} s; script {} turns, model {} ms \
         per turn; fault once turn {FAULT_AFTER_TURN}'s effect landed",
        lease.duration_seconds,
        lease.renew_seconds,
        script().turns,
        script().think_ms
    );
    let mut results = Vec::new();
    for fault in [
        Fault::Term,
        Fault::Evict,
        Fault::Kill,
        Fault::Freeze,
        Fault::NodeLost,
    ] {
        let mut v = Vec::new();
        for i in 0..samples {
            v.push(sample(&env, fault, i).await);
        }
        results.push((fault, v));
    }
    let mut jobs = Vec::new();
    for i in 0..samples {
        jobs.push(job_style(&env, i).await);
    }
    let pod_starts: Vec<f64> = results
        .iter()
        .flat_map(|(_, v)| v.iter().filter_map(|s| s.pod_start))
        .collect();
    let (leaderless, delayed) = controller_rollout(&env).await;

    println!();
    println!(
        "{:<64} {:>10} {:>3} {:>8} {:>8} {:>8}",
        "figure", "target", "n", "mean", "p50", "max"
    );
    let secs = |v: &[Sample], f: fn(&Sample) -> Duration| -> Vec<f64> {
        v.iter().map(|s| f(s).as_secs_f64()).collect()
    };
    let count = |v: &[Sample], f: fn(&Sample) -> usize| -> Vec<f64> {
        v.iter().map(|s| f(s) as f64).collect()
    };
    let expiry = format!("<= {}s", lease.duration_seconds + 1);
    let expiry_st = format!("<= {}s+st", lease.duration_seconds + 1);
    for (fault, v) in &results {
        match fault {
            Fault::Term => line(
                "(a) pod deleted (SIGTERM) -> next worker's first write",
                "<= 1s+st",
                secs(v, |s| s.resume),
                "s",
            ),
            Fault::Evict => line(
                "(a) evicted (drain) -> next worker's first write",
                "<= 1s+st",
                secs(v, |s| s.resume),
                "s",
            ),
            Fault::Kill => line(
                "(b) kill -9 -> next worker's first write",
                "<= 2s+st",
                secs(v, |s| s.resume),
                "s",
            ),
            Fault::Freeze => line(
                "(b) frozen (death not reported) -> next worker's first write",
                &expiry_st,
                secs(v, |s| s.resume),
                "s",
            ),
            Fault::NodeLost => {
                line(
                    "(b) node lost -> claimed again (new pod created)",
                    &expiry,
                    secs(v, |s| s.claimed),
                    "s",
                );
                line(
                    "(b) node lost: kubelet back -> next worker's first write",
                    "st",
                    secs(v, |s| s.resume),
                    "s",
                );
            }
        }
    }
    for (fault, v) in &results {
        let what = format!("{fault:?}").to_lowercase();
        line(
            &format!("(c) {what}: effects lost (ran 0 times) per fault"),
            "<= 1",
            count(v, |s| s.lost),
            " ",
        );
        line(
            &format!("(c) {what}: effects run twice per fault"),
            "0",
            count(v, |s| s.doubled),
            " ",
        );
        line(
            &format!("(c) {what}: steps reported unknown per fault"),
            "<= 1",
            count(v, |s| s.unknown),
            " ",
        );
        line(
            &format!("(c) {what}: model turns repeated (ledger; lower bound)"),
            "<= 1",
            count(v, |s| s.repeated_model),
            " ",
        );
    }
    let kills = &results.iter().find(|(f, _)| *f == Fault::Kill).unwrap().1;
    println!();
    line(
        "(d) baton: kill -9 -> run Succeeded",
        "-",
        secs(kills, |s| s.total),
        "s",
    );
    line(
        "(d) Job-style: kill -9 -> restarted run Succeeded",
        "-",
        secs(&jobs, |s| s.total),
        "s",
    );
    line(
        "(d) baton: effects run twice per kill",
        "0",
        count(kills, |s| s.doubled),
        " ",
    );
    line(
        "(d) Job-style: effects run twice per kill",
        "-",
        count(&jobs, |s| s.doubled),
        " ",
    );
    line(
        "(d) baton: model turns repeated per kill (lower bound)",
        "<= 1",
        count(kills, |s| s.repeated_model),
        " ",
    );
    line(
        "(d) Job-style: model turns repeated per kill",
        "-",
        count(&jobs, |s| s.repeated_model),
        " ",
    );
    println!();
    line(
        "(e) worker pod start: created -> container running (st)",
        "-",
        pod_starts,
        "s",
    );
    line(
        "(e) controller rollout restart: time with no leader",
        "<= 1s",
        vec![leaderless.as_secs_f64()],
        "s",
    );
    line(
        "(e) controller rollout: a run created meanwhile, created -> claimed",
        "-",
        vec![delayed.as_secs_f64()],
        "s",
    );
    println!("(e) image {IMAGE}: {}", image_size());
    approval_figures(&env, samples).await;
    warm_figures(&env, WARM_TURNS).await;
    println!();
    println!(
        "(st: the next worker pod's start, on this node; Job-style: a fresh run created at the kill)"
    );
    env.finish().await;
}

fn line(what: &str, target: &str, xs: Vec<f64>, unit: &str) {
    let n = xs.len();
    let mut s = xs;
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = s.iter().sum::<f64>() / n.max(1) as f64;
    let p50 = s.get(n / 2).copied().unwrap_or(0.0);
    let max = s.last().copied().unwrap_or(0.0);
    println!("{what:<64} {target:>10} {n:>3} {mean:>7.2}{unit} {p50:>7.2}{unit} {max:>7.2}{unit}");
}
