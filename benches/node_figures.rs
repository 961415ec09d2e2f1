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
//!     the approved step starting (its `approvalDecided`, appended right before the tool runs).

#[path = "../tests/e2e_support/mod.rs"]
mod e2e_support;
#[path = "../tests/node_support/mod.rs"]
mod node_support;

use std::time::{Duration, Instant};

use baton::cli::{ApproveArgs, RunArgs, Verb};
use baton::crd::v1alpha1::{ApprovalPolicy, LedgerEvent, Phase, ScriptToolCall, ScriptTurn};
use baton::fence::Fence;
use e2e_support::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::EvictParams;
use node_support::*;

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

/// Effects lost and doubled for a run tagged `tag`.
fn effect_loss(env: &NodeEnv, tag: &str) -> (usize, usize) {
    let e = Effects::read(&env.effects.file);
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

async fn sample(env: &NodeEnv, fault: Fault, i: usize) -> Sample {
    let name = format!("{}-{i}", format!("{fault:?}").to_lowercase());
    env.create(&env.scripted(&name, &script())).await;
    let (pod, fence) = env.wait_worker(&name, 1).await;
    let pod_start = env
        .pods()
        .get(&pod)
        .await
        .ok()
        .as_ref()
        .and_then(started_after);
    env.wait_effect(&name, FAULT_AFTER_TURN).await;
    // Let the tool's result land: the fault hits during the model's "thinking".
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = env
        .container_pid(&pod)
        .await
        .expect("the worker's host PID");
    let t0 = Instant::now();
    let mut claimed = Duration::ZERO;
    let mut back = t0;
    match fault {
        Fault::Term => env.delete_pod(&pod).await,
        Fault::Evict => {
            env.pods()
                .evict(&pod, &EvictParams::default())
                .await
                .expect("evicting the pod");
        }
        Fault::Kill => signal_pid(pid, libc::SIGKILL),
        Fault::Freeze => signal_pid(pid, libc::SIGSTOP),
        Fault::NodeLost => {
            tokio::task::spawn_blocking(|| node_sh(&["stop-kubelet"]))
                .await
                .unwrap();
            signal_pid(pid, libc::SIGSTOP);
            env.wait_run(&name, RUN_TIMEOUT, "claimed again", |s| {
                s.fence.get() > fence
            })
            .await;
            claimed = t0.elapsed();
            tokio::task::spawn_blocking(|| node_sh(&["start-kubelet"]))
                .await
                .unwrap();
            back = Instant::now();
        }
    }
    let (at, _) = env
        .recorder
        .wait_attempt_started(&name, fence, RUN_TIMEOUT)
        .await;
    let resume = at.saturating_duration_since(back);
    if matches!(fault, Fault::Freeze | Fault::NodeLost) {
        // SAFETY: kill(2) on this sample's own worker process; gone already is fine.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }
    let st = env
        .wait_run(&name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
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
        pod_start,
        resume,
        claimed,
        total,
        lost,
        doubled,
        unknown,
        repeated_model,
    }
}

/// The same kill, but the run starts over from zero (a Job's replacement pod).
async fn job_style(env: &NodeEnv, i: usize) -> Sample {
    let name = format!("job-{i}");
    let sink = env.effects.addr.as_str();
    let mut run = scripted_run(sink, &name, &script());
    run.spec.max_attempts = 1;
    env.create(&run).await;
    let (pod, _) = env.wait_worker(&name, 1).await;
    env.wait_effect(&name, FAULT_AFTER_TURN).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    env.signal_worker(&pod, libc::SIGKILL).await;
    let restart = format!("job-{i}-restart");
    env.create(&scripted_run_tagged(sink, &restart, &name, &script()))
        .await;
    let st = env
        .wait_run(&restart, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    let total = t0.elapsed();
    if st.phase != Phase::Succeeded {
        eprintln!("warning: {restart} ended {}", st.phase);
    }
    let (lost, doubled) = effect_loss(env, &name);
    eprintln!(
        "{name}: restarted from zero, done {:.2}s after the kill; doubled {doubled}",
        total.as_secs_f64()
    );
    // Every model turn the killed attempt had completed is made again from scratch.
    Sample {
        total,
        lost,
        doubled,
        repeated_model: FAULT_AFTER_TURN + 1,
        ..Sample::default()
    }
}

/// Created → worker container running.
fn started_after(pod: &Pod) -> Option<f64> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let status = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "worker")?;
    let state = status.state.as_ref()?;
    let started = state
        .running
        .as_ref()
        .and_then(|r| r.started_at.as_ref())
        .or_else(|| {
            state
                .terminated
                .as_ref()
                .and_then(|t| t.started_at.as_ref())
        })?
        .0;
    Some(started.duration_since(created).as_secs_f64())
}

/// Section (f); alone with `BATON_FIGURES=approvals`.
async fn approval_figures(env: &NodeEnv, samples: usize) {
    let mut approvals = Vec::new();
    for i in 0..samples {
        approvals.push(approval_sample(env, i).await);
    }
    println!();
    line(
        "(f) baton approve -> next worker's first write",
        "st",
        approvals.iter().map(|(w, _)| w.as_secs_f64()).collect(),
        "s",
    );
    line(
        "(f) baton approve -> the approved step starts",
        "<= 1s+st",
        approvals.iter().map(|(_, s)| s.as_secs_f64()).collect(),
        "s",
    );
}

/// A run whose one step waits for approval: once it waits (its pod gone), `baton approve` (the
/// CLI's own code) → the next worker's first write, and → the step starting.
async fn approval_sample(env: &NodeEnv, i: usize) -> (Duration, Duration) {
    let name = format!("approval-{i}");
    let command = effect_command(&env.effects.addr, &name, 1, 0);
    let mut deploy = shell_tool("deploy");
    deploy.approval = Some(ApprovalPolicy::Required);
    let turns = vec![
        ScriptTurn {
            text: Some("deploying".into()),
            tool_calls: vec![ScriptToolCall {
                tool: "deploy".into(),
                arguments: [("command".to_string(), command)].into(),
            }],
            ..ScriptTurn::default()
        },
        ScriptTurn {
            text: Some("deployed".into()),
            ..ScriptTurn::default()
        },
    ];
    env.create(&run_with(&name, turns, vec![deploy])).await;
    let st = env
        .wait_run(&name, RUN_TIMEOUT, "WaitingApproval", |s| {
            s.phase == Phase::WaitingApproval
        })
        .await;
    let pod = baton::fence::worker_pod_name(&name, st.fence);
    env.wait_container_gone(&pod, RUN_TIMEOUT).await;
    let cli = baton::cli::Session::new(env.client.clone(), "node".into(), env.ns.clone());
    let verb = Verb::Approve(ApproveArgs {
        target: RunArgs {
            run: name.clone(),
            namespace: Some(env.ns.clone()),
        },
        step: None,
        reason: None,
    });
    cli.run(verb, &mut Vec::new()).await.expect("baton approve");
    let t0 = Instant::now();
    let (worker, _) = env
        .recorder
        .wait_attempt_started(&name, st.fence.get(), RUN_TIMEOUT)
        .await;
    let decided = |e: &LedgerEvent| matches!(e, LedgerEvent::ApprovalDecided { .. });
    let step = env
        .recorder
        .wait_event(&name, "approvalDecided", decided, RUN_TIMEOUT)
        .await;
    env.wait_succeeded(&name).await;
    let (worker, step) = (
        worker.saturating_duration_since(t0),
        step.saturating_duration_since(t0),
    );
    eprintln!(
        "{name}: approve -> worker's first write {:.2}s, -> step {:.2}s",
        worker.as_secs_f64(),
        step.as_secs_f64()
    );
    (worker, step)
}

/// `kubectl rollout restart` of the controllers: the longest time no Ready controller pod led,
/// and how long a run created right after the restart waited for its claim.
async fn controller_rollout(env: &NodeEnv) -> (Duration, Duration) {
    restart_controllers();
    let created = Instant::now();
    env.create(&env.scripted("during-rollout", &Script::new(1, 100)))
        .await;
    let claim = async {
        env.wait_run("during-rollout", RUN_TIMEOUT, "claimed", |s| {
            s.fence >= Fence::new(1)
        })
        .await;
        created.elapsed()
    };
    let (leaderless, delayed) = tokio::join!(
        leaderless_until_rolled(&env.client, Duration::from_secs(180)),
        claim
    );
    env.wait_succeeded("during-rollout").await;
    (leaderless, delayed)
}

fn image_size() -> String {
    let out = std::process::Command::new("podman")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Size}}",
            &format!("docker.io/library/{IMAGE}"),
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let bytes: f64 = String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse()
                .unwrap_or(0.0);
            format!("{:.1} MB (podman image inspect)", bytes / 1e6)
        }
        _ => "unknown (podman image inspect failed)".into(),
    }
}
