//! Trust boundaries on the real node without the webhook: in a namespace the chart's webhook
//! does not watch (`webhook.namespaceSelector`), another run's worker identity may create any
//! segment and re-point its own Lease, and only the readers' own checks stand between it and
//! the victim. Each attack is admitted here (the webhook refuses it elsewhere:
//! tests/node_trust.rs) and each comes to nothing: a segment that claims the run under a name
//! of its own is never folded in (its step never runs), a planted leftover deletes nothing, a
//! Lease pointed at the victim does not keep its frozen worker alive, and a Lease of a run's
//! name that baton did not make is left alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Phase};
use baton::fence::{Fence, segment_name};
use baton_testkit::common::events;
use baton_testkit::e2e::{Effects, Script, approval_run, effect_command};
use baton_testkit::node::rbac::forged_segment;
use baton_testkit::node::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};

/// The turn under which the forged step would record its effect, were it ever run.
const FORGED_TURN: usize = 99;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_without_the_webhook_the_readers_own_checks_stand() {
    let env = NodeEnv::start_without_webhook("trust-readers").await;
    // The attacker: run `a`'s worker identity, which baton made with a worker's rights. `a`
    // waits for an approval that never comes: a run that has not ended keeps its identity
    // (an ended one's is removed), and its pod is gone.
    env.create(&approval_run(&env.effects.addr, "a")).await;
    env.wait_run("a", RUN_TIMEOUT, "WaitingApproval", |s| {
        s.phase == Phase::WaitingApproval
    })
    .await;
    let attacker = format!("system:serviceaccount:{}:baton-run-a", env.ns);

    env.create(&env.scripted("v", &Script::new(4, 1500))).await;
    let (pod, fence) = env.wait_worker("v", 1).await;
    env.wait_effect("v", 1).await;
    let victim: AgentRun = env.runs().get("v").await.unwrap();

    let segments = Api::namespaced(client_as(&attacker).await, &env.ns);
    let forged_step = LedgerEvent::StepIntent {
        step: 1,
        tool: "sh".into(),
        call_id: "forged".into(),
        input: serde_json::json!({
            "command": effect_command(&env.effects.addr, "v", FORGED_TURN, 0)
        })
        .to_string(),
        idempotent: true,
    };
    for planted in [
        forged_segment("a-claims", &victim, vec![forged_step]),
        forged_segment("x", &victim, vec![]),
    ] {
        segments
            .create(&PostParams::default(), &planted)
            .await
            .expect("without the webhook, any worker may create a segment");
    }

    let spoofing = Spoofing::start(&env, &attacker, &victim).await;
    env.signal_worker(&pod, libc::SIGSTOP).await;
    let frozen = Instant::now();
    let taken = env
        .wait_run("v", RUN_TIMEOUT, "taken over", |s| s.fence.get() > fence)
        .await;
    let touches = spoofing.stop();
    // The Lease lasts 5 s: the spoofer touched it all along the freeze.
    assert!(
        touches >= 5,
        "only {touches} spoofed touches in {:?}",
        frozen.elapsed()
    );
    assert_eq!(taken.reason.as_deref(), Some("LeaseExpired"), "{taken:#?}");
    env.signal_worker(&pod, libc::SIGCONT).await;

    // A run named for the planted leftover: its first claim deletes nothing and stops there.
    env.create(&env.scripted("x", &Script::new(1, 100))).await;
    wait_event(&env, "x", "ForeignLedgerSegment").await;
    assert_eq!(
        env.status("x").await.fence,
        Fence::new(0),
        "x is not claimed over it"
    );

    // A Lease of a run's name that baton did not make is left as it was.
    let theirs = foreign_lease(&env, "y").await;
    env.create(&env.scripted("y", &Script::new(1, 100))).await;
    let st = env
        .wait_run("y", RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    assert_eq!(
        (st.phase, st.reason.as_deref()),
        (Phase::Failed, Some("LeaseNotOwned")),
        "{st:#?}"
    );
    let now: Lease = env.api().get("run.y").await.unwrap();
    assert_eq!(
        now.resource_version(),
        theirs.resource_version(),
        "untouched"
    );

    let st = env.wait_succeeded("v").await;
    assert_eq!(st.failed_attempts, 1, "the freeze cost one attempt");
    let effects = Effects::read(&env.effects.file);
    assert_eq!(effects.count("v", FORGED_TURN), 0, "the forged step ran");
    let names: Vec<String> = env.ledger("v").await.iter().map(|s| s.name_any()).collect();
    let own: Vec<String> = (1..=names.len() as i64)
        .map(|seq| segment_name("v", seq))
        .collect();
    assert_eq!(names, own, "the victim's ledger is its own, whole");
    for kept in ["a-claims", "x"] {
        let seg: Option<baton::crd::v1alpha1::LedgerSegment> =
            env.api().get_opt(&segment_name(kept, 1)).await.unwrap();
        assert!(seg.is_some(), "{kept}'s segment is not a leftover: kept");
    }
    env.check_invariants(&["v".into()]).await;
    env.finish().await;
}

/// The attacker points its own run's Lease (`run.a`) at the victim and touches it every half
/// second, the keep-alive a frozen victim would need, until [`Spoofing::stop`].
struct Spoofing {
    on: Arc<AtomicBool>,
    touches: Arc<AtomicUsize>,
}

impl Spoofing {
    async fn start(env: &NodeEnv, attacker: &str, victim: &AgentRun) -> Spoofing {
        let leases: Api<Lease> = Api::namespaced(client_as(attacker).await, &env.ns);
        let mut pointed = victim.controller_owner_ref(&()).unwrap();
        pointed.block_owner_deletion = None;
        let (on, touches) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (going, touched) = (on.clone(), touches.clone());
        tokio::spawn(async move {
            while going.load(Ordering::Relaxed) {
                let mut own = leases.get("run.a").await.expect("a worker reads its Lease");
                own.metadata.owner_references = Some(vec![pointed.clone()]);
                let n = touched.load(Ordering::Relaxed);
                own.annotations_mut().insert("spoof".into(), n.to_string());
                match leases.replace("run.a", &PostParams::default(), &own).await {
                    Ok(_) => touched.fetch_add(1, Ordering::Relaxed),
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => panic!("without the webhook, a worker may re-point its Lease: {e}"),
                };
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Spoofing { on, touches }
    }

    /// Stops, and says how many touches landed.
    fn stop(self) -> usize {
        self.on.store(false, Ordering::Relaxed);
        self.touches.load(Ordering::Relaxed)
    }
}

/// A Lease `run.<name>` made by something else (no owner, its own holder).
async fn foreign_lease(env: &NodeEnv, name: &str) -> Lease {
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("run.{name}") },
        "spec": { "holderIdentity": "someone-else", "leaseDurationSeconds": 3600 }
    }))
    .unwrap();
    env.api()
        .create(&PostParams::default(), &lease)
        .await
        .expect("a foreign Lease")
}

/// Waits for an Event of `reason` about run `run`.
async fn wait_event(env: &NodeEnv, run: &str, reason: &str) -> Event {
    events::wait_event(&env.api::<Event>(), run, reason, RUN_TIMEOUT).await
}
