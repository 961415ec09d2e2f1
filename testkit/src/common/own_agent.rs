//! Runs that bring their own agent, for the worker tests: the agent is a script of
//! `tests/agents/` run by the agents venv's python (hack/setup.sh installs it from the agent
//! image's own pins; on the bed there is no image to run), and an attempt is a real worker
//! with the agent container's executor beside it.

use baton::cli::{ApproveArgs, DenyArgs, RunArgs, Session, Verb};
use baton::crd::v1alpha1::{AgentContainer, AgentRun, LeaseSpec, PlainEnvVar, Provider};
use kube::Api;

use super::TestNamespace;
use super::claim::claim;
use super::litellm::LiteLlm;
use super::worker_proc::{WorkerProc, scripted_run, shell_tool, spawn_agent_worker};

/// How long an attempt of an own agent may take to end.
const EXIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The image of the example agents on the real node (hack/images.sh agents: tests/agents/ in
/// /opt/agents/app/, run by Debian's Python with the same pins as the agents venv).
pub const AGENTS_IMAGE: &str = "docker.io/library/baton-agents:py";

/// The agent container running `tests/agents/<script>` with `env`, on the bed: the agents
/// venv's Python runs it from the repository (there is no image to run).
pub fn agent_container(script: &str, env: &[(&str, &str)]) -> AgentContainer {
    let script = crate::repo_root().join("tests/agents").join(script);
    AgentContainer {
        image: "baton-agents:py".into(),
        command: vec![python(), script.display().to_string()],
        env: plain_env(env),
        ..AgentContainer::default()
    }
}

/// The agent container running `tests/agents/<script>` from [`AGENTS_IMAGE`] with `env`, as a
/// run on the real node brings it.
pub fn image_agent_container(script: &str, env: &[(&str, &str)]) -> AgentContainer {
    AgentContainer {
        image: AGENTS_IMAGE.into(),
        command: vec!["python".into(), format!("/opt/agents/app/{script}")],
        env: plain_env(env),
        ..AgentContainer::default()
    }
}

/// `env` as a container's plain variables.
pub fn plain_env(env: &[(&str, &str)]) -> Vec<PlainEnvVar> {
    let var = |(name, value): &(&str, &str)| PlainEnvVar {
        name: name.to_string(),
        value: value.to_string(),
    };
    env.iter().map(var).collect()
}

/// A run `name` of the agent `tests/agents/<script>` with the shell tool `sh`, asked to run
/// `steps` steps of the LiteLLM proxy's steps model (tests/litellm/steps.yaml).
pub fn steps_run(name: &str, proxy: &LiteLlm, script: &str, steps: usize) -> AgentRun {
    let tools = vec![shell_tool("sh", false)];
    let mut run = scripted_run(name, vec![], tools, LeaseSpec::default());
    run.spec.input = format!("run the {steps} steps");
    let agent = run.spec.agent_mut();
    agent.model = proxy.model(Provider::Openai, "mock-steps");
    agent.container = Some(agent_container(script, &[("AGENT_MODEL", "mock-steps")]));
    run
}

/// The Python of the agents venv (tests/agents/requirements.txt: the stock `openai` SDK, the
/// Agents SDK, the `mcp` client).
pub fn python() -> String {
    let python = crate::cache_dir().join("agents-venv/bin/python");
    python.display().to_string()
}

/// Claims `name` for attempt `fence` and starts its worker, `env` added to the worker's.
pub async fn start_attempt(
    ns: &TestNamespace,
    name: &str,
    fence: i64,
    env: &[(&str, &str)],
) -> WorkerProc {
    let pod = claim(&ns.client, &ns.name, name, fence).await;
    let runs: Api<AgentRun> = ns.api();
    let run = runs.get(name).await.unwrap();
    spawn_agent_worker(&run, fence, &pod, env)
}

/// Runs attempt `fence` of `name` to its end (exit 0); the run as it ended.
pub async fn finish_attempt(
    ns: &TestNamespace,
    name: &str,
    fence: i64,
    env: &[(&str, &str)],
) -> AgentRun {
    let mut worker = start_attempt(ns, name, fence, env).await;
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{name}: {}", worker.log_text());
    let runs: Api<AgentRun> = ns.api();
    runs.get(name).await.unwrap()
}

/// The lines of `file` (none when it does not exist yet): effects a tool appended, calls a
/// model server counted.
pub fn lines(file: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

/// The lines of the proxy's count of completed model calls once it stops growing (LiteLLM
/// writes its success log a moment after the answer).
pub async fn counted(file: &std::path::Path) -> usize {
    let mut last = lines(file).len();
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = lines(file).len();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Approves the call `name` waits for, as `baton approve <name> --reason <reason>` does.
pub async fn approve(ns: &TestNamespace, name: &str, reason: &str) {
    approve_in(&ns.client, &ns.name, name, reason).await;
}

/// [`approve`] in namespace `namespace` with `client`'s credentials.
pub async fn approve_in(client: &kube::Client, namespace: &str, name: &str, reason: &str) {
    let target = run_args(namespace, name);
    let approve = ApproveArgs {
        target,
        step: None,
        reason: Some(reason.into()),
    };
    decide(client, namespace, Verb::Approve(approve)).await;
}

/// Denies the call `name` waits for, as `baton deny <name> --reason <reason>` does.
pub async fn deny(ns: &TestNamespace, name: &str, reason: &str) {
    let deny = DenyArgs {
        target: run_args(&ns.name, name),
        step: None,
        reason: reason.into(),
    };
    decide(&ns.client, &ns.name, Verb::Deny(deny)).await;
}

fn run_args(namespace: &str, name: &str) -> RunArgs {
    RunArgs {
        run: name.into(),
        namespace: Some(namespace.to_string()),
    }
}

/// Runs the CLI's decision `verb` in `namespace` with `client`'s credentials.
async fn decide(client: &kube::Client, namespace: &str, verb: Verb) {
    let session = Session::new(client.clone(), "test".into(), namespace.to_string());
    session.run(verb, &mut Vec::new()).await.unwrap();
}

/// Asserts the run ended `Failed` with `ResumeDiverged`, its message naming call 1 and the
/// first differing field, the system prompt (`/messages/0/content`).
pub fn assert_diverged_at_the_prompt(st: &baton::crd::v1alpha1::AgentRunStatus) {
    use baton::crd::v1alpha1::Phase;
    assert_eq!(st.outcome, Some(Phase::Failed), "{st:?}");
    assert_eq!(st.reason.as_deref(), Some("ResumeDiverged"), "{st:?}");
    let message = st.message.clone().unwrap_or_default();
    assert!(
        message.contains("call 1") && message.contains("/messages/0/content"),
        "the call and the field named: {message}"
    );
}
