//! The worker: what runs inside a worker pod. It proves it holds the run, resumes the turn
//! from the ledger, and drives the agent loop with every write fenced (docs/protocol.md).
//!
//! Pure decisions (`resume::plan`, `FlushPolicy`, `heartbeat::next_step`,
//! `finish::phase_change`) are kept apart from the I/O that carries them out.
//!
//! Choices worth knowing:
//! - The first append of an attempt is one segment: `attemptStarted`, then a `stepUnknown`
//!   for every step found open. Probes and re-runs come after, in later appends.
//! - A lost run (newer fence, closed ledger, lease not renewed in time) exits 3 without any
//!   further write; a worker superseded before it started exits 0 quietly.
//! - An older owner's segments that slip in before an append are folded into the replay
//!   after what this attempt buffered (the seal makes that practically impossible).
//! - Metrics (`baton_worker_*`) and probes are served on `--admin-addr`; a busy port only
//!   costs the endpoint, never the run.

pub mod admin;
mod agent;
pub mod api_count;
pub mod appender;
mod budget;
mod byo;
mod config;
mod finish;
mod guard;
mod heartbeat;
mod holder;
mod mcp_servers;
mod metrics;
pub mod model;
mod outage;
mod progress;
mod provider;
mod resume;
mod session;
mod spans;
pub mod toolbox;
pub mod tools;
pub mod warm;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, error, info, info_span};

use admin::AdminState;
use api_count::{ApiCounters, counted_client};
use appender::{Appender, stats_of};
use finish::{Exit, conclude};
use guard::{Interrupts, LostGuard, RETRY_FIRST};
use heartbeat::{RenewTiming, renew_loop, watch_run};
use metrics::{FenceRejection, WorkerMetrics};
use progress::{Progress, progress_loop};
use resume::Resumed;
use session::{Handles, Identity, Session};
use toolbox::Toolbox;
use tools::Tools;
use tools::executor::Executor;

use crate::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerSegment, Phase};
use crate::fence::Fence;
use crate::lease::LeaseError;
use crate::ledger::{Fitted, LedgerError, Replay, fit, recorded_history};
use crate::telemetry::init_logging_and_traces;
use crate::traces::RunTrace;
use holder::Holder;

pub use config::{DEFAULT_MAX_LEDGER_BYTES, WorkerArgs, WorkerConfig};

/// Errors that end an attempt without a decision.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("lease: {0}")]
    Lease(#[from] LeaseError),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    #[error("tools: {0}")]
    Tools(String),
    /// A turn claimed before it took its thread's agent: the controller never does that.
    #[error("the run has no spec.agent (a turn not yet admitted to its thread)")]
    NoAgent,
}

impl WorkerError {
    pub fn label(&self) -> &'static str {
        match self {
            WorkerError::Kube(_) => "kube",
            WorkerError::Lease(e) => e.label(),
            WorkerError::Ledger(e) => e.label(),
            WorkerError::Tools(_) => "tools",
            WorkerError::NoAgent => "no_agent",
        }
    }
}

/// `baton worker`'s entry point: sets up logging and the admin server, runs one attempt,
/// returns the exit code.
pub async fn cli_main(args: WorkerArgs) -> u8 {
    let traces = init_logging_and_traces(args.log_format, "baton-worker");
    forbid_dumping();
    let state = AdminState {
        metrics: Arc::new(WorkerMetrics::new()),
        ready: Arc::new(AtomicBool::new(false)),
    };
    let admin = admin::start(args.admin_addr, state.clone()).await;
    let exit = match WorkerConfig::try_from(args) {
        Ok(cfg) => run_observed(cfg, state).await,
        Err(err) => {
            error!(error = %err, "the worker's configuration does not hold");
            Exit::Failed
        }
    };
    if let Some(server) = admin {
        server.abort();
    }
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    exit.code()
}

/// No core dumps and no ptrace attach by anyone of this user: the process holds the model
/// key and the API token. (The tools run in another container, under another user, without
/// a shared process namespace; this closes the door for anything else.)
fn forbid_dumping() {
    // SAFETY: prctl(PR_SET_DUMPABLE) only changes a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not make the worker undumpable");
    }
}

