//! What the tests of the stock protocol clients share: a scripted thread, the next run; the
//! client scripts' runner is the test kit's (`baton_testkit::clients`).

use baton::crd::v1alpha1::{AgentRun, AgentThread, AgentThreadSpec, ScriptTurn};
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::{Api, ResourceExt};
use serde_json::json;

pub use baton_testkit::clients::SdkClient;

/// A thread whose scripted agent plays `script`, with the `sh` tool.
pub fn thread(name: &str, script: Vec<ScriptTurn>) -> AgentThread {
    let agent = scripted_run(
        name,
        script,
        vec![shell_tool("sh", false)],
        Default::default(),
    )
    .spec
    .agent;
    let spec: AgentThreadSpec = serde_json::from_value(json!({
        "agent": agent,
        "lease": {"durationSeconds": 4, "renewSeconds": 1, "startupSeconds": 60},
    }))
    .unwrap();
    AgentThread::new(name, spec)
}

/// Eight tool turns (`sh`, 300 ms each) and a final answer: long enough to be killed mid-run.
pub fn stepping_script() -> Vec<ScriptTurn> {
    let mut script: Vec<_> = (1..=8)
        .map(|i| shell_turn(&format!("step {i}. "), "sh", &format!("echo out-{i}"), 300))
        .collect();
    script.push(final_turn("all done", 100));
    script
}

/// A thread named `slow` whose agent takes a minute to answer.
pub fn slow_thread() -> AgentThread {
    thread("slow", vec![final_turn("too late", 120_000)])
}

/// The output text of [`stepping_script`] played whole, as an uninterrupted run answers.
pub fn stepping_answer() -> String {
    (1..=8).map(|i| format!("step {i}. ")).collect::<String>() + "all done"
}

/// The name of a run of `runs` not in `known`, once there is one.
pub async fn next_run(runs: &Api<AgentRun>, known: &[String]) -> String {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let names = runs.list(&Default::default()).await.unwrap().items;
        if let Some(name) = names
            .iter()
            .map(|r| r.name_any())
            .find(|n| !known.contains(n))
        {
            return name;
        }
        assert!(tokio::time::Instant::now() < deadline, "no new run");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Runs the worker of run `name` at fence 1 if the controller makes its pod before the run
/// ends (a run stopped before its first claim ends without one): what a kubelet would do.
pub async fn work_if_claimed(ns: &baton_testkit::common::TestNamespace, name: &str) {
    let runs: Api<AgentRun> = ns.api();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    let pod = baton::fence::worker_pod_name(name, baton::fence::Fence::new(1));
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if pods.get_opt(&pod).await.unwrap().is_some() {
            let mut worker = run_pod(ns, name, 1).await;
            worker.wait(T).await;
            return;
        }
        let run = runs.get(name).await.unwrap();
        if baton::requests::phase_of(&run).is_terminal() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {name} neither claimed nor ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
