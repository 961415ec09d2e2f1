//! Section (g): a thread's turns created one after another, each as soon as the one before
//! succeeded, on a thread that starts its next turn's pod ahead (`spec.warm`) and on one that
//! does not: created → the model server received the turn's request, created → Succeeded
//! (seen by polling every 100 ms), how many turns ran on a pod started ahead, and what an idle
//! warm thread holds.

use std::time::Duration;

use baton_testkit::model::{Reply, Server};
use baton_testkit::node::{NETNS, NODE_IP, NodeEnv, first_pod, model_thread, to_model};
use baton_testkit::worker::answer_stream;
use kube::ResourceExt;
use kube::api::{ListParams, PostParams};

/// Section (g); alone with `BATON_FIGURES=warm`. `turns` turns per thread.
pub async fn warm_figures(env: &NodeEnv, turns: usize) {
    let replies = (0..2 * turns + 2)
        .map(|_| Reply::sse(answer_stream("an answer")))
        .collect();
    let server = Server::start_in_netns(NETNS, NODE_IP, replies).await;
    println!();
    for warm in [false, true] {
        let thread = if warm { "warm" } else { "own-pods" };
        env.api()
            .create(&PostParams::default(), &model_thread(thread, &server, warm))
            .await
            .unwrap();
        let (mut model, mut done, mut ahead) = (Vec::new(), Vec::new(), 0);
        for i in 0..turns {
            let input = format!("{thread} message {i}");
            let (name, asked) = env.create_turn(thread, &input).await;
            env.wait_succeeded(&name).await;
            done.push(asked.elapsed());
            model.push(to_model(&server, &input, asked));
            ahead += usize::from(env.ran_on_pod_started_ahead(&name).await);
        }
        let what = if warm { "warm thread" } else { "no warm" };
        spread(
            &format!("(g) {what}: turn created -> model request"),
            &model,
        );
        spread(&format!("(g) {what}: turn created -> Succeeded"), &done);
        println!("(g) {what}: turns on a pod started ahead: {ahead} of {turns}");
    }
    at_rest(env, "warm").await;
}

/// What the idle warm thread holds once its last turn ended: its pods, and the resident
/// memory of the waiting worker (read on the host from its process).
async fn at_rest(env: &NodeEnv, thread: &str) {
    let pods = env.pods().list(&ListParams::default()).await.unwrap();
    let running: Vec<_> = pods
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.name_any())
        .collect();
    let (offered, _) = env.started_ahead(thread).await;
    let pod = first_pod(&offered);
    let (worker, tools) = (
        rss(env, &pod, "worker").await,
        rss(env, &pod, "tools").await,
    );
    println!(
        "(g) at rest: pods running in the namespace {} ({running:?}); the waiting pod's worker \
         {worker:?} KiB, tools {tools:?} KiB resident",
        running.len()
    );
}

/// The resident memory (KiB) of a pod's container's process, read on the host.
async fn rss(env: &NodeEnv, pod: &str, container: &str) -> Option<u64> {
    let pid = env.container_pid_of(pod, container).await?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One figure's p50, p95 and max, in seconds.
fn spread(what: &str, xs: &[Duration]) {
    let mut s: Vec<f64> = xs.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| s[((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1];
    println!(
        "{what:<64} n {:>3}  p50 {:>6.3}s  p95 {:>6.3}s  max {:>6.3}s",
        s.len(),
        at(0.5),
        at(0.95),
        at(1.0)
    );
}
