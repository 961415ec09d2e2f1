//! End to end: the API server becomes unreachable for 20 s (its process is SIGSTOPped) and
//! comes back; workers and the controller recover and the runs finish.
//!
//! It runs against a control plane of its OWN (`hack/control-plane.sh up` with a temporary
//! BATON_CP_DIR and free ports), torn down at the end, so no other test is disturbed.

mod e2e_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e_support::*;

/// A private control plane, taken down on drop.
struct OwnControlPlane {
    dir: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/control-plane.sh")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port()
}

impl OwnControlPlane {
    fn cmd(&self, sub: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg(script()).arg(sub).env("BATON_CP_DIR", &self.dir);
        c
    }

    async fn up() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "baton-cp-e2e-{}",
            rand::random::<u32>() % 1_000_000
        ));
        let cp = Self { dir };
        let mut c = cp.cmd("up");
        c.env("BATON_CP_API_PORT", free_port().to_string())
            .env("BATON_CP_ETCD_PORT", free_port().to_string())
            .env("BATON_CP_ETCD_PEER_PORT", free_port().to_string())
            .env("BATON_CP_TIMEOUT", "240");
        let out = tokio::task::spawn_blocking(move || c.output())
            .await
            .unwrap()
            .expect("running hack/control-plane.sh up");
        assert!(
            out.status.success(),
            "starting a private control plane failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        cp
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn signal(&self, sub: &str) {
        let out = self
            .cmd(sub)
            .output()
            .expect("running hack/control-plane.sh");
        assert!(
            out.status.success(),
            "{sub}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for OwnControlPlane {
    fn drop(&mut self) {
        let _ = self.cmd("resume-apiserver").output();
        let _ = self.cmd("down").output();
        let _ = std::fs::remove_file(self.dir.with_extension("lock"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_unreachable_for_20s_then_back_runs_finish() {
    let cp = OwnControlPlane::up().await;
    let env = E2e::start_with(
        "apiserver",
        Opts {
            kubeconfig: Some(cp.kubeconfig()),
            ..Opts::default()
        },
    )
    .await;
    let script = Script {
        turns: 8,
        think_ms: 300,
        tool_ms: 1000,
    };
    let names: Vec<String> = (1..=2).map(|i| format!("api-{i}")).collect();
    env.create_scripted(&names, &script).await;
    for name in &names {
        env.wait_worker(name, 1).await;
        env.wait_effect(name, 1).await;
    }

    cp.signal("pause-apiserver");
    tokio::time::sleep(Duration::from_secs(20)).await; // the outage itself, not a wait
    cp.signal("resume-apiserver");

    for name in &names {
        let st = env.wait_succeeded(name).await;
        assert_eq!(
            st.output.as_deref(),
            Some(format!("{name}: all 8 turns done").as_str())
        );
    }
    env.check_invariants(&names, true).await;
    env.finish().await;
    drop(cp);
}
