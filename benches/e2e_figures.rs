//! End-to-end figures (prints them; asserts nothing).
//!
//! `cargo bench --bench e2e_figures` (control plane in KUBECONFIG; `BATON_FIGURES_SAMPLES`,
//! default 5, samples per figure). The controller and the local pod runner run in this
//! process; workers are the `baton` binary of the same build. Samples run one at a time.
//!
//! (a) SIGTERM (graceful delete of the worker pod) → the next worker's first ledger write
//!     (its `attemptStarted` segment, seen by a watch, client clock);
//! (b) kill -9 → resumed work (same measure), when the pod's death is reported (the runner
//!     reports it) and when the process is paused instead (death not reported: lease expiry);
//! (c) work lost per crash: turns whose non-idempotent effect ran zero or twice, and model
//!     turns repeated;
//! (d) the same kill on a Job-style restart: the run is not resumed (maxAttempts 1) and a
//!     fresh run of the same script starts from zero at the kill, as a Job's replacement pod
//!     would; its effects are counted against the killed run's.

#[path = "../tests/e2e_support/mod.rs"]
mod e2e_support;

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::Phase;
use e2e_support::*;

/// The script of every sample: 6 tool turns; killed once the effect of turn 3 landed.
fn script() -> Script {
    Script {
        turns: 6,
        think_ms: 1500,
        tool_ms: 100,
    }
}
const KILL_AFTER_TURN: usize = 3;

