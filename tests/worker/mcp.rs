//! MCP tools with a real worker against a real MCP server this project did not write: the
//! official Python SDK (`mcp` on PyPI) serving tests/mcp/server.py over Streamable HTTP on
//! loopback, started here. Its `record` tool appends a line per call to a file, so a test can
//! count how often a call ran.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{create, status};
use baton::crd::v1alpha1::{
    AgentRun, AgentRunStatus, LeaseSpec, LedgerEvent, Phase, ScriptToolCall, ScriptTurn, ToolSpec,
};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;

const TIMEOUT: Duration = Duration::from_secs(90);

/// tests/mcp/server.py, running: stopped (by its PID) when dropped.
struct McpServer {
    _child: Child,
    url: String,
    port: u16,
    calls: PathBuf,
}

impl McpServer {
    async fn start(calls: &Path, port: u16, extra: &[&str]) -> Self {
        let python = std::env::var("BATON_MCP_PYTHON").unwrap_or_else(|_| {
            let home = std::env::var("HOME").unwrap_or_default();
            format!("{home}/.cache/baton/mcp-venv/bin/python")
        });
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/server.py");
        let mut child = Command::new(&python)
            .arg(script)
            .arg("--calls")
            .arg(calls)
            .args(["--port", &port.to_string()])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(calls.with_extension("log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting the MCP server with {python} (hack/setup.sh installs it): {e}")
            });
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the MCP server listens within 60 s")
            .unwrap()
            .expect("the MCP server says its port");
        let port: u16 = first.trim_start_matches("PORT ").parse().expect(&first);
        Self {
            _child: child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            port,
            calls: calls.to_path_buf(),
        }
    }

    /// The lines `record` wrote, one per call that ran.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The MCP server's credential, a header value from the run's Secret.
const TOKEN: &str = "s3cret-Hq7Zp2Kw";

fn calls_file(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("baton-mcp-{tag}-{}", rand::random::<u32>()));
    let _ = std::fs::remove_file(&path);
    path
}

fn call(tool: &str, args: &[(&str, &str)]) -> ScriptTurn {
    ScriptTurn {
        text: Some(format!("calling {tool}")),
        tool_calls: vec![ScriptToolCall {
            tool: tool.into(),
            arguments: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }],
        delay_milliseconds: Some(0),
        usage: None,
    }
}

fn server_tool(url: &str, mcp: Value) -> ToolSpec {
    let mut mcp = mcp;
    mcp["url"] = url.into();
    serde_json::from_value(json!({"name": "srv", "kind": "mcp", "timeoutSeconds": 5, "mcp": mcp}))
        .unwrap()
}

/// Creates the run `m` with `script` and its one tool.
async fn create_run(ns: &TestNamespace, script: Vec<ScriptTurn>, tool: ToolSpec) {
    create(
        ns,
        &scripted_run("m", script, vec![tool], LeaseSpec::default()),
    )
    .await;
}

async fn run_attempt(ns: &TestNamespace, fence: i64, env: &[(&str, &str)]) -> AgentRunStatus {
    let pod = claim(&ns.client, &ns.name, "m", fence).await;
    let mut w = spawn_worker_env(&ns.name, "m", fence, &pod, &[], env);
    assert_eq!(w.wait(TIMEOUT).await, 0, "{}", w.log_text());
    status(ns, "m").await
}

/// Step `step`'s result: (output, is_error).
async fn result_of(ns: &TestNamespace, step: i64) -> (String, bool) {
    events(&segments(&ns.client, &ns.name, "m").await)
        .into_iter()
        .find_map(|(_, e)| match e {
            LedgerEvent::StepResult {
                step: s,
                output,
                is_error,
            } if s == step => Some((output, is_error)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("step {step} has a result"))
}

fn finished(st: &AgentRunStatus) {
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded)),
        "{st:?}"
    );
}