/// Connects to the tools container's executor, if the pod has one. At once, whatever the
/// run: the executor ends when this connection does, so the pod ends with its worker.
async fn connect_tools(cfg: &WorkerConfig) -> Tools {
    let Some(socket) = &cfg.executor_socket else {
        return Err(format!(
            "this worker has no tools container ({} is not set)",
            crate::crd::env::EXECUTOR_SOCKET
        ));
    };
    Executor::connect(socket, cfg.executor_wait)
        .await
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// True when the run's tools need the executor (a shell tool, or any probe).
pub fn needs_executor(spec: &crate::crd::v1alpha1::AgentRunSpec) -> bool {
    spec.tools()
        .iter()
        .any(|t| t.kind == crate::crd::v1alpha1::ToolKind::Shell || t.probe.is_some())
}

/// Runs one attempt, with metrics nobody serves.
pub async fn run(cfg: WorkerConfig) -> Exit {
    let state = AdminState {
        metrics: Arc::new(WorkerMetrics::new()),
        ready: Arc::default(),
    };
    run_observed(cfg, state).await
}

/// Runs one attempt, counting into `state.metrics` and raising `state.ready` once the
/// attempt holds the run and has replayed its ledger.
pub async fn run_observed(cfg: WorkerConfig, state: AdminState) -> Exit {
    let span = info_span!("worker", run = %cfg.run, fence = %cfg.fence, pod = %cfg.pod);
    let counters = Arc::new(ApiCounters::default());
    let stats_file = cfg.stats_file.clone();
    let tools = connect_tools(&cfg).instrument(span.clone()).await;
    let exit = match attempt(cfg, tools, counters.clone(), state)
        .instrument(span)
        .await
    {
        Ok(exit) => exit,
        Err(err) => {
            error!(error = %err, label = err.label(), "the attempt failed");
            Exit::Failed
        }
    };
    if let Some(path) = stats_file {
        let counts = counters.snapshot();
        let _ = std::fs::write(path, serde_json::to_string(&counts).unwrap_or_default());
    }
    exit
}

/// Pure: a worker may start only if the run is `Running` under its fence with it as the worker.
pub fn may_start(status: Option<&AgentRunStatus>, fence: Fence, pod: &str) -> bool {
    status.is_some_and(|s| {
        s.phase == Phase::Running
            && crate::fence::status_names(s.fence, fence)
            && s.worker.as_deref() == Some(pod)
    })
}

async fn attempt(
    cfg: WorkerConfig,
    tools: Tools,
    counters: Arc<ApiCounters>,
    state: AdminState,
) -> Result<Exit, WorkerError> {
    let client = counted_client(counters.clone()).await?;
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &cfg.namespace);
    if let Some(warm) = &cfg.warm
        && !warm::wait_for_turn(&client, &cfg, warm).await
    {
        return Ok(Exit::Superseded);
    }
    let Some((run, holder)) = start_check(&client, &runs, &cfg).await? else {
        info!("superseded before starting: exiting");
        return Ok(Exit::Superseded);
    };
    hold(cfg, tools, counters, state, (runs, run, holder)).await
}

