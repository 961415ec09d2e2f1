//! The upgrade lane (issue 42; README "Upgrading"): baton's previous release
//! (`hack/previous-release`, built from its commit by `hack/images.sh previous`) installed on
//! the real node with runs in flight in every state it can hold them in, then upgraded to this
//! tree exactly as the README says (the CRDs applied, then `helm upgrade` naming the new
//! image), with old workers killed with SIGKILL around it. Every run must end Succeeded, no
//! non-idempotent effect may run twice (counted outside baton, by the effects server), every
//! run must have moved to the new image, and no ledger may show a write from a stale fence.
//!
//! Figures printed: runs in flight, lost, effects run twice; the seconds from `helm upgrade`
//! to the last worker of the old image gone.

mod e2e_support;
mod node_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{ApprovalPolicy, Phase, ScriptToolCall, ScriptTurn, ToolKind};
use e2e_support::{Effects, Script, effect_command, run_with, shell_tool};
use kube::ResourceExt;
use kube::api::ListParams;
use node_support::*;

/// Runs mid tool call across the upgrade: long enough to outlast the controller's rollout and
/// the handoffs, one at a time, that move them to the new image.
const MID_RUNS: usize = 4;
const MID_SCRIPT: Script = Script {
    turns: 20,
    think_ms: 200,
    tool_ms: 2000,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_upgrade_from_the_previous_release_keeps_every_run() {
    let previous = PreviousRelease::built();
    let env = NodeEnv::start("upgrade").await;
    let on_previous = OnPreviousRelease::install(&env.client, &previous).await;
    eprintln!(
        "upgrade lane: {} ({}) installed",
        previous.version, previous.commit
    );

    let mid: Vec<String> = (0..MID_RUNS).map(|i| format!("mid-{i}")).collect();
    env.create_scripted(&mid, &MID_SCRIPT).await;
    env.create(&approval_run(&env, "approval")).await;
    env.create(&ask_run(&env, "ask")).await;
    for run in &mid {
        env.wait_effect(run, 1).await;
    }
    wait_phase(&env, "approval", Phase::WaitingApproval).await;
    wait_phase(&env, "ask", Phase::WaitingInput).await;
    // An attempt of the old version dies mid tool call before the upgrade: its step is an
    // unknown effect that the new version must report and never run again.
    kill_mid_tool(&env, &mid[0]).await;

    let images = ImageSampler::start(&env);
    let upgraded_at = Instant::now();
    on_previous.upgrade();
    // Two more old workers die while the new controller rolls out.
    kill_mid_tool(&env, &mid[1]).await;
    kill_mid_tool(&env, &mid[2]).await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;

    // What waits for a person is answered with this tree's CLI.
    baton_cli(&["approve", "approval", "-n", &env.ns]).expect("baton approve");
    baton_cli(&["input", "ask", "staging", "-n", &env.ns]).expect("baton input");

    let all: Vec<String> = mid
        .iter()
        .cloned()
        .chain(["approval".into(), "ask".into()])
        .collect();
    for run in &all {
        env.wait_succeeded(run).await;
    }
    let old_gone = images.stop();
    env.check_invariants(&all).await;
    assert_every_run_moved(&images, &all);
    let effects = Effects::read(&env.effects.file);
    assert_eq!(
        effects.count("approval", 1),
        1,
        "the approved call ran once"
    );
    assert_eq!(
        effects.count("ask", 2),
        1,
        "the answered run's call ran once"
    );
    let unknown = env.status(&mid[0]).await.unknown_effects;
    eprintln!(
        "upgrade lane: {} runs in flight across the upgrade, 0 lost, 0 effects twice; \
         {:.1} s from helm upgrade to the last worker of {} gone; {} unknown effect(s) \
         reported on {}",
        all.len(),
        old_gone
            .map(|at| at.duration_since(upgraded_at).as_secs_f64())
            .unwrap_or_default(),
        previous.version,
        unknown.len(),
        mid[0]
    );
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    env.finish().await;
}

fn call(tool: &str, arg: &str, value: &str) -> ScriptToolCall {
    ScriptToolCall {
        tool: tool.into(),
        arguments: [(arg.to_string(), value.to_string())].into(),
    }
}

fn turn(text: &str, calls: Vec<ScriptToolCall>) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        tool_calls: calls,
        delay_milliseconds: Some(200),
        usage: None,
    }
}

