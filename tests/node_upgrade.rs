//! The upgrade lane (issue 42; docs/operations.md, "Upgrading"): baton's previous release
//! (`hack/previous-release`, built from its commit by `hack/images.sh previous`) installed on
//! the real node with runs in flight in every state it can hold them in, on both ledger
//! backends, then upgraded to this tree exactly as docs/operations.md says (the CRDs applied, then
//! `helm upgrade` with the release's values and the new image), with old workers killed with
//! SIGKILL around it. Every run must end Succeeded, no non-idempotent effect may run twice
//! (counted outside baton, by the effects server), no ledger may show a write from a stale
//! fence, and what resumes after the upgrade runs the new image.
//!
//! The states, in LedgerSegments: mid tool call (one killed before the upgrade, leaving an
//! unknown effect to report; one killed after), WaitingApproval, WaitingInput, a thread whose
//! first turn is mid tool call and whose second is queued behind it (a third is said after the
//! upgrade). Then the previous release is switched to PostgreSQL, and in it: mid tool call
//! (one killed after the upgrade) and WaitingInput.
//!
//! Then the way back (docs/operations.md, "Upgrading"): with runs of this version in flight (mid tool call,
//! WaitingInput), `helm rollback` to the previous release; a worker is killed during it, the
//! waiting run is answered once the old controllers lead, and every run ends Succeeded with
//! no effect twice, the answered one resumed on the previous release's image.
//!
//! Figures printed: runs in flight, lost, effects run twice; the seconds from `helm upgrade`
//! to the last worker of the old image gone; how many live runs moved to the new image by
//! handoff and how many finished on their old worker under the new controller.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{
    AgentRun, AgentThread, LedgerBackend, LedgerEvent, Phase, ScriptToolCall, ScriptTurn, ToolKind,
};
use baton_testkit::e2e::{
    Effects, Script, approval_run, effect_command, run_with, scripted_run_tagged, shell_tool,
    tool_call,
};
use baton_testkit::node::*;
use kube::api::PostParams;

/// Runs started before the switch to PostgreSQL: they must still be mid tool call after the
/// upgrade (the switch is a rollout of its own).
const LONG: Script = Script {
    turns: 60,
    think_ms: 200,
    tool_ms: 1500,
};
/// Runs started in PostgreSQL, just before the upgrade.
const SHORT: Script = Script {
    turns: 30,
    think_ms: 200,
    tool_ms: 1500,
};
const THREAD: &str = "talk";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_upgrade_from_the_previous_release_keeps_every_run() {
    let previous = PreviousRelease::with_chart();
    let db = NodePostgres::up();
    let rows = baton::ledger::postgres::PgLedger::connect(&db.local_url, 2)
        .await
        .expect("the node's database, through the relay");
    let env = NodeEnv::start("upgrade").await.with_rows(rows);
    let on_previous =
        OnPreviousRelease::install(&env.client, &previous, &serde_json::json!({})).await;
    eprintln!(
        "upgrade lane: {} ({}) installed",
        previous.version, previous.commit
    );

    let in_segments = start_in_segments(&env).await;
    // An attempt of the old version dies mid tool call: its step is an unknown effect the
    // new version must report and never run again.
    kill_mid_tool(&env, "seg-0").await;
    let in_postgres = InPostgres::switch_release(
        &env.client,
        &db,
        &previous.chart(),
        &serde_json::json!({"image": {"tag": PREVIOUS_TAG}}),
    )
    .await;
    let in_rows = start_in_postgres(&env).await;

    let images = ImageSampler::start(&env);
    let upgraded_at = Instant::now();
    on_previous.upgrade(&in_postgres.values);
    // More old workers die while the new controllers roll out.
    kill_mid_tool(&env, "seg-1").await;
    kill_mid_tool(&env, "pg-0").await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    let live_after_rollout = live_runs(&env, &[&in_segments[..], &in_rows[..]].concat()).await;

    // What waits for a person is answered with this tree's CLI, and the thread goes on.
    baton_cli(&["approve", "approval", "-n", &env.ns]).expect("baton approve");
    baton_cli(&["input", "ask", "staging", "-n", &env.ns]).expect("baton input");
    baton_cli(&["input", "pg-ask", "staging", "-n", &env.ns]).expect("baton input");
    env.create(&thread_turn(THREAD, "talk-3", "thanks")).await;

    let all: Vec<String> = [&in_segments[..], &in_rows[..], &["talk-3".to_string()]].concat();
    for run in &all {
        env.wait_succeeded(run).await;
    }
    let old_gone = images.stop();
    env.check_invariants(&all).await;
    check_backends(&env, &in_segments, &in_rows).await;
    check_waiting_runs_resumed_once(&env, &images).await;
    check_thread(&env).await;
    let moved = live_after_rollout
        .iter()
        .filter(|run| images.ran_new(run))
        .count();
    let unknown = env.status("seg-0").await.unknown_effects.len();
    eprintln!(
        "upgrade lane: {} runs in flight across the upgrade ({} in LedgerSegments, {} in \
         PostgreSQL), 0 lost, 0 effects twice; {:.1} s from helm upgrade to the last worker of \
         {} gone; of {} runs live after the rollout, {} moved to the new image by handoff, {} \
         finished on their old worker; {} unknown effect(s) reported on seg-0",
        in_segments.len() + in_rows.len(),
        in_segments.len(),
        in_rows.len(),
        old_gone
            .map(|at| at.duration_since(upgraded_at).as_secs_f64())
            .unwrap_or_default(),
        previous.version,
        live_after_rollout.len(),
        moved,
        live_after_rollout.len() - moved,
        unknown,
    );
    roll_back(&env).await;
    in_postgres.switch_back(&env.client).await;
    env.finish().await;
}

