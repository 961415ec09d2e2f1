//! Section (f): `baton approve` → the next worker's first write, → the approved step starting.

use std::time::{Duration, Instant};

use baton::cli::{ApproveArgs, RunArgs, Verb};
use baton::crd::v1alpha1::{LedgerEvent, Phase};

use crate::line;
use baton_testkit::e2e::approval_run;
use baton_testkit::node::{NodeEnv, RUN_TIMEOUT};

/// Section (f); alone with `BATON_FIGURES=approvals`.
pub async fn approval_figures(env: &NodeEnv, samples: usize) {
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
    env.create(&approval_run(&env.effects.addr, &name)).await;
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
