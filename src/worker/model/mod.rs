//! Model providers behind one interface: the agent loop asks for the next assistant turn
//! given the conversation so far, and receives streamed text as it comes.

pub mod answer;
pub mod anthropic;
pub mod body;
pub mod endpoint;
pub mod openai;
pub mod retry;
pub mod scripted;
pub mod sse;

use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::toolbox::ModelTool;
use crate::ledger::ReplayedMessage;

/// What the model is asked.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub system_prompt: Option<String>,
    /// The conversation as replayed from the ledger plus what this attempt added.
    pub messages: Vec<ReplayedMessage>,
    /// The tools offered, by the names the model calls them.
    pub tools: Vec<ModelTool>,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelToolCall {
    /// The provider's id for the call (generated when the provider has none).
    pub call_id: String,
    pub tool: String,
    /// Arguments as a JSON object, serialized.
    pub arguments: String,
}

impl ModelToolCall {
    /// A tool call as a provider's stream assembled it. One without a name is a broken stream
    /// (worth retrying); empty arguments are `{}`; a call without an id gets a unique one
    /// (some local servers give none, and the conversation needs them).
    pub fn from_stream(id: String, name: String, arguments: String) -> Result<Self, ModelError> {
        if name.is_empty() {
            return Err(ModelError::Retryable {
                message: "the model's stream held a tool call without a name".into(),
                retry_after: None,
            });
        }
        let arguments = match arguments.trim() {
            "" => "{}".to_string(),
            _ => arguments,
        };
        let call_id = match id.is_empty() {
            true => format!("call_{:016x}", rand::random::<u64>()),
            false => id,
        };
        Ok(Self {
            call_id,
            tool: name,
            arguments,
        })
    }
}

/// The model's turn: its text and the tool calls to run, in order. No tool calls = final answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelTurn {
    pub text: String,
    pub tool_calls: Vec<ModelToolCall>,
    /// The tokens the call used, as the provider reported them (None: it reported none).
    pub usage: Option<Usage>,
}

/// Tokens one model call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: i64,
    pub output_tokens: i64,
}

impl ModelTurn {
    /// The turn a provider's stream assembled: its text and its tool calls in order (the
    /// first broken call fails the turn).
    pub fn assembled(
        text: String,
        calls: impl IntoIterator<Item = Result<ModelToolCall, ModelError>>,
    ) -> Result<Self, ModelError> {
        let tool_calls = calls.into_iter().collect::<Result<_, _>>()?;
        Ok(Self {
            text,
            tool_calls,
            usage: None,
        })
    }
}

/// Why a model call failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Worth retrying (429, 5xx, connection errors), after `retry_after` if the provider said.
    #[error("model call failed, will retry: {message}")]
    Retryable {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help (401, 400, unknown model, bad script): the run fails with `message`.
    /// Never contains the API key.
    #[error("model call failed: {message}")]
    Permanent {
        status: Option<u16>,
        message: String,
    },
}

impl ModelError {
    pub fn label(&self) -> &'static str {
        match self {
            ModelError::Retryable { .. } => "retryable",
            ModelError::Permanent { .. } => "permanent",
        }
    }
}

/// Sends streamed text pieces to the agent loop (which records them as `modelDelta`).
pub type DeltaSink = UnboundedSender<String>;