#[derive(Default)]
struct Sample {
    resume: Duration,
    total: Duration,
    lost: usize,
    doubled: usize,
    unknown: usize,
    repeated_model: usize,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Term,
    Kill,
    Pause,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let samples: usize = std::env::var("BATON_FIGURES_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let env = E2e::start("figures").await;
    let duration = lease().duration_seconds;
    println!(
        "e2e figures: {samples} samples each; lease {duration} s / renew {} s; script {} turns, \
         model {} ms per turn; fault once turn {KILL_AFTER_TURN}'s effect landed",
        lease().renew_seconds,
        script().turns,
        script().think_ms
    );

    let mut results = Vec::new();
    for fault in [Fault::Term, Fault::Kill, Fault::Pause] {
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

    println!();
    println!(
        "{:<62} {:>8} {:>3} {:>8} {:>8} {:>8}",
        "figure", "target", "n", "mean", "p50", "max"
    );
    let line = |what: &str, target: &str, xs: Vec<f64>, unit: &str| {
        let n = xs.len();
        let mut s = xs.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let mean = s.iter().sum::<f64>() / n.max(1) as f64;
        let p50 = s.get(n / 2).copied().unwrap_or(0.0);
        let max = s.last().copied().unwrap_or(0.0);
        println!(
            "{what:<62} {target:>8} {n:>3} {mean:>7.2}{unit} {p50:>7.2}{unit} {max:>7.2}{unit}"
        );
    };
    let secs = |v: &[Sample], f: fn(&Sample) -> Duration| -> Vec<f64> {
        v.iter().map(|s| f(s).as_secs_f64()).collect()
    };
    let count = |v: &[Sample], f: fn(&Sample) -> usize| -> Vec<f64> {
        v.iter().map(|s| f(s) as f64).collect()
    };
    let pause_target = format!("<= {}s", duration + 1);
    for (fault, v) in &results {
        match fault {
            Fault::Term => line(
                "(a) SIGTERM -> next worker's first ledger write",
                "<= 1s+st",
                secs(v, |s| s.resume),
                "s",
            ),
            Fault::Kill => line(
                "(b) kill -9 -> resumed work (death reported)",
                "<= 2s",
                secs(v, |s| s.resume),
                "s",
            ),
            Fault::Pause => line(
                "(b) pause (death not reported) -> resumed work",
                &pause_target,
                secs(v, |s| s.resume),
                "s",
            ),
        }
    }
    for (fault, v) in &results {
        let what = match fault {
            Fault::Term => "SIGTERM",
            Fault::Kill => "kill -9",
            Fault::Pause => "pause",
        };
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
    let kills = &results[1].1;
    println!();
    println!(
        "(d) the same kill -9 (after turn {KILL_AFTER_TURN} of {}), baton vs a Job-style restart from zero:",
        script().turns
    );
    line(
        "(d) baton: kill -> run Succeeded",
        "-",
        secs(kills, |s| s.total),
        "s",
    );
    line(
        "(d) Job-style: kill -> restarted run Succeeded",
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
    println!(
        "(times include starting the next worker process: `st`; the Job-style restart is simulated \
         by a fresh run created at the kill)"
    );
    env.finish().await;
}

/// Effects lost and doubled for a run tagged `tag`.
fn effect_loss(env: &E2e, tag: &str) -> (usize, usize) {
    let e = env.effects();
    let (mut lost, mut doubled) = (0, 0);
    for turn in 1..=script().turns {
        match e.count(tag, turn) {
            0 => lost += 1,
            1 => {}
            n => doubled += n - 1,
        }
    }
    (lost, doubled)
}

async fn sample(env: &E2e, fault: Fault, i: usize) -> Sample {
    let name = format!("{}-{i}", format!("{fault:?}").to_lowercase());
    env.create(&scripted_run(&env.effects, &name, &script()))
        .await;
    let (pod, fence, _) = env.wait_worker(&name, 1).await;
    env.wait_effect(&name, KILL_AFTER_TURN).await;
    // Let the tool's result land: the fault hits during the model's "thinking".
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    match fault {
        Fault::Term => env.delete_pod(&pod).await,
        Fault::Kill => env.runner.kill(&env.ns, &pod).expect("kill -9"),
        Fault::Pause => env.runner.pause(&env.ns, &pod).expect("SIGSTOP"),
    }
    let (at, _) = env
        .recorder
        .wait_attempt_started(&name, fence, RUN_TIMEOUT)
        .await;
    let resume = at.saturating_duration_since(t0);
    if let Fault::Pause = fault {
        let _ = env.runner.resume(&env.ns, &pod);
    }
    let st = env.wait_terminal(&name).await;
    let total = t0.elapsed();
    if st.phase != Phase::Succeeded {
        eprintln!("warning: {name} ended {}: {:?}", st.phase, st.reason);
    }
    let (lost, doubled) = effect_loss(env, &name);
    let unknown = st.unknown_effects.len();
    let repeated_model = repeated_model_turns(&env.ledger(&name).await);
    eprintln!(
        "{name}: resumed after {:.2}s, done {:.2}s after the fault; lost {lost}, doubled {doubled}, unknown {unknown}, model turns repeated {repeated_model}",
        resume.as_secs_f64(),
        total.as_secs_f64()
    );
    Sample {
        resume,
        total,
        lost,
        doubled,
        unknown,
        repeated_model,
    }
}

/// The same kill, but the run starts over from zero (a Job's replacement pod).
async fn job_style(env: &E2e, i: usize) -> Sample {
    let name = format!("job-{i}");
    let mut run = scripted_run(&env.effects, &name, &script());
    run.spec.max_attempts = 1;
    env.create(&run).await;
    let (pod, _, _) = env.wait_worker(&name, 1).await;
    env.wait_effect(&name, KILL_AFTER_TURN).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    env.runner.kill(&env.ns, &pod).expect("kill -9");
    let restart = format!("job-{i}-restart");
    env.create(&scripted_run_tagged(
        &env.effects,
        &restart,
        &name,
        &script(),
    ))
    .await;
    let st = env.wait_terminal(&restart).await;
    let total = t0.elapsed();
    if st.phase != Phase::Succeeded {
        eprintln!("warning: {restart} ended {}", st.phase);
    }
    let (lost, doubled) = effect_loss(env, &name);
    // Every model turn the killed attempt had completed is made again from scratch.
    let repeated_model = KILL_AFTER_TURN + 1;
    eprintln!(
        "{name}: restarted from zero, done {:.2}s after the kill; doubled {doubled}",
        total.as_secs_f64()
    );
    Sample {
        resume: Duration::ZERO,
        total,
        lost,
        doubled,
        unknown: 0,
        repeated_model,
    }
}
