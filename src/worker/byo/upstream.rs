//! The run's model provider, as the gateway reaches it: the agent's request forwarded as it
//! was sent, to the same API at the provider's base URL (an OpenAI provider for Chat
//! Completions and Responses, an Anthropic one for Messages), with the run's key (which the
//! agent never holds), within the call's bounds. The provider's answer is sorted as the
//! built-in loop's is (`model::answer`), so a server that misbehaves ends the call with a
//! clear error, never a silent wait.

use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde_json::Value;

use crate::crd::v1alpha1::{ModelSpec, Provider};
use crate::ledger::model_api::ModelApi;
use crate::worker::model::ModelError;
use crate::worker::model::answer::{self, Answer};
use crate::worker::model::anthropic::{API_VERSION, AnthropicModel};
use crate::worker::model::body::Target;
use crate::worker::model::openai::OpenAiModel;

/// The run's provider: the built-in loop's own, its client and bounds included.
#[derive(Debug, Clone)]
pub enum Upstream {
    OpenAi(OpenAiModel),
    Anthropic(AnthropicModel),
}

impl Upstream {
    /// From the run's model spec and key; a bad endpoint or key is the spec's error.
    pub fn for_model(spec: &ModelSpec, api_key: Option<String>) -> Result<Self, ModelError> {
        Ok(match spec.provider {
            Provider::Anthropic => Self::Anthropic(AnthropicModel::new(spec, api_key)?),
            Provider::Openai | Provider::Scripted => Self::OpenAi(OpenAiModel::new(spec, api_key)?),
        })
    }

    fn endpoint(&self) -> (&reqwest::Client, &Target) {
        match self {
            Self::OpenAi(provider) => provider.endpoint(),
            Self::Anthropic(provider) => provider.endpoint(),
        }
    }

    /// Sends `body` to `api` as the agent sent it; the answer, sorted (a stream, or a whole
    /// document). An API the run's provider does not speak is the agent's error.
    pub async fn send(
        &self,
        api: ModelApi,
        body: &Value,
        stream: bool,
    ) -> Result<Answer, ModelError> {
        let (client, target) = self.endpoint();
        let accept = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let http = match (self, api) {
            (Self::OpenAi(_), ModelApi::Chat | ModelApi::Responses) => {
                // The built-in loop's target is the Chat Completions URL; the others sit
                // beside it.
                let base = target
                    .url
                    .strip_suffix(ModelApi::Chat.path())
                    .unwrap_or(&target.url);
                let http = client.post(format!("{base}{}", api.path()));
                match target.key.header("Bearer ")? {
                    Some(auth) => http.header(AUTHORIZATION, auth),
                    None => http,
                }
            }
            (Self::Anthropic(_), ModelApi::Messages) => {
                let http = client
                    .post(&target.url)
                    .header("anthropic-version", API_VERSION);
                match target.key.header("")? {
                    Some(key) => http.header("x-api-key", key),
                    None => http,
                }
            }
            _ => return Err(self.not_spoken(api)),
        };
        let response = answer::send(http.header(ACCEPT, accept).json(body), target).await?;
        answer::receive(response, target).await
    }

    fn not_spoken(&self, api: ModelApi) -> ModelError {
        let (provider, speaks) = match self {
            Self::OpenAi(_) => ("openai", "/v1/chat/completions and /v1/responses"),
            Self::Anthropic(_) => ("anthropic", "/v1/messages"),
        };
        ModelError::Permanent {
            status: Some(400),
            message: format!(
                "the run's model provider is {provider} (spec.agent.model.provider): the \
                 gateway forwards {speaks} to it, not the {} API",
                api.name()
            ),
        }
    }

    /// What a 2xx JSON answer without its API's `field` says, as the built-in loop's provider
    /// words it, the key redacted.
    pub fn not_an_answer(&self, answer: &Value, field: &str) -> String {
        match self.endpoint().1.not_an_answer(answer, field) {
            ModelError::Permanent { message, .. } | ModelError::Retryable { message, .. } => {
                message
            }
        }
    }

    /// `message` about this provider's call, the key redacted.
    pub fn error_text(&self, message: &str) -> String {
        self.endpoint().1.error_text(message)
    }
}