#[tokio::test]
async fn worker_mcp_tools_are_recorded_offered_and_called_with_batons_metadata_and_headers() {
    let ns = TestNamespace::new("worker-mcp").await;
    let required = format!("x-test-token={TOKEN}");
    let server = McpServer::start(&calls_file("basic"), 0, &["--require-header", &required]).await;
    let headers = std::env::temp_dir().join(format!("baton-mcp-headers-{}", ns.name));
    std::fs::create_dir_all(headers.join("srv")).unwrap();
    std::fs::write(headers.join("srv/x-test-token"), format!("{TOKEN}\n")).unwrap();
    let tool = server_tool(
        &server.url,
        json!({"headersFromSecret": "srv-auth", "exclude": ["huge"]}),
    );
    let script = vec![
        call("srv__lookup", &[("key", "a")]),
        call("srv__record", &[("note", "n1")]),
        call("srv__explode", &[]),
        call("srv__huge", &[]),
        // A server that echoes its credential: the echo is scrubbed before it is recorded.
        call("srv__whoami", &[]),
        final_turn("done", 0),
    ];
    create_run(&ns, script, tool).await;
    let dir = headers.to_string_lossy().to_string();
    let st = run_attempt(&ns, 1, &[("BATON_MCP_HEADERS_DIR", &dir)]).await;
    finished(&st);

    let evs = events(&segments(&ns.client, &ns.name, "m").await);
    let listed: Vec<Vec<String>> = evs
        .iter()
        .filter_map(|(_, e)| match e {
            LedgerEvent::McpTools { tool, tools } if tool == "srv" => {
                Some(tools.iter().map(|t| t.name.clone()).collect())
            }
            _ => None,
        })
        .collect();
    assert_eq!(listed.len(), 1, "listed once: {listed:?}");
    assert!(listed[0].contains(&"record".to_string()), "{listed:?}");
    assert!(result_of(&ns, 1).await.0.contains("the value of a is 42"));
    assert_eq!(
        result_of(&ns, 2).await,
        ("recorded n1 (call 1)".to_string(), false)
    );
    let (failed, is_error) = result_of(&ns, 3).await;
    assert!(is_error && failed.contains("failed on purpose"), "{failed}");
    let (excluded, is_error) = result_of(&ns, 4).await;
    assert!(is_error && excluded.contains("no tool named"), "{excluded}");
    let (echoed, _) = result_of(&ns, 5).await;
    assert_eq!(echoed, "you sent x-test-token [REDACTED]");
    let recorded = serde_json::to_string(&evs).unwrap();
    assert!(
        !recorded.contains(TOKEN),
        "the header value is nowhere in the ledger"
    );

    let runs: Api<AgentRun> = ns.api();
    let uid = runs.get("m").await.unwrap().metadata.uid.unwrap();
    let calls = server.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["fence"], 1);
    assert_eq!(calls[0]["idempotencyKey"], format!("{uid}/2"));
    assert_eq!(calls[0]["run"], "m");
    assert_eq!(
        calls[0]["auth"], TOKEN,
        "the Secret's header reached the server"
    );
    let _ = std::fs::remove_dir_all(&headers);
    ns.cleanup().await;
}

/// Attempt 1 is killed (-9) while `srv__record` runs on the server; attempt 2 resumes.
async fn kill_mid_call(ns: &TestNamespace, server: &McpServer, mcp: Value) -> AgentRunStatus {
    let mut tool = server_tool(&server.url, mcp);
    tool.timeout_seconds = 60;
    let script = vec![
        call("srv__record", &[("note", "once"), ("seconds", "8")]),
        final_turn("done", 0),
    ];
    create_run(ns, script, tool).await;
    let pod = claim(&ns.client, &ns.name, "m", 1).await;
    let mut a = spawn_worker(&ns.name, "m", 1, &pod, &[]);
    wait_until(TIMEOUT, "the call reached the server", || async {
        server.calls().len() == 1
    })
    .await;
    a.kill9().await;
    let st = run_attempt(ns, 2, &[]).await;
    finished(&st);
    assert_eq!(st.unknown_effect_count, 1, "{st:?}");
    assert_eq!(st.unknown_effects[0].tool, "srv__record");
    st
}

/// Killed while an MCP call runs: the call ran once, and the next worker reports its effect
/// unknown and does not call it again: the server's hints do not count unless the manifest
/// trusts them, and `record` has none anyway.
#[tokio::test]
async fn worker_an_mcp_call_in_flight_at_a_kill_runs_at_most_once() {
    let ns = TestNamespace::new("worker-mcp-kill").await;
    let server = McpServer::start(&calls_file("kill"), 0, &[]).await;
    let st = kill_mid_call(&ns, &server, json!({"trustHints": true})).await;
    assert_eq!(server.calls().len(), 1, "never run again");
    assert_eq!(st.unknown_effects[0].resolution.as_str(), "unknown");
    ns.cleanup().await;
}

