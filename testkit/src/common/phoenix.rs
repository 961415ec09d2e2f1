//! Arize Phoenix (PyPI's `arize-phoenix`, in the venv hack/setup.sh installs): a real trace
//! backend that receives OTLP over HTTP, on a loopback port of its own (or on the node's
//! address: `crate::node::NodePhoenix`), its database in a directory of its own. Read back through its REST API. Stopped (by its PID) when dropped,
//! and its directory removed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

pub struct Phoenix {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:<port>`: its UI, its REST API, and its OTLP/HTTP receiver
    /// (`/v1/traces`).
    pub url: String,
    log: PathBuf,
}

impl Phoenix {
    /// Phoenix on a loopback port of its own.
    pub async fn start() -> Self {
        let port = crate::free_port();
        let url = format!("http://127.0.0.1:{port}");
        Self::serve(Command::new(phoenix_bin()), "127.0.0.1", port, url).await
    }

    /// Phoenix run by `command` (its `phoenix` program, maybe behind `nsenter`), listening on
    /// `host:port`, reached from this process at `url`; once it answers there.
    pub(crate) async fn serve(mut command: Command, host: &str, port: u16, url: String) -> Self {
        baton::kube_util::ensure_crypto_provider();
        let grpc = crate::free_port();
        let dir = std::env::temp_dir().join(format!("baton-phoenix-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for Phoenix");
        let log = std::env::temp_dir().join(format!("baton-phoenix-{port}.log"));
        let child = command
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", &dir)
            .env("PHOENIX_HOST", host)
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            // Nothing from outside the machine: no usage telemetry, and none of what it fetches
            // on its own at start (a docs MCP server, a WASM sandbox binary).
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting Phoenix (hack/setup.sh installs it): {e}"));
        let phoenix = Self {
            child,
            dir,
            url,
            log,
        };
        phoenix.wait_live().await;
        phoenix
    }

    /// The environment that points an OTLP exporter at it, exporting within 100 ms of a
    /// span's end (a worker killed a moment later has exported what it ended).
    pub fn otlp_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.url.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ]
    }

    /// Every span of project `default` it holds, as its REST API gives them, page by page.
    pub async fn spans(&self) -> Vec<Value> {
        let (client, url) = (
            reqwest::Client::new(),
            format!("{}/v1/projects/default/spans", self.url),
        );
        let mut spans = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut query = vec![("limit", "1000".to_string())];
            query.extend(cursor.take().map(|c| ("cursor", c)));
            let page = reqwest::Url::parse_with_params(&url, &query).expect("Phoenix's URL");
            let body: Value = client
                .get(page)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .expect("Phoenix's spans")
                .json()
                .await
                .expect("Phoenix's spans as JSON");
            spans.extend(body["data"].as_array().cloned().unwrap_or_default());
            match body["next_cursor"].as_str() {
                Some(next) if !next.is_empty() => cursor = Some(next.to_string()),
                _ => return spans,
            }
        }
    }

    /// Waits until its spans hold one that `found` takes (polling its API); fails showing
    /// what it holds and the end of its log.
    pub async fn wait_for_span(&self, what: &str, found: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.spans().await;
            if spans.iter().any(&found) {
                return spans;
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "Phoenix shows no {what} within 60 s; it holds {}:\n{}\nits log's end:\n{}",
                    spans.len(),
                    serde_json::to_string_pretty(&spans).unwrap_or_default(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn wait_live(&self) {
        let health = format!("{}/healthz", self.url);
        if crate::answers_within(&health, Duration::from_secs(90)).await {
            return;
        }
        let log = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        panic!("Phoenix did not answer within 90 s:\n{log}");
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `phoenix` of the venv hack/setup.sh installs it in.
pub(crate) fn phoenix_bin() -> String {
    let venv = std::env::var("BATON_PHOENIX_VENV").unwrap_or_else(|_| {
        crate::cache_dir()
            .join("phoenix-venv")
            .display()
            .to_string()
    });
    format!("{venv}/bin/phoenix")
}