/// Runs of this version in flight (in PostgreSQL, where the release now keeps them) while the
/// release is rolled back to the previous one: one mid tool call, its worker killed during the
/// rollback; one waiting for input, answered once the previous release's controllers lead.
async fn roll_back(env: &NodeEnv) {
    let mid = vec!["back-0".to_string()];
    env.create_scripted(&mid, &SHORT).await;
    env.create(&ask_run(env, "back-ask")).await;
    env.wait_effect("back-0", 1).await;
    wait_phase(env, "back-ask", Phase::WaitingInput).await;

    let images = ImageSampler::start(env);
    helm_rollback();
    kill_mid_tool(env, "back-0").await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    baton_cli(&["input", "back-ask", "staging", "-n", &env.ns]).expect("baton input");
    let all: Vec<String> = mid.into_iter().chain(["back-ask".to_string()]).collect();
    for run in &all {
        env.wait_succeeded(run).await;
    }
    images.stop();
    env.check_invariants(&all).await;
    assert_eq!(
        Effects::read(&env.effects.file).count("back-ask", 2),
        1,
        "back-ask's call ran once"
    );
    assert!(
        images.ran_previous("back-ask"),
        "back-ask resumed on the previous release's image after the rollback; its pods ran {:?}",
        images.images("back-ask")
    );
    eprintln!(
        "upgrade lane: rolled back with {} runs in flight, 0 lost, 0 effects twice",
        all.len()
    );
}

/// The runs kept in LedgerSegments, each in its state before the switch: mid tool call
/// (`seg-*`), WaitingApproval, WaitingInput, and the thread (turn 1 mid tool call, turn 2
/// queued behind it).
async fn start_in_segments(env: &NodeEnv) -> Vec<String> {
    let mid: Vec<String> = (0..3).map(|i| format!("seg-{i}")).collect();
    env.create_scripted(&mid, &LONG).await;
    env.create(&approval_run(&env.effects.addr, "approval"))
        .await;
    env.create(&ask_run(env, "ask")).await;
    let threads: kube::Api<AgentThread> = env.api();
    threads
        .create(&PostParams::default(), &thread(env))
        .await
        .expect("creating the thread");
    env.create(&thread_turn(THREAD, "talk-1", "do the long thing"))
        .await;
    env.wait_worker("talk-1", 1).await;
    env.create(&thread_turn(THREAD, "talk-2", "and then?"))
        .await;
    for run in mid.iter().chain(["talk-1".to_string()].iter()) {
        env.wait_effect(run, 1).await;
    }
    wait_phase(env, "approval", Phase::WaitingApproval).await;
    wait_phase(env, "ask", Phase::WaitingInput).await;
    wait_phase(env, "talk-2", Phase::Pending).await;
    mid.into_iter()
        .chain(["approval", "ask", "talk-1", "talk-2"].map(String::from))
        .collect()
}

