//! `make bench-byo`: a run that brings its own agent, its model calls through the worker's
//! gateway, against the real API server in KUBECONFIG and the LiteLLM proxy on loopback (mock
//! answers: the model's own time is nil, so what is measured is baton's). Prints:
//! - the latency a call gets through the gateway, against the same call made straight to the
//!   proxy by the same agent (p50/p99), live and replayed;
//! - replay speed (recorded calls answered per second) and the time from a worker's kill to
//!   the resumed agent's first live call (claim, worker start, the agent started again, every
//!   recorded call replayed);
//! - the awaited API round trips per model call (target 1.0) and the ledger's share of each;
//! - streamed calls: the time to the first content chunk and to the stream's end, through the
//!   gateway and straight to the proxy;
//! - a tool call through the tool gateway (the run's shell tool `sh`, `echo <n>` in the tools
//!   executor, its write-ahead intent awaited), live and replayed, and from a kill to the
//!   resumed agent's first live tool call.
//!
//!     cargo run --release --example byo_bench [-- CALLS]
//!
//! The worker is the release `baton worker` process, the agent container's executor a
//! `baton-exec serve` process beside it, the agent examples/byo_support/timed_agent.py (the
//! stock `openai` SDK) with the proxy venv's Python, or examples/byo_support/timed_tools.py
//! (the stock `mcp` client) with the agents venv's.

use std::time::{Duration, Instant, SystemTime};

use baton::crd::v1alpha1::{AgentContainer, AgentRun, LeaseSpec, LedgerEvent, Provider, ToolSpec};
use baton::worker::api_count::ApiCounts;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::namespace;
use baton_testkit::common::own_agent;
use baton_testkit::common::worker_proc::{scripted_run, shell_tool, spawn_agent_worker_with};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::Value;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(50);
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("bench-byo-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;
    let counted = std::env::temp_dir().join(format!("baton-{ns}-calls.jsonl"));
    let proxy = LiteLlm::counted(&counted).await;
    let bed = Bed {
        client: client.clone(),
        ns: ns.clone(),
    };

    let direct = format!("{}/v1", proxy.url);
    let live_env = [
        ("AGENT_CALLS", calls.to_string()),
        ("DIRECT_BASE_URL", direct),
        ("DIRECT_API_KEY", litellm::KEY.to_string()),
    ];
    let live = bed.create("live", &proxy, &live_env).await;
    let stats = std::env::temp_dir().join(format!("baton-{ns}-live-stats.json"));
    let live_report = bed.to_its_end(&live, Some(&stats)).await?;
    let counts: ApiCounts = serde_json::from_str(&std::fs::read_to_string(&stats)?)?;
    let held_env = [
        ("AGENT_CALLS", (calls + 1).to_string()),
        ("AGENT_HOLD_AFTER", calls.to_string()),
    ];
    let replayed = bed.create("replayed", &proxy, &held_env).await;
    let (replay_report, killed_at) = bed.killed_and_resumed(&replayed, calls).await?;
    report(calls, &live_report, &replay_report, killed_at, &counts);

    let mut streamed_env = live_env.to_vec();
    streamed_env.push(("AGENT_STREAM", "1".to_string()));
    let streamed = bed.create("streamed", &proxy, &streamed_env).await;
    report_streamed(calls, &bed.to_its_end(&streamed, None).await?);

    let tools_env = [("AGENT_TOOL_CALLS", calls.to_string())];
    let tools = bed.create_tools("tools", &proxy, &tools_env).await;
    let tools_report = bed.to_its_end(&tools, None).await?;
    let held_env = [
        ("AGENT_TOOL_CALLS", (calls + 1).to_string()),
        ("AGENT_HOLD_AFTER", calls.to_string()),
    ];
    let replayed_tools = bed.create_tools("tools-replayed", &proxy, &held_env).await;
    let (replayed_tools, killed_at) = bed.killed_and_resumed(&replayed_tools, calls).await?;
    report_tools(calls, &tools_report, &replayed_tools, killed_at);
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    Ok(())
}

struct Bed {
    client: Client,
    ns: String,
}

impl Bed {
    /// A run of the timed agent, `env` its container's.
    async fn create(&self, name: &str, proxy: &LiteLlm, env: &[(&str, String)]) -> AgentRun {
        let agent = ("timed_agent.py", LiteLlm::python());
        self.create_with(name, proxy, agent, vec![], env, 50).await
    }

    /// A run of the timed tool caller with the shell tool `sh`, `env` its container's.
    async fn create_tools(&self, name: &str, proxy: &LiteLlm, env: &[(&str, String)]) -> AgentRun {
        let agent = ("timed_tools.py", own_agent::python());
        let tools = vec![shell_tool("sh", false)];
        self.create_with(name, proxy, agent, tools, env, 10_000)
            .await
    }

