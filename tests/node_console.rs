//! The web console in a real browser against the chart's own `baton server` on the node:
//! tests/browser/console.mjs drives Debian's Chromium (headless, through npm's
//! playwright-core) to sign in with a ServiceAccount's token, chat on a thread and see the
//! answer stream in, reload a run's page mid-run and see it continue without a repeat,
//! approve a gated call from the inbox and see the run go on, and be refused a namespace the
//! token may not read. Its screenshots land in target/console-screenshots.

use std::path::Path;
use std::process::Command;

use baton::crd::v1alpha1::{AgentThread, AgentThreadSpec, ApprovalPolicy, Phase, ScriptTurn};
use baton_testkit::e2e::{run_with, shell_tool};
use baton_testkit::node::*;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use serde_json::json;

const SLOW_STEPS: usize = 8;
const GATED_MARK: &str = "deploy-approved-by-a-person";

fn turn(value: serde_json::Value) -> ScriptTurn {
    serde_json::from_value(value).expect("a scripted turn")
}

/// A thread whose scripted agent answers slowly enough to be seen streaming.
fn thread() -> AgentThread {
    let script = vec![turn(json!({
        "text": "The capital of France is Paris. It has been the capital for centuries.",
        "delayMilliseconds": 1500,
    }))];
    let agent = run_with("geo", script, vec![]).spec.agent;
    let spec: AgentThreadSpec = serde_json::from_value(json!({"agent": agent})).unwrap();
    AgentThread::new("geo", spec)
}

fn slow_run() -> baton::crd::v1alpha1::AgentRun {
    let mut script: Vec<ScriptTurn> = (1..=SLOW_STEPS)
        .map(|i| {
            turn(json!({
                "text": format!("step {i}"),
                "toolCalls": [{"tool": "sh", "arguments": {"command": format!("echo slow-{i}")}}],
                "delayMilliseconds": 1200,
            }))
        })
        .collect();
    script.push(turn(json!({"text": "slow and done"})));
    run_with("slow", script, vec![shell_tool("sh")])
}

fn gated_run() -> baton::crd::v1alpha1::AgentRun {
    let mut deploy = shell_tool("deploy");
    deploy.approval = Some(ApprovalPolicy::Required);
    let script = vec![
        turn(json!({
            "text": "deploying",
            // A right-to-left override after a comment: an approver must see it, not read
            // the text after it reversed.
            "toolCalls": [{"tool": "deploy", "arguments": {"command": format!("echo {GATED_MARK} # \u{202E}txt.exe")}}],
        })),
        turn(json!({"text": "deployed"})),
    ];
    run_with("gated", script, vec![deploy])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_console_in_a_real_browser() {
    let env = NodeEnv::start("console").await;
    servers_ready(&env.client).await;
    let other = format!("{}-other", env.ns);
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let meta = ObjectMeta {
        name: Some(other.clone()),
        ..Default::default()
    };
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let token = person(
        &env.client,
        &env.ns,
        "alice",
        vec![
            rule(
                &["agentruns"],
                &["get", "list", "watch", "create", "patch", "update"],
            ),
            rule(&["agentthreads"], &["get", "list", "watch"]),
            rule(&["ledgersegments"], &["get", "list", "watch"]),
        ],
    )
    .await;
    // The attacker of the login CSRF page: a real token, with rights of its own here.
    let attacker = person(
        &env.client,
        &env.ns,
        "mallory",
        vec![rule(&["agentruns"], &["get", "list"])],
    )
    .await;
    let threads: Api<AgentThread> = env.api();
    threads
        .create(&PostParams::default(), &thread())
        .await
        .unwrap();
    env.create(&gated_run()).await;
    env.wait_run("gated", RUN_TIMEOUT, "WaitingApproval", |s| {
        s.phase == Phase::WaitingApproval
    })
    .await;
    env.create(&slow_run()).await;

    let cluster_ip = server_cluster_ip(&env.client).await;
    let relay = Relay::start(&format!("{cluster_ip}:80"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shots = root.join("target/console-screenshots");
    let out = Command::new("node")
        .arg(root.join("tests/browser/console.mjs"))
        .current_dir(root.join("tests/browser"))
        .env("CONSOLE_URL", relay.url())
        .env("TOKEN", &token)
        .env("ATTACKER_TOKEN", &attacker)
        .env("NS", &env.ns)
        .env("FORBIDDEN_NS", &other)
        .env("THREAD", "geo")
        .env("SLOW_RUN", "slow")
        .env("SLOW_STEPS", SLOW_STEPS.to_string())
        .env("GATED_RUN", "gated")
        .env("GATED_MARK", GATED_MARK)
        .env("SHOTS", &shots)
        .output()
        .expect("running node tests/browser/console.mjs (hack/setup.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{said}");
    assert!(
        out.status.success(),
        "the browser test failed:\n{said}\n{}",
        env.pod_logs("gated").await
    );
    for name in [
        "02-runs",
        "04-thread-answered",
        "06-run-ended",
        "07-inbox",
        "09-forbidden-namespace",
        "10-login-csrf-refused",
    ] {
        assert!(
            shots.join(format!("{name}.png")).exists(),
            "no screenshot {name}"
        );
    }
    // The approved call ran once, as the ledger records.
    env.wait_succeeded("gated").await;
    drop(relay);
    let _ = namespaces.delete(&other, &DeleteParams::default()).await;
    env.finish().await;
}
