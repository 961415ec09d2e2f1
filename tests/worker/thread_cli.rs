//! `baton chat`, `baton thread` and `baton get` against a thread, end to end: the real
//! controller, a real worker for each pod (the test plays the kubelet), the real binary.

use std::process::Stdio;
use std::time::Duration;

use crate::threads::*;
use baton::crd::v1alpha1::AgentRun;
use baton_testkit::common::TestNamespace;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::*;
use kube::{Api, ResourceExt};
use tokio::process::Command;

/// `baton ARGS -n NS`, started (its output captured).
fn baton(ns: &TestNamespace, args: &[&str]) -> tokio::process::Child {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .args(["-n", &ns.name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running baton")
}

/// The turn of thread `geo` not in `seen`, once `chat` has created it.
async fn new_turn(ns: &TestNamespace, seen: &[String]) -> String {
    let runs: Api<AgentRun> = ns.api();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let list = runs.list(&Default::default()).await.unwrap().items;
        let found = list
            .iter()
            .map(|r| r.name_any())
            .find(|n| n.starts_with("geo-") && !seen.contains(n));
        if let Some(name) = found {
            return name;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chat created no turn"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `baton chat geo MESSAGE` while playing the kubelet for the turn it creates.
async fn chat(ns: &TestNamespace, message: &str, seen: &mut Vec<String>) -> std::process::Output {
    let child = baton(ns, &["chat", "geo", message]);
    let name = new_turn(ns, seen).await;
    seen.push(name.clone());
    let mut worker = run_pod(ns, &name, 1).await;
    worker.wait(crate::EXIT_TIMEOUT).await;
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("chat ends with its turn")
        .expect("chat's output")
}

#[tokio::test]
async fn chat_follows_a_turn_to_its_answer_and_exits_with_its_outcome() {
    let ns = TestNamespace::new("thread-cli").await;
    let server = Server::start(vec![
        Reply::sse(answer_stream("Paris.")),
        Reply::json(400, r#"{"error":{"message":"the model refuses"}}"#),
    ])
    .await;
    let _controller = start_controller(&ns);
    create(&ns, &thread("geo", &server)).await;
    let mut seen = Vec::new();

    let out = chat(&ns, "Capital of France?", &mut seen).await;
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains(&format!("turn {} of thread geo", seen[0])),
        "{printed}"
    );
    assert!(
        printed.contains("Capital of France?") && printed.contains("Paris."),
        "{printed}"
    );

    let out = chat(&ns, "And its population?", &mut seen).await;
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&seen[1]) && said.contains("Failed") && said.contains("ProviderError"),
        "{said}"
    );

    // `baton thread` prints the conversation turn by turn; `baton get` lists the thread.
    let out = baton(&ns, &["thread", "geo"])
        .wait_with_output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    let first = printed
        .find(&format!("turn 1: {}", seen[0]))
        .expect(&printed);
    let second = printed
        .find(&format!("turn 2: {}", seen[1]))
        .expect(&printed);
    assert!(first < printed.find("Paris.").unwrap() && printed.find("Paris.").unwrap() < second);
    let out = baton(&ns, &["get"]).wait_with_output().await.unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("THREAD") && printed.contains("geo"),
        "{printed}"
    );
    let out = baton(&ns, &["chat", "nowhere", "hi"])
        .wait_with_output()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("thread nowhere not found"));
    ns.cleanup().await;
}
