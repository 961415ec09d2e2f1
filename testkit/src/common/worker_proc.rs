//! Real `baton worker` processes for the worker tests: spawned with the pod's environment,
//! signalled like a kubelet (or a crash) would. Each has a real executor (`baton-exec serve`,
//! what the pod's tools container runs) on a socket of its own.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use kube::ResourceExt;
use tokio::process::{Child, Command};

/// A running worker process.
pub struct WorkerProc {
    pub child: Child,
    pub pod: String,
    pub log: PathBuf,
    /// The executor beside it: it exits when the worker's connection ends.
    pub executor: Child,
    /// The agent container's executor, for a run that brings its own agent.
    pub agent: Option<Child>,
}

/// The executor binary: built beside `baton` (`cargo build -p baton-exec`, as hack/test.sh
/// does before the tests).
pub fn executor_bin() -> PathBuf {
    let baton = crate::baton_bin();
    let exec = baton.with_file_name("baton-exec");
    assert!(
        exec.exists(),
        "{} is missing: run `cargo build -p baton-exec` first",
        exec.display()
    );
    exec
}

/// Starts an executor serving on a fresh socket, with its own workspace directory.
fn spawn_executor(namespace: &str, pod: &str) -> (Child, PathBuf) {
    spawn_executor_in(&format!("baton-exec-{namespace}-{pod}"))
}

/// An executor on `<tmp>/<name>/exec.sock` (what the pod's agent container runs, its
/// directory the one the worker shares with it).
fn spawn_executor_in(name: &str) -> (Child, PathBuf) {
    spawn_executor_with(name, &[])
}

/// [`spawn_executor_in`] with `env` in the executor's environment (a container's own, which
/// what it runs inherits).
fn spawn_executor_with(name: &str, env: &[(&str, &str)]) -> (Child, PathBuf) {
    let dir = std::env::temp_dir().join(name);
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).expect("creating the executor's workspace");
    let socket = dir.join("exec.sock");
    let log = std::fs::File::create(dir.join("executor.log")).expect("creating the executor log");
    let child = Command::new(executor_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .arg("--workspace")
        .arg(&workspace)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("starting baton-exec serve");
    (child, socket)
}

/// Starts `baton worker` for `run` at `fence` as `pod`, with extra flags.
pub fn spawn_worker(
    namespace: &str,
    run: &str,
    fence: i64,
    pod: &str,
    extra: &[&str],
) -> WorkerProc {
    spawn_worker_env(namespace, run, fence, pod, extra, &[])
}

