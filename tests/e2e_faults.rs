//! End to end, one fault at a time: the controller and the local pod runner in-process, real
//! `baton worker` processes, scripted runs whose non-idempotent shell tool counts its effects.
//! kill -9, drain (graceful delete) and pause-past-lease.

mod e2e_support;

use std::time::Duration;

use baton::crd::v1alpha1::LedgerEvent;
use e2e_support::*;

fn turn_text(name: &str, turns: usize) -> String {
    format!("{name}: all {turns} turns done")
}

/// kill -9 the worker while its tool runs: the pod's death is reported, the run resumes in a
/// new pod and succeeds; the in-flight step is reported as an unknown effect and not re-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_mid_step_resumes_and_does_not_rerun() {
    let env = E2e::start("kill9").await;
    let name = "kill9";
    let script = Script::new(4, 4000);
    env.create(&scripted_run(&env.effects, name, &script)).await;
    let (pod, fence, _) = env.wait_worker(name, 1).await;
    env.wait_effect(name, 2).await; // turn 2's tool is now sleeping: its effect landed
    env.runner.kill(&env.ns, &pod).expect("kill -9");

    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some(turn_text(name, 4).as_str()));
    assert!(st.fence > fence, "a new pod took over: {st:#?}");
    assert_eq!(st.failed_attempts, 1, "the kill consumed one attempt");
    assert_eq!(st.unknown_effects.len(), 1, "{:#?}", st.unknown_effects);
    let u = &st.unknown_effects[0];
    assert_eq!(
        (u.step, u.tool.as_str(), u.attempt, u.resolution.as_str()),
        (2, "sh", fence, "unknown")
    );
    let effects = env.effects();
    for turn in 1..=4 {
        assert_eq!(
            effects.count(name, turn),
            1,
            "turn {turn} ran exactly once: {:?}",
            effects.per_turn(name)
        );
    }
    let ledger = env.ledger(name).await;
    assert!(
        ledger
            .iter()
            .flat_map(|s| &s.spec.events)
            .any(|e| matches!(e, LedgerEvent::StepUnknown { step: 2, .. })),
        "the ledger records step 2 as unknown"
    );
    env.check_invariants(&[name.to_string()], true).await;
    env.finish().await;
}

/// Drain the node (graceful delete of the worker pod): the worker hands off, the next one
/// continues at once; no attempt is consumed and no effect is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_hands_off_without_consuming_an_attempt() {
    let env = E2e::start("drain").await;
    let name = "drain";
    let script = Script::new(4, 1500);
    let (pod, fence, _) = env.start_run(name, &script).await;
    let drained = env.runner.drain().await.expect("draining the node");
    assert!(
        drained.iter().any(|k| k.name == pod),
        "the drain deleted {pod}: {drained:?}"
    );

    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some(turn_text(name, 4).as_str()));
    assert!(st.fence > fence, "a new pod continued: {st:#?}");
    assert_eq!(st.failed_attempts, 0, "a handoff consumes no attempt");
    assert!(st.unknown_effects.is_empty(), "{:#?}", st.unknown_effects);
    let effects = env.effects();
    for turn in 1..=4 {
        assert_eq!(effects.count(name, turn), 1, "{:?}", effects.per_turn(name));
    }
    // The drained worker wrote `handoff` under its fence, before the next claim's seal.
    let ledger = env.ledger(name).await;
    let handoff = ledger
        .iter()
        .position(|s| s.spec.events.contains(&LedgerEvent::Handoff));
    let next_seal = ledger.iter().position(|s| {
        s.spec
            .events
            .iter()
            .any(|e| matches!(e, LedgerEvent::Claimed { fence: f, .. } if *f == fence + 1))
    });
    assert!(
        matches!((handoff, next_seal), (Some(h), Some(c)) if h < c),
        "handoff ({handoff:?}) precedes the claim of fence {} ({next_seal:?})",
        fence + 1
    );
    assert_eq!(ledger[handoff.unwrap()].spec.fence, fence);
    env.check_invariants(&[name.to_string()], true).await;
    env.finish().await;
}

/// Pause the worker (SIGSTOP) past its lease: the run is taken over; resumed, the old worker
/// writes nothing (no segment with its fence after the seal) and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_worker_is_taken_over_and_writes_nothing_when_resumed() {
    let env = E2e::start("pause").await;
    let name = "pause";
    let script = Script::new(4, 1500);
    let (pod, fence, _) = env.start_run(name, &script).await;
    env.runner.pause(&env.ns, &pod).expect("SIGSTOP");

    // Taken over after the lease expired, and the new worker has started writing.
    env.wait_run(name, RUN_TIMEOUT, "taken over", |s| s.fence > fence)
        .await;
    env.recorder
        .wait_attempt_started(name, fence, RUN_TIMEOUT)
        .await;
    let resumed_at = std::time::Instant::now();
    env.runner.resume(&env.ns, &pod).expect("SIGCONT");

    // The old process exits.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while env.runner.pid(&env.ns, &pod).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the resumed zombie worker {pod} did not exit\n{}",
            env.pod_logs(name)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let st = env.wait_succeeded(name).await;
    assert_eq!(st.failed_attempts, 1, "the expiry consumed one attempt");
    let effects = env.effects();
    for turn in 1..=4 {
        assert!(
            effects.count(name, turn) <= 1,
            "{:?}",
            effects.per_turn(name)
        );
    }
    // Nothing of the paused worker's fence appeared after it was resumed.
    let recorded = env.recorder.snapshot();
    let late: Vec<_> = recorded
        .segments
        .iter()
        .filter(|(_, s)| s.run == name && s.fence == fence && s.at > resumed_at)
        .map(|(n, _)| n.clone())
        .collect();
    assert!(late.is_empty(), "the zombie wrote {late:?}");
    env.check_invariants(&[name.to_string()], true).await;
    env.finish().await;
}
