//! A real `baton worker` process against a real API server (the local control plane), the
//! tests playing the controller. One test binary for all of it (each file is a module):
//! - `approval`: a gated call waits, is approved, denied or timed out, and never runs twice;
//! - `budget`: a run killed again and again near its limit stops at it;
//! - `byo`: a run that brings its own agent (the stock `openai` SDK): replayed after a kill,
//!   diverging, exiting non-zero, its gateway closed to all but its agent;
//! - `byo_frameworks`: agent frameworks from PyPI, unmodified (the Agents SDK, LangGraph), killed
//!   while a tool runs: no effect and no model call twice, the same answer;
//! - `byo_gates`: the frameworks where a run stops: LangGraph's tool gated by approvals, the
//!   Agents SDK asking the user, the Agents SDK telling its model the time (divergent);
//! - `byo_responses`: an own agent on the Responses API, streamed and not, replayed after a kill;
//! - `byo_tools`: its tools through the tool gateway (the stock `mcp` client): a kill while a
//!   tool runs never runs an effect twice, a gated call waits and runs once when approved or
//!   never when denied, an `askUser` waits for its answer;
//! - `crash`: kill -9 at each write-ahead boundary, then the next worker resumes;
//! - `format`: a ledger holding an event of a newer kind is resumed past, and said so;
//! - `limits`: the ledger's size cap and events split across segments;
//! - `mcp`: MCP tools against the official Python SDK's server: recorded, called with
//!   baton's metadata, never run twice, errors bounded;
//! - `openai`: the OpenAI-compatible provider end to end against a local server;
//! - `providers`: both HTTP providers through the LiteLLM proxy, and a server answering a page;
//! - `resume`: zombies, effect probes, idempotent re-runs, askUser answered later;
//! - `run`: a run from claim to Finishing, handoff on SIGTERM, stop;
//! - `threads`: turns of a thread with the real controller: history carried, resumed the same,
//!   a deleted earlier turn failing the turn, each busy policy;
//! - `thread_own_agent`: a thread whose agent is a container: each turn given the earlier ones,
//!   the same after a kill;
//! - `thread_context`: each overflow policy of a thread's context;
//! - `thread_history`: the earlier turns' ledgers read with one list of the thread's segments,
//!   a turn from before the thread label read alone;
//! - `traces`: a run killed mid tool call is one trace across its attempts in Arize Phoenix;
//! - `thread_cli`: `baton chat`, `baton thread` and `baton get` on a thread.

use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, AgentRunStatus};
use kube::Api;
use kube::api::PostParams;

/// How long a worker process may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates `run` in the test's namespace.
async fn create(ns: &baton_testkit::common::TestNamespace, run: &AgentRun) {
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), run)
        .await
        .expect("creating the run");
}

/// The run's status as the API server has it now.
async fn status(ns: &baton_testkit::common::TestNamespace, name: &str) -> AgentRunStatus {
    let runs: Api<AgentRun> = ns.api();
    runs.get(name).await.unwrap().status.unwrap_or_default()
}

mod approval;
mod budget;
mod byo;
mod byo_frameworks;
mod byo_gates;
mod byo_responses;
mod byo_tools;
mod crash;
mod format;
mod limits;
mod mcp;
mod openai;
mod providers;
mod resume;
mod run;
mod thread_cli;
mod thread_context;
mod thread_history;
mod thread_own_agent;
mod threads;
mod traces;