/// `baton worker` like [`spawn_worker`], with `env` added to its environment.
pub fn spawn_worker_env(
    namespace: &str,
    run: &str,
    fence: i64,
    pod: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> WorkerProc {
    let log = std::env::temp_dir().join(format!("baton-{namespace}-{pod}.log"));
    let file = std::fs::File::create(&log).expect("creating the worker log");
    let (executor, socket) = spawn_executor(namespace, pod);
    let mut command = Command::new(crate::baton_bin());
    command
        .arg("worker")
        .args(extra)
        .env("BATON_EXECUTOR_SOCKET", &socket)
        .env("BATON_RUN", run)
        .env("BATON_NAMESPACE", namespace)
        .env("BATON_FENCE", fence.to_string())
        .env("BATON_POD", pod)
        .env("RUST_LOG", "info,baton=debug,kube=warn");
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .expect("starting baton worker");
    WorkerProc {
        child,
        pod: pod.to_string(),
        log,
        executor,
        agent: None,
    }
}

/// `baton worker` for attempt `fence` of `run`, which brings its own agent: besides the tools'
/// executor, the agent container's (its directory given as `BATON_AGENT_DIR`) with the
/// container's `env` as the pod gives it, and `env` added to the worker's.
pub fn spawn_agent_worker(
    run: &AgentRun,
    fence: i64,
    pod: &str,
    env: &[(&str, &str)],
) -> WorkerProc {
    let args = ["--log-format=json", "--admin-addr=none"];
    spawn_agent_worker_with(run, fence, pod, env, &args)
}

/// [`spawn_agent_worker`] with the worker's flags given.
pub fn spawn_agent_worker_with(
    run: &AgentRun,
    fence: i64,
    pod: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> WorkerProc {
    let (namespace, name) = (run.namespace().unwrap_or_default(), run.name_any());
    let container = run.spec.agent().and_then(|a| a.container.as_ref());
    let agent_env: Vec<(&str, &str)> = container
        .iter()
        .flat_map(|c| c.env.iter().map(|v| (v.name.as_str(), v.value.as_str())))
        .collect();
    let executor = format!("baton-agent-{namespace}-{pod}");
    let (agent, socket) = spawn_executor_with(&executor, &agent_env);
    let dir = socket
        .parent()
        .expect("the socket's directory")
        .display()
        .to_string();
    let mut env = env.to_vec();
    env.push(("BATON_AGENT_DIR", &dir));
    let mut worker = spawn_worker_env(&namespace, &name, fence, pod, args, &env);
    worker.agent = Some(agent);
    worker
}

impl WorkerProc {
    pub fn pid(&self) -> i32 {
        self.child.id().expect("worker still running") as i32
    }

    /// Sends `signal` (libc::SIGKILL, SIGSTOP, SIGCONT, SIGTERM).
    pub fn signal(&self, signal: i32) {
        // SAFETY: sends a signal to our own child process.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "signalling the worker");
    }

    /// Waits for the exit code, failing the test after `timeout` (the log is printed).
    pub async fn wait(&mut self, timeout: Duration) -> i32 {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.expect("waiting for the worker").code().unwrap_or(-1),
            Err(_) => panic!(
                "worker {} did not exit in {timeout:?}; log:\n{}",
                self.pod,
                self.log_text()
            ),
        }
    }

    /// kill -9 and reap.
    pub async fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait().await;
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Polls `check` every 50 ms until it returns true, failing after `timeout` with `what`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

use baton::crd::v1alpha1::{
    AgentRun, LeaseSpec, Phase, ScriptToolCall, ScriptTurn, ToolKind, ToolSpec,
};

/// Creates `run` in `runs`; its UID.
pub async fn create_run(runs: &kube::Api<AgentRun>, run: &AgentRun) -> String {
    let created = runs
        .create(&Default::default(), run)
        .await
        .expect("creating the run");
    kube::ResourceExt::uid(&created).expect("a created run has a UID")
}

/// Waits until run `name` of `runs` is in `phase`.
pub async fn wait_phase(runs: &kube::Api<AgentRun>, name: &str, phase: Phase, timeout: Duration) {
    wait_until(timeout, &format!("{name} {phase}"), || async {
        let run = runs.get(name).await.expect("reading the run");
        run.status.is_some_and(|s| s.phase == phase)
    })
    .await;
}

/// A scripted turn that calls `tool` with `command`.
pub fn shell_turn(text: &str, tool: &str, command: &str, delay_ms: i64) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        tool_calls: vec![ScriptToolCall {
            tool: tool.into(),
            arguments: [("command".to_string(), command.to_string())].into(),
        }],
        delay_milliseconds: Some(delay_ms),
        usage: None,
    }
}

/// A final scripted turn.
pub fn final_turn(text: &str, delay_ms: i64) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        tool_calls: vec![],
        delay_milliseconds: Some(delay_ms),
        usage: None,
    }
}

/// A shell tool.
pub fn shell_tool(name: &str, idempotent: bool) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        kind: ToolKind::Shell,
        description: None,
        idempotent,
        timeout_seconds: 60,
        probe: None,
        approval: None,
        mcp: None,
    }
}

/// An AgentRun with a scripted model.
pub fn scripted_run(
    name: &str,
    script: Vec<ScriptTurn>,
    tools: Vec<ToolSpec>,
    lease: LeaseSpec,
) -> AgentRun {
    AgentRun::builder(name)
        .input("do the thing")
        .script(script)
        .tools(tools)
        .max_steps(50)
        .lease(
            lease.duration_seconds,
            lease.renew_seconds,
            lease.startup_seconds,
        )
        .max_attempts(3)
        .build()
}

/// A counter file for side effects: each run of the tool appends a line.
pub fn counter_file(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("baton-counter-{tag}-{}", rand::random::<u32>()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Lines in a counter file.
pub fn count(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}