/// The attempt from the moment it holds the run: the first renewal, the session, the agent.
async fn hold(
    cfg: WorkerConfig,
    tools: Tools,
    counters: Arc<ApiCounters>,
    state: AdminState,
    (runs, run, holder): (Api<AgentRun>, AgentRun, Holder),
) -> Result<Exit, WorkerError> {
    let metrics = state.metrics.clone();
    let renewed_at = Instant::now();
    let renewal = holder.renew_lease().await;
    metrics.lease_renewed(renewed_at.elapsed());
    match renewal {
        Ok(_) => {}
        Err(err) if err.is_lost() => {
            metrics.fence_rejected(FenceRejection::LeaseLost);
            return Ok(Exit::Superseded);
        }
        Err(err) => return Err(err.into()),
    }
    if let Err(why) = &tools
        && needs_executor(&run.spec)
    {
        return Err(WorkerError::Tools(why.clone()));
    }
    let timing = RenewTiming::from_spec(&run.spec.lease);
    let guard = LostGuard::new(renewed_at, timing.duration);
    let interrupts = Interrupts::default();
    let parts = (runs, run, holder);
    let s = open_session(cfg, parts, tools, (guard, interrupts), counters, metrics).await?;
    let Some(mut s) = s else {
        return Ok(Exit::Lost);
    };
    state.ready.store(true, Ordering::Relaxed);
    s.report_unrecognized().await;
    let timed_out = crate::approval::claimed_for_timeout(&s.me.run, s.fence());
    let plan = resume::plan(&s.turn.replay, s.spec(), &s.io.toolbox, timed_out);
    let (ending, record) = match resume::resume(&mut s, plan).await {
        Resumed::End { ending, record } => (ending, record),
        Resumed::Continue => match s.agent().container.clone() {
            Some(container) => (byo::run_agent(&mut s, &container).await, true),
            None => (agent::agent_loop(&mut s).await, true),
        },
    };
    let ends_run = finish::outcome(&ending);
    let exit = conclude(&mut s, ending, record).await;
    spans::attempt_ended(&s.me.span, exit);
    if let (Exit::Done, Some(phase)) = (exit, ends_run) {
        spans::run_ended(&s.me.run, &s.me.trace, phase);
    }
    Ok(exit)
}

