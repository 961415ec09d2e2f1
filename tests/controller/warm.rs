//! A thread's next turn started ahead (`spec.warm`), the controller's half, against the real
//! API server (no kubelet: the pods never run; the tests play the worker). The thread offers a
//! name; the pod and worker RBAC of that turn exist before it, owned by the thread; the turn
//! created under the name adopts that very pod at its claim; a run of that name that is no
//! turn never does (the pod is removed, and the run's next attempt gets a pod of its own).

use baton::crd::v1alpha1::{AgentRun, AgentThread};
use baton::crd::{WARM_THREAD_LABEL, controlled_by_run};
use baton::fence::{Fence, worker_pod_name};
use baton_testkit::controller::*;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::PostParams;
use std::time::{Duration, Instant};

/// The pod of attempt `fence` of run `run`.
fn pod_name(run: &str, fence: i64) -> String {
    worker_pod_name(run, Fence::new(fence))
}

/// Waits until thread `thread` offers a name and its pod started ahead exists; returns both.
async fn offered_by(ns: &TestNamespace, thread: &str) -> (String, Pod) {
    let deadline = Instant::now() + T;
    loop {
        let thread = ns.api::<AgentThread>().get(thread).await.unwrap();
        if let Some(name) = thread.offered_turn_name()
            && let Some(pod) = ns.api::<Pod>().get_opt(&pod_name(name, 1)).await.unwrap()
        {
            return (name.to_string(), pod);
        }
        assert!(
            Instant::now() < deadline,
            "nothing started ahead: {thread:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn offered(ns: &TestNamespace) -> (String, Pod) {
    offered_by(ns, "conv").await
}

/// Pod `name`, once the claim that moved its Lease made it.
async fn pod_once_made(ns: &TestNamespace, name: &str) -> Pod {
    let deadline = Instant::now() + T;
    loop {
        if let Some(pod) = ns.api::<Pod>().get_opt(name).await.unwrap() {
            return pod;
        }
        assert!(Instant::now() < deadline, "no pod {name}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates thread `name` with `spec.warm` (`idleSeconds: idle`).
async fn create_warm_thread(ns: &TestNamespace, name: &str, idle: i64) -> AgentThread {
    let agent = agent_run("x", 10).spec.agent;
    let thread: AgentThread = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentThread",
        "metadata": {"name": name},
        "spec": {"agent": agent, "warm": {"idleSeconds": idle}},
    }))
    .unwrap();
    let threads = ns.api::<AgentThread>();
    threads
        .create(&PostParams::default(), &thread)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_turn_under_the_offered_name_adopts_its_pod_and_no_other_run_does() {
    let ns = TestNamespace::new("ctl-warm").await;
    let thread = create_warm_thread(&ns, "conv", 300).await;
    let threads = ns.api::<AgentThread>();
    let _c = start(&ns.client, config(&ns.name));
    let runs = ns.api::<AgentRun>();

    // The first turn: nothing offered yet.
    let created = baton::requests::create_turn(&runs, &thread, thread.new_turn("one")).await;
    let first = created.unwrap().name_any();
    wait_fence(&ns, &first, 1, T).await;
    finish_first_attempt(&ns, &first).await;

    // The next turn's pod and RBAC exist before it, the thread's.
    let (next, ahead) = offered(&ns).await;
    let thread_uid = thread.uid().unwrap();
    assert_eq!(ahead.labels().get(WARM_THREAD_LABEL), Some(&thread_uid));
    assert_eq!(ahead.owner_references()[0].uid, thread_uid);
    let account = ns.api::<ServiceAccount>();
    let made = account.get(&format!("baton-run-{next}")).await.unwrap();
    assert_eq!(made.owner_references()[0].uid, thread_uid);

    // The turn under that name adopts that very pod: no second pod, the run its controller.
    let thread = threads.get("conv").await.unwrap();
    let turn = baton::requests::create_turn(&runs, &thread, thread.new_turn("two"))
        .await
        .unwrap();
    assert_eq!(turn.name_any(), next);
    wait_fence(&ns, &next, 1, T).await;
    let deadline = Instant::now() + T;
    let adopted = loop {
        let pod = ns.api::<Pod>().get(&pod_name(&next, 1)).await.unwrap();
        if controlled_by_run(&pod, &turn.uid().unwrap()) {
            break pod;
        }
        assert!(Instant::now() < deadline, "not adopted: {pod:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        adopted.uid(),
        ahead.uid(),
        "the pod started ahead, not a new one"
    );
    let kept = account.get(&format!("baton-run-{next}")).await.unwrap();
    assert_eq!(
        kept.uid(),
        made.uid(),
        "the identity made ahead is the turn's: kept"
    );
    finish_first_attempt(&ns, &next).await;

    // A plain run of the name offered now: the pod started ahead is removed, never adopted,
    // and the run's next attempt gets a pod of its own.
    let (squatted, ahead) = offered(&ns).await;
    create(&ns, agent_run(&squatted, 10)).await;
    let run = wait_fence(&ns, &squatted, 2, T).await;
    let own = pod_once_made(&ns, &pod_name(&squatted, 2)).await;
    assert!(controlled_by_run(&own, &run.uid().unwrap()));
    assert!(!own.labels().contains_key(WARM_THREAD_LABEL), "{own:?}");
    let first_pod = ns
        .api::<Pod>()
        .get_opt(&pod_name(&squatted, 1))
        .await
        .unwrap();
    assert!(
        first_pod.is_none_or(|p| p.uid() != ahead.uid() || p.metadata.deletion_timestamp.is_some()),
        "the pod started ahead was left to a run of no thread"
    );
    let account = account.get(&format!("baton-run-{squatted}")).await.unwrap();
    assert!(
        controlled_by_run(&account, &run.uid().unwrap()),
        "{account:?}"
    );
    ns.cleanup().await;
}

/// A thread idle for longer than its `idleSeconds` keeps nothing for its next turn: the pod
/// started ahead and the RBAC made ahead are removed (the last turn is looked at again then).
#[tokio::test]
async fn an_idle_thread_keeps_nothing_ahead_once_its_idle_seconds_pass() {
    let ns = TestNamespace::new("ctl-warm-idle").await;
    let thread = create_warm_thread(&ns, "brief", 10).await;
    let _c = start(&ns.client, config(&ns.name));
    let runs = ns.api::<AgentRun>();
    let created = baton::requests::create_turn(&runs, &thread, thread.new_turn("one")).await;
    let turn = created.unwrap().name_any();
    wait_fence(&ns, &turn, 1, T).await;
    finish_first_attempt(&ns, &turn).await;
    let (next, _) = offered_by(&ns, "brief").await;
    let account = format!("baton-run-{next}");
    assert!(
        ns.api::<ServiceAccount>()
            .get_opt(&account)
            .await
            .unwrap()
            .is_some()
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let pod = ns.api::<Pod>().get_opt(&pod_name(&next, 1)).await.unwrap();
        let sa = ns.api::<ServiceAccount>().get_opt(&account).await.unwrap();
        let role = ns.api::<Role>().get_opt(&account).await.unwrap();
        let binding = ns.api::<RoleBinding>().get_opt(&account).await.unwrap();
        if pod.is_none() && sa.is_none() && role.is_none() && binding.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kept ahead while idle: {pod:?} {sa:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ns.cleanup().await;
}
