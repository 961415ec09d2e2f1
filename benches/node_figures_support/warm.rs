//! Section (g): a thread's turns created one after another, on a thread that starts its next
//! turn's pod ahead (`spec.warm`) and on one that does not: created → the model server
//! received the turn's request, created → Succeeded (seen by polling every 100 ms), and how
//! many turns ran on a pod started ahead. Each turn is created as soon as the one before
//! succeeded (back to back), and, on a warm thread, also once its pod started ahead runs (a
//! chat whose user reads the answer first). Then what an idle warm thread holds: the waiting
//! pod's memory, no pod once `idleSeconds` passed, and every object it keeps, counted and
//! sized (times 100,000 idle threads).

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::AgentThread;
use baton_testkit::model::{Reply, Server};
use baton_testkit::node::{NETNS, NODE_IP, NodeEnv, first_pod, model_thread, to_model};
use baton_testkit::worker::answer_stream;
use kube::api::PostParams;

/// How turns follow one another.
#[derive(Clone, Copy, PartialEq)]
enum Pace {
    /// Each as soon as the one before succeeded.
    BackToBack,
    /// Each once the pod started ahead for it runs.
    PodReady,
}

/// Section (g); alone with `BATON_FIGURES=warm`. `turns` turns per thread.
pub async fn warm_figures(env: &NodeEnv, turns: usize) {
    let replies = (0..3 * turns + 4)
        .map(|_| Reply::sse(answer_stream("an answer")))
        .collect();
    let server = Server::start_in_netns(NETNS, NODE_IP, replies).await;
    println!();
    let runs = [
        ("own-pods", None, Pace::BackToBack, "no warm, back to back"),
        ("warm", Some(120), Pace::BackToBack, "warm, back to back"),
        (
            "paced",
            Some(120),
            Pace::PodReady,
            "warm, each once its pod runs",
        ),
    ];
    for (thread, idle, pace, what) in runs {
        thread_figures(env, &server, thread, idle, pace, what, turns).await;
    }
    at_rest(env, &server).await;
}

async fn thread_figures(
    env: &NodeEnv,
    server: &Server,
    thread: &str,
    idle: Option<i64>,
    pace: Pace,
    what: &str,
    turns: usize,
) {
    env.api()
        .create(&PostParams::default(), &model_thread(thread, server, idle))
        .await
        .unwrap();
    let (mut model, mut done, mut ahead) = (Vec::new(), Vec::new(), 0);
    for i in 0..turns {
        if pace == Pace::PodReady && i > 0 {
            env.started_ahead(thread).await;
        }
        let input = format!("{thread} message {i}");
        let (name, asked) = env.create_turn(thread, &input).await;
        env.wait_succeeded(&name).await;
        done.push(asked.elapsed());
        model.push(to_model(server, &input, asked));
        ahead += usize::from(env.ran_on_pod_started_ahead(&name).await);
    }
    spread(&format!("(g) {what}: created -> model request"), &model);
    spread(&format!("(g) {what}: created -> Succeeded"), &done);
    println!("(g) {what}: turns on a pod started ahead: {ahead} of {turns}");
}

/// What an idle warm thread holds: once its turn ended, the one pod waiting for the next turn
/// (its processes' resident memory, read on the host); once `idleSeconds` passed, no pod, and
/// the objects it keeps ([`holdings`]).
async fn at_rest(env: &NodeEnv, server: &Server) {
    const IDLE: i64 = 10;
    let threads = env.api::<AgentThread>();
    let thread = threads
        .create(
            &PostParams::default(),
            &model_thread("idle", server, Some(IDLE)),
        )
        .await
        .unwrap();
    let (name, _) = env.create_turn("idle", "idle message").await;
    env.wait_succeeded(&name).await;
    let (offered, _) = env.started_ahead("idle").await;
    let pod = first_pod(&offered);
    let waiting = env.pods_started_ahead(&thread).await;
    let (worker, tools) = (
        rss(env, &pod, "worker").await,
        rss(env, &pod, "tools").await,
    );
    println!(
        "(g) idle warm thread, its turn ended: pods started ahead {} ({waiting:?}); resident \
         memory of the waiting pod: worker {worker:?} KiB, tools {tools:?} KiB",
        waiting.len()
    );
    let ended = Instant::now();
    let deadline = ended + Duration::from_secs(IDLE as u64 + 60);
    while !env.pods_started_ahead(&thread).await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let left = env.pods_started_ahead(&thread).await;
    println!(
        "(g) idle warm thread, idleSeconds {IDLE}: pods started ahead {} after {:.1} s",
        left.len(),
        ended.elapsed().as_secs_f64()
    );
    holdings(env, "idle").await;
}

/// Every object of the namespace whose name carries `thread`'s (the thread, its turn, the
/// turn's ledger, Lease, RBAC, token Secret and Events, what was made ahead for its next
/// turn), by kind: count and bytes as the API server serves them (JSON, managedFields
/// included; etcd keeps custom resources as such JSON, built-in kinds as protobuf, smaller).
/// Then times 100,000 such threads.
async fn holdings(env: &NodeEnv, thread: &str) {
    use baton::crd::v1alpha1::{AgentRun, LedgerSegment};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Event, Pod, Secret, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let rows = vec![
        ("AgentThread", held::<AgentThread>(env, thread).await),
        ("AgentRun", held::<AgentRun>(env, thread).await),
        ("LedgerSegment", held::<LedgerSegment>(env, thread).await),
        ("Lease", held::<Lease>(env, thread).await),
        ("Pod", held::<Pod>(env, thread).await),
        ("ServiceAccount", held::<ServiceAccount>(env, thread).await),
        ("Secret", held::<Secret>(env, thread).await),
        ("Role", held::<Role>(env, thread).await),
        ("RoleBinding", held::<RoleBinding>(env, thread).await),
        ("Event", held::<Event>(env, thread).await),
    ];
    let (mut objects, mut bytes) = (0, 0);
    for (kind, (n, b)) in &rows {
        println!("(g) an idle warm thread of one turn holds: {kind:<15} {n:>3} objects {b:>7} B");
        (objects, bytes) = (objects + n, bytes + b);
    }
    let segments = rows
        .iter()
        .find(|(k, _)| *k == "LedgerSegment")
        .map_or(0, |(_, (_, b))| *b);
    println!(
        "(g) an idle warm thread of one turn holds: {objects} objects, {bytes} B; 100,000 such \
         threads: {:.1} M objects, {:.1} GB ({:.1} GB of it ledger segments, which PostgreSQL \
         keeps out of etcd)",
        objects as f64 * 0.1,
        bytes as f64 * 1e5 / 1e9,
        segments as f64 * 1e5 / 1e9
    );
}

/// How many objects of kind `K` in the namespace carry `thread` in their name (not being
/// deleted), and their bytes.
async fn held<K>(env: &NodeEnv, thread: &str) -> (usize, usize)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let listed = env.api::<K>().list(&Default::default()).await.unwrap();
    let mine: Vec<_> = listed
        .items
        .iter()
        .filter(|o| kube::ResourceExt::name_any(*o).contains(thread))
        .filter(|o| o.meta().deletion_timestamp.is_none())
        .collect();
    let bytes = mine
        .iter()
        .map(|o| serde_json::to_vec(o).unwrap().len())
        .sum();
    (mine.len(), bytes)
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
