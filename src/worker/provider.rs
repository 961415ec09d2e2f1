//! Model dispatch: the run's `agent.model.provider` picks the implementation; retryable
//! failures (429, 5xx, connection errors) are retried with backoff without losing the turn.

use tokio_util::sync::CancellationToken;

use super::metrics::WorkerMetrics;
use super::model::anthropic::AnthropicModel;
use super::model::openai::OpenAiModel;
use super::model::retry::{RetryPolicy, with_retries};
use super::model::scripted::ScriptedModel;
use super::model::{DeltaSink, ModelError, ModelRequest, ModelTurn};
use crate::crd::v1alpha1::{ModelSpec, Provider};

/// The model that drives a run.
#[derive(Debug, Clone)]
pub enum Model {
    Scripted(ScriptedModel),
    OpenAi(OpenAiModel),
    Anthropic(AnthropicModel),
}

impl Model {
    /// Builds the provider the spec names. A bad spec (no model name, bad endpoint, missing
    /// key) is a permanent error: the run fails with its message, which never holds the key.
    pub fn for_spec(spec: &ModelSpec, api_key: Option<String>) -> Result<Self, ModelError> {
        Ok(match spec.provider {
            Provider::Scripted => Model::Scripted(ScriptedModel::new(spec.script.clone())),
            Provider::Openai => Model::OpenAi(OpenAiModel::new(spec, api_key)?),
            Provider::Anthropic => Model::Anthropic(AnthropicModel::new(spec, api_key)?),
        })
    }

    /// One call, without retries.
    pub async fn complete_once(
        &self,
        request: &ModelRequest,
        deltas: &DeltaSink,
    ) -> Result<ModelTurn, ModelError> {
        match self {
            Model::Scripted(m) => m.complete(request, deltas).await,
            Model::OpenAi(m) => m.complete(request, deltas).await,
            Model::Anthropic(m) => m.complete(request, deltas).await,
        }
    }

    /// The next turn, retrying retryable failures; `cancel` ends it at once. Every request
    /// and every retry is counted in `metrics`.
    pub async fn complete(
        &self,
        request: &ModelRequest,
        deltas: &DeltaSink,
        cancel: &CancellationToken,
        metrics: &WorkerMetrics,
    ) -> Result<ModelTurn, ModelError> {
        let policy = RetryPolicy::default();
        let mut calls = 0u32;
        let call = || {
            calls += 1;
            let retry = calls > 1;
            async move {
                let result = self.complete_once(request, deltas).await;
                metrics.model_called(&result, retry);
                result
            }
        };
        with_retries(&policy, cancel, call).await
    }
}
