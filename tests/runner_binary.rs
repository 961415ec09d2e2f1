//! The `baton-runner` binary against the real local API server: it runs pods, `ctl` injects
//! faults through its control endpoint, and SIGTERM leaves no process behind.

mod common;

use std::time::{Duration, Instant};

use common::TestNamespace;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_baton-runner");
const WAIT: Duration = Duration::from_secs(20);

fn sleeper(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "baton".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                command: Some(vec!["sleep".into(), "300".into()]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn ctl(addr: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--addr")
        .arg(addr)
        .args(args)
        .output()
        .await
        .expect("running ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

async fn wait_phase(api: &Api<Pod>, name: &str, want: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = api.get(name).await.expect("reading pod");
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} never {want}: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

async fn pid_of(addr: &str, pod: &str) -> u32 {
    let deadline = Instant::now() + WAIT;
    loop {
        let (ok, out) = ctl(addr, &["pid", pod]).await;
        if ok {
            return out.parse().expect("a pid");
        }
        assert!(Instant::now() < deadline, "no pid for {pod}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn binary_runs_pods_takes_faults_and_leaves_nothing() {
    let ns = TestNamespace::new("runner_binary").await;
    let dir = std::env::temp_dir()
        .join("baton-runner-tests")
        .join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let addr_file = dir.join("addr");
    let mut runner = Command::new(BIN)
        .args([
            "run",
            "--namespace",
            &ns.name,
            "--node",
            &format!("node-{}", ns.name),
            "--remove-node",
        ])
        .args([
            "--control-addr",
            "127.0.0.1:0",
            "--control-addr-file",
            addr_file.to_str().unwrap(),
        ])
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .kill_on_drop(true)
        .spawn()
        .expect("starting baton-runner");
    let deadline = Instant::now() + WAIT;
    let addr = loop {
        if let Ok(text) = std::fs::read_to_string(&addr_file)
            && text.ends_with('\n')
        {
            break text.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the runner never wrote its control address"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let pods: Api<Pod> = ns.api();
    // The container command `baton` runs the local baton binary (next to baton-runner).
    let mut help = sleeper("help");
    help.spec.as_mut().unwrap().containers[0].command =
        Some(vec!["baton".into(), "--version".into()]);
    pods.create(&PostParams::default(), &help).await.unwrap();
    wait_phase(&pods, "help", "Succeeded").await;
    let log =
        std::fs::read_to_string(dir.join("logs").join(format!("{}_help.log", ns.name))).unwrap();
    assert!(log.contains(env!("CARGO_PKG_VERSION")), "{log}");

    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &sleeper(name))
            .await
            .unwrap();
    }
    let (a, b) = (format!("{}/a", ns.name), format!("{}/b", ns.name));
    let pid_a = pid_of(&addr, &a).await;
    let pid_b = pid_of(&addr, &b).await;
    wait_phase(&pods, "a", "Running").await;
    let (ok, list) = ctl(&addr, &["list"]).await;
    assert!(ok && list.contains(&format!("\"pid\":{pid_a}")), "{list}");

    assert!(ctl(&addr, &["kill", &a]).await.0);
    wait_phase(&pods, "a", "Failed").await;
    assert!(!alive(pid_a));
    let (ok, _) = ctl(&addr, &["kill", &format!("{}/nope", ns.name)]).await;
    assert!(!ok, "an unknown pod is an error");

    // SIGTERM: the runner kills what it started and exits.
    let pid = runner.id().unwrap();
    // SAFETY: signalling the child we spawned.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(WAIT, runner.wait())
        .await
        .expect("runner exits")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(!alive(pid_b), "the runner left pod b's process behind");
    ns.cleanup().await;
}
