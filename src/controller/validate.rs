//! Spec rules the CRD schema cannot express, checked at admission. A run that breaks one
//! ends `Failed` with reason `InvalidSpec` and a message naming the field.

use crate::crd::v1alpha1::{AgentContainer, AgentRunSpec, AgentSpec, Provider, ToolKind};

/// The reason a rejected run ends with.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// Checks the rules; the error names the field.
pub fn validate(spec: &AgentRunSpec) -> Result<(), String> {
    check_thread(spec)?;
    check_lease(spec)?;
    let Some(agent) = spec.agent() else {
        return Err("spec.agent is required (or spec.thread: a turn takes its thread's)".into());
    };
    check_model(agent)?;
    if let Some(container) = &agent.container {
        check_container(agent, container)?;
    }
    check_mcp_tools(agent)?;
    check_script_tools(spec, agent)
}

/// Why a turn that has not joined its thread yet can never join: the field it sets that its
/// thread gives (or that would take history its thread keeps), or None.
pub fn join_problem(spec: &AgentRunSpec) -> Option<String> {
    let thread = spec.thread.as_deref()?;
    let own = [
        ("spec.agent", spec.agent.is_some()),
        ("spec.budget", spec.budget.is_some()),
        ("spec.workspace", spec.workspace.is_some()),
        (
            "spec.ttlSecondsAfterFinished",
            spec.ttl_seconds_after_finished.is_some(),
        ),
    ];
    let (field, _) = own.into_iter().find(|(_, set)| *set)?;
    Some(format!(
        "{field} must not be set on a turn of thread {thread} (spec.thread): a turn takes its \
         agent and settings from its thread, and its thread keeps its history"
    ))
}

/// A turn's thread is its admission key: it sets no other.
fn check_thread(spec: &AgentRunSpec) -> Result<(), String> {
    match (&spec.thread, &spec.thread_key) {
        (Some(thread), Some(_)) => Err(format!(
            "spec.threadKey must not be set on a turn of thread {thread} (spec.thread): its \
             turns take turns already"
        )),
        _ => Ok(()),
    }
}

