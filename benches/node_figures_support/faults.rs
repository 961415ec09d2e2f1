//! Sections (a)-(d): one fault's sample, the Job-style restart from zero, a worker pod's start.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::Phase;
use k8s_openapi::api::core::v1::Pod;
use kube::api::EvictParams;

use crate::{FAULT_AFTER_TURN, Fault, Sample, script};
use baton_testkit::e2e::{Effects, repeated_model_turns, scripted_run, scripted_run_tagged};
use baton_testkit::node::{NodeEnv, RUN_TIMEOUT, node_sh, signal_pid};

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

pub async fn sample(env: &NodeEnv, fault: Fault, i: usize) -> Sample {
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
pub async fn job_style(env: &NodeEnv, i: usize) -> Sample {
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
