//! `baton transcript -f --server` on a run kept in PostgreSQL, as a person runs it: the real
//! `baton server` process, the CLI acting with its kubeconfig's own credential (an exec
//! plugin here, as cloud kubeconfigs have), and the server killed mid-run and started again.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::pg_runs::{
    free_addr, server_process, start_pg_controller, start_pg_worker, test_controller,
};
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;

/// The test's kubeconfig with its user replaced by `user` (YAML), written next to it.
pub(crate) fn kubeconfig_with_user(
    ns: &TestNamespace,
    name: &str,
    user: serde_yaml::Value,
) -> String {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for entry in config["users"].as_sequence_mut().unwrap() {
        entry["user"] = user.clone();
    }
    let file = std::env::temp_dir().join(format!("baton-{}-{name}.kubeconfig", ns.name));
    std::fs::write(&file, serde_yaml::to_string(&config).unwrap()).unwrap();
    file.to_string_lossy().into_owned()
}

/// A kubeconfig whose user signs in by an exec plugin printing `token` as an ExecCredential.
pub(crate) fn exec_kubeconfig(ns: &TestNamespace, name: &str, token: &str) -> String {
    let credential = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": { "token": token },
    });
    let file = std::env::temp_dir().join(format!("baton-{}-{name}.credential", ns.name));
    std::fs::write(&file, credential.to_string()).unwrap();
    let user = serde_yaml::to_value(serde_json::json!({
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "cat",
            "args": [file.to_string_lossy()],
            "interactiveMode": "Never",
        }
    }))
    .unwrap();
    kubeconfig_with_user(ns, name, user)
}

/// `baton transcript RUN -n NS --server BASE [extra]` with `kubeconfig`, its output piped.
fn transcript(ns: &TestNamespace, kubeconfig: &str, base: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    command
        .args(["transcript", "pg", "-n", &ns.name, "--server", base])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn transcript_follows_a_postgresql_run_with_the_kubeconfigs_credential_across_a_server_kill()
{
    let ns = TestNamespace::new("served-transcript").await;
    let (controller_user, seal) = test_controller(&ns).await;
    let addr = free_addr().await;
    let base = format!("http://{addr}");
    let mut server = server_process(&addr, &controller_user).await;
    let _controller = start_pg_controller(&ns, &base, seal);
    let lease = LeaseSpec {
        duration_seconds: 4,
        renew_seconds: 1,
        startup_seconds: 60,
    };
    let run = scripted_run("pg", vec![final_turn("told live", 6000)], vec![], lease);
    let runs: Api<AgentRun> = ns.api();
    create_run(&runs, &run).await;

    let reader = person(&ns, "alice", run_user_rules()).await;
    let alice = exec_kubeconfig(&ns, "alice", &reader);
    let mut follower = transcript(&ns, &alice, &base, &["-f"]).spawn().unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    let mut worker = start_pg_worker(&ns, "pg", 1).await;

    // The first lines come while the model still thinks: followed, not read at the end.
    let first = tokio::time::timeout(T, lines.next_line()).await;
    let Some(first) = first.expect("a first line").unwrap() else {
        let out = follower.wait_with_output().await.unwrap();
        panic!("no line: {}", String::from_utf8_lossy(&out.stderr));
    };
    let phase = runs.get("pg").await.unwrap().status.map(|s| s.phase);
    assert_ne!(phase, Some(Phase::Succeeded), "after {first:?}");

    // The server dies mid-run and comes back on its address: the follower reads on after the
    // last position it printed, and the worker's append waits it out.
    server.kill().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let _server = server_process(&addr, &controller_user).await;
    let ended = worker.wait(T).await;
    assert_eq!(ended, 0, "{}", worker.log_text());
    wait_phase(&runs, "pg", Phase::Succeeded, T).await;
    let mut followed = vec![first];
    while let Some(line) = tokio::time::timeout(T, lines.next_line())
        .await
        .unwrap()
        .unwrap()
    {
        followed.push(line);
    }
    let ended = tokio::time::timeout(T, follower.wait_with_output()).await;
    let ended = ended.expect("the follower ends with the run").unwrap();
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert!(ended.status.success(), "{stderr}");
    assert!(stderr.contains("reading on after position"), "{stderr}");

    // What was followed across the kill is the transcript, each line once.
    let read = transcript(&ns, &alice, &base, &[]).output().await.unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let read: Vec<String> = String::from_utf8_lossy(&read.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(followed, read);
    let answers = followed
        .iter()
        .filter(|l| l.starts_with("[assistant] told live"));
    let answers = answers.count();
    assert_eq!(answers, 1, "{followed:?}");

    // A person who may read runs but not transcripts is refused at once, not retried.
    let runs_only = vec![rule(&["agentruns"], &["get", "list", "watch"])];
    let nosy = person(&ns, "mallory", runs_only).await;
    let mallory = kubeconfig_with_user(
        &ns,
        "mallory",
        serde_yaml::to_value(serde_json::json!({ "token": nosy })).unwrap(),
    );
    let refused = transcript(&ns, &mallory, &base, &["-f"]).output();
    let refused = tokio::time::timeout(std::time::Duration::from_secs(20), refused).await;
    let refused = refused.expect("a refusal is not retried").unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("403"),
        "{stderr}"
    );
    ns.cleanup().await;
}

/// SIGTERM (a rollout, a drain): the server answers on for a moment while the Service drops
/// it, then stops, cutting a stream still open within its drain deadline.
#[tokio::test]
async fn a_server_told_to_stop_serves_on_a_moment_then_cuts_open_streams() {
    let ns = TestNamespace::new("server-sigterm").await;
    let addr = free_addr().await;
    let mut server = server_process(&addr, "nobody").await;
    let reader = person(&ns, "alice", run_user_rules()).await;
    let run = scripted_run(
        "quiet",
        vec![final_turn("never", 0)],
        vec![],
        LeaseSpec::default(),
    );
    create_run(&ns.api::<AgentRun>(), &run).await;
    let events = format!(
        "http://{addr}/api/v1/namespaces/{}/runs/quiet/events",
        ns.name
    );
    let mut stream = baton_testkit::sse::SseReader::open(&events, &reader, None).await;

    let told = std::time::Instant::now();
    let pid = server.id().expect("the server's PID") as i32;
    // SAFETY: kill(2) on the PID of the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let ready = reqwest::get(format!("http://{addr}/readyz")).await;
    assert!(ready.is_ok_and(|r| r.status().is_success()), "it serves on");
    let exited = tokio::time::timeout(T, server.wait())
        .await
        .expect("it stops");
    assert!(exited.unwrap().success());
    let took = told.elapsed();
    assert!(took >= std::time::Duration::from_secs(5), "{took:?}");
    let rest = tokio::time::timeout(T, stream.until_end()).await;
    assert!(
        rest.is_ok(),
        "the open stream was cut when the server stopped"
    );
    ns.cleanup().await;
}