    /// A run of examples/byo_support/`script` run by `python`, offered `tools`, at most
    /// `max_steps` tool calls.
    async fn create_with(
        &self,
        name: &str,
        proxy: &LiteLlm,
        (script, python): (&str, String),
        tools: Vec<ToolSpec>,
        env: &[(&str, String)],
        max_steps: i32,
    ) -> AgentRun {
        let agent = baton_testkit::repo_root()
            .join("examples/byo_support")
            .join(script);
        let mut run = scripted_run(name, vec![], tools, LeaseSpec::default());
        let spec = run.spec.agent_mut();
        spec.max_steps = max_steps;
        spec.model = proxy.model(Provider::Openai, "mock-gpt");
        spec.container = Some(AgentContainer {
            image: "unused:bench".into(),
            command: vec![python, agent.display().to_string()],
            env: env
                .iter()
                .map(|(k, v)| baton::crd::v1alpha1::PlainEnvVar {
                    name: k.to_string(),
                    value: v.clone(),
                })
                .collect(),
            ..AgentContainer::default()
        });
        let runs: Api<AgentRun> = Api::namespaced(self.client.clone(), &self.ns);
        runs.create(&PostParams::default(), &run)
            .await
            .expect("creating the run")
    }

    fn start(
        &self,
        run: &AgentRun,
        fence: i64,
        pod: &str,
        stats: Option<&std::path::Path>,
    ) -> baton_testkit::common::worker_proc::WorkerProc {
        let key = [("BATON_MODEL_API_KEY", litellm::KEY)];
        let stats_flag = stats.map(|p| format!("--stats-file={}", p.display()));
        let mut args = vec!["--log-format=json", "--admin-addr=none"];
        args.extend(stats_flag.as_deref());
        spawn_agent_worker_with(run, fence, pod, &key, &args)
    }

    /// Attempt `fence` of `run` to its end: its worker's exit code and how long it took.
    async fn attempt(
        &self,
        run: &AgentRun,
        fence: i64,
        stats: Option<&std::path::Path>,
    ) -> (i32, Duration) {
        let name = run.metadata.name.clone().unwrap_or_default();
        let pod = claim(&self.client, &self.ns, &name, fence).await;
        let started = Instant::now();
        let mut worker = self.start(run, fence, &pod, stats);
        let code = worker.wait(Duration::from_secs(1800)).await;
        (code, started.elapsed())
    }

    /// Runs `run`'s first attempt to its end (its worker's counts in `stats`); the agent's report.
    async fn to_its_end(
        &self,
        run: &AgentRun,
        stats: Option<&std::path::Path>,
    ) -> anyhow::Result<Value> {
        let (code, _) = self.attempt(run, 1, stats).await;
        let name = run.metadata.name.as_deref().unwrap_or_default();
        anyhow::ensure!(code == 0, "{name}'s worker exited {code}");
        self.output(run).await
    }

    /// Kills `run`'s first attempt once `calls` calls are recorded and runs the second to its
    /// end; the agent's report and when the kill came.
    async fn killed_and_resumed(
        &self,
        run: &AgentRun,
        calls: usize,
    ) -> anyhow::Result<(Value, SystemTime)> {
        let killed_at = self.kill_after(run, calls).await;
        let (code, _) = self.attempt(run, 2, None).await;
        let name = run.metadata.name.as_deref().unwrap_or_default();
        anyhow::ensure!(code == 0, "{name}'s resumed worker exited {code}");
        Ok((self.output(run).await?, killed_at))
    }

