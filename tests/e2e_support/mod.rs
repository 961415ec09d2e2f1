//! End-to-end harness: the controller (in-process), the local pod runner (in-process) running
//! real `baton worker` processes, scripted runs whose shell tool counts its side effects in a
//! file, a watch that records every ledger segment as it appears, and the invariant checks.
//!
//! Shared by `tests/e2e_*.rs` and the figures benchmark (`benches/e2e_figures.rs`).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::controller::{self, Config};
use baton::crd::v1alpha1::{
    AgentRun, AgentRunSpec, AgentRunStatus, AgentSpec, LeaseSpec, LedgerEvent, LedgerSegment,
    ModelSpec, Phase, ScriptToolCall, ScriptTurn, ToolKind, ToolSpec,
};
use baton::ledger::SegmentStore;
use baton::runner::{Runner, RunnerConfig, RunnerHandle};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

/// Generous deadline for a run to finish on a busy 2-core machine.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(150);

/// A client for the control plane in `kubeconfig` (else KUBECONFIG), with baton's CRDs installed.
pub async fn client(kubeconfig: Option<&Path>) -> Client {
    if let Some(path) = kubeconfig {
        let kc = kube::config::Kubeconfig::read_from(path).expect("reading the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("loading the kubeconfig");
        let client = Client::try_from(config).expect("building a client");
        baton::crd::install(client.clone(), Duration::from_secs(60))
            .await
            .expect("installing baton CRDs");
        return client;
    }
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: the end-to-end tests need a real API server. Start one with \
         `hack/control-plane.sh up` and `eval \"$(hack/control-plane.sh env)\"`, or run `make test`."
    );
    let client = Client::try_default()
        .await
        .expect("building a client from KUBECONFIG");
    baton::crd::install(client.clone(), Duration::from_secs(60))
        .await
        .expect("installing baton CRDs");
    client
}

/// Options of one environment.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Controller replicas (leader election on when > 1).
    pub controllers: usize,
    /// Worker image the controller gives new runs.
    pub worker_image: String,
    /// Extra images the runner maps to the baton binary.
    pub images: Vec<String>,
    /// Another control plane than KUBECONFIG's (its workers get it too).
    pub kubeconfig: Option<PathBuf>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            controllers: 1,
            worker_image: controller::DEFAULT_WORKER_IMAGE.into(),
            images: vec![],
            kubeconfig: None,
        }
    }
}

/// One end-to-end environment: a namespace, controller(s), a runner, a temp dir.
pub struct E2e {
    pub client: Client,
    pub ns: String,
    pub dir: PathBuf,
    pub effects: PathBuf,
    pub runner: RunnerHandle,
    pub controllers: Vec<Option<JoinHandle<()>>>,
    /// The leader-election identity of each controller replica.
    pub identities: Vec<String>,
    pub config: Config,
    pub recorder: Recorder,
    /// Every worker pod seen, with its image.
    pub pod_images: Arc<Mutex<BTreeMap<String, String>>>,
    pod_watch: JoinHandle<()>,
}

impl E2e {
    pub async fn start(test: &str) -> Self {
        Self::start_with(test, Opts::default()).await
    }