/// Reads the run and the Lease; `None` when this pod is not the run's current worker.
async fn start_check(
    client: &Client,
    runs: &Api<AgentRun>,
    cfg: &WorkerConfig,
) -> Result<Option<(AgentRun, Holder)>, WorkerError> {
    let Some(run) = runs.get_opt(&cfg.run).await? else {
        return Ok(None);
    };
    if !may_start(run.status.as_ref(), cfg.fence, &cfg.pod) {
        return Ok(None);
    }
    let holder = Holder::new(
        client.clone(),
        &run,
        &cfg.pod,
        cfg.fence,
        cfg.segment_budget,
        cfg.ledger_server.as_ref(),
    )?;
    match holder.verify_lease().await {
        Ok(_) => Ok(Some((run, holder))),
        Err(err) if err.is_lost() => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// Starts the background tasks, lists and replays the ledger. `None`: the ledger shows a
/// newer owner or a close, so the run is lost.
async fn open_session(
    cfg: WorkerConfig,
    (runs, run, holder): (Api<AgentRun>, AgentRun, Holder),
    tools: Tools,
    (guard, interrupts): (LostGuard, Interrupts),
    counters: Arc<ApiCounters>,
    metrics: Arc<WorkerMetrics>,
) -> Result<Option<Session>, WorkerError> {
    let agent = run.spec.agent.clone().ok_or(WorkerError::NoAgent)?;
    let heartbeat = spawn_heartbeat(&cfg, &runs, &run, &holder, &guard, &interrupts, &metrics);
    let Some(segments) = read_own_ledger(&holder, &guard).await? else {
        return Ok(None);
    };
    let replay = Replay::from_segments(&segments)?;
    let history = match recorded_history(&segments) {
        Some(fixed) => holder
            .read_history(run.thread_owner().map(|o| o.uid.as_str()), &fixed.turns)
            .await?
            .and_then(|turns| fit(turns, fixed.context.as_ref())),
        None => Ok(Fitted::default()),
    };
    let start = appender::Start {
        tail: replay.tail,
        stats: stats_of(&segments),
    };
    let (appender, ledger_stats) = Appender::spawn(
        holder.clone(),
        start,
        cfg.max_ledger_bytes,
        cfg.flush,
        guard.clone(),
        metrics.clone(),
    );
    let (progress_tx, progress_rx) = watch::channel(progress_at_start(&replay, &run));
    let writer = progress_loop(
        holder.clone(),
        progress_rx,
        ledger_stats.clone(),
        cfg.progress_interval,
        guard.clone(),
        metrics.clone(),
    );
    let progress_task = tokio::spawn(writer.in_current_span());
    let model = provider::Model::for_spec(&agent.model, cfg.api_key.clone())
        .map(Arc::new)
        .map_err(|e| e.to_string());
    let toolbox = Toolbox::new(&run.spec, &replay.mcp_tools);
    let trace = RunTrace::of(&run);
    let me = Identity {
        span: spans::attempt(&run, &trace, cfg.fence, &cfg.pod),
        trace,
        cfg,
        run,
        agent,
        history,
    };
    let io = Handles {
        holder,
        appender,
        ledger_stats,
        guard,
        interrupts,
        progress: progress_tx,
        counters,
        metrics,
        model,
        tools,
        toolbox,
        mcp: Default::default(),
    };
    Ok(Some(Session::new(me, io, replay, heartbeat, progress_task)))
}

/// The progress an attempt starts from: what its ledger already records.
fn progress_at_start(replay: &Replay, run: &AgentRun) -> Progress {
    Progress {
        steps: replay.last_step(),
        inputs_consumed: replay.inputs_consumed,
        resumed: resumed_message(replay),
        generation: run.metadata.generation,
        usage: replay.usage.clone(),
        ..Progress::default()
    }
}

/// The ledger as it stands, or None (the guard set) when it shows the run lost.
///
/// A transient failure (the ledger server rolling out, its database restarting) is retried
/// while the lease is held, as an append is: it costs a wait, not the attempt.
async fn read_own_ledger(
    holder: &Holder,
    guard: &LostGuard,
) -> Result<Option<Vec<LedgerSegment>>, WorkerError> {
    let mut backoff = RETRY_FIRST;
    loop {
        match holder.read_ledger().await {
            Err(err) if err.is_lost() => {
                guard.lose(err.to_string());
                return Ok(None);
            }
            Err(err) if err.is_transient() && !guard.is_lost() => {
                tracing::warn!(error = %err, "reading the ledger failed; retrying");
                if guard.pause_before_retry(&mut backoff).await {
                    return Ok(None);
                }
            }
            read => return Ok(Some(read?)),
        }
    }
}

/// Off the hot path, for the whole attempt: Lease renewals, the run watch (stop, a fence that
/// moved on), and SIGTERM.
fn spawn_heartbeat(
    cfg: &WorkerConfig,
    runs: &Api<AgentRun>,
    run: &AgentRun,
    holder: &Holder,
    guard: &LostGuard,
    interrupts: &Interrupts,
    metrics: &Arc<WorkerMetrics>,
) -> Vec<JoinHandle<()>> {
    let timing = RenewTiming::from_spec(&run.spec.lease);
    let renewals = renew_loop(holder.clone(), timing, guard.clone(), metrics.clone());
    let watch = watch_run(
        runs.clone(),
        cfg.run.clone(),
        cfg.fence,
        guard.clone(),
        interrupts.clone(),
    );
    vec![
        tokio::spawn(renewals.in_current_span()),
        tokio::spawn(watch.in_current_span()),
        tokio::spawn(on_sigterm(interrupts.clone())),
    ]
}

/// The Resumed condition's message when an earlier attempt had started.
fn resumed_message(replay: &Replay) -> Option<String> {
    (!replay.attempts.is_empty()).then(|| {
        format!(
            "resumed from ledger position {} after {} earlier attempt(s), {} step(s) recorded",
            replay.tail,
            replay.attempts.len(),
            replay.last_step()
        )
    })
}

async fn on_sigterm(interrupts: Interrupts) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    if term.recv().await.is_some() {
        info!("SIGTERM: handing the run off");
        interrupts.handoff.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_worker_of_a_running_run_may_start() {
        let status = AgentRunStatus {
            phase: Phase::Running,
            fence: Fence::new(3),
            worker: Some("r-w3".into()),
            ..Default::default()
        };
        assert!(may_start(Some(&status), Fence::new(3), "r-w3"));
        assert!(!may_start(Some(&status), Fence::new(2), "r-w3"));
        assert!(!may_start(Some(&status), Fence::new(3), "r-w2"));
        let finishing = AgentRunStatus {
            phase: Phase::Finishing,
            ..status
        };
        assert!(!may_start(Some(&finishing), Fence::new(3), "r-w3"));
        assert!(!may_start(None, Fence::new(3), "r-w3"));
    }
}
