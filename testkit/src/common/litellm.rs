//! The LiteLLM proxy (PyPI's `litellm[proxy]`, in the venv hack/setup.sh installs) on a
//! loopback port of its own, with the mock models of tests/litellm/config.yaml: a model
//! server nobody here wrote, as teams reach their models. Stopped (by its PID) when dropped.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{ModelSpec, Provider};
use tokio::process::{Child, Command};

/// The proxy's own key (tests/litellm/config.yaml): every request must carry it.
pub const KEY: &str = "sk-baton-litellm-test-5f0c2a9e7d1b4c83";

/// The switches that keep the proxy from fetching anything at start (read in its source).
const LOCAL_ONLY: [&str; 5] = [
    "LITELLM_LOCAL_MODEL_COST_MAP",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS",
    "LITELLM_LOCAL_BLOG_POSTS",
    "LITELLM_LOCAL_POLICY_TEMPLATES",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS",
];

pub struct LiteLlm {
    _child: Child,
    pub url: String,
    /// Its version, as installed.
    pub version: String,
    log: PathBuf,
}

impl LiteLlm {
    pub async fn start() -> Self {
        Self::start_with("tests/litellm/config.yaml", &[]).await
    }

    /// The proxy with tests/litellm/counted.yaml: every model call that completed is a line of
    /// `calls` (counted at the server, outside baton).
    pub async fn counted(calls: &std::path::Path) -> Self {
        let calls = calls.display().to_string();
        Self::start_with(
            "tests/litellm/counted.yaml",
            &[("BATON_MODEL_CALLS_FILE", &calls)],
        )
        .await
    }

    /// The proxy with tests/litellm/steps.yaml: its model `mock-steps` asks for `steps` calls
    /// of the first tool a request offers, each with the one argument `argument` set to
    /// `command` (`{n}`: the step), then answers "done after <steps> steps"; every completed
    /// call a line of `calls`.
    pub async fn steps(
        calls: &std::path::Path,
        steps: usize,
        argument: &str,
        command: &str,
    ) -> Self {
        let calls = calls.display().to_string();
        let steps = steps.to_string();
        let env = [
            ("BATON_MODEL_CALLS_FILE", calls.as_str()),
            ("BATON_STEPS", steps.as_str()),
            ("BATON_STEP_ARGUMENT", argument),
            ("BATON_STEP_COMMAND", command),
        ];
        Self::start_with("tests/litellm/steps.yaml", &env).await
    }

    /// The proxy with `config` (relative to the repository), `env` added to its environment.
    pub async fn start_with(config: &str, env: &[(&str, &str)]) -> Self {
        baton::kube_util::ensure_crypto_provider();
        let venv = venv();
        let port = free_port();
        let log = std::env::temp_dir().join(format!("baton-litellm-{port}.log"));
        let config = crate::repo_root().join(config);
        let child = Command::new(format!("{venv}/bin/litellm"))
            .arg("--config")
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            // Everything it would fetch at start (prices, beta headers, blog posts, policy
            // templates, router presets) from the package instead: it reaches nothing but
            // loopback.
            .envs(LOCAL_ONLY.iter().map(|name| (*name, "True")))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting the LiteLLM proxy from {venv} (hack/setup.sh installs it): {e}")
            });
        let version = std::process::Command::new(format!("{venv}/bin/python"))
            .args([
                "-c",
                "import importlib.metadata as m; print(m.version('litellm'))",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let proxy = Self {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
            version,
            log,
        };
        proxy.wait_live().await;
        proxy
    }

    /// The Python of the proxy's venv (it has the stock `openai` SDK): what runs the example
    /// agents of tests/agents/ on this host.
    pub fn python() -> String {
        format!("{}/bin/python", venv())
    }

    /// `model` of the proxy through `provider`'s API (its Chat Completions under `/v1`, its
    /// Messages at the root, as each provider's endpoint is written).
    pub fn model(&self, provider: Provider, model: &str) -> ModelSpec {
        let endpoint = match provider {
            Provider::Anthropic => self.url.clone(),
            _ => format!("{}/v1", self.url),
        };
        ModelSpec {
            provider,
            name: Some(model.into()),
            endpoint: Some(endpoint),
            idle_timeout_seconds: Some(30),
            ..ModelSpec::default()
        }
    }

    /// Waits for its liveness answer; its logs in the panic when it never comes.
    async fn wait_live(&self) {
        let live = format!("{}/health/liveliness", self.url);
        if crate::answers_within(&live, Duration::from_secs(180)).await {
            return;
        }
        let err = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        panic!("the LiteLLM proxy never answered {live}:\n{err}");
    }
}

/// The proxy with tests/litellm/counted.yaml inside the real node's network namespace, on the
/// node's address (where pods reach it and nothing outside the namespace can), counting the
/// model calls that complete into `calls`. Stopped (by its PID) when dropped.
pub struct LiteLlmInNode {
    child: std::process::Child,
    /// `http://<node ip>:<port>`, as pods reach it.
    pub url: String,
}

impl LiteLlmInNode {
    pub fn start(node_ip: &str, netns: &str, calls: &std::path::Path) -> Self {
        let port = 20_000 + rand::random::<u16>() % 20_000;
        let log = std::env::temp_dir().join(format!("baton-litellm-node-{port}.log"));
        let config = crate::repo_root().join("tests/litellm/counted.yaml");
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .arg(format!("{}/bin/litellm", venv()))
            .arg("--config")
            .arg(&config)
            .args(["--host", node_ip, "--port", &port.to_string()])
            .envs(LOCAL_ONLY.iter().map(|name| (*name, "True")))
            .env("BATON_MODEL_CALLS_FILE", calls)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .spawn()
            .expect("starting the LiteLLM proxy in the node's network namespace");
        // uvicorn binds once the app has started: an accepted connection means it answers.
        let deadline = Instant::now() + Duration::from_secs(180);
        let probe = format!("exec 3<>/dev/tcp/{node_ip}/{port}");
        while !std::process::Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args(["bash", "-c", &probe])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "the LiteLLM proxy did not listen on {node_ip}:{port}: {}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        Self {
            child,
            url: format!("http://{node_ip}:{port}"),
        }
    }
}

impl Drop for LiteLlmInNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The venv hack/setup.sh installs the proxy in.
fn venv() -> String {
    std::env::var("BATON_LITELLM_VENV").unwrap_or_else(|_| {
        crate::cache_dir()
            .join("litellm-venv")
            .display()
            .to_string()
    })
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