/// A `kind: mcp` tool has its `mcp` block, and only an `mcp` tool has one.
fn check_mcp_tools(agent: &AgentSpec) -> Result<(), String> {
    for (i, tool) in agent.tools.iter().enumerate() {
        match (tool.kind, &tool.mcp) {
            (ToolKind::Mcp, None) => {
                return Err(format!(
                    "spec.agent.tools[{i}].mcp is required for kind mcp ({})",
                    tool.name
                ));
            }
            (kind, Some(_)) if kind != ToolKind::Mcp => {
                return Err(format!(
                    "spec.agent.tools[{i}].mcp is only for kind mcp ({} is another kind)",
                    tool.name
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_lease(spec: &AgentRunSpec) -> Result<(), String> {
    let lease = &spec.lease;
    if lease.renew_seconds >= lease.duration_seconds {
        return Err(format!(
            "spec.lease.renewSeconds ({}) must be less than spec.lease.durationSeconds ({})",
            lease.renew_seconds, lease.duration_seconds
        ));
    }
    Ok(())
}

fn check_model(agent: &AgentSpec) -> Result<(), String> {
    let model = &agent.model;
    match model.provider {
        Provider::Scripted if model.script.is_empty() => {
            Err("spec.agent.model.script must not be empty for provider scripted".to_string())
        }
        Provider::Openai | Provider::Anthropic
            if model.name.as_deref().is_none_or(|n| n.trim().is_empty()) =>
        {
            Err(format!(
                "spec.agent.model.name is required for provider {}",
                provider_name(model.provider)
            ))
        }
        _ => Ok(()),
    }
}

/// The environment variables the worker gives an agent container itself.
pub const RESERVED_ENV_PREFIXES: [&str; 3] = ["OPENAI_", "ANTHROPIC_", "BATON_"];

/// An agent container's run: its model is reached through the gateway, which speaks the
/// OpenAI API to an OpenAI-compatible provider; the built-in loop's settings have no use.
fn check_container(agent: &AgentSpec, container: &AgentContainer) -> Result<(), String> {
    if agent.model.provider == Provider::Scripted {
        return Err(format!(
            "spec.agent.model.provider must be openai or anthropic with \
             spec.agent.container (the gateway forwards their APIs; {} has none)",
            provider_name(agent.model.provider)
        ));
    }
    // The agent container calls spec.agent.tools (and approval gates them) through the tool
    // gateway; a system prompt is its own to give.
    if agent.system_prompt.is_some() {
        return Err(
            "spec.agent.systemPrompt must not be set with spec.agent.container: it is \
             for baton's own agent loop, and an agent container brings its own prompt"
                .into(),
        );
    }
    for (i, var) in container.env.iter().enumerate() {
        if let Some(prefix) = RESERVED_ENV_PREFIXES
            .iter()
            .find(|p| var.name.starts_with(*p))
        {
            return Err(format!(
                "spec.agent.container.env[{i}].name ({}): names starting {prefix} are set by \
                 baton (the gateway's address and this attempt's key)",
                var.name
            ));
        }
    }
    Ok(())
}

fn provider_name(provider: Provider) -> &'static str {
    match provider {
        Provider::Scripted => "scripted",
        Provider::Openai => "openai",
        Provider::Anthropic => "anthropic",
    }
}

fn check_script_tools(spec: &AgentRunSpec, agent: &AgentSpec) -> Result<(), String> {
    let declared =
        |name: &str| agent.tools.iter().any(|t| t.name == name) || spec.names_an_mcp_tool(name);
    for (turn_index, turn) in agent.model.script.iter().enumerate() {
        for (call_index, call) in turn.tool_calls.iter().enumerate() {
            if !declared(&call.tool) {
                return Err(format!(
                    "spec.agent.model.script[{turn_index}].toolCalls[{call_index}].tool ({}) \
                     is not declared in spec.agent.tools",
                    call.tool
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::AgentRun;
    use crate::crd::v1alpha1::{ScriptToolCall, ScriptTurn, ToolKind, ToolSpec};

    fn spec() -> AgentRunSpec {
        AgentRun::builder("r").spec()
    }

    fn shell(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            kind: ToolKind::Shell,
            description: None,
            idempotent: false,
            timeout_seconds: 5,
            probe: None,
            approval: None,
            mcp: None,
        }
    }

    #[test]
    fn a_plain_scripted_spec_is_valid() {
        assert_eq!(validate(&spec()), Ok(()));
    }

    #[test]
    fn renew_must_be_below_duration() {
        let mut s = spec();
        s.lease.renew_seconds = 30;
        s.lease.duration_seconds = 30;
        assert_eq!(
            validate(&s).unwrap_err(),
            "spec.lease.renewSeconds (30) must be less than spec.lease.durationSeconds (30)"
        );
    }

    #[test]
    fn scripted_needs_a_script_and_remote_providers_a_name() {
        let mut s = spec();
        s.agent_mut().model.script.clear();
        assert!(
            validate(&s)
                .unwrap_err()
                .contains("spec.agent.model.script")
        );
        s.agent_mut().model.provider = Provider::Openai;
        assert!(validate(&s).unwrap_err().contains("spec.agent.model.name"));
        s.agent_mut().model.name = Some("gpt-4o-mini".into());
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn an_agent_container_speaks_openai_and_sets_no_reserved_variable() {
        use crate::crd::v1alpha1::{AgentContainer, PlainEnvVar};
        let mut s = spec();
        s.agent_mut().container = Some(AgentContainer {
            image: "agents:py".into(),
            command: vec!["python".into()],
            env: vec![PlainEnvVar {
                name: "AGENT_CALLS".into(),
                value: "3".into(),
            }],
            ..AgentContainer::default()
        });
        let err = validate(&s).unwrap_err();
        assert!(
            err.starts_with("spec.agent.model.provider must be openai or anthropic"),
            "{err}"
        );
        s.agent_mut().model.provider = Provider::Openai;
        s.agent_mut().model.name = Some("m".into());
        assert_eq!(validate(&s), Ok(()));
        s.agent_mut().system_prompt = Some("be brief".into());
        let err = validate(&s).unwrap_err();
        assert!(
            err.starts_with("spec.agent.systemPrompt must not be set"),
            "{err}"
        );
        s.agent_mut().system_prompt = None;
        // Its tools are served to it through the tool gateway, and checked as any run's.
        s.agent_mut().tools.push(shell("mcp-without-server"));
        s.agent_mut().tools[0].kind = ToolKind::Mcp;
        let err = validate(&s).unwrap_err();
        assert!(err.contains("spec.agent.tools[0]"), "{err}");
        s.agent_mut().tools[0].kind = ToolKind::Shell;
        s.agent_mut().tools[0].name = "sh".into();
        assert_eq!(validate(&s), Ok(()));
        let container = s.agent_mut().container.as_mut().unwrap();
        container.env.push(PlainEnvVar {
            name: "OPENAI_API_KEY".into(),
            value: "sk-mine".into(),
        });
        let err = validate(&s).unwrap_err();
        assert!(
            err.starts_with("spec.agent.container.env[1].name (OPENAI_API_KEY)"),
            "{err}"
        );
    }

    #[test]
    fn scripted_tool_calls_must_name_declared_tools() {
        let mut s = spec();
        s.agent_mut().model.script.insert(
            0,
            ScriptTurn {
                tool_calls: vec![ScriptToolCall {
                    tool: "sh".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let err = validate(&s).unwrap_err();
        assert!(
            err.contains("spec.agent.model.script[0].toolCalls[0].tool (sh)"),
            "{err}"
        );
        s.agent_mut().tools.push(shell("sh"));
        assert_eq!(validate(&s), Ok(()));
    }
}
