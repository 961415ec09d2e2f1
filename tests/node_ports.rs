//! baton's listeners on the real node (`hack/node.sh`), played from where an attacker in the
//! cluster stands: a pod with no credential at all (no ServiceAccount token mounted), whose
//! network namespace `curl` runs in. The chart is installed with `webhook.clientCA`, the CA of
//! the client certificate the node's API server presents to webhooks (`hack/node.sh`).

use std::process::Command;
use std::time::{Duration, Instant};

use baton_testkit::e2e::{Script, retry};
use baton_testkit::node::*;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

/// A pod of baton's image that only sleeps, with no ServiceAccount token: the attacker's place
/// in the cluster. The host PID of its container (its network namespace).
async fn attacker_pod(env: &NodeEnv) -> u32 {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "attacker"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "attacker", "image": "baton:dev", "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    }))
    .unwrap();
    env.pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(pid) = env.container_pid_of("attacker", "attacker").await {
            return pid;
        }
        assert!(Instant::now() < deadline, "the attacker pod never ran");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `curl ARGS` in the network namespace of process `pid`: its exit code and what it printed
/// (`-w '%{http_code}'`: `000` when no HTTP answer came).
fn curl_from(pid: u32, args: &[&str]) -> (i32, String) {
    let out = Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-n",
            "curl",
            "-sk",
            "-o",
            "/dev/null",
        ])
        .args(["-w", "%{http_code}"])
        .args(args)
        .output()
        .expect("running curl through nsenter");
    let code = out.status.code().unwrap_or(-1);
    (
        code,
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

async fn cluster_ip(client: &Client, service: &str) -> String {
    let services: Api<Service> = Api::namespaced(client.clone(), SYSTEM_NS);
    let service = retry(|| services.get(service)).await;
    service.spec.and_then(|s| s.cluster_ip).unwrap()
}

/// A review as the API server would send it, asking whether `alice` may make a run that
/// lends the Secret `model-key`: answered, it would tell the sender what `alice` may read.
fn forged_review(namespace: &str) -> String {
    let run = serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": "forged", "namespace": namespace},
        "spec": {"input": "hi", "agent": {"model": {
            "provider": "openai", "name": "m",
            "apiKeySecretRef": {"name": "model-key", "key": "key"},
        }}},
    });
    baton_testkit::common::webhook::forged_review(namespace, run).to_string()
}

/// Restarts of the release's controller and server containers, and whether any last ended
/// OOMKilled.
async fn restarts(client: &Client) -> (i32, bool) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let params = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let list = retry(|| pods.list(&params)).await;
    let statuses = list.items.into_iter().flat_map(|p| {
        p.status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
    });
    statuses.fold((0, false), |(n, oom), s| {
        let killed = s
            .last_state
            .and_then(|l| l.terminated)
            .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"));
        (n + s.restart_count, oom || killed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_pod_without_credentials_is_not_read_by_the_webhook_nor_starves_the_server() {
    let env = NodeEnv::start("ports").await;
    servers_ready(&env.client).await;
    let before = restarts(&env.client).await;
    env.create(&env.scripted("steady", &Script::new(6, 1500)))
        .await;
    let pid = attacker_pod(&env).await;
    let webhook = format!(
        "https://{}:443{}",
        cluster_ip(&env.client, &format!("{RELEASE}-webhook")).await,
        baton::webhook::PATH
    );
    let review = env.dir.join("review.json");
    std::fs::write(&review, forged_review(&env.ns)).unwrap();
    let data = format!("@{}", review.display());
    let post = ["-H", "content-type: application/json", "--max-time", "15"];

    // No certificate: the handshake ends it, no HTTP answer at all.
    let (code, status) = curl_from(
        pid,
        &[&post[..], &["--data-binary", &data, &webhook]].concat(),
    );
    assert_eq!(
        status, "000",
        "a review with no client certificate was answered (curl {code})"
    );
    assert_ne!(code, 0);
    // The API server's own certificate, from the same pod: read and answered. What refused
    // the request above is the certificate, not the network.
    let pki = node_dir().join("pki");
    let (cert, key) = (
        pki.join("webhook-client.crt"),
        pki.join("webhook-client.key"),
    );
    let with_cert = [
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let (_, status) = curl_from(
        pid,
        &[&post[..], &with_cert, &["--data-binary", &data, &webhook]].concat(),
    );
    assert_eq!(status, "200", "the API server's certificate is read");

    // A burst of large bodies with no credential, against both: the webhook's end in the
    // handshake; the server's ledger route answers from the headers, unread: 413 by the
    // announced length, 400 for a server that keeps no ledger (the chart's default), 401 for
    // one that does (tests/server/hostile.rs).
    let big = env.dir.join("big.bin");
    std::fs::write(&big, vec![b' '; 56 * 1024 * 1024]).unwrap();
    let big_data = format!("@{}", big.display());
    let server = cluster_ip(&env.client, SERVER).await;
    let append = format!(
        "http://{server}:80{}",
        baton::ledger::served::ledger_path(&env.ns, "steady")
    );
    let mut sent = Vec::new();
    for round in 0..5 {
        for _ in 0..4 {
            let (webhook, append, big_data) = (webhook.clone(), append.clone(), big_data.clone());
            sent.push(std::thread::spawn(move || {
                let webhook = curl_from(
                    pid,
                    &["--max-time", "20", "--data-binary", &big_data, &webhook],
                );
                // Every other one announces no length (chunked) and is sent at 64 KiB/s: a
                // withheld body, as a slow attacker would send it.
                let slow: &[&str] = if round % 2 == 0 {
                    &[]
                } else {
                    &["-H", "transfer-encoding: chunked", "--limit-rate", "64k"]
                };
                let args = [
                    slow,
                    &["--max-time", "30", "--data-binary", &big_data, &append],
                ]
                .concat();
                (webhook, curl_from(pid, &args))
            }));
        }
    }
    for burst in sent {
        let ((_, webhook), (_, server)) = burst.join().unwrap();
        assert_eq!(
            webhook, "000",
            "the webhook answered a client with no certificate"
        );
        assert!(
            ["400", "401", "413"].contains(&server.as_str()),
            "the server answered an unauthenticated append with {server}"
        );
    }
    env.wait_succeeded("steady").await;
    let after = restarts(&env.client).await;
    assert_eq!(
        after, before,
        "a controller or server container restarted (restarts, OOMKilled) during the burst"
    );
    env.finish().await;
}
