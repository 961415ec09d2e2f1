//! A thread's next turn started ahead (`spec.warm`) on the real node (`hack/node.sh`), baton
//! installed by its chart: a turn created under the name the thread offers runs on the pod
//! started for it, and writes the ledger a turn on a pod of its own writes; a run of that name
//! that is no turn gets a pod of its own; the pod's identity reaches no other run (played with
//! `kubectl --as`-style impersonation of its ServiceAccount); a pod killed as its turn is
//! claimed loses nothing and runs nothing twice. And the chaos suite's faults on warm threads,
//! its invariants unchanged.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentThread, LedgerEvent, LedgerSegment, Phase, ScriptTurn};
use baton::crd::{controlled_by_run, env as pod_env};
use baton_testkit::e2e::{Effects, Script, effect_command, run_with, shell_tool, tool_call};
use baton_testkit::model::{Reply, Server};
use baton_testkit::node::*;
use baton_testkit::worker::answer_stream;
use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::json;

const THREAD: &str = "chat";

/// The kinds of a ledger's events, the history left out (it names the turns before).
fn kinds(ledger: &[LedgerSegment]) -> Vec<String> {
    let events = ledger.iter().flat_map(|s| s.spec.events.iter());
    events
        .filter(|e| !matches!(e, LedgerEvent::History { .. }))
        .map(|e| serde_json::to_value(e).unwrap()["type"].to_string())
        .collect()
}

fn finals(ledger: &[LedgerSegment]) -> usize {
    let events = ledger.iter().flat_map(|s| s.spec.events.iter());
    events
        .filter(|e| matches!(e, LedgerEvent::Final { .. }))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_warm_threads_next_turn_runs_on_the_pod_started_for_it() {
    let env = NodeEnv::start("warm").await;
    let replies = (0..8)
        .map(|i| Reply::sse(answer_stream(&format!("answer {i}"))))
        .collect();
    let server = Server::start_in_netns(NETNS, NODE_IP, replies).await;
    let threads = env.api::<AgentThread>();
    threads
        .create(
            &PostParams::default(),
            &model_thread(THREAD, &server, Some(120)),
        )
        .await
        .unwrap();

    // The first turn: no turn ran yet, so the thread offers no name: a pod of its own.
    let (first, asked) = env.create_turn(THREAD, "message one").await;
    env.wait_succeeded(&first).await;
    let cold = to_model(&server, "message one", asked);

    // The second, under the offered name, on the pod started for it.
    let (offered, warm_uid) = env.started_ahead(THREAD).await;
    let (second, asked) = env.create_turn(THREAD, "message two").await;
    assert_eq!(second, offered, "the turn took the name the thread offered");
    env.wait_succeeded(&second).await;
    let warm = to_model(&server, "message two", asked);
    let pod = env.pods().get(&first_pod(&second)).await.unwrap();
    let run = env.runs().get(&second).await.unwrap();
    assert_eq!(
        pod.uid(),
        Some(warm_uid),
        "the turn ran on the pod started for it"
    );
    assert!(
        controlled_by_run(&pod, &run.uid().unwrap()),
        "adopted: {pod:?}"
    );
    assert_eq!(run.status.as_ref().unwrap().fence.get(), 1);
    let (cold_ledger, warm_ledger) = (env.ledger(&first).await, env.ledger(&second).await);
    assert_eq!(
        kinds(&cold_ledger),
        kinds(&warm_ledger),
        "the same ledger either way"
    );
    println!("created -> model request: own pod {cold:?}; pod started ahead {warm:?}");

    // A run of the offered name that is no turn of the thread: the pod started ahead (the
    // thread's Secrets, the turn's identity) is not its; it gets a pod of its own.
    let (offered, warm_uid) = env.started_ahead(THREAD).await;
    let mut squatter = env.scripted(&offered, &Script::new(1, 10));
    squatter.spec.thread = None;
    env.create(&squatter).await;
    let fence = env.wait_succeeded(&offered).await.fence;
    assert!(
        fence.get() >= 2,
        "the pod started ahead ran a run of no thread"
    );
    let own = baton::fence::worker_pod_name(&offered, fence);
    let pod = env.pods().get(&own).await.unwrap();
    assert_ne!(pod.uid(), Some(warm_uid));
    let worker = pod
        .spec
        .unwrap()
        .containers
        .into_iter()
        .find(|c| c.name == "worker");
    let vars = worker.unwrap().env.unwrap_or_default();
    assert!(
        !vars.iter().any(|v| v.name == pod_env::WARM_THREAD_UID),
        "{vars:?}"
    );

    // The identity the pod started ahead runs as reaches no other run: `kubectl --as` it.
    let (offered, _) = env.started_ahead(THREAD).await;
    assert_ne!(
        offered,
        squatter.name_any(),
        "the thread offers a name no run has"
    );
    let as_pod = format!("--as=system:serviceaccount:{}:baton-run-{offered}", env.ns);
    let read = kubectl(&[
        &as_pod, "-n", &env.ns, "get", "agentrun", &first, "-o", "json",
    ]);
    let denied = read.expect_err("the pod's identity read another turn");
    assert!(denied.contains("forbidden"), "{denied}");
    let victim = env.runs().get(&first).await.unwrap();
    let next = env.ledger(&first).await.len() as i64 + 1;
    let forged = json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "LedgerSegment",
        "metadata": {
            "name": baton::fence::segment_name(&first, next),
            "labels": { baton::crd::RUN_UID_LABEL: victim.uid().unwrap() }
        },
        "spec": { "run": first, "seq": next, "fence": 1, "events": [
            { "type": "final", "output": "forged" }
        ] }
    });
    let path = env.dir.join("forged.json");
    std::fs::write(&path, forged.to_string()).unwrap();
    let wrote = kubectl(&[
        &as_pod,
        "-n",
        &env.ns,
        "create",
        "-f",
        path.to_str().unwrap(),
    ]);
    let refused = wrote.expect_err("the pod's identity appended to another turn's ledger");
    assert!(refused.contains("only its worker"), "{refused}");

    // Killed as its turn is claimed: the turn still ends once, on another attempt if need be.
    let (third, _) = env.create_turn(THREAD, "message three").await;
    assert_eq!(third, offered);
    env.try_signal_worker(&first_pod(&third), libc::SIGKILL)
        .await;
    let status = env.wait_succeeded(&third).await;
    assert_eq!(finals(&env.ledger(&third).await), 1, "the turn ended once");
    println!(
        "killed as claimed: succeeded at fence {}",
        status.fence.get()
    );
    env.finish().await;
}