/// A run whose first call needs an approval (WaitingApproval across the upgrade).
fn approval_run(env: &NodeEnv, name: &str) -> baton::crd::v1alpha1::AgentRun {
    let command = effect_command(&env.effects.addr, name, 1, 0);
    let mut deploy = shell_tool("deploy");
    deploy.approval = Some(ApprovalPolicy::Required);
    run_with(
        name,
        vec![
            turn("deploying", vec![call("deploy", "command", &command)]),
            turn("deployed", vec![]),
        ],
        vec![deploy],
    )
}

/// A run that asks its user first (WaitingInput across the upgrade), then calls a tool.
fn ask_run(env: &NodeEnv, name: &str) -> baton::crd::v1alpha1::AgentRun {
    let command = effect_command(&env.effects.addr, name, 2, 0);
    let mut ask = shell_tool("ask");
    ask.kind = ToolKind::AskUser;
    run_with(
        name,
        vec![
            turn(
                "Which environment?",
                vec![call("ask", "question", "which?")],
            ),
            turn("deploying", vec![call("sh", "command", &command)]),
            turn("deployed", vec![]),
        ],
        vec![ask, shell_tool("sh")],
    )
}

async fn wait_phase(env: &NodeEnv, run: &str, phase: Phase) {
    env.wait_run(run, RUN_TIMEOUT, &format!("{phase:?}"), |s| {
        s.phase == phase
    })
    .await;
}

/// SIGKILL to the run's worker while its tool runs (right after the tool's effect landed).
async fn kill_mid_tool(env: &NodeEnv, run: &str) {
    let (pod, _) = env.wait_worker(run, 1).await;
    let done = Effects::read(&env.effects.file).per_turn(run).len();
    env.wait_effect(run, done + 1).await;
    if !env.try_signal_worker(&pod, libc::SIGKILL).await {
        eprintln!("upgrade lane: {run}'s worker {pod} was gone before the kill");
    }
}

/// Every worker pod of the namespace seen while the runs go on: each run's images, and when
/// a pod of the previous release's image was last seen alive.
struct ImageSampler {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Seen {
    images: BTreeMap<String, BTreeSet<String>>,
    old_last_seen: Option<Instant>,
}

impl ImageSampler {
    fn start(env: &NodeEnv) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let pods = env.pods();
        let into = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&ListParams::default()).await {
                    record(&mut into.lock().unwrap(), &list.items);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { seen, task }
    }

    /// Stops sampling; when a worker of the old image was last seen alive.
    fn stop(&self) -> Option<Instant> {
        self.task.abort();
        self.seen.lock().unwrap().old_last_seen
    }

    fn images(&self, run: &str) -> BTreeSet<String> {
        let seen = self.seen.lock().unwrap();
        seen.images.get(run).cloned().unwrap_or_default()
    }
}

fn record(seen: &mut Seen, pods: &[k8s_openapi::api::core::v1::Pod]) {
    for pod in pods {
        let name = pod.name_any();
        let Some((run, _)) = name.rsplit_once("-w") else {
            continue;
        };
        let image = baton::controller::pod::pod_image(pod);
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let alive = matches!(phase.as_deref(), Some("Pending" | "Running"));
        if alive && image.ends_with(&format!(":{PREVIOUS_TAG}")) {
            seen.old_last_seen = Some(Instant::now());
        }
        seen.images
            .entry(run.to_string())
            .or_default()
            .insert(image);
    }
}

/// Each run had a worker of this tree's image after the upgrade.
fn assert_every_run_moved(images: &ImageSampler, runs: &[String]) {
    for run in runs {
        let seen = images.images(run);
        assert!(
            seen.iter().any(|i| i.ends_with(":dev")),
            "{run} never ran on this tree's image (baton:dev); its pods ran {seen:?}"
        );
    }
}