    /// Runs attempt 1 until `calls` model calls or tool results are recorded, then kills its
    /// worker (kill -9); when.
    async fn kill_after(&self, run: &AgentRun, calls: usize) -> SystemTime {
        let name = run.metadata.name.clone().unwrap_or_default();
        let pod = claim(&self.client, &self.ns, &name, 1).await;
        let mut worker = self.start(run, 1, &pod, None);
        loop {
            let listed = segments(&self.client, &self.ns, &name).await;
            let recorded = events(&listed)
                .iter()
                .filter(|(_, e)| {
                    matches!(
                        e,
                        LedgerEvent::GatewayCall { .. } | LedgerEvent::StepResult { .. }
                    )
                })
                .count();
            if recorded >= calls {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        worker.kill9().await;
        SystemTime::now()
    }

    /// The agent's report: the run's output, as JSON.
    async fn output(&self, run: &AgentRun) -> anyhow::Result<Value> {
        let runs: Api<AgentRun> = Api::namespaced(self.client.clone(), &self.ns);
        let name = run.metadata.name.clone().unwrap_or_default();
        let st = runs.get(&name).await?.status.unwrap_or_default();
        let output = st.output.unwrap_or_default();
        serde_json::from_str(&output).map_err(|e| {
            let ended = (st.outcome, st.reason, st.message);
            anyhow::anyhow!("{name}'s output {output:?}: {e}; it ended {ended:?}")
        })
    }
}

fn millis(report: &Value, key: &str) -> Vec<f64> {
    let list = report[key].as_array().cloned().unwrap_or_default();
    list.iter().filter_map(Value::as_f64).collect()
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn report(calls: usize, live: &Value, replayed: &Value, killed_at: SystemTime, counts: &ApiCounts) {
    let (through, direct) = (millis(live, "gateway_ms"), millis(live, "direct_ms"));
    let replay = millis(replayed, "gateway_ms");
    let replay = &replay[..calls.min(replay.len())];
    let p = |v: &[f64], q| quantile(v, q);
    println!("bring your own agent: {calls} calls (mock answers), release build");
    println!(
        "  a live call through the gateway: p50 {:.2} ms, p99 {:.2} ms; straight to the proxy: p50 {:.2} ms, p99 {:.2} ms; added p50 {:+.2} ms, p99 {:+.2} ms",
        p(&through, 0.5),
        p(&through, 0.99),
        p(&direct, 0.5),
        p(&direct, 0.99),
        p(&through, 0.5) - p(&direct, 0.5),
        p(&through, 0.99) - p(&direct, 0.99),
    );
    let total: f64 = replay.iter().sum();
    println!(
        "  a replayed call: p50 {:.2} ms, p99 {:.2} ms; replay speed {:.0} calls/s",
        p(replay, 0.5),
        p(replay, 0.99),
        replay.len() as f64 / (total / 1000.0)
    );
    if let Some(seconds) = kill_to_first_live(replayed, killed_at) {
        println!(
            "  from the kill to the resumed agent's first live call ({calls} replayed first): {seconds:.2} s"
        );
    }
    println!(
        "  awaited API round trips per model call: {:.2} ({} for {calls} calls, the attempt's start and end included)",
        counts.awaited as f64 / calls as f64,
        counts.awaited
    );
}

fn report_streamed(calls: usize, streamed: &Value) {
    let (through, direct) = (
        millis(streamed, "gateway_ms"),
        millis(streamed, "direct_ms"),
    );
    let first = millis(streamed, "gateway_first_ms");
    let direct_first = millis(streamed, "direct_first_ms");
    let p = |v: &[f64], q| quantile(v, q);
    println!(
        "  a streamed call ({calls}), to its first content chunk: through the gateway p50 {:.2} ms, p99 {:.2} ms; straight p50 {:.2} ms, p99 {:.2} ms; added p50 {:+.2} ms",
        p(&first, 0.5),
        p(&first, 0.99),
        p(&direct_first, 0.5),
        p(&direct_first, 0.99),
        p(&first, 0.5) - p(&direct_first, 0.5),
    );
    println!(
        "  a streamed call, to its end: through the gateway p50 {:.2} ms, p99 {:.2} ms; straight p50 {:.2} ms; added p50 {:+.2} ms",
        p(&through, 0.5),
        p(&through, 0.99),
        p(&direct, 0.5),
        p(&through, 0.5) - p(&direct, 0.5),
    );
}

fn report_tools(calls: usize, live: &Value, replayed: &Value, killed_at: SystemTime) {
    let live_ms = millis(live, "tool_ms");
    let replay = millis(replayed, "tool_ms");
    let replay = &replay[..calls.min(replay.len())];
    let p = |v: &[f64], q| quantile(v, q);
    println!(
        "  a tool call through the tool gateway ({calls} calls of `echo <n>`): live p50 {:.2} ms, p99 {:.2} ms; replayed p50 {:.2} ms, p99 {:.2} ms",
        p(&live_ms, 0.5),
        p(&live_ms, 0.99),
        p(replay, 0.5),
        p(replay, 0.99),
    );
    if let Some(seconds) = kill_to_first_live(replayed, killed_at) {
        println!(
            "  from the kill to the resumed agent's first live tool call ({calls} replayed first): {seconds:.2} s"
        );
    }
}

/// Seconds from the kill to the first call the resumed agent made past the replayed ones.
fn kill_to_first_live(replayed: &Value, killed_at: SystemTime) -> Option<f64> {
    let live_at = replayed["past_hold_at"].as_f64()?;
    let killed = killed_at.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    Some(live_at - killed.as_secs_f64())
}
