//! The `shell` tool and probe runner: `sh -c` in its own process group, so a timeout or a
//! cancellation kills everything the command started.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::{OUTPUT_CAP_BYTES, ToolOutput, capped_text, truncation_marker};
use crate::crd::env::MODEL_API_KEY;

/// How long to wait for the pipes to close after the group was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// How a shell command ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Exited(i32),
    /// Killed by a signal (not ours).
    Signalled,
    TimedOut,
    Cancelled,
    /// It could not be started.
    SpawnFailed(String),
}

/// A finished shell command.
#[derive(Debug, Clone, PartialEq)]
pub struct ShellResult {
    pub ending: Ending,
    pub stdout: String,
    pub stderr: String,
    /// Bytes dropped over the cap.
    pub dropped: usize,
}

impl ShellResult {
    /// The bounded, clearly marked text the model sees.
    pub fn to_tool_output(&self) -> ToolOutput {
        let mut out = self.stdout.clone();
        if !self.stderr.is_empty() {
            out.push_str("\n[stderr]\n");
            out.push_str(&self.stderr);
        }
        if self.dropped > 0 {
            out.push_str(&truncation_marker(self.dropped));
        }
        let (note, is_error) = match &self.ending {
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
}

/// Runs `sh -c command` with `vars` added to the environment, minus the model API key: a
/// command the model chose must not be able to print it into the ledger.
pub async fn run(
    command: &str,
    vars: &[(String, String)],
    timeout: Duration,
    cancel: &CancellationToken,
) -> ShellResult {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .envs(vars.iter().cloned())
        .env_remove(MODEL_API_KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return spawn_failed(e),
    };
    let pid = child.id();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let work = async {
        let (o, e, status) = tokio::join!(
            read_capped(stdout, OUTPUT_CAP_BYTES),
            read_capped(stderr, OUTPUT_CAP_BYTES),
            child.wait()
        );
        (o, e, status)
    };
    tokio::pin!(work);
    let interrupted = tokio::select! {
        done = &mut work => return finished(done),
        _ = tokio::time::sleep(timeout) => Ending::TimedOut,
        _ = cancel.cancelled() => Ending::Cancelled,
    };
    kill_group(pid);
    let partial = tokio::time::timeout(DRAIN_AFTER_KILL, &mut work).await.ok();
    let mut result = partial.map(finished).unwrap_or_else(|| ShellResult {
        ending: Ending::Signalled,
        stdout: String::new(),
        stderr: String::new(),
        dropped: 0,
    });
    result.ending = interrupted;
    result
}

fn spawn_failed(e: std::io::Error) -> ShellResult {
    ShellResult {
        ending: Ending::SpawnFailed(e.to_string()),
        stdout: String::new(),
        stderr: String::new(),
        dropped: 0,
    }
}

type Captured = (String, usize);

fn finished(
    (out, err, status): (
        Captured,
        Captured,
        std::io::Result<std::process::ExitStatus>,
    ),
) -> ShellResult {
    let ending = match status {
        Ok(s) => s.code().map(Ending::Exited).unwrap_or(Ending::Signalled),
        Err(e) => Ending::SpawnFailed(e.to_string()),
    };
    // Each stream is capped on its own; the total kept stays within the cap.
    let (stdout, mut dropped) = out;
    let (mut stderr, err_dropped) = err;
    dropped += err_dropped;
    let room = OUTPUT_CAP_BYTES.saturating_sub(stdout.len());
    if stderr.len() > room {
        let cut = floor_char_boundary(&stderr, room);
        dropped += stderr.len() - cut;
        stderr.truncate(cut);
    }
    ShellResult {
        ending,
        stdout,
        stderr,
        dropped,
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Reads a pipe to its end, keeping at most `cap` bytes and counting the rest.
async fn read_capped<R: AsyncRead + Unpin>(pipe: Option<R>, cap: usize) -> Captured {
    let Some(mut pipe) = pipe else {
        return (String::new(), 0);
    };
    let mut kept = Vec::new();
    let mut total = 0usize;
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    capped_text(&kept, total, cap)
}

/// SIGKILL to the whole process group the command leads.
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        // SAFETY: killpg only sends a signal; the group id is our child's pid.
        unsafe {
            libc::killpg(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sh(command: &str, timeout_ms: u64) -> ShellResult {
        run(
            command,
            &[("BATON_STEP".into(), "4".into())],
            Duration::from_millis(timeout_ms),
            &CancellationToken::new(),
        )
        .await
    }

    #[tokio::test]
    async fn the_model_api_key_is_not_in_a_commands_environment() {
        let vars = [(MODEL_API_KEY.to_string(), "sk-secret".to_string())];
        let command = format!("echo ${{{MODEL_API_KEY}:-unset}}; env | grep -c sk-secret");
        let r = run(
            &command,
            &vars,
            Duration::from_secs(5),
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(r.stdout, "unset\n0\n");
    }

    #[tokio::test]
    async fn reports_output_and_exit_code() {
        let r = sh(
            "echo out; echo err >&2; echo step=$BATON_STEP; exit 3",
            5000,
        )
        .await;
        assert_eq!(r.ending, Ending::Exited(3));
        assert_eq!(r.stdout, "out\nstep=4\n");
        assert_eq!(r.stderr, "err\n");
        let out = r.to_tool_output();
        assert!(out.is_error);
        assert!(out.output.ends_with("[exit code: 3]"), "{}", out.output);
    }

    #[tokio::test]
    async fn huge_output_is_capped_and_marked() {
        let r = sh("head -c 200000 /dev/zero | tr '\\0' a", 10_000).await;
        assert_eq!(r.ending, Ending::Exited(0));
        assert_eq!(r.stdout.len(), OUTPUT_CAP_BYTES);
        assert_eq!(r.dropped, 200_000 - OUTPUT_CAP_BYTES);
        let out = r.to_tool_output().output;
        assert!(
            out.contains("[output truncated: 134464 bytes]"),
            "{}",
            &out[out.len() - 80..]
        );
    }

    #[tokio::test]
    async fn non_utf8_output_is_converted_lossily() {
        let r = sh("printf 'ok \\377\\376 end'", 5000).await;
        assert_eq!(r.stdout, "ok \u{fffd}\u{fffd} end");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_group() {
        let started = std::time::Instant::now();
        let r = sh("echo before; sleep 30 & sleep 30; echo never", 300).await;
        assert_eq!(r.ending, Ending::TimedOut);
        assert_eq!(r.stdout, "before\n");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the background sleep was killed too"
        );
        assert!(r.to_tool_output().output.contains("[timed out"));
    }

    #[tokio::test]
    async fn cancellation_kills_the_command() {
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            c.cancel();
        });
        let r = run("sleep 30", &[], Duration::from_secs(60), &cancel).await;
        assert_eq!(r.ending, Ending::Cancelled);
    }
}
