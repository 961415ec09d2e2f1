//! Both providers against a model server nobody here wrote: the LiteLLM proxy, with mock
//! models (tests/litellm/config.yaml). Its Chat Completions endpoint streams as asked; its
//! Messages endpoint answers a streamed request with the whole message as JSON (before, the
//! Anthropic provider waited on events that never came); its errors are its own.

use baton::crd::v1alpha1::Provider;
use baton::ledger::ReplayedMessage;
use baton::worker::model::anthropic::AnthropicModel;
use baton::worker::model::openai::OpenAiModel;
use baton::worker::model::{ModelError, ModelRequest, ModelTurn};
use baton_testkit::common::litellm::{KEY, LiteLlm};
use tokio::sync::mpsc::unbounded_channel;

fn hi() -> ModelRequest {
    ModelRequest {
        system_prompt: Some("Be brief.".into()),
        messages: vec![ReplayedMessage::User("hi".into())],
        tools: vec![],
    }
}

/// One call of `model` on the proxy through `provider`'s API, with `key`; the turn or error,
/// and the text streamed on the way.
async fn call(
    proxy: &LiteLlm,
    provider: Provider,
    model: &str,
    key: &str,
) -> (Result<ModelTurn, ModelError>, String) {
    let (tx, mut rx) = unbounded_channel();
    let spec = proxy.model(provider, model);
    let result = match provider {
        Provider::Anthropic => {
            let m = AnthropicModel::new(&spec, Some(key.into())).unwrap();
            m.complete(&hi(), &tx).await
        }
        _ => {
            let m = OpenAiModel::new(&spec, Some(key.into())).unwrap();
            m.complete(&hi(), &tx).await
        }
    };
    let mut streamed = String::new();
    while let Ok(piece) = rx.try_recv() {
        streamed.push_str(&piece);
    }
    (result, streamed)
}

#[tokio::test]
async fn both_providers_through_the_litellm_proxy() {
    let proxy = LiteLlm::start().await;
    println!("LiteLLM {} at {}", proxy.version, proxy.url);

    // Chat Completions, streamed: the text in pieces, the usage from its last chunk.
    for model in ["mock-gpt", "mock-claude"] {
        let (turn, streamed) = call(&proxy, Provider::Openai, model, KEY).await;
        let turn = turn.unwrap_or_else(|e| panic!("openai, {model}: {e}"));
        assert_eq!(turn.text, "hello from the mock", "openai, {model}");
        assert_eq!(streamed, turn.text);
        let usage = turn.usage.expect("usage");
        assert!(
            usage.input_tokens > 0 && usage.output_tokens > 0,
            "{usage:?}"
        );
    }

    // Messages, asked to stream, answered whole as JSON: taken as the turn, with its usage.
    for model in ["mock-claude", "mock-gpt"] {
        let (turn, streamed) = call(&proxy, Provider::Anthropic, model, KEY).await;
        let turn = turn.unwrap_or_else(|e| panic!("anthropic, {model}: {e}"));
        assert_eq!(turn.text, "hello from the mock", "anthropic, {model}");
        assert_eq!(streamed, turn.text);
        let usage = turn.usage.expect("usage");
        assert!(
            usage.input_tokens > 0 && usage.output_tokens > 0,
            "{usage:?}"
        );
    }

    // Its errors: a rate limit is waited out, a request too long for the model is not, and a
    // key it does not know is refused for good; none shows the key.
    for provider in [Provider::Openai, Provider::Anthropic] {
        let (result, _) = call(&proxy, provider, "mock-rate-limited", KEY).await;
        let err = result.expect_err("a rate limit");
        assert!(
            matches!(err, ModelError::Retryable { .. }),
            "{provider:?}: {err:?}"
        );
        assert!(err.to_string().contains("HTTP 429"), "{err}");
        assert!(err.to_string().contains("mock rate limit error"), "{err}");

        let (result, _) = call(&proxy, provider, "mock-too-long", KEY).await;
        let err = result.expect_err("a context window error");
        assert!(
            matches!(
                err,
                ModelError::Permanent {
                    status: Some(400),
                    ..
                }
            ),
            "{provider:?}: {err:?}"
        );
        assert!(err.to_string().contains("context window exceeded"), "{err}");

        // Without a database of keys, the proxy answers a key that is not its own with a 400
        // ("No connected db."), not a 401: refused for good either way.
        let wrong = "sk-wrong-0a1b2c3d4e5f6a7b8c9d";
        let (result, _) = call(&proxy, provider, "mock-gpt", wrong).await;
        let err = result.expect_err("an unknown key");
        assert!(
            matches!(
                err,
                ModelError::Permanent {
                    status: Some(400 | 401),
                    ..
                }
            ),
            "{provider:?}: {err:?}"
        );
        assert!(
            !err.to_string().contains(wrong) && !err.to_string().contains(KEY),
            "{err}"
        );
    }
}
