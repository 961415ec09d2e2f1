//! Bring your own agent (docs/byo-agent.md): the attempt of a run whose agent is its own
//! container. The worker starts the model gateway on the loopback, hands the agent's command
//! to the agent container's executor with the gateway's address and a key good for this
//! attempt only, and waits for it to end. Its exit decides the turn: 0 is its answer (what it
//! printed), another code a failure with the end of its stderr, a death (a signal, the
//! container gone) an attempt that died, resumed by the next one, which runs the agent again
//! from the top and answers its recorded calls from the journal.

mod answers;
pub mod gateway;
mod tool_calls;
mod tool_gateway;
mod tool_replay;
mod upstream;

use std::path::PathBuf;
use std::time::Duration;

use baton_exec::protocol::{Ending as Exit, Outcome, RunRequest};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::agent::interrupted;
use super::finish::Ending;
use super::session::Session;
use super::tools::executor::{Executor, ExecutorLost};
use crate::crd::v1alpha1::AgentContainer;
use crate::fence::EndReason;
use gateway::{Report, Setup};
use tool_gateway::ToolAsk;
use tool_replay::ToolReplay;
use upstream::Upstream;

/// The agent's output (stdout) and the end of its stderr, kept at most.
const OUTPUT_CAP_BYTES: usize = 1024 * 1024;
/// How much of the stderr's end a failure's message shows.
const STDERR_SHOWN_CHARS: usize = 2000;
/// The longest an agent may run in one attempt; the run's budget (`deadlineSeconds`) is
/// what bounds a run, this only keeps the executor's timer finite.
const AGENT_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a cancelled agent may take to be reported gone.
const CANCEL_WAIT: Duration = Duration::from_secs(15);

/// Runs the agent container's command to its end (or the attempt's).
pub async fn run_agent(s: &mut Session, container: &AgentContainer) -> Ending {
    let (executor, input, history) = match reach_agent(s).await {
        Ok(reached) => reached,
        Err(ending) => return ending,
    };
    let (tools, asked) = tool_gateway::service(s.io.toolbox.offered());
    let (gateway, mut reported) = match open_gateway(s, container, tools).await {
        Ok(opened) => opened,
        Err(ending) => return ending,
    };
    let mut env = vec![
        ("OPENAI_BASE_URL", format!("http://{}/v1", gateway.address)),
        ("OPENAI_API_KEY", gateway.key.clone()),
        ("ANTHROPIC_BASE_URL", format!("http://{}", gateway.address)),
        ("ANTHROPIC_API_KEY", gateway.key.clone()),
        (
            "BATON_MCP_URL",
            format!("http://{}{}", gateway.address, tool_gateway::PATH),
        ),
        ("BATON_INPUT_FILE", input.display().to_string()),
        ("BATON_RUN", s.me.cfg.run.clone()),
        ("BATON_ATTEMPT", s.fence().to_string()),
    ];
    if let Some(history) = history {
        env.push(("BATON_HISTORY_FILE", history.display().to_string()));
    }
    let request = command(container, &env);
    let asks = Asks {
        asked,
        recorded: ToolReplay::new(&s.turn.replay),
    };
    let ending = supervise(s, &executor, request, &mut reported, asks).await;
    gateway.server.abort();
    while let Ok(report) = reported.try_recv() {
        fold(s, report);
    }
    ending
}

