//! The tools a run offers the model, by the name the model calls them (pure): the spec's own
//! tools, and each MCP server's tools as the ledger recorded them (`<name>__<tool>`),
//! with the settings that apply to each (idempotent, approval).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::crd::v1alpha1::{
    AgentRunSpec, MCP_SEPARATOR, McpSpec, McpToolRecord, ToolKind, ToolSpec,
};

/// The longest tool name providers accept.
const MAX_NAME: usize = 64;

/// A tool as the model is offered it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTool {
    pub name: String,
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// An MCP server's tool that a call goes to.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTarget {
    /// The spec's `mcp` tool (the server).
    pub server: String,
    /// The server's name for the tool.
    pub tool: String,
}

/// What a call of one model-facing name runs, with the settings that apply to it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEntry {
    /// The tool's spec; for an MCP tool, its server's, named as the model calls it, with the
    /// `idempotent` and `approval` that apply to this one tool.
    pub spec: ToolSpec,
    pub mcp: Option<McpTarget>,
}

/// Every tool the run offers, by the model's name for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Toolbox {
    entries: BTreeMap<String, ToolEntry>,
    offered: Vec<ModelTool>,
}

impl Toolbox {
    /// The spec's tools plus, for each `mcp` tool, the tools `listed` for it (as recorded).
    pub fn new(spec: &AgentRunSpec, listed: &BTreeMap<String, Vec<McpToolRecord>>) -> Self {
        let mut toolbox = Toolbox::default();
        for tool in spec.tools() {
            match (&tool.mcp, tool.kind) {
                (Some(mcp), ToolKind::Mcp) => {
                    for record in listed.get(&tool.name).into_iter().flatten() {
                        if offered(mcp, &record.name) {
                            toolbox.add_mcp(tool, mcp, record);
                        }
                    }
                }
                (_, ToolKind::Mcp) => {}
                _ => toolbox.add(
                    ToolEntry {
                        spec: tool.clone(),
                        mcp: None,
                    },
                    ModelTool {
                        name: tool.name.clone(),
                        description: builtin_description(tool),
                        parameters: builtin_parameters(tool.kind),
                    },
                ),
            }
        }
        toolbox
    }

    /// What a call of `name` runs.
    pub fn get(&self, name: &str) -> Option<&ToolEntry> {
        self.entries.get(name)
    }

    /// The tools as the model is offered them, in the spec's order.
    pub fn offered(&self) -> &[ModelTool] {
        &self.offered
    }

    fn add(&mut self, entry: ToolEntry, tool: ModelTool) {
        // A name taken already (two servers' tools cut to the same name) keeps the first.
        if self.entries.contains_key(&tool.name) {
            return;
        }
        self.entries.insert(tool.name.clone(), entry);
        self.offered.push(tool);
    }

    fn add_mcp(&mut self, server: &ToolSpec, mcp: &McpSpec, record: &McpToolRecord) {
        let name = mcp_tool_name(&server.name, &record.name);
        let over = mcp.overrides.iter().find(|o| o.name == record.name);
        let hinted = mcp.trust_hints
            && (record.read_only_hint == Some(true) || record.idempotent_hint == Some(true));
        let spec = ToolSpec {
            name: name.clone(),
            description: Some(record.description.clone()),
            idempotent: over
                .and_then(|o| o.idempotent)
                .unwrap_or(server.idempotent || hinted),
            approval: over.and_then(|o| o.approval).or(server.approval),
            probe: None,
            ..server.clone()
        };
        let description = if record.description.is_empty() {
            format!("Tool {} of the MCP server {}.", record.name, server.name)
        } else {
            record.description.clone()
        };
        let entry = ToolEntry {
            spec,
            mcp: Some(McpTarget {
                server: server.name.clone(),
                tool: record.name.clone(),
            }),
        };
        let tool = ModelTool {
            name,
            description,
            parameters: record.input_schema.clone(),
        };
        self.add(entry, tool);
    }
}

/// True when `mcp`'s include and exclude lists let the model have `tool`.
fn offered(mcp: &McpSpec, tool: &str) -> bool {
    (mcp.include.is_empty() || mcp.include.iter().any(|t| t == tool))
        && !mcp.exclude.iter().any(|t| t == tool)
}

/// The model's name for `tool` of the server `server`: `<server>__<tool>`, with characters
/// providers refuse made `_`, cut to 64.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    let safe: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = format!("{server}{MCP_SEPARATOR}{safe}");
    name.truncate(MAX_NAME);
    name
}

fn builtin_description(spec: &ToolSpec) -> String {
    let default = match spec.kind {
        ToolKind::Shell => "Runs a shell command (sh -c) and returns its output.",
        ToolKind::Http => "Sends an HTTP request and returns the response.",
        ToolKind::AskUser => "Asks the user a question and waits for the answer.",
        ToolKind::Mcp => "A tool of an MCP server.",
    };
    spec.description.clone().unwrap_or_else(|| default.into())
}

