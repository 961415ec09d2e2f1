//! End to end on the real node (`hack/node.sh`): baton installed by its chart, so the
//! controller runs as the Deployment's two pods and the workers as real pods on containerd;
//! every fault is a real one. After each scenario the chaos invariants are checked (every run
//! terminal, no non-idempotent effect twice, no stale-fence write accepted, transcripts
//! contiguous and unchanged). The scenarios run one at a time: they share the node.

use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{LedgerEvent, Phase};
use baton::fence::Fence;
use baton_testkit::e2e::Script;
use baton_testkit::node::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}-{i}")).collect()
}

async fn all_succeed(env: &NodeEnv, names: &[String], turns: usize) {
    for name in names {
        let st = env.wait_succeeded(name).await;
        assert_eq!(
            st.output.as_deref(),
            Some(format!("{name}: all {turns} turns done").as_str())
        );
    }
    env.check_invariants(names).await;
}

/// The chart, installed for real: two controller pods of the Deployment, Ready (their probes
/// pass), one of them leading, the PodDisruptionBudget in place, and a run that succeeds
/// through the in-cluster config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_chart_runs_two_ready_controllers_one_leading_behind_a_pdb() {
    let env = NodeEnv::start("chart").await;
    let (pods, holder) = controller_pods(&env.client).await;
    // Pods of an earlier scenario's deleted leader may still be terminating (kubelet 1.20 takes
    // 10 s or the grace period): the replicas are the pods not being deleted.
    let pods: Vec<Pod> = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let replicas: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    assert_eq!(pods.len(), 2, "two controller replicas: {replicas:?}");
    for pod in &pods {
        assert!(
            is_ready(pod),
            "{} is Ready (its probes pass)",
            pod.name_any()
        );
    }
    let holder = holder.expect("a controller holds the leader Lease");
    assert!(
        leader_pod(&pods, &holder).is_some(),
        "the leader {holder} is one of the pods"
    );
    let min_available = kubectl(&[
        "-n",
        SYSTEM_NS,
        "get",
        "pdb",
        &deployment_name(),
        "-o",
        "jsonpath={.spec.minAvailable}",
    ])
    .expect("the chart's PodDisruptionBudget");
    assert_eq!(min_available, "1");

    // The CRD upgrade command (docs/operations.md, "Upgrading") works on the oldest server the
    // chart claims (1.20).
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/baton/crds/");
    kubectl(&["apply", "--server-side", "--force-conflicts", "-f", crds])
        .expect("kubectl apply --server-side -f charts/baton/crds/");

    let run = names("chart", 1);
    env.create_scripted(&run, &Script::new(2, 200)).await;
    all_succeed(&env, &run, 2).await;
    // `kubectl wait --for=condition=...` works with any kubectl (jsonpath needs >= 1.23).
    kubectl(&[
        "-n",
        &env.ns,
        "wait",
        "--for=condition=Succeeded",
        "agentrun/chart-1",
        "--timeout=10s",
    ])
    .expect("kubectl wait --for=condition=Succeeded");
    env.finish().await;
}

/// The worker container's process is killed with SIGKILL from the host (as the OOM killer
/// would): the kubelet reports the container gone, the run resumes in a new pod at fence 2,
/// and the step in flight is reported as an unknown effect, not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_kill9_of_the_worker_resumes_and_does_not_rerun_the_step() {
    let env = NodeEnv::start("kill9").await;
    let run = names("k9", 1);
    env.create_scripted(&run, &Script::new(4, 3000)).await;
    let (pod, _) = env.wait_worker(&run[0], 1).await;
    env.wait_effect(&run[0], 1).await;
    env.signal_worker(&pod, libc::SIGKILL).await;

    all_succeed(&env, &run, 4).await;
    let st = env.status(&run[0]).await;
    assert_eq!(st.failed_attempts, 1, "the killed attempt died: {st:#?}");
    assert_eq!(st.unknown_effects.len(), 1, "the step in flight: {st:#?}");
    assert_eq!(st.unknown_effects[0].step, 1);
    env.finish().await;
}

