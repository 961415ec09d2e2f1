//! Worker benchmark: a 1,000-step scripted run against the real API server in KUBECONFIG.
//! Prints awaited API round trips per step (target 1.0), total API requests per step
//! (target <= 1.2), ledger bytes per transcript byte (target <= 1.3) and the worker's peak RSS.
//!
//!     cargo run --release --example worker_bench [-- STEPS [PAYLOAD_BYTES]]
//!
//! The worker runs in this process (`baton::worker::run`), its tools as real `sh` processes.

use baton_testkit::common::claim;
use baton_testkit::common::namespace;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let payload: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1024);
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

    let started = Instant::now();
    let exit = baton::worker::run(cfg).await;
    let elapsed = started.elapsed();
    let counts: ApiCounts = serde_json::from_str(&std::fs::read_to_string(&stats_file)?)?;
    let segments = claim::segments(&client, &ns, "bench").await;
    report(steps, payload, exit.code(), elapsed, &counts, &segments);
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    Ok(())
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
        "  worker peak RSS                   {} (VmHWM of the bench process, which runs the worker)",
        peak_rss()
    );
}

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "unknown".into())
}