/// The agent container's executor, connected, and the run's input written where the agent
/// reads it; for a thread's turn, its history too.
async fn reach_agent(s: &Session) -> Result<(Executor, PathBuf, Option<PathBuf>), Ending> {
    let Some(dir) = s.me.cfg.agent_dir.clone() else {
        return Err(failed(format!(
            "this worker has no agent container to run ({} is not set: the pod was not made \
             for spec.agent.container)",
            crate::crd::env::AGENT_DIR
        )));
    };
    let socket = dir.join("exec.sock");
    let executor = Executor::connect_to("agent", &socket, s.me.cfg.executor_wait)
        .await
        .map_err(|err| Ending::GaveUp {
            message: err.to_string(),
        })?;
    let input = dir.join("input.txt");
    write(&input, s.me.run.spec.input.as_bytes(), "the run's input")?;
    let history = match (&s.spec().thread, &s.me.history) {
        (Some(_), Ok(fitted)) => {
            let file = dir.join("history.json");
            let messages = crate::worker::model::openai::chat_messages(&fitted.messages);
            let json = serde_json::to_vec(&messages).unwrap_or_default();
            write(&file, &json, "the thread's history")?;
            Some(file)
        }
        // A history that cannot be had ends the turn before its agent starts (the resume plan).
        _ => None,
    };
    Ok((executor, input, history))
}

/// Writes `what` to `file`, where the agent reads it.
fn write(file: &std::path::Path, bytes: &[u8], what: &str) -> Result<(), Ending> {
    std::fs::write(file, bytes).map_err(|err| Ending::GaveUp {
        message: format!("writing {what} to {}: {err}", file.display()),
    })
}

/// The gateway of this attempt, serving.
struct Opened {
    address: std::net::SocketAddr,
    key: String,
    server: tokio::task::JoinHandle<()>,
}

/// Starts the gateway with a fresh key, the journal and usage as replayed.
async fn open_gateway(
    s: &Session,
    container: &AgentContainer,
    tools: tool_gateway::Service,
) -> Result<(Opened, mpsc::UnboundedReceiver<Report>), Ending> {
    let upstream =
        Upstream::for_model(&s.agent().model, s.me.cfg.api_key.clone()).map_err(|err| {
            Ending::Failed {
                reason: EndReason::ProviderError,
                message: err.to_string(),
            }
        })?;
    let key = format!("baton-attempt-{:032x}", rand::random::<u128>());
    let (reports, reported) = mpsc::unbounded_channel();
    let setup = Setup {
        key: key.clone(),
        upstream,
        appender: s.io.appender.clone(),
        journal: s.turn.replay.journal.clone(),
        usage: s.turn.replay.usage.clone(),
        budget: s.spec().budget.clone(),
        elapsed_before: run_time(s),
        on_divergence: container.on_divergence,
        reports,
        attempt: s.me.span.clone(),
        provider: s.agent().model.provider,
    };
    let (address, server) = gateway::start(setup, tools)
        .await
        .map_err(|err| Ending::GaveUp {
            message: format!("starting the model gateway: {err}"),
        })?;
    Ok((
        Opened {
            address,
            key,
            server,
        },
        reported,
    ))
}

/// The agent's command as the executor runs it: the argv of the manifest, no shell.
fn command(container: &AgentContainer, env: &[(&str, String)]) -> RunRequest {
    let argv: Vec<String> = container
        .command
        .iter()
        .chain(&container.args)
        .cloned()
        .collect();
    RunRequest {
        id: String::new(),
        command: argv.join(" "),
        argv,
        stderr_tail: true,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        timeout_ms: AGENT_TIMEOUT.as_millis() as u64,
        cap_bytes: OUTPUT_CAP_BYTES,
    }
}

/// The agent's tool calls as they arrive, and the recorded ones that answer them.
struct Asks {
    asked: mpsc::Receiver<ToolAsk>,
    recorded: ToolReplay,
}

