//! An agent container's tool call, answered within its attempt (docs/byo-agent.md, The tool
//! gateway): from the ledger when a step recorded it (`tool_replay`), otherwise as the
//! built-in loop runs a call: budget and step checks, the write-ahead intent (the one awaited
//! append), an approval gate or an `askUser` that ends the attempt, then the tool and its
//! buffered result. So a resumed agent gets the same answers its first attempt got, and a
//! call whose effect is unknown is told so, never run again (unless idempotent or probed, as
//! the resume plan decided before the agent started).

use serde_json::Value;

use super::tool_gateway::{Reply, ToolAsk};
use super::tool_replay::{ToolReplay, told};
use crate::worker::agent::run_call;
use crate::worker::finish::Ending;
use crate::worker::model::ModelToolCall;
use crate::worker::session::Session;

/// Answers `ask`; an ending when the call ends the attempt.
pub async fn answer(s: &mut Session, recorded: &mut ToolReplay, ask: ToolAsk) -> Option<Ending> {
    if let Some(told) = recorded.answer(&ask.tool, &ask.arguments) {
        let _ = ask.reply.send(Reply::Told(told));
        return None;
    }
    let step = s.turn.replay.last_step() + 1;
    let call = ModelToolCall {
        call_id: format!("call_{step}"),
        tool: ask.tool.clone(),
        arguments: arguments_text(&ask.arguments),
    };
    let ending = run_call(s, call).await;
    let reply = match &ending {
        None => match told(&s.turn.replay, step) {
            Some(told) => Reply::Told(told),
            None => Reply::Ends(format!("step {step} recorded no result")),
        },
        Some(ending) => Reply::Ends(why(ending, step)),
    };
    let _ = ask.reply.send(reply);
    ending
}

/// The arguments as a step records them: a JSON object's text (`{}` for none).
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::Null => "{}".into(),
        other => other.to_string(),
    }
}

/// What the agent is told when its call ends the attempt (it is stopped right after).
fn why(ending: &Ending, step: i64) -> String {
    match ending {
        Ending::AwaitingApproval { .. } => format!(
            "this call (step {step}) waits for a person's approval; the agent runs again once \
             it is decided"
        ),
        Ending::Waiting { question, .. } => format!(
            "the question (step {step}) waits for the user's answer: {question}; the agent \
             runs again once it is answered"
        ),
        Ending::Failed { message, .. } => message.clone(),
        _ => format!("this attempt ended during step {step}; the run goes on in the next"),
    }
}
