//! The runs of the end-to-end tests and what is checked after them: scripted runs whose shell
//! tools record their side effects outside baton (with `hack/effects.py`, over TCP), the effects
//! as recorded, a watch that records every ledger segment as it first appears, and the ledger
//! invariants (contiguous, no stale-fence write after a seal, nothing changed, every worker
//! segment written as `baton-worker`). Nothing here talks to the node itself: `node_support`
//! does. Used by `tests/node_*.rs` and `benches/node_figures.rs`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{
    AgentRun, AgentRunStatus, LeaseSpec, LedgerEvent, LedgerSegment, ScriptToolCall, ScriptTurn,
    ToolKind, ToolSpec,
};
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

/// Retries a read through short API hiccups (the API server test restarts it).
pub async fn retry<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                eprintln!("API read failed (retrying): {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("API read failed: {e}"),
        }
    }
}

/// Checks one run's ledger against its status and what the recorder saw.
pub fn check_ledger(
    name: &str,
    st: &AgentRunStatus,
    segments: &[LedgerSegment],
    recorded: &Recorded,
) {
    // Contiguous from 1.
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(s.spec.seq, i as i64 + 1, "{name}: ledger not contiguous");
    }
    // No write from a stale fence after a seal; nothing at all after `closed`.
    let mut sealed: Option<(i64, i64, bool)> = None; // (seq, fence, closed)
    let mut last_seal = 0;
    for s in segments {
        if let Some((seq, fence, closed)) = sealed {
            assert!(
                !closed,
                "{name}: segment {} written after the ledger was closed at {seq}",
                s.spec.seq
            );
            assert!(
                s.spec.fence >= fence,
                "{name}: segment {} has fence {} after the seal claimed{{{fence}}} at {seq}",
                s.spec.seq,
                s.spec.fence
            );
        }
        for e in &s.spec.events {
            match e {
                LedgerEvent::Claimed { fence, .. } => {
                    sealed = Some((s.spec.seq, *fence, false));
                    last_seal = *fence;
                }
                LedgerEvent::Closed { fence, .. } => {
                    sealed = Some((s.spec.seq, *fence, true));
                    last_seal = *fence;
                }
                LedgerEvent::AttemptStarted { fence, .. } => assert_eq!(
                    *fence, s.spec.fence,
                    "{name}: attemptStarted{{{fence}}} in a segment of fence {}",
                    s.spec.fence
                ),
                _ => {}
            }
        }
    }
    assert_eq!(
        st.fence, last_seal,
        "{name}: status fence {} is not the last seal's {last_seal}",
        st.fence
    );
    // Unchanged since first seen.
    for s in segments {
        let n = s.name_any();
        if let Some(seen) = recorded.segments.get(&n) {
            assert_eq!(
                Some(seen.rv.as_str()),
                s.resource_version().as_deref(),
                "{name}: segment {n} changed after it was written"
            );
            assert_eq!(
                seen.spec,
                serde_json::to_value(&s.spec).unwrap(),
                "{name}: segment {n} content changed"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// scripted runs

/// Lease settings for the tests: short, but generous enough for a loaded 2-core machine.
/// The worker's writes carry its User-Agent, so the API server records `baton-worker` (not
/// `unknown`) as their field manager: every segment but the controller's seals.
pub fn check_worker_field_manager(name: &str, segments: &[LedgerSegment]) {
    let sealed_by_controller = |seg: &LedgerSegment| {
        seg.spec
            .events
            .iter()
            .any(|e| matches!(e, LedgerEvent::Claimed { .. } | LedgerEvent::Closed { .. }))
    };
    for seg in segments.iter().filter(|s| !sealed_by_controller(s)) {
        let managers: Vec<&str> = seg
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.as_deref())
            .collect();
        assert_eq!(
            managers,
            ["baton-worker"],
            "{name}: segment {} has field managers {managers:?}",
            seg.spec.seq
        );
    }
}

pub fn lease() -> LeaseSpec {
    LeaseSpec {
        duration_seconds: 5,
        renew_seconds: 1,
        startup_seconds: 30,
    }
}

/// A shell command that records the effect of `turn` of `run` with the effects server at
/// `effects` (`host:port` of `hack/effects.py`, through bash's /dev/tcp), then sleeps `sleep_ms`.
pub fn effect_command(effects: &str, run: &str, turn: usize, sleep_ms: u64) -> String {
    let (host, port) = effects.rsplit_once(':').expect("host:port");
    format!(
        "bash -c 'echo \"{run} {turn} $BATON_STEP $BATON_FENCE\" > /dev/tcp/{host}/{port}'; sleep {}; echo ok {turn}",
        sleep_ms as f64 / 1000.0
    )
}

/// The shape of a scripted run.
#[derive(Clone, Debug)]
pub struct Script {
    pub turns: usize,
    /// Model "thinking" before each turn.
    pub think_ms: u64,
    /// How long each tool call takes (after its effect landed).
    pub tool_ms: u64,
}

impl Script {
    /// `turns` tool turns of `tool_ms` each, after a short think (200 ms).
    pub fn new(turns: usize, tool_ms: u64) -> Self {
        Self {
            turns,
            think_ms: 200,
            tool_ms,
        }
    }
}

impl Default for Script {
    fn default() -> Self {
        Self {
            turns: 4,
            think_ms: 300,
            tool_ms: 1000,
        }
    }
}

/// A run of `script.turns` tool turns (tool `sh`, non-idempotent) and a final answer.
pub fn scripted_run(effects: &str, name: &str, script: &Script) -> AgentRun {
    scripted_run_tagged(effects, name, name, script)
}

/// [`scripted_run`] whose effects are recorded under `tag` instead of the run's name (a
/// from-scratch restart of another run counts its effects as that run's).
pub fn scripted_run_tagged(effects: &str, name: &str, tag: &str, script: &Script) -> AgentRun {
    let mut turns: Vec<ScriptTurn> = (1..=script.turns)
        .map(|t| ScriptTurn {
            text: Some(format!("turn {t}: working")),
            tool_calls: vec![ScriptToolCall {
                tool: "sh".into(),
                arguments: [(
                    "command".to_string(),
                    effect_command(effects, tag, t, script.tool_ms),
                )]
                .into(),
            }],
            delay_milliseconds: Some(script.think_ms as i64),
        })
        .collect();
    turns.push(ScriptTurn {
        text: Some(format!("{tag}: all {} turns done", script.turns)),
        tool_calls: vec![],
        delay_milliseconds: Some(script.think_ms as i64),
    });
    run_with(name, turns, vec![shell_tool("sh")])
}

pub fn shell_tool(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        kind: ToolKind::Shell,
        description: None,
        idempotent: false,
        timeout_seconds: 120,
        probe: None,
    }
}

/// A run with these scripted turns and tools, test leases and maxAttempts 3.
pub fn run_with(name: &str, script: Vec<ScriptTurn>, tools: Vec<ToolSpec>) -> AgentRun {
    let l = lease();
    AgentRun::builder(name)
        .input("do the thing")
        .script(script)
        .tools(tools)
        .max_steps(100)
        .lease(l.duration_seconds, l.renew_seconds, l.startup_seconds)
        .max_attempts(3)
        .build()
}

/// The effects as `hack/effects.py` recorded them: one line per tool execution, `run turn step fence`.
pub struct Effects {
    pub lines: Vec<(String, usize, i64, i64)>,
}

impl Effects {
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((
                    it.next()?.to_string(),
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                ))
            })
            .collect();
        Self { lines }
    }

    pub fn count(&self, run: &str, turn: usize) -> usize {
        self.lines
            .iter()
            .filter(|(r, t, _, _)| r == run && *t == turn)
            .count()
    }

    /// turn → executions, for one run.
    pub fn per_turn(&self, run: &str) -> BTreeMap<usize, usize> {
        let mut m = BTreeMap::new();
        for (r, t, _, _) in &self.lines {
            if r == run {
                *m.entry(*t).or_default() += 1;
            }
        }
        m
    }
}

