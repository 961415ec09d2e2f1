//! The run's model provider, as the gateway reaches it: the agent's request forwarded as it
//! was sent, to the same API (Chat Completions or Responses) at the provider's base URL, with the run's key (which the agent never holds), within the call's bounds. The
//! provider's answer is sorted as the built-in loop's is (`model::answer`), so a server that
//! misbehaves ends the call with a clear error, never a silent wait.

use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde_json::Value;

use crate::crd::v1alpha1::ModelSpec;
use crate::ledger::model_api::ModelApi;
use crate::worker::model::ModelError;
use crate::worker::model::answer::{self, Answer};
use crate::worker::model::openai::OpenAiModel;

/// The OpenAI endpoint of the run's provider: the built-in loop's own, its client and bounds
/// included.
#[derive(Debug, Clone)]
pub struct Upstream {
    provider: OpenAiModel,
}

impl Upstream {
    /// From the run's model spec and key; a bad endpoint or key is the spec's error.
    pub fn openai(spec: &ModelSpec, api_key: Option<String>) -> Result<Self, ModelError> {
        Ok(Self {
            provider: OpenAiModel::new(spec, api_key)?,
        })
    }

    /// Sends `body` to `api` as the agent sent it; the answer, sorted (a stream, or a whole
    /// document).
    pub async fn send(
        &self,
        api: ModelApi,
        body: &Value,
        stream: bool,
    ) -> Result<Answer, ModelError> {
        let (client, target) = self.provider.endpoint();
        // The built-in loop's target is the Chat Completions URL; the other APIs sit beside it.
        let base = target
            .url
            .strip_suffix(ModelApi::Chat.path())
            .unwrap_or(&target.url);
        let url = format!("{base}{}", api.path());
        let accept = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut http = client.post(&url).header(ACCEPT, accept).json(body);
        if let Some(auth) = target.key.header("Bearer ")? {
            http = http.header(AUTHORIZATION, auth);
        }
        let response = answer::send(http, target).await?;
        answer::receive(response, target).await
    }

    /// What a 2xx JSON answer without its API's `field` says, as the built-in loop's provider
    /// words it, the key redacted.
    pub fn not_an_answer(&self, answer: &Value, field: &str) -> String {
        match self.provider.endpoint().1.not_an_answer(answer, field) {
            ModelError::Permanent { message, .. } | ModelError::Retryable { message, .. } => {
                message
            }
        }
    }

    /// `message` about this provider's call, the key redacted.
    pub fn error_text(&self, message: &str) -> String {
        self.provider.endpoint().1.error_text(message)
    }
}
