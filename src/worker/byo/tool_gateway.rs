//! The tool gateway: the run's tools (`spec.agent.tools`, its MCP servers' tools, `askUser`)
//! served to its agent container as one MCP server, Streamable HTTP on the model gateway's
//! listener at `/mcp`, behind the same key (docs/byo-agent.md). rmcp speaks the protocol; a
//! call is handed to the attempt, which owns the ledger and the tools, and answers it from the
//! ledger or runs it as the built-in loop runs a step (`tool_calls`). Nothing here runs a tool.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::tool_replay::Told;
use crate::worker::toolbox::ModelTool;

/// The path the tool gateway serves on.
pub const PATH: &str = "/mcp";
/// Calls waiting for the attempt at once: an agent's parallel calls, taken one at a time.
const WAITING_CALLS: usize = 16;
/// The largest MCP message an agent may send: a tool call's arguments, not a file upload.
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// A call of the agent's, for the attempt to answer.
#[derive(Debug)]
pub struct ToolAsk {
    pub tool: String,
    /// The call's arguments (`Null` when it sent none).
    pub arguments: Value,
    pub reply: oneshot::Sender<Reply>,
}

/// The attempt's answer to a call.
#[derive(Debug)]
pub enum Reply {
    /// The step's result (recorded before, or just run).
    Told(Told),
    /// The attempt ends with this call (it waits for an approval or an answer, a budget is
    /// spent, the run was lost): why, for the agent, which is stopped next.
    Ends(String),
}

/// The MCP server one agent session talks to.
#[derive(Clone)]
pub struct ToolGateway {
    tools: Arc<Vec<Tool>>,
    asks: mpsc::Sender<ToolAsk>,
}

/// The tool gateway as a tower service, to mount at [`PATH`].
pub type Service = StreamableHttpService<ToolGateway, LocalSessionManager>;

/// The service to mount at [`PATH`], and where its calls arrive.
pub fn service(offered: &[ModelTool]) -> (Service, mpsc::Receiver<ToolAsk>) {
    let (asks, asked) = mpsc::channel(WAITING_CALLS);
    let gateway = ToolGateway {
        tools: Arc::new(offered.iter().map(tool).collect()),
        asks,
    };
    // Sessions for the clients that keep one (protocol versions before 2026-07-28), in this
    // process's memory: an attempt's agent talks to its own worker only. rmcp's default host
    // check already allows only loopback names.
    let service = StreamableHttpService::new(
        move || Ok(gateway.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_max_request_body_bytes(MAX_MESSAGE_BYTES),
    );
    (service, asked)
}

fn tool(offered: &ModelTool) -> Tool {
    let schema = match &offered.parameters {
        Value::Object(schema) => schema.clone(),
        _ => Default::default(),
    };
    Tool::new(offered.name.clone(), offered.description.clone(), schema)
}

impl ServerHandler for ToolGateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "The run's tools, run by baton: each call is recorded before it runs and runs at \
             most once across the run's attempts.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (reply, replied) = oneshot::channel();
        let ask = ToolAsk {
            tool: request.name.to_string(),
            arguments: request.arguments.map(Value::Object).unwrap_or(Value::Null),
            reply,
        };
        let gone =
            || ErrorData::internal_error("the attempt that served this call has ended", None);
        self.asks.send(ask).await.map_err(|_| gone())?;
        let result = match replied.await.map_err(|_| gone())? {
            Reply::Told(told) if told.is_error => {
                CallToolResult::error(vec![ContentBlock::text(told.content)])
            }
            Reply::Told(told) => CallToolResult::success(vec![ContentBlock::text(told.content)]),
            Reply::Ends(why) => CallToolResult::error(vec![ContentBlock::text(why)]),
        };
        Ok(result.into())
    }
}