/// Model calls a run made again: every attempt that ended (died, or handed off) while a model
/// call was in flight or due — its last event before the next seal is neither a tool call in
/// flight (`stepIntent`) nor an end (`final`, `waitingInput`, `stopped`, `failed`) — has its
/// call made again by the next attempt (streamed text of a dead attempt is not promoted).
pub fn repeated_model_turns(segments: &[LedgerSegment]) -> usize {
    let mut repeated = 0;
    let mut last: Option<&LedgerEvent> = None; // last event of the current attempt
    for e in segments.iter().flat_map(|s| &s.spec.events) {
        match e {
            LedgerEvent::Claimed { .. } | LedgerEvent::Closed { .. } => {
                if let Some(l) = last.take()
                    && !matches!(
                        l,
                        LedgerEvent::StepIntent { .. }
                            | LedgerEvent::Final { .. }
                            | LedgerEvent::WaitingInput { .. }
                            | LedgerEvent::Stopped
                            | LedgerEvent::Failed { .. }
                    )
                {
                    repeated += 1;
                }
            }
            LedgerEvent::Handoff => {}
            LedgerEvent::AttemptStarted { .. } => last = Some(e),
            _ if last.is_some() => last = Some(e),
            _ => {}
        }
    }
    repeated
}

// ---------------------------------------------------------------------------------------------
// the segment recorder