/// The runs kept in PostgreSQL once the previous release was switched to it: mid tool call
/// (`pg-*`) and WaitingInput.
async fn start_in_postgres(env: &NodeEnv) -> Vec<String> {
    let mid: Vec<String> = (0..2).map(|i| format!("pg-{i}")).collect();
    env.create_scripted(&mid, &SHORT).await;
    env.create(&ask_run(env, "pg-ask")).await;
    for run in &mid {
        env.wait_effect(run, 1).await;
    }
    wait_phase(env, "pg-ask", Phase::WaitingInput).await;
    mid.into_iter().chain(["pg-ask".to_string()]).collect()
}

/// The runs of `names` not yet ended.
async fn live_runs(env: &NodeEnv, names: &[String]) -> Vec<String> {
    let mut live = Vec::new();
    for name in names {
        let phase = env.status(name).await.phase;
        if !phase.is_terminal() && phase != Phase::WaitingApproval && phase != Phase::WaitingInput {
            live.push(name.clone());
        }
    }
    live
}

async fn check_backends(env: &NodeEnv, in_segments: &[String], in_rows: &[String]) {
    for (runs, backend) in [
        (in_segments, LedgerBackend::LedgerSegments),
        (in_rows, LedgerBackend::PostgreSQL),
    ] {
        for run in runs {
            let st = env.status(run).await;
            assert_eq!(
                LedgerBackend::of(Some(&st)),
                backend,
                "{run} keeps its ledger where it began"
            );
        }
    }
}

/// What waited for a person ran its call once, on the new image (the new controllers claimed
/// it: the answers came once they led).
async fn check_waiting_runs_resumed_once(env: &NodeEnv, images: &ImageSampler) {
    let effects = Effects::read(&env.effects.file);
    for (run, turn) in [("approval", 1), ("ask", 2), ("pg-ask", 2)] {
        assert_eq!(effects.count(run, turn), 1, "{run}'s call ran once");
        assert!(
            images.ran_new(run),
            "{run} resumed on this tree's image; its pods ran {:?}",
            images.images(run)
        );
    }
}

/// The thread's turns ran one after the other, across the upgrade: the third, said after it,
/// saw both earlier ones.
async fn check_thread(env: &NodeEnv) {
    let third = env.ledger("talk-3").await;
    let history = third[0].spec.events.iter().find_map(|e| match e {
        LedgerEvent::History { turns, .. } => Some(turns.len()),
        _ => None,
    });
    assert_eq!(history, Some(2), "{:?}", third[0].spec.events);
    let first = env.status("talk-1").await.completion_time;
    let second = env.status("talk-2").await.start_time;
    assert!(
        first.is_some() && second.is_some() && first <= second,
        "turn 2 began after turn 1 ended: {first:?}, {second:?}"
    );
}

fn turn(text: &str, calls: Vec<ScriptToolCall>) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        tool_calls: calls,
        delay_milliseconds: Some(200),
        usage: None,
    }
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
                vec![tool_call("ask", "question", "which?")],
            ),
            turn("deploying", vec![tool_call("sh", "command", &command)]),
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

/// The thread: its scripted agent spans the conversation. Turn 1 is a long run of tool calls
/// (as the `seg-*` runs); turns 2 and 3 answer in a word.
fn thread(env: &NodeEnv) -> AgentThread {
    let first = scripted_run_tagged(&env.effects.addr, THREAD, "talk-1", &LONG);
    let mut agent = first
        .spec
        .agent
        .clone()
        .expect("a scripted run has an agent");
    for answer in ["then nothing", "you are welcome"] {
        agent.model.script.push(ScriptTurn {
            text: Some(answer.into()),
            ..ScriptTurn::default()
        });
    }
    let lease = baton_testkit::e2e::lease();
    let mut thread: AgentThread = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentThread",
        "metadata": {"name": THREAD},
        "spec": {"agent": {"model": {"script": []}}, "maxAttempts": 3},
    }))
    .expect("a thread deserializes");
    thread.spec.agent = agent;
    thread.spec.lease = lease;
    thread
}

/// A turn of `thread` named `name`.
fn thread_turn(thread: &str, name: &str, input: &str) -> AgentRun {
    let spec = serde_json::json!({"input": input, "thread": thread});
    let mut turn: AgentRun = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("a turn deserializes");
    turn.metadata.generate_name = None;
    turn
}
