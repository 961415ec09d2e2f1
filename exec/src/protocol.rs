//! What the worker and the executor say to each other: one JSON object per line over one Unix
//! stream connection, which the worker opens once at its start and holds for its life.
//!
//! - executor → worker, once on accept: [`FromExecutor::Ready`].
//! - worker → executor: [`FromWorker::Run`] starts a command; [`FromWorker::Cancel`] kills one.
//! - executor → worker: [`FromExecutor::Done`] for every command it was asked to run, exactly
//!   once, after the command's whole process group is gone (or was killed).
//!
//! The connection's end is the protocol's other half: when the worker's side closes (the
//! worker finished or died), the executor kills every command still running and exits, so a
//! step in flight is never left running for nobody. When the executor's side closes before a
//! `Done`, the worker cannot know what the command did: it records the step's effect as
//! unknown and ends the attempt (the next owner resumes; nothing is re-run blindly).

use serde::{Deserialize, Serialize};

/// Bumped on any change the other side could misread; both sides come from one image, so a
/// mismatch means a mixed rollout and is refused with both numbers named.
pub const PROTOCOL_VERSION: u32 = 2;

/// A message from the worker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum FromWorker {
    Run(RunRequest),
    Cancel { id: String },
}

/// A message from the executor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum FromExecutor {
    Ready { version: u32, workspace: String },
    Done(Outcome),
}

/// One command to run: `sh -c command` in the workspace (or `argv` itself, when given), with
/// `env` added.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunRequest {
    /// Unique on the connection; the `Done` names it.
    pub id: String,
    pub command: String,
    /// When not empty: run this argv directly, no shell (an agent container's command, as
    /// its manifest gives it); `command` is then only what logs show.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// Keep the end of stderr rather than its start (where a crash's traceback is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stderr_tail: bool,
    /// Added to the executor's own environment (the tools container's: no secret is in it).
    pub env: Vec<(String, String)>,
    pub timeout_ms: u64,
    /// Bytes of output kept over both streams, at most.
    pub cap_bytes: usize,
}

/// How a command ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Ending {
    Exited(i32),
    /// Killed by a signal that was not the executor's.
    Signalled,
    TimedOut,
    Cancelled,
    /// It could not be started.
    SpawnFailed(String),
}

/// A finished command: its ending and its capped output (non-UTF-8 converted lossily).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub id: String,
    pub ending: Ending,
    pub stdout: String,
    pub stderr: String,
    /// Bytes dropped over the cap.
    pub dropped: usize,
}

/// One message as its line (with the newline).
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("protocol messages always serialize");
    line.push(b'\n');
    line
}

/// One line as a message.
pub fn decode<'a, T: Deserialize<'a>>(line: &'a str) -> Result<T, serde_json::Error> {
    serde_json::from_str(line.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_each_and_read_back() {
        let run = FromWorker::Run(RunRequest {
            id: "7".into(),
            command: "printf 'a\\nb'".into(),
            argv: vec![],
            stderr_tail: false,
            env: vec![("BATON_STEP".into(), "3".into())],
            timeout_ms: 1000,
            cap_bytes: 10,
        });
        let line = encode(&run);
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let back: FromWorker = decode(std::str::from_utf8(&line).unwrap()).unwrap();
        assert_eq!(back, run);
        let done = FromExecutor::Done(Outcome {
            id: "7".into(),
            ending: Ending::SpawnFailed("no sh".into()),
            stdout: "\u{fffd}".into(),
            stderr: String::new(),
            dropped: 2,
        });
        let back: FromExecutor = decode(std::str::from_utf8(&encode(&done)).unwrap()).unwrap();
        assert_eq!(back, done);
    }
}