/// Turns of each chaos thread, and tool steps of each turn.
const CHAOS_TURNS: usize = 4;
const CHAOS_STEPS: usize = 2;

/// The chaos suite's faults (`baton_testkit::node::Chaos`) on warm threads: turns created one
/// after another under the names their threads offer, while workers are killed, frozen past
/// their lease and drained, the leading controller is deleted, and pods started ahead are
/// deleted before or while their turn takes them. The chaos suite's invariants hold for every
/// turn, every turn succeeds with its own answer, and turns did run on pods started ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_chaos_on_warm_threads() {
    let (seed, n) = seed_and_runs(3);
    let env = NodeEnv::start("chaos-warm").await;
    let threads: Vec<String> = (0..n).map(|i| format!("warm-{i}")).collect();
    for name in &threads {
        env.api::<AgentThread>()
            .create(&PostParams::default(), &chaos_thread(&env, name))
            .await
            .unwrap();
    }
    let chaos = Chaos {
        env: &env,
        seed,
        window: chaos_window(),
        per_run: 2,
        db: None,
        warm: true,
        stop_when_all_ended: false,
    };
    let drivers = futures::future::join_all(threads.iter().map(|t| converse(&env, t)));
    let (log, conversations) = tokio::join!(chaos.run(), drivers);
    eprintln!("chaos: {} faults injected:\n{}", log.len(), log.join("\n"));

    let turns: Vec<String> = conversations
        .iter()
        .flatten()
        .map(|t| t.0.clone())
        .collect();
    env.check_invariants(&turns).await;
    let effects = Effects::read(&env.effects.file);
    let mut ahead = 0;
    for conversation in &conversations {
        for (i, (turn, on_pod_ahead)) in conversation.iter().enumerate() {
            let st = env.status(turn).await;
            assert_eq!(st.phase, Phase::Succeeded, "seed {seed}: {turn}: {st:#?}");
            let answer = format!("turn {} done", i + 1);
            assert_eq!(st.output.as_deref(), Some(answer.as_str()), "seed {seed}");
            for step in 1..=CHAOS_STEPS {
                let unknown = st.unknown_effects.iter().any(|u| u.step == step as i64);
                assert!(
                    effects.count(turn, step) == 1 || unknown,
                    "seed {seed}: {turn} step {step} never ran and is not reported: {st:#?}"
                );
            }
            ahead += usize::from(*on_pod_ahead);
        }
    }
    eprintln!(
        "chaos: seed {seed}: {ahead} of {} turns on a pod started ahead",
        turns.len()
    );
    assert!(
        ahead >= 1,
        "seed {seed}: no turn ran on a pod started ahead"
    );
    env.finish().await;
}

/// A warm thread whose scripted agent spans `CHAOS_TURNS` turns of `CHAOS_STEPS` tool steps
/// each (their effects recorded under the turn's name, `$BATON_RUN`), with the tests' short
/// Lease and attempts enough for the faults a turn may take (2) and a pod started ahead
/// deleted as it is adopted.
fn chaos_thread(env: &NodeEnv, name: &str) -> AgentThread {
    let mut script = Vec::new();
    for turn in 1..=CHAOS_TURNS {
        for step in 1..=CHAOS_STEPS {
            let command = effect_command(&env.effects.addr, "$BATON_RUN", step, 1500);
            script.push(ScriptTurn {
                text: Some(format!("turn {turn}, step {step}")),
                tool_calls: vec![tool_call("sh", "command", &command)],
                delay_milliseconds: Some(200),
                usage: None,
            });
        }
        script.push(ScriptTurn {
            text: Some(format!("turn {turn} done")),
            tool_calls: vec![],
            delay_milliseconds: Some(200),
            usage: None,
        });
    }
    let shape = run_with(name, script, vec![shell_tool("sh")]).spec;
    let spec = json!({
        "agent": shape.agent,
        "lease": shape.lease,
        "maxAttempts": 4,
        "warm": { "idleSeconds": 60 },
    });
    AgentThread::new(name, serde_json::from_value(spec).unwrap())
}

/// Creates `CHAOS_TURNS` turns of `thread` one after another, each once the one before has
/// ended, as `baton chat` does (under the name the thread offers); returns their names, and
/// whether each was seen running on a pod started ahead (its pod is deleted once it ends).
async fn converse(env: &NodeEnv, thread: &str) -> Vec<(String, bool)> {
    let mut turns = Vec::new();
    for i in 1..=CHAOS_TURNS {
        let (turn, _) = env.create_turn(thread, &format!("message {i}")).await;
        let deadline = Instant::now() + RUN_TIMEOUT;
        let mut ahead = false;
        while !env.status(&turn).await.phase.is_terminal() {
            ahead = ahead || env.ran_on_pod_started_ahead(&turn).await;
            assert!(Instant::now() < deadline, "{turn} did not end");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        turns.push((turn, ahead));
    }
    turns
}