/// The worker pod is deleted: the kubelet sends SIGTERM, the worker hands off, and the next
/// pod continues at once without consuming an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_worker_pod_deleted_hands_off_without_consuming_an_attempt() {
    let env = NodeEnv::start("podkill").await;
    let run = names("del", 1);
    env.create_scripted(&run, &Script::new(4, 1500)).await;
    let (pod, _) = env.wait_worker(&run[0], 1).await;
    env.wait_effect(&run[0], 1).await;
    env.delete_pod(&pod).await;

    all_succeed(&env, &run, 4).await;
    let st = env.status(&run[0]).await;
    assert_eq!(st.failed_attempts, 0, "a handoff is no death: {st:#?}");
    assert!(st.fence >= Fence::new(2));
    let handed_off = env
        .ledger(&run[0])
        .await
        .iter()
        .any(|s| s.spec.events.contains(&LedgerEvent::Handoff));
    assert!(handed_off, "the worker appended handoff on SIGTERM");
    env.finish().await;
}

/// `kubectl rollout restart` of the controller Deployment with live runs: the runs finish, the
/// Deployment comes back with both replicas, and a leader is there throughout but for a short
/// gap (printed: old pods release leadership on SIGTERM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_controller_rollout_restart_keeps_live_runs_going() {
    let env = NodeEnv::start("ctl-rollout").await;
    let runs = names("cro", 2);
    env.create_scripted(&runs, &Script::new(6, 1000)).await;
    for run in &runs {
        env.wait_worker(run, 1).await;
    }
    let started = Instant::now();
    restart_controllers();
    let leaderless = leaderless_until_rolled(&env.client, Duration::from_secs(120)).await;
    eprintln!(
        "controller rollout: {:.1} s until both new replicas were Ready; {:.2} s with no leader",
        started.elapsed().as_secs_f64(),
        leaderless.as_secs_f64()
    );
    all_succeed(&env, &runs, 6).await;
    env.finish().await;
}

/// The leader controller pod is deleted while runs are live and one worker is killed: the
/// other replica leads at once and the runs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_leader_pod_deleted_the_other_replica_leads() {
    let env = NodeEnv::start("leader").await;
    let runs = names("ld", 2);
    env.create_scripted(&runs, &Script::new(5, 1000)).await;
    let (pod, _) = env.wait_worker(&runs[0], 1).await;
    env.wait_worker(&runs[1], 1).await;
    env.wait_effect(&runs[0], 1).await;

    let (pods, holder) = controller_pods(&env.client).await;
    let holder = holder.expect("a leader");
    let leader = leader_pod(&pods, &holder).expect("the leader's pod");
    let controllers: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM_NS);
    controllers
        .delete(&leader, &DeleteParams::default())
        .await
        .expect("deleting the leader pod");
    env.signal_worker(&pod, libc::SIGKILL).await;

    all_succeed(&env, &runs, 5).await;
    let (pods, holder) = controller_pods(&env.client).await;
    let now_leading = holder.as_deref().and_then(|h| leader_pod(&pods, h));
    assert!(
        now_leading.is_some_and(|p| p != leader),
        "another pod leads now: {holder:?}"
    );
    assert_eq!(env.status(&runs[0]).await.failed_attempts, 1);
    wait_controllers_ready(&env.client, Duration::from_secs(120)).await;
    env.finish().await;
}

