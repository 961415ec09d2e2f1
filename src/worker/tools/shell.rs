//! The `shell` tool and probe runner: `sh -c` in the tools container, through its executor
//! (`baton_exec`), which runs it in its own process group, so a timeout or a cancellation
//! kills everything the command started. The worker's own environment (the model key, the API
//! token) is in another container: a command cannot print what it cannot reach.

use std::time::Duration;

pub use baton_exec::protocol::{Ending, Outcome};
use tokio_util::sync::CancellationToken;

use super::executor::{Executor, ExecutorLost};
use super::{OUTPUT_CAP_BYTES, ToolOutput, truncation_marker};

/// Runs `sh -c command` in the tools container with `vars` added to its environment.
pub async fn run(
    executor: &Executor,
    command: &str,
    vars: &[(String, String)],
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Outcome, ExecutorLost> {
    executor
        .run(command, vars, timeout, OUTPUT_CAP_BYTES, cancel)
        .await
}

/// The bounded, clearly marked text the model sees.
pub fn to_tool_output(outcome: &Outcome) -> ToolOutput {
    let mut out = outcome.stdout.clone();
    if !outcome.stderr.is_empty() {
        out.push_str("\n[stderr]\n");
        out.push_str(&outcome.stderr);
    }
    if outcome.dropped > 0 {
        out.push_str(&truncation_marker(outcome.dropped));
    }
    let (note, is_error) = match &outcome.ending {
        Ending::Exited(0) => ("[exit code: 0]".to_string(), false),
        Ending::Exited(code) => (format!("[exit code: {code}]"), true),
        Ending::Signalled => ("[killed by a signal]".to_string(), true),
        Ending::TimedOut => ("[timed out: the command was killed]".to_string(), true),
        Ending::Cancelled => ("[cancelled: the command was killed]".to_string(), true),
        Ending::SpawnFailed(e) => (format!("[could not start: {e}]"), true),
    };
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&note);
    ToolOutput {
        output: out,
        is_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ending: Ending, stdout: &str, stderr: &str, dropped: usize) -> Outcome {
        Outcome {
            id: "1".into(),
            ending,
            stdout: stdout.into(),
            stderr: stderr.into(),
            dropped,
        }
    }

    #[test]
    fn the_model_sees_output_stderr_truncation_and_the_ending() {
        let out = to_tool_output(&outcome(Ending::Exited(3), "out\n", "err", 5));
        assert!(out.is_error);
        assert_eq!(
            out.output,
            "out\n\n[stderr]\nerr\n[output truncated: 5 bytes]\n[exit code: 3]"
        );
        let ok = to_tool_output(&outcome(Ending::Exited(0), "", "", 0));
        assert!(!ok.is_error);
        assert_eq!(ok.output, "[exit code: 0]");
        let timed_out = to_tool_output(&outcome(Ending::TimedOut, "before\n", "", 0));
        assert!(
            timed_out
                .output
                .ends_with("[timed out: the command was killed]")
        );
    }
}