/// The JSON schema of a built-in tool kind's arguments: an object of strings, as the tools
/// read them.
pub fn builtin_parameters(kind: ToolKind) -> Value {
    let (properties, required): (&[(&str, &str)], &[&str]) = match kind {
        ToolKind::Shell => (
            &[("command", "The command line, run with sh -c.")],
            &["command"],
        ),
        ToolKind::Http => (
            &[
                ("method", "HTTP method: GET, POST, PUT, PATCH or DELETE."),
                ("url", "The absolute URL to request."),
                ("body", "The request body, if any."),
            ],
            &["method", "url"],
        ),
        ToolKind::AskUser => (&[("question", "The question for the user.")], &["question"]),
        ToolKind::Mcp => (&[], &[]),
    };
    let props: serde_json::Map<String, Value> = properties
        .iter()
        .map(|(name, description)| {
            (
                (*name).to_string(),
                json!({"type": "string", "description": description}),
            )
        })
        .collect();
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::{AgentRun, ApprovalPolicy, McpToolOverride};

    fn record(name: &str, read_only: Option<bool>) -> McpToolRecord {
        McpToolRecord {
            name: name.into(),
            description: format!("does {name}"),
            input_schema: json!({"type": "object", "properties": {"key": {"type": "string"}}}),
            read_only_hint: read_only,
            idempotent_hint: None,
            destructive_hint: None,
        }
    }

    fn spec(mcp: McpSpec) -> AgentRunSpec {
        let server: ToolSpec = serde_json::from_value(json!({
            "name": "files", "kind": "mcp", "mcp": mcp
        }))
        .unwrap();
        let sh: ToolSpec = serde_json::from_value(json!({"name": "sh", "kind": "shell"})).unwrap();
        AgentRun::builder("r").tools(vec![sh, server]).spec()
    }

    fn listed() -> BTreeMap<String, Vec<McpToolRecord>> {
        [(
            "files".to_string(),
            vec![
                record("read", Some(true)),
                record("write", None),
                record("rm.rf", None),
            ],
        )]
        .into()
    }

    #[test]
    fn a_servers_recorded_tools_are_offered_under_its_name_after_the_specs_own() {
        let tb = Toolbox::new(&spec(McpSpec::default()), &listed());
        let names: Vec<&str> = tb.offered().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["sh", "files__read", "files__write", "files__rm_rf"]);
        let read = tb.get("files__read").unwrap();
        assert_eq!(
            read.mcp,
            Some(McpTarget {
                server: "files".into(),
                tool: "read".into()
            })
        );
        assert_eq!(read.spec.kind, ToolKind::Mcp);
        assert_eq!(
            tb.offered()[1].parameters["properties"]["key"]["type"],
            "string"
        );
        assert!(tb.get("files").is_none(), "the server itself is no tool");
        let unlisted = Toolbox::new(&spec(McpSpec::default()), &BTreeMap::new());
        assert_eq!(
            unlisted.offered().len(),
            1,
            "nothing recorded, nothing offered"
        );
    }

    #[test]
    fn include_and_exclude_choose_the_tools() {
        let mcp = McpSpec {
            include: vec!["read".into(), "write".into()],
            exclude: vec!["write".into()],
            ..Default::default()
        };
        let tb = Toolbox::new(&spec(mcp), &listed());
        assert!(tb.get("files__read").is_some());
        assert!(tb.get("files__write").is_none());
        assert!(tb.get("files__rm_rf").is_none());
    }

    #[test]
    fn hints_make_a_tool_rerunnable_only_when_the_manifest_trusts_them_and_overrides_win() {
        let tb = Toolbox::new(&spec(McpSpec::default()), &listed());
        assert!(
            !tb.get("files__read").unwrap().spec.idempotent,
            "hints alone: no"
        );
        let trusting = McpSpec {
            trust_hints: true,
            overrides: vec![
                McpToolOverride {
                    name: "read".into(),
                    idempotent: Some(false),
                    approval: None,
                },
                McpToolOverride {
                    name: "write".into(),
                    idempotent: Some(true),
                    approval: Some(ApprovalPolicy::Required),
                },
            ],
            ..Default::default()
        };
        let tb = Toolbox::new(&spec(trusting.clone()), &listed());
        assert!(
            !tb.get("files__read").unwrap().spec.idempotent,
            "the override wins"
        );
        let write = &tb.get("files__write").unwrap().spec;
        assert!(write.idempotent);
        assert_eq!(write.approval, Some(ApprovalPolicy::Required));
        let mut plain = trusting;
        plain.overrides.clear();
        let tb = Toolbox::new(&spec(plain), &listed());
        assert!(
            tb.get("files__read").unwrap().spec.idempotent,
            "trusted hint"
        );
        assert!(!tb.get("files__write").unwrap().spec.idempotent);
    }

    #[test]
    fn model_names_are_safe_and_short_and_recognised() {
        assert_eq!(mcp_tool_name("s", "a/b.c"), "s__a_b_c");
        assert_eq!(mcp_tool_name("s", &"x".repeat(100)).len(), 64);
        let spec = spec(McpSpec::default());
        assert!(spec.names_an_mcp_tool("files__anything"));
        assert!(!spec.names_an_mcp_tool("sh__x"));
        assert!(!spec.names_an_mcp_tool("files"));
    }
}