/// A run is deleted while it runs: the real garbage collector removes everything it owned —
/// its Lease, its ledger segments, its worker pods, its ServiceAccount, Role and RoleBinding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_deleted_run_is_garbage_collected() {
    let env = NodeEnv::start("gc").await;
    let run = names("gc", 1);
    env.create_scripted(&run, &Script::new(6, 1000)).await;
    env.wait_worker(&run[0], 1).await;
    env.wait_effect(&run[0], 1).await;
    env.runs()
        .delete(&run[0], &DeleteParams::background())
        .await
        .expect("deleting the run");

    let c = &env.client;
    let ns = &env.ns;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let leases = Api::<Lease>::namespaced(c.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let segments = Api::<baton::crd::v1alpha1::LedgerSegment>::namespaced(c.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let pods = env.pods().list(&ListParams::default()).await.unwrap();
        let accounts = Api::<ServiceAccount>::namespaced(c.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let roles = Api::<Role>::namespaced(c.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let bindings = Api::<RoleBinding>::namespaced(c.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let left: Vec<String> = leases
            .items
            .iter()
            .map(|o| format!("Lease/{}", o.name_any()))
            .chain(
                segments
                    .items
                    .iter()
                    .map(|o| format!("LedgerSegment/{}", o.name_any())),
            )
            .chain(pods.items.iter().map(|o| format!("Pod/{}", o.name_any())))
            .chain(
                accounts
                    .items
                    .iter()
                    .filter(|o| o.name_any() != "default")
                    .map(|o| format!("ServiceAccount/{}", o.name_any())),
            )
            .chain(roles.items.iter().map(|o| format!("Role/{}", o.name_any())))
            .chain(
                bindings
                    .items
                    .iter()
                    .map(|o| format!("RoleBinding/{}", o.name_any())),
            )
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind after the run was deleted: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    env.finish().await;
}

/// A run whose model key names a Secret that does not exist: the worker pod can never start,
/// and instead of staying `Running` the run ends `Failed`, naming the Secret in its reason,
/// condition and Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_missing_secret_fails_the_run_naming_the_secret() {
    let env = NodeEnv::start("secret").await;
    let mut run = env.scripted("nokey", &Script::new(1, 100));
    run.spec.agent_mut().model.api_key_secret_ref = Some(baton::crd::v1alpha1::SecretKeyRef {
        name: "no-such-key".into(),
        key: "api-key".into(),
    });
    env.create(&run).await;
    let st = env
        .wait_run("nokey", RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    assert_eq!(st.phase, Phase::Failed, "{st:#?}");
    assert_eq!(st.reason.as_deref(), Some("SecretNotFound"), "{st:#?}");
    let message = st.message.clone().unwrap_or_default();
    assert!(
        message.contains("no-such-key"),
        "the message names the Secret: {message}"
    );
    let complete = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .expect("Complete");
    assert_eq!(complete.reason, "SecretNotFound");
    let events = kubectl(&[
        "-n",
        &env.ns,
        "get",
        "events",
        "-o",
        "jsonpath={range .items[*]}{.reason} {.note}{.message}{\"\\n\"}{end}",
    ])
    .expect("listing Events");
    assert!(
        events
            .lines()
            .any(|l| l.starts_with("SecretNotFound") && l.contains("no-such-key")),
        "an Event says so: {events}"
    );
    env.finish().await;
}

/// `kubectl drain` of the node mid-run (the Eviction API): the workers get SIGTERM and hand
/// off; the controllers' PodDisruptionBudget keeps one controller pod (the drain stops at it
/// and times out, as it must on a single node); after `uncordon` the runs finish in new pods
/// without consuming an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_drain_hands_off_and_respects_the_pdb() {
    let env = NodeEnv::start("drain").await;
    let runs = names("dr", 2);
    for name in &runs {
        let mut run = env.scripted(name, &Script::new(5, 1500));
        // The next pods wait, unschedulable, while the node is cordoned: longer than the
        // test's usual startup allowance, after which an attempt counts as dead.
        run.spec.lease.startup_seconds = 180;
        env.create(&run).await;
    }
    for run in &runs {
        env.wait_worker(run, 1).await;
        env.wait_effect(run, 1).await;
    }
    let drained = drain_then_uncordon();
    let refusal = drained.expect_err("a single-node drain cannot evict the last controller pod");
    assert!(
        refusal.contains("disruption budget"),
        "the drain stopped at the PodDisruptionBudget: {refusal}"
    );

    all_succeed(&env, &runs, 5).await;
    for run in &runs {
        let st = env.status(run).await;
        assert_eq!(
            st.failed_attempts, 0,
            "{run}: a drain is a handoff: {st:#?}"
        );
        assert!(st.fence >= Fence::new(2), "{run} moved to a new pod");
    }
    wait_controllers_ready(&env.client, Duration::from_secs(120)).await;
    env.finish().await;
}

/// A worker-image rollout (`helm upgrade` with a new `workerImage`): live runs move to pods of
/// the new image by handoff, consuming no attempt, and finish there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_worker_image_rollout_moves_live_runs_by_handoff() {
    let env = NodeEnv::start("worker-rollout").await;
    let runs = names("wro", 2);
    // Long enough to outlast the controller's own rollout (its args carry the worker image).
    env.create_scripted(&runs, &Script::new(16, 2500)).await;
    for run in &runs {
        env.wait_worker(run, 1).await;
        env.wait_effect(run, 1).await;
    }
    helm_upgrade(&serde_json::json!({"workerImage": NEXT_IMAGE}));
    let finished = async {
        for run in &runs {
            env.wait_succeeded(run).await;
        }
    };
    finished.await;
    // Back to the chart's default for the scenarios after this one.
    helm_upgrade(&serde_json::json!({}));
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;

    env.check_invariants(&runs).await;
    for run in &runs {
        let st = env.status(run).await;
        assert_eq!(
            st.failed_attempts, 0,
            "{run}: a rollout consumes no attempt: {st:#?}"
        );
        let last = env
            .pods()
            .get_opt(&baton::fence::worker_pod_name(run, st.fence))
            .await
            .unwrap();
        let first_handoff = env
            .ledger(run)
            .await
            .iter()
            .any(|s| s.spec.events.contains(&LedgerEvent::Handoff));
        assert!(first_handoff, "{run} moved by handoff");
        if let Some(pod) = last {
            assert_eq!(
                baton::controller::pod::pod_image(&pod),
                NEXT_IMAGE,
                "{run} finished on the new image"
            );
        }
    }
    env.finish().await;
}

/// The node's kube-apiserver is stopped and started again with live runs: workers and
/// controllers ride it out and the runs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_apiserver_restart_with_live_runs() {
    let env = NodeEnv::start("apiserver").await;
    let runs = names("api", 2);
    env.create_scripted(&runs, &Script::new(6, 1000)).await;
    for run in &runs {
        env.wait_worker(run, 1).await;
    }
    env.wait_effect(&runs[0], 1).await;
    tokio::task::spawn_blocking(|| node_sh(&["restart-apiserver"]))
        .await
        .unwrap();
    all_succeed(&env, &runs, 6).await;
    wait_controllers_ready(&env.client, Duration::from_secs(180)).await;
    env.finish().await;
}

/// The node is lost: the worker's process freezes (SIGSTOP) and its kubelet stops. The run's
/// Lease expires on the controller's clock and the run is claimed for a new pod without
/// waiting for the old one, which sticks in Terminating while the kubelet is away. When the
/// node comes back the frozen worker wakes up as a zombie: every write it tries is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lost_the_run_resumes_once_the_lease_expires_and_the_zombie_writes_nothing() {
    let env = NodeEnv::start("node-lost").await;
    let run = names("lost", 1);
    env.create_scripted(&run, &Script::new(8, 1500)).await;
    let (pod, _) = env.wait_worker(&run[0], 1).await;
    env.wait_effect(&run[0], 1).await;
    let pid = env
        .container_pid(&pod)
        .await
        .expect("the worker's host PID");
    let lost_at = Instant::now();
    let loss = NodeLoss::begin(pid).await;

    let st = env
        .wait_run(&run[0], Duration::from_secs(120), "claimed again", |s| {
            s.fence >= Fence::new(2)
        })
        .await;
    let claimed_after = lost_at.elapsed();
    let old = env.pods().get_opt(&pod).await.unwrap();
    let terminating = old
        .as_ref()
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    eprintln!(
        "node lost: claimed again at fence {} after {:.1} s (lease {} s); old pod terminating: {terminating}",
        st.fence,
        claimed_after.as_secs_f64(),
        baton_testkit::e2e::lease().duration_seconds
    );
    assert!(
        terminating,
        "the old pod is being deleted, stuck while its kubelet is away: {old:?}"
    );

    loss.end().await;
    all_succeed(&env, &run, 8).await;
    assert!(env.status(&run[0]).await.failed_attempts >= 1);
    env.finish().await;
}
