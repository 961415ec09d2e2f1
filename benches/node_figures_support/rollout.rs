//! Section (e) beyond the pod start: the controllers' rollout restart and the image's size.

use std::time::{Duration, Instant};

use baton::fence::Fence;

use baton_testkit::e2e::Script;
use baton_testkit::node::{
    IMAGE, NodeEnv, RUN_TIMEOUT, leaderless_until_rolled, restart_controllers,
};

/// `kubectl rollout restart` of the controllers: the longest time no Ready controller pod led,
/// and how long a run created right after the restart waited for its claim.
pub async fn controller_rollout(env: &NodeEnv) -> (Duration, Duration) {
    restart_controllers();
    let created = Instant::now();
    env.create(&env.scripted("during-rollout", &Script::new(1, 100)))
        .await;
    let claim = async {
        env.wait_run("during-rollout", RUN_TIMEOUT, "claimed", |s| {
            s.fence >= Fence::new(1)
        })
        .await;
        created.elapsed()
    };
    let (leaderless, delayed) = tokio::join!(
        leaderless_until_rolled(&env.client, Duration::from_secs(180)),
        claim
    );
    env.wait_succeeded("during-rollout").await;
    (leaderless, delayed)
}

pub fn image_size() -> String {
    let out = std::process::Command::new("podman")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Size}}",
            &format!("docker.io/library/{IMAGE}"),
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let bytes: f64 = String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse()
                .unwrap_or(0.0);
            format!("{:.1} MB (podman image inspect)", bytes / 1e6)
        }
        _ => "unknown (podman image inspect failed)".into(),
    }
}
