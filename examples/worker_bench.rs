//! Worker benchmark: a 1,000-step scripted run against the real API server in KUBECONFIG.
//! Prints awaited API round trips per step (target 1.0), total API requests per step
//! (target <= 1.2), ledger bytes per transcript byte (target <= 1.3), the worker's peak RSS
//! and its CPU time per step; twice, with traces off and on, and their ratio.
//!
//!     cargo run --release --example worker_bench [-- STEPS [PAYLOAD_BYTES]]
//!
//! Each run is a child process of this one (the same binary), set up as a worker pod is: its
//! logging and, for the second, traces exported over OTLP/HTTP to a real Arize Phoenix (the
//! venv hack/setup.sh installs) that this process starts. The worker runs in the child
//! (`baton::worker::run`), its tools as real `sh` processes.

use baton_testkit::common::claim;
use baton_testkit::common::namespace;
use baton_testkit::common::phoenix::Phoenix;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use baton::crd::v1alpha1::{
    AgentRun, AgentRunSpec, AgentSpec, LeaseSpec, LedgerEvent, ModelSpec, ScriptToolCall,
    ScriptTurn, ToolKind, ToolSpec,
};
use baton::fence::Fence;
use baton::worker::WorkerConfig;
use baton::worker::api_count::ApiCounts;
use baton::worker::appender::FlushPolicy;

/// Set in a child: it runs the worker once and prints its figures.
const CHILD: &str = "BATON_WORKER_BENCH_CHILD";

/// What a child prints before its figures' JSON.
const FIGURES: &str = "figures: ";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let payload: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1024);
    if std::env::var_os(CHILD).is_some() {
        return child(steps, payload).await;
    }
    let off = run_child(steps, payload, &[])?;
    let phoenix = Phoenix::start().await;
    let on = run_child(steps, payload, &phoenix.otlp_env())?;
    anyhow::ensure!(
        !off.traces && on.traces,
        "the second run, and only it, exports traces"
    );
    let spans = settled_spans(&phoenix).await;
    compare(steps, &off, &on, &spans);
    Ok(())
}

/// Runs one child with `env` added, echoing what it prints; its figures.
fn run_child(steps: usize, payload: usize, env: &[(&str, String)]) -> anyhow::Result<Figures> {
    let output = std::process::Command::new(std::env::current_exe()?)
        .args([steps.to_string(), payload.to_string()])
        .env(CHILD, "1")
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!(
        "{}",
        stdout
            .lines()
            .filter(|l| !l.starts_with(FIGURES))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );
    anyhow::ensure!(
        output.status.success(),
        "the bench's child failed: {}",
        output.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(FIGURES))
        .ok_or_else(|| anyhow::anyhow!("the child printed no figures"))?;
    Ok(serde_json::from_str(line)?)
}

/// One run's figures, per step.
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    traces: bool,
    awaited: f64,
    requests: f64,
    cpu_ms: f64,
    wall_ms: f64,
    peak_rss_kb: u64,
}

fn compare(steps: usize, off: &Figures, on: &Figures, spans: &BTreeMap<String, usize>) {
    println!("\nworker benchmark, {steps} steps: traces off / on (exported to Phoenix) / on : off");
    let row = |what: &str, off: f64, on: f64| {
        println!(
            "  {what:<34} {off:>9.3} {on:>9.3} {:>9.3}",
            on / off.max(f64::MIN_POSITIVE)
        );
    };
    row("awaited API round trips per step", off.awaited, on.awaited);
    row("API requests per step", off.requests, on.requests);
    row("worker CPU per step (ms)", off.cpu_ms, on.cpu_ms);
    row("wall time per step (ms)", off.wall_ms, on.wall_ms);
    row(
        "worker peak RSS (MiB)",
        off.peak_rss_kb as f64 / 1024.0,
        on.peak_rss_kb as f64 / 1024.0,
    );
    let total: usize = spans.values().sum();
    println!(
        "  spans Phoenix received             {total} ({:.2} per step: {spans:?})",
        total as f64 / steps as f64
    );
}

