//! The runs of the end-to-end tests: scripted runs whose shell tools record their side
//! effects with `hack/effects.py` over TCP, and the test leases.

use baton::crd::v1alpha1::{
    AgentRun, ApprovalPolicy, LeaseSpec, ScriptToolCall, ScriptTurn, ToolKind, ToolSpec,
};

/// Lease settings for the tests: short, but generous enough for a loaded 2-core machine.
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
            tool_calls: vec![tool_call(
                "sh",
                "command",
                &effect_command(effects, tag, t, script.tool_ms),
            )],
            delay_milliseconds: Some(script.think_ms as i64),
            usage: None,
        })
        .collect();
    turns.push(ScriptTurn {
        text: Some(format!("{tag}: all {} turns done", script.turns)),
        tool_calls: vec![],
        delay_milliseconds: Some(script.think_ms as i64),
        usage: None,
    });
    run_with(name, turns, vec![shell_tool("sh")])
}

/// A scripted call of `tool` with one argument.
pub fn tool_call(tool: &str, arg: &str, value: &str) -> ScriptToolCall {
    ScriptToolCall {
        tool: tool.into(),
        arguments: [(arg.to_string(), value.to_string())].into(),
    }
}

/// A run whose one call (tool `deploy`, recording effect 1 with the effects server at
/// `effects`) needs an approval: it waits `WaitingApproval`, then says "deployed".
pub fn approval_run(effects: &str, name: &str) -> AgentRun {
    let command = effect_command(effects, name, 1, 0);
    let mut deploy = shell_tool("deploy");
    deploy.approval = Some(ApprovalPolicy::Required);
    let turns = vec![
        ScriptTurn {
            text: Some("deploying".into()),
            tool_calls: vec![tool_call("deploy", "command", &command)],
            ..ScriptTurn::default()
        },
        ScriptTurn {
            text: Some("deployed".into()),
            ..ScriptTurn::default()
        },
    ];
    run_with(name, turns, vec![deploy])
}

pub fn shell_tool(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        kind: ToolKind::Shell,
        description: None,
        idempotent: false,
        timeout_seconds: 120,
        probe: None,
        approval: None,
        mcp: None,
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
