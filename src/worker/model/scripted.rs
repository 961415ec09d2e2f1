//! The `scripted` provider: deterministic turns from the run's spec, no network. The turn it
//! plays is the number of assistant turns already in the conversation, so a resumed run picks
//! up the script exactly where the ledger says it is.

use std::time::Duration;

use super::{DeltaSink, ModelError, ModelRequest, ModelToolCall, ModelTurn, Usage};
use crate::crd::v1alpha1::ScriptTurn;
use crate::ledger::ReplayedMessage;

/// Plays a script.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    script: Vec<ScriptTurn>,
}

impl ScriptedModel {
    pub fn new(script: Vec<ScriptTurn>) -> Self {
        Self { script }
    }

    /// The next turn of the script, streamed word by word over its delay.
    pub async fn complete(
        &self,
        request: &ModelRequest,
        deltas: &DeltaSink,
    ) -> Result<ModelTurn, ModelError> {
        let position = request
            .messages
            .iter()
            .filter(|m| matches!(m, ReplayedMessage::Assistant { .. }))
            .count();
        let turn = self
            .script
            .get(position)
            .ok_or_else(|| ModelError::Permanent {
                status: None,
                message: format!(
                    "the script has {} turns and the run asked for turn {}",
                    self.script.len(),
                    position + 1
                ),
            })?;
        let text = turn.text.clone().unwrap_or_default();
        stream(&text, turn.delay_milliseconds.unwrap_or(0), deltas).await;
        let tool_calls = tool_calls(position, turn);
        let usage = match turn.usage {
            Some(stated) => Usage {
                input_tokens: stated.input_tokens,
                output_tokens: stated.output_tokens,
            },
            None => estimated_usage(request, &text, &tool_calls),
        };
        Ok(ModelTurn {
            text,
            tool_calls,
            usage: Some(usage),
        })
    }
}

/// One token per 4 bytes, rounded up: deterministic, so a test can state what a run spends.
pub fn estimated_usage(request: &ModelRequest, text: &str, calls: &[ModelToolCall]) -> Usage {
    let tokens = |bytes: usize| bytes.div_ceil(4) as i64;
    let input: usize = request.system_prompt.as_deref().map_or(0, str::len)
        + request
            .messages
            .iter()
            .map(ReplayedMessage::text_bytes)
            .sum::<usize>();
    let output = text.len() + calls.iter().map(|c| c.arguments.len()).sum::<usize>();
    Usage {
        input_tokens: tokens(input),
        output_tokens: tokens(output),
    }
}

/// Streams `text` word by word. A turn's delay is spent half "thinking" before the first
/// word and half spread between the words, so a long turn is seen streaming (and can be
/// interrupted mid-stream).
async fn stream(text: &str, delay_ms: i64, deltas: &DeltaSink) {
    let pieces: Vec<&str> = text.split_inclusive(' ').collect();
    let delay = Duration::from_millis(delay_ms.max(0) as u64);
    tokio::time::sleep(delay / 2).await;
    let gap = delay / 2 / (pieces.len().max(1) as u32);
    for piece in pieces {
        let _ = deltas.send(piece.to_string());
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
}

/// Call ids are derived from the position, so a replayed call keeps its id.
fn tool_calls(position: usize, turn: &ScriptTurn) -> Vec<ModelToolCall> {
    turn.tool_calls
        .iter()
        .enumerate()
        .map(|(i, call)| ModelToolCall {
            call_id: format!("call_{position}_{i}"),
            tool: call.tool.clone(),
            arguments: serde_json::to_string(&call.arguments).unwrap_or_else(|_| "{}".into()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::v1alpha1::ScriptToolCall;

    fn request(assistant_turns: usize) -> ModelRequest {
        let messages = (0..assistant_turns)
            .map(|_| ReplayedMessage::Assistant {
                text: String::new(),
                tool_calls: vec![],
            })
            .collect();
        ModelRequest {
            system_prompt: None,
            messages,
            tools: vec![],
        }
    }

    fn script() -> Vec<ScriptTurn> {
        vec![
            ScriptTurn {
                text: Some("step one".into()),
                tool_calls: vec![ScriptToolCall {
                    tool: "sh".into(),
                    arguments: [("command".to_string(), "true".to_string())].into(),
                }],
                delay_milliseconds: None,
                usage: None,
            },
            ScriptTurn {
                text: Some("done".into()),
                ..ScriptTurn::default()
            },
        ]
    }

    #[tokio::test]
    async fn plays_the_turn_the_conversation_is_at() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let model = ScriptedModel::new(script());
        let first = model.complete(&request(0), &tx).await.unwrap();
        assert_eq!(first.tool_calls.len(), 1);
        assert_eq!(first.tool_calls[0].call_id, "call_0_0");
        assert_eq!(first.tool_calls[0].arguments, r#"{"command":"true"}"#);
        let second = model.complete(&request(1), &tx).await.unwrap();
        assert_eq!(second.text, "done");
        assert!(second.tool_calls.is_empty());
        let mut streamed = String::new();
        while let Ok(piece) = rx.try_recv() {
            streamed.push_str(&piece);
        }
        assert_eq!(streamed, "step onedone");
    }

    #[tokio::test]
    async fn running_past_the_script_is_a_permanent_error() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let err = ScriptedModel::new(script())
            .complete(&request(2), &tx)
            .await
            .unwrap_err();
        assert!(matches!(err, ModelError::Permanent { .. }));
    }
}