/// A segment as first seen.
#[derive(Clone, Debug)]
pub struct Seen {
    pub rv: String,
    pub spec: serde_json::Value,
    pub at: Instant,
    pub run: String,
    pub fence: i64,
    pub seq: i64,
    pub events: Vec<LedgerEvent>,
}

#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub segments: BTreeMap<String, Seen>,
    /// Segments seen again with another resourceVersion or content.
    pub updated: BTreeSet<String>,
}

/// Watches the namespace's LedgerSegments and records each one as first seen (client clock).
pub struct Recorder {
    state: Arc<Mutex<Recorded>>,
    task: JoinHandle<()>,
}

impl Recorder {
    pub fn start(client: Client, ns: &str) -> Self {
        let state = Arc::new(Mutex::new(Recorded::default()));
        let api: Api<LedgerSegment> = Api::namespaced(client, ns);
        let out = state.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .touched_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let Ok(seg) = item else { continue };
                let name = seg.name_any();
                let rv = seg.resource_version().unwrap_or_default();
                let spec = serde_json::to_value(&seg.spec).unwrap();
                let mut st = out.lock().unwrap();
                match st.segments.get(&name) {
                    Some(seen) if seen.rv != rv || seen.spec != spec => {
                        st.updated.insert(name);
                    }
                    Some(_) => {}
                    None => {
                        st.segments.insert(
                            name,
                            Seen {
                                rv,
                                spec,
                                at: Instant::now(),
                                run: seg.spec.run.clone(),
                                fence: seg.spec.fence,
                                seq: seg.spec.seq,
                                events: seg.spec.events.clone(),
                            },
                        );
                    }
                }
            }
        });
        Self { state, task }
    }

    pub fn snapshot(&self) -> Recorded {
        self.state.lock().unwrap().clone()
    }

    /// When the first segment of `run` with a fence above `fence` that starts an attempt was
    /// first seen.
    pub fn attempt_started_after(&self, run: &str, fence: i64) -> Option<(Instant, i64)> {
        self.state
            .lock()
            .unwrap()
            .segments
            .values()
            .filter(|s| s.run == run && s.fence > fence)
            .filter(|s| {
                s.events
                    .iter()
                    .any(|e| matches!(e, LedgerEvent::AttemptStarted { .. }))
            })
            .map(|s| (s.at, s.fence))
            .min_by_key(|(at, _)| *at)
    }

    /// Waits (up to `timeout`) for [`attempt_started_after`](Self::attempt_started_after).
    pub async fn wait_attempt_started(
        &self,
        run: &str,
        fence: i64,
        timeout: Duration,
    ) -> (Instant, i64) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.attempt_started_after(run, fence) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no attempt of {run} after fence {fence} started within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}