    pub async fn start_with(test: &str, opts: Opts) -> Self {
        let client = client(opts.kubeconfig.as_deref()).await;
        let suffix: u32 = rand::random::<u32>() % 1_000_000;
        let ns = format!(
            "e2e-{}-{suffix}",
            test.replace('_', "-").chars().take(40).collect::<String>()
        );
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .expect("creating the test namespace");
        let dir = std::env::temp_dir().join(format!("baton-{ns}"));
        std::fs::create_dir_all(&dir).expect("creating the temp dir");
        let effects = dir.join("effects");
        let recorder = Recorder::start(client.clone(), &ns);
        let pod_images = Arc::new(Mutex::new(BTreeMap::new()));
        let pod_watch = watch_pod_images(client.clone(), &ns, pod_images.clone());

        let bin = PathBuf::from(env!("CARGO_BIN_EXE_baton"));
        let mut rc = RunnerConfig::new(client.clone());
        rc.node_name = ns.clone();
        rc.namespace = Some(ns.clone());
        rc.baton_bin = bin.clone();
        rc.log_dir = dir.join("pods");
        rc.heartbeat = Duration::from_secs(5);
        rc.remove_node_on_shutdown = true;
        rc.extra_env = vec![(
            "RUST_LOG".into(),
            std::env::var("BATON_E2E_WORKER_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
        )];
        if let Some(kc) = &opts.kubeconfig {
            rc.extra_env
                .push(("KUBECONFIG".into(), kc.display().to_string()));
        }
        for image in opts
            .images
            .iter()
            .chain(std::iter::once(&opts.worker_image))
        {
            rc.image_bins.insert(image.clone(), bin.clone());
        }
        let runner = Runner::start(rc).await.expect("starting the pod runner");

        let config = Config {
            namespace: Some(ns.clone()),
            leader_election: opts.controllers > 1,
            leader_namespace: ns.clone(),
            leader_lease: Duration::from_secs(3),
            admin_addr: None,
            worker_image: opts.worker_image.clone(),
            ..Config::default()
        };
        let mut env = Self {
            client,
            ns,
            dir,
            effects,
            runner,
            controllers: Vec::new(),
            identities: Vec::new(),
            config,
            recorder,
            pod_images,
            pod_watch,
        };
        for _ in 0..opts.controllers {
            let (c, id) = env.spawn_controller(env.config.clone());
            env.controllers.push(Some(c));
            env.identities.push(id);
        }
        env
    }

    fn spawn_controller(&self, mut config: Config) -> (JoinHandle<()>, String) {
        config.identity = controller::default_identity();
        let id = config.identity.clone();
        let client = self.client.clone();
        let task = tokio::spawn(async move {
            if let Err(err) = controller::run(client, config).await {
                eprintln!("controller stopped: {err}");
            }
        });
        (task, id)
    }

    /// Kills controller `i` (aborts its task), as a crash would.
    pub fn kill_controller(&mut self, i: usize) {
        if let Some(c) = self.controllers[i].take() {
            c.abort();
        }
    }

    /// (Re)starts controller `i` with the environment's current config.
    pub fn start_controller(&mut self, i: usize) {
        self.kill_controller(i);
        let (c, id) = self.spawn_controller(self.config.clone());
        self.controllers[i] = Some(c);
        self.identities[i] = id;
    }

    pub fn runs(&self) -> Api<AgentRun> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn create(&self, run: &AgentRun) {
        self.runs()
            .create(&PostParams::default(), run)
            .await
            .expect("creating the run");
    }

    /// Creates one [`scripted_run`] of `script` per name.
    pub async fn create_scripted(&self, names: &[String], script: &Script) {
        for name in names {
            self.create(&scripted_run(&self.effects, name, script))
                .await;
        }
    }

    /// Creates a [`scripted_run`] and waits until its first worker ran turn 1's effect;
    /// returns that worker's (pod, fence, pid).
    pub async fn start_run(&self, name: &str, script: &Script) -> (String, i64, u32) {
        self.create(&scripted_run(&self.effects, name, script))
            .await;
        let worker = self.wait_worker(name, 1).await;
        self.wait_effect(name, 1).await;
        worker
    }

    pub async fn get(&self, name: &str) -> AgentRun {
        let runs = self.runs();
        retry(|| runs.get(name)).await
    }

    pub async fn status(&self, name: &str) -> AgentRunStatus {
        self.get(name).await.status.unwrap_or_default()
    }

    /// Polls until `ok(status)`, failing after `timeout` with the last status and the pod logs.
    pub async fn wait_run(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        ok: impl Fn(&AgentRunStatus) -> bool,
    ) -> AgentRunStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status(name).await;
            if ok(&st) {
                return st;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out ({timeout:?}) waiting for run {name} to be {what}; status: {st:#?}\n{}",
                    self.pod_logs(name)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_terminal(&self, name: &str) -> AgentRunStatus {
        self.wait_run(name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
            .await
    }

    /// Waits until the run is terminal and asserts it `Succeeded` (its pods' logs otherwise).
    pub async fn wait_succeeded(&self, name: &str) -> AgentRunStatus {
        let st = self.wait_terminal(name).await;
        assert_eq!(
            st.phase,
            Phase::Succeeded,
            "{st:#?}\n{}",
            self.pod_logs(name)
        );
        st
    }

    /// Waits until the run is Running at fence ≥ `min_fence` with its worker's process up;
    /// returns (pod, fence, pid).
    pub async fn wait_worker(&self, name: &str, min_fence: i64) -> (String, i64, u32) {
        let deadline = Instant::now() + RUN_TIMEOUT;
        loop {
            let st = self.status(name).await;
            if st.phase == Phase::Running
                && st.fence >= min_fence
                && let Some(pod) = st.worker.clone()
                && let Some(pid) = self.runner.pid(&self.ns, &pod)
            {
                return (pod, st.fence, pid);
            }
            assert!(
                Instant::now() < deadline,
                "run {name} never got a live worker at fence >= {min_fence}; status: {st:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the effect of `turn` of `run` has landed (its line is in the effects file).
    pub async fn wait_effect(&self, run: &str, turn: usize) {
        let deadline = Instant::now() + RUN_TIMEOUT;
        while self.effects().count(run, turn) == 0 {
            assert!(
                Instant::now() < deadline,
                "the effect of turn {turn} of {run} never landed\n{}",
                self.pod_logs(run)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Gracefully deletes a pod (its default grace period), as a drain or eviction does.
    pub async fn delete_pod(&self, pod: &str) {
        match self.pods().delete(pod, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if baton::kube_util::is_not_found(&e) => {}
            Err(e) => panic!("deleting pod {pod}: {e}"),
        }
    }

    /// Sets `spec.stop`.
    pub async fn stop(&self, name: &str) {
        let patch = serde_json::json!({"spec": {"stop": true}});
        self.runs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("setting spec.stop");
    }

    /// Appends an entry to `spec.inputs`.
    pub async fn answer(&self, name: &str, text: &str) {
        let run = self.get(name).await;
        let mut inputs = run.spec.inputs.clone();
        inputs.push(text.into());
        let patch = serde_json::json!({"spec": {"inputs": inputs}});
        self.runs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("adding an input");
    }

    pub fn effects(&self) -> Effects {
        Effects::read(&self.effects)
    }

    pub async fn ledger(&self, name: &str) -> Vec<LedgerSegment> {
        let run = self.get(name).await;
        SegmentStore::for_run(self.client.clone(), &run)
            .list()
            .await
            .expect("listing the ledger (contiguous)")
    }

    /// The worker pod logs of one run (for failure messages).
    pub fn pod_logs(&self, run: &str) -> String {
        let mut out = String::new();
        let Ok(dir) = std::fs::read_dir(self.dir.join("pods")) else {
            return out;
        };
        let mut files: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if !name.starts_with(&format!("{}_{run}-w", self.ns)) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            out.push_str(&format!("---- {name} (last lines) ----\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Checks every end-of-run invariant for `names`, which must all be terminal.
    pub async fn check_invariants(&self, names: &[String], non_idempotent: bool) {
        let effects = self.effects();
        let recorded = self.recorder.snapshot();
        for name in names {
            let run = self.get(name).await;
            let st = run.status.clone().unwrap_or_default();
            assert!(st.phase.is_terminal(), "{name} is not terminal: {st:#?}");
            let segments = self.ledger(name).await;
            check_ledger(name, &st, &segments, &recorded);
            check_worker_field_manager(name, &segments);
            if non_idempotent {
                for (turn, n) in effects.per_turn(name) {
                    assert!(
                        n <= 1,
                        "{name}: the non-idempotent effect of turn {turn} ran {n} times\n{}",
                        self.pod_logs(name)
                    );
                }
            }
        }
        assert!(
            recorded.updated.is_empty(),
            "segments changed after they were written: {:?}",
            recorded.updated
        );
    }

    /// Stops everything this environment started; the namespace is deleted.
    pub async fn finish(mut self) {
        for i in 0..self.controllers.len() {
            self.kill_controller(i);
        }
        self.runner.shutdown().await;
        self.recorder.stop();
        self.pod_watch.abort();
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn watch_pod_images(
    client: Client,
    ns: &str,
    out: Arc<Mutex<BTreeMap<String, String>>>,
) -> JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .touched_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(pod) = item {
                let image = baton::controller::pod::pod_image(&pod);
                out.lock().unwrap().insert(pod.name_any(), image);
            }
        }
    })
}

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
fn check_worker_field_manager(name: &str, segments: &[LedgerSegment]) {
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

/// Where the shell tools of a test record their effects: a file they append to (workers on this
/// machine), or `host:port` of `hack/effects.py`, which appends what it receives to a file (workers
/// in the node's pods, through bash's /dev/tcp).
#[derive(Clone, Copy, Debug)]
pub enum Sink<'a> {
    File(&'a Path),
    Tcp(&'a str),
}

impl<'a> From<&'a Path> for Sink<'a> {
    fn from(path: &'a Path) -> Self {
        Sink::File(path)
    }
}

impl<'a> From<&'a PathBuf> for Sink<'a> {
    fn from(path: &'a PathBuf) -> Self {
        Sink::File(path)
    }
}

/// A shell command that records the effect of `turn` of `run`, then sleeps `sleep_ms`.
pub fn effect_command<'a>(
    sink: impl Into<Sink<'a>>,
    run: &str,
    turn: usize,
    sleep_ms: u64,
) -> String {
    let line = format!("{run} {turn} $BATON_STEP $BATON_FENCE");
    let record = match sink.into() {
        Sink::File(path) => format!("echo \"{line}\" >> '{}'", path.display()),
        Sink::Tcp(addr) => {
            let (host, port) = addr.rsplit_once(':').expect("host:port");
            format!("bash -c 'echo \"{line}\" > /dev/tcp/{host}/{port}'")
        }
    };
    format!(
        "{record}; sleep {}; echo ok {turn}",
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
pub fn scripted_run<'a>(effects: impl Into<Sink<'a>>, name: &str, script: &Script) -> AgentRun {
    scripted_run_tagged(effects, name, name, script)
}

/// [`scripted_run`] whose effects are recorded under `tag` instead of the run's name (a
/// from-scratch restart of another run counts its effects as that run's).
pub fn scripted_run_tagged<'a>(
    effects: impl Into<Sink<'a>>,
    name: &str,
    tag: &str,
    script: &Script,
) -> AgentRun {
    let effects = effects.into();
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
    AgentRun::new(
        name,
        AgentRunSpec {
            input: "do the thing".into(),
            inputs: vec![],
            thread_key: None,
            agent: AgentSpec {
                model: ModelSpec {
                    script,
                    ..ModelSpec::default()
                },
                system_prompt: None,
                max_steps: 100,
                tools,
            },
            lease: lease(),
            max_attempts: 3,
            stop: false,
            ttl_seconds_after_finished: None,
            worker: Default::default(),
        },
    )
}

/// The effects file: one line per tool execution, `run turn step fence`.
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