/// Waits for the agent's end while folding what the model gateway records and answering its
/// tool calls, one at a time; an interruption or an ending asked for (a divergence, a budget,
/// a call that waits for a person) stops the agent first.
async fn supervise(
    s: &mut Session,
    executor: &Executor,
    request: RunRequest,
    reported: &mut mpsc::UnboundedReceiver<Report>,
    mut asks: Asks,
) -> Ending {
    let cancel = CancellationToken::new();
    let running = executor.submit(request, &cancel);
    tokio::pin!(running);
    let guard = s.io.guard.token().clone();
    let (stop, handoff) = (
        s.io.interrupts.stop.clone(),
        s.io.interrupts.handoff.clone(),
    );
    let decided = loop {
        tokio::select! {
            outcome = &mut running => return gateway_ending(s, reported).unwrap_or_else(|| ended(outcome)),
            Some(report) = reported.recv() => match report {
                Report::End(ending) => break ending,
                appended => fold(s, appended),
            },
            Some(ask) = asks.asked.recv() => {
                if let Some(ending) = tool_calls::answer(s, &mut asks.recorded, ask).await {
                    break ending;
                }
            }
            _ = guard.cancelled() => break Ending::Lost,
            _ = stop.cancelled() => break Ending::Stopped,
            _ = handoff.cancelled() => break Ending::Handoff,
        }
    };
    cancel.cancel();
    let _ = tokio::time::timeout(CANCEL_WAIT, running).await;
    interrupted(s).unwrap_or(decided)
}

/// An ending the gateway asked for that the agent's exit overtook (the agent exits on the
/// answer that told it why: a divergence, a budget), folding what else it reported; it wins
/// over the exit it caused.
fn gateway_ending(
    s: &mut Session,
    reported: &mut mpsc::UnboundedReceiver<Report>,
) -> Option<Ending> {
    let mut ending = None;
    while let Ok(report) = reported.try_recv() {
        match report {
            Report::End(asked) => ending = ending.or(Some(asked)),
            appended => fold(s, appended),
        }
    }
    ending
}

/// Folds what the gateway appended into the attempt's replay (the run's usage with it).
fn fold(s: &mut Session, report: Report) {
    if let Report::Appended { events, requests } = report {
        s.io.counters.add_awaited(requests);
        let fence = s.fence();
        for event in &events {
            s.turn.replay.apply(fence, event);
        }
        s.publish_usage();
    }
}

/// The turn's ending for how the agent's command ended.
fn ended(outcome: Result<Outcome, ExecutorLost>) -> Ending {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(_) => {
            return Ending::GaveUp {
                message: "the agent container died while its agent ran (see its logs and the \
                          pod's events); the next attempt runs it again"
                    .into(),
            };
        }
    };
    match outcome.ending {
        Exit::Exited(0) => Ending::Final {
            output: outcome
                .stdout
                .strip_suffix('\n')
                .unwrap_or(&outcome.stdout)
                .to_string(),
        },
        Exit::Exited(code) => failed(format!(
            "the agent exited with code {code}; its stderr ended: {}",
            tail(&outcome.stderr)
        )),
        Exit::Signalled => Ending::GaveUp {
            message: format!(
                "the agent was killed by a signal (out of memory?); its stderr ended: {}",
                tail(&outcome.stderr)
            ),
        },
        Exit::TimedOut => failed("the agent ran longer than an attempt may".into()),
        Exit::Cancelled => Ending::GaveUp {
            message: "the agent was stopped".into(),
        },
        Exit::SpawnFailed(why) => failed(format!(
            "the agent's command could not be started (spec.agent.container.command): {why}"
        )),
    }
}

fn failed(message: String) -> Ending {
    Ending::Failed {
        reason: EndReason::AgentExited,
        message,
    }
}

/// The last [`STDERR_SHOWN_CHARS`] characters of `stderr`.
fn tail(stderr: &str) -> String {
    let chars: Vec<char> = stderr.trim_end().chars().collect();
    chars[chars.len().saturating_sub(STDERR_SHOWN_CHARS)..]
        .iter()
        .collect()
}

/// How long the run had run when this attempt started (its deadline counts from its start).
fn run_time(s: &Session) -> Option<Duration> {
    let start = s.me.run.status.as_ref()?.start_time.as_ref()?;
    Duration::try_from(Timestamp::now().duration_since(start.0)).ok()
}