/// The manifest makes the tool idempotent (an override): the next worker calls it again,
/// with its own fence and the same idempotency key.
#[tokio::test]
async fn worker_an_mcp_tool_the_manifest_makes_idempotent_is_called_again_after_a_kill() {
    let ns = TestNamespace::new("worker-mcp-rerun").await;
    let server = McpServer::start(&calls_file("rerun"), 0, &[]).await;
    let over = json!({"overrides": [{"name": "record", "idempotent": true}]});
    let st = kill_mid_call(&ns, &server, over).await;
    assert_eq!(st.unknown_effects[0].resolution.as_str(), "rerun");
    let calls = server.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        (calls[0]["fence"].clone(), calls[1]["fence"].clone()),
        (json!(1), json!(2))
    );
    assert_eq!(calls[0]["idempotencyKey"], calls[1]["idempotencyKey"]);
    ns.cleanup().await;
}

/// The server offers another list at resume: condition McpToolsChanged, and the run goes on
/// with the recorded tools (a call held for approval by a per-tool override runs once
/// approved, in the next attempt).
#[tokio::test]
async fn worker_a_changed_server_list_is_reported_and_the_recorded_one_is_offered() {
    let ns = TestNamespace::new("worker-mcp-changed").await;
    let calls = calls_file("changed");
    let first = McpServer::start(&calls, 0, &[]).await;
    let tool = server_tool(
        &first.url,
        json!({"overrides": [{"name": "record", "approval": "Required"}]}),
    );
    let script = vec![
        call("srv__record", &[("note", "gated")]),
        final_turn("done", 0),
    ];
    create_run(&ns, script, tool).await;
    let st = run_attempt(&ns, 1, &[]).await;
    assert_eq!(st.phase, Phase::WaitingApproval, "{st:?}");
    let pending = st.pending_approval.unwrap();
    assert_eq!(pending.tool, "srv__record");
    let port = first.port;
    drop(first);
    let _second = McpServer::start(&calls, port, &["--extra-tool"]).await;
    let decision = json!({"spec": {"approvals": [
        {"step": pending.step, "callId": pending.call_id, "decision": "Approve"}
    ]}});
    let runs: Api<AgentRun> = ns.api();
    runs.patch("m", &PatchParams::default(), &Patch::Merge(&decision))
        .await
        .unwrap();
    let st = run_attempt(&ns, 2, &[]).await;
    finished(&st);
    let changed = st
        .conditions
        .iter()
        .find(|c| c.type_ == "McpToolsChanged")
        .expect("condition McpToolsChanged");
    assert!(
        changed.message.contains("added extra"),
        "{}",
        changed.message
    );
    assert_eq!(result_of(&ns, 1).await.0, "recorded gated (call 1)");
    let listings = events(&segments(&ns.client, &ns.name, "m").await)
        .into_iter()
        .filter(|(_, e)| matches!(e, LedgerEvent::McpTools { .. }))
        .count();
    assert_eq!(listings, 1, "the first list is the one");
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_mcp_failures_are_bounded_and_name_the_server() {
    let ns = TestNamespace::new("worker-mcp-errors").await;
    let server = McpServer::start(&calls_file("errors"), 0, &[]).await;
    let mut tool = server_tool(&server.url, json!({}));
    tool.timeout_seconds = 2;
    let script = vec![
        call("srv__record", &[("note", "slow"), ("seconds", "10")]),
        call("srv__huge", &[]),
        final_turn("done", 0),
    ];
    create_run(&ns, script, tool).await;
    finished(&run_attempt(&ns, 1, &[]).await);
    let (slow, is_error) = result_of(&ns, 1).await;
    assert!(is_error && slow.contains("timed out after 2s"), "{slow}");
    assert!(slow.contains("MCP server srv"), "{slow}");
    let (huge, _) = result_of(&ns, 2).await;
    assert!(huge.len() < 70 * 1024, "cut: {} bytes", huge.len());
    assert!(huge.contains("[output truncated"), "marked");
    ns.cleanup().await;

    let ns = TestNamespace::new("worker-mcp-unreachable").await;
    // Port 9 (discard) on loopback: nothing listens there in the test bed.
    let tool = server_tool("http://127.0.0.1:9/mcp", json!({}));
    let script = vec![call("srv__lookup", &[("key", "a")]), final_turn("done", 0)];
    create_run(&ns, script, tool).await;
    let st = run_attempt(&ns, 1, &[]).await;
    assert_eq!(
        (st.phase, st.outcome, st.reason.as_deref()),
        (
            Phase::Finishing,
            Some(Phase::Failed),
            Some("McpServerUnavailable")
        ),
        "{st:?}"
    );
    let message = st.message.unwrap_or_default();
    assert!(
        message.contains("MCP server srv (http://127.0.0.1:9/mcp) could not be reached"),
        "{message}"
    );
    ns.cleanup().await;
}