/// The spans Phoenix holds once it has taken in all it was sent (three counts two seconds
/// apart agree), by name.
async fn settled_spans(phoenix: &Phoenix) -> BTreeMap<String, usize> {
    let (mut last, mut same) = (usize::MAX, 0);
    loop {
        let spans = phoenix.spans().await;
        same = if spans.len() == last { same + 1 } else { 0 };
        last = spans.len();
        if same == 2 {
            let mut by_name = BTreeMap::new();
            for span in &spans {
                let name = span["name"].as_str().unwrap_or_default();
                let kind = name.split(' ').next().unwrap_or_default().to_string();
                *by_name.entry(kind).or_default() += 1;
            }
            return by_name;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A child: the worker's logging and traces as a pod sets them up, one run, its figures.
async fn child(steps: usize, payload: usize) -> anyhow::Result<()> {
    let traces = baton::telemetry::init_logging_and_traces(Default::default(), "baton-worker");
    let traced = traces.is_some();
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("bench-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;

    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &ns);
    runs.create(&PostParams::default(), &bench_run(steps, payload))
        .await?;
    let pod = claim::claim(&client, &ns, "bench", 1).await;
    let stats_file = std::env::temp_dir().join(format!("baton-bench-{ns}.json"));
    let cfg = config(&ns, &pod, &stats_file);

    let (started, cpu_before) = (Instant::now(), cpu_time());
    let exit = baton::worker::run(cfg).await;
    // The last spans exported, as a worker does before it exits: part of what traces cost.
    if let Some(traces) = traces {
        tokio::task::spawn_blocking(move || traces.shutdown()).await?;
    }
    let (elapsed, cpu) = (started.elapsed(), cpu_time() - cpu_before);
    let counts: ApiCounts = serde_json::from_str(&std::fs::read_to_string(&stats_file)?)?;
    let segments = claim::segments(&client, &ns, "bench").await;
    report(steps, payload, exit.code(), elapsed, &counts, &segments);
    println!(
        "  worker CPU time                   {:.2} s ({:.3} ms/step, traces {})",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1000.0 / steps as f64,
        if traced { "on" } else { "off" }
    );
    let per_step = |n: u64| n as f64 / steps as f64;
    let figures = Figures {
        traces: traced,
        awaited: per_step(counts.awaited),
        requests: per_step(counts.total()),
        cpu_ms: cpu.as_secs_f64() * 1000.0 / steps as f64,
        wall_ms: elapsed.as_secs_f64() * 1000.0 / steps as f64,
        peak_rss_kb: peak_rss_kb(),
    };
    println!("{FIGURES}{}", serde_json::to_string(&figures)?);
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    Ok(())
}

/// CPU time (user and system) this process has used, all its threads.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

fn config(ns: &str, pod: &str, stats_file: &std::path::Path) -> WorkerConfig {
    WorkerConfig {
        run: "bench".into(),
        namespace: ns.into(),
        fence: Fence::new(1),
        pod: pod.into(),
        api_key: None,
        max_ledger_bytes: baton::worker::DEFAULT_MAX_LEDGER_BYTES,
        flush: FlushPolicy::default(),
        handoff_grace: Duration::from_secs(20),
        progress_interval: Duration::from_secs(1),
        stats_file: Some(stats_file.to_path_buf()),
        segment_budget: baton::ledger::SEGMENT_BUDGET_BYTES,
        executor_socket: Some(executor_socket()),
        agent_dir: None,
        executor_wait: Duration::from_secs(10),
        mcp_headers_dir: baton::crd::MCP_HEADERS_DIR.into(),
        ledger_server: None,
        warm: None,
    }
}

/// The executor the shell steps go through, served from a thread of this process (in a pod
/// it is the tools container's process).
fn executor_socket() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-bench-exec-{}", std::process::id()));
    baton_exec::server::serve_in_thread(&dir, Duration::from_secs(120))
        .expect("creating the executor's directory")
}

/// `steps` turns, each with ~`payload` bytes of model text and a shell call that prints
/// ~`payload` bytes, then a final answer.
fn bench_run(steps: usize, payload: usize) -> AgentRun {
    let text = "lorem ipsum ".repeat(payload / 24 + 1);
    let printed = "x".repeat(payload / 2);
    let mut script: Vec<ScriptTurn> = (0..steps)
        .map(|i| ScriptTurn {
            text: Some(format!("step {i}: {text}")),
            tool_calls: vec![ScriptToolCall {
                tool: "sh".into(),
                arguments: [("command".to_string(), format!("echo {printed}"))].into(),
            }],
            delay_milliseconds: None,
            usage: None,
        })
        .collect();
    script.push(ScriptTurn {
        text: Some("done".into()),
        ..Default::default()
    });
    let sh = ToolSpec {
        name: "sh".into(),
        kind: ToolKind::Shell,
        description: None,
        idempotent: false,
        timeout_seconds: 60,
        probe: None,
        approval: None,
        mcp: None,
    };
    AgentRun::new(
        "bench",
        AgentRunSpec {
            input: "benchmark".into(),
            inputs: vec![],
            approvals: vec![],
            approval_timeout_seconds: None,
            thread_key: None,
            thread: None,
            agent: Some(AgentSpec {
                model: ModelSpec {
                    script,
                    ..Default::default()
                },
                system_prompt: None,
                max_steps: steps as i32 + 1,
                tools: vec![sh],
                approval: None,
                container: None,
            }),
            lease: LeaseSpec::default(),
            max_attempts: 3,
            stop: false,
            ttl_seconds_after_finished: None,
            worker: Default::default(),
            workspace: None,
            budget: None,
        },
    )
}

/// Transcript bytes: what the conversation holds (message text, tool inputs, tool outputs).
fn transcript_bytes(events: &[LedgerEvent]) -> usize {
    events
        .iter()
        .map(|e| match e {
            LedgerEvent::Message { content, .. } => content.len(),
            LedgerEvent::StepIntent {
                input,
                tool,
                call_id,
                ..
            } => input.len() + tool.len() + call_id.len(),
            LedgerEvent::StepResult { output, .. } => output.len(),
            LedgerEvent::Final { output } => output.len(),
            _ => 0,
        })
        .sum()
}

fn report(
    steps: usize,
    payload: usize,
    exit: u8,
    elapsed: Duration,
    counts: &ApiCounts,
    segments: &[baton::crd::v1alpha1::LedgerSegment],
) {
    let events: Vec<LedgerEvent> = segments
        .iter()
        .flat_map(|s| s.spec.events.clone())
        .collect();
    let event_bytes: usize = events
        .iter()
        .map(|e| serde_json::to_vec(e).map(|v| v.len()).unwrap_or(0))
        .sum();
    let object_bytes: usize = segments
        .iter()
        .map(|s| serde_json::to_vec(s).map(|v| v.len()).unwrap_or(0))
        .sum();
    let transcript = transcript_bytes(&events).max(1);
    let per_step = |n: u64| n as f64 / steps as f64;
    println!(
        "worker benchmark: {steps} scripted steps, ~{payload} B of model text per step (exit {exit})"
    );
    println!(
        "  wall time                         {:.2} s ({:.2} ms/step)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / steps as f64
    );
    println!(
        "  awaited API round trips per step  {:.3}  ({} awaited, incl. attemptStarted and final)",
        per_step(counts.awaited),
        counts.awaited
    );
    println!(
        "  total API requests per step       {:.3}  ({} total: {:?})",
        per_step(counts.total()),
        counts.total(),
        counts
    );
    println!(
        "  ledger segments / events          {} / {}",
        segments.len(),
        events.len()
    );
    println!(
        "  ledger bytes per transcript byte  {:.3}  (events {} B / transcript {} B)",
        event_bytes as f64 / transcript as f64,
        event_bytes,
        transcript
    );
    println!(
        "  stored objects per transcript B   {:.3}  (with object metadata: {} B)",
        object_bytes as f64 / transcript as f64,
        object_bytes
    );
    println!(
        "  worker peak RSS                   {} kB (VmHWM of the process that runs the worker)",
        peak_rss_kb()
    );
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse().ok())
        })
        .unwrap_or_default()
}
