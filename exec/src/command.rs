//! One command: `sh -c` in its own process group, so a timeout, a cancel or the worker's
//! going away kills everything the command started. A process that left the group (`setsid`,
//! or a daemon's double fork) is found by a mark in its environment that every descendant
//! inherits ([`Tree`]), and killed too; only one that also cleared its environment escapes,
//! bounded by the pod's process limit. Plain threads, not an async runtime: the executor runs
//! a handful of commands at a time and must stay small enough to link statically.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime};

use crate::capture::{Captured, capped_text, tail_text, within_cap};
use crate::protocol::{Ending, Outcome, RunRequest};
use crate::reaper;

/// How long to wait for the pipes to close after the group was killed (a process that left
/// the group may hold them open; its output is then given up).
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// The environment variable that marks every process of one command.
const TREE_MARK: &str = "BATON_EXEC_TREE";

/// Everything one command started: its process group, and the mark its processes carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub group: i32,
    mark: String,
}

impl Tree {
    /// A mark no other command of any executor on this machine has.
    fn new_mark() -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let since = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("{}.{}.{n}", std::process::id(), since.as_nanos())
    }

    /// SIGKILL to the group, then to every process that carries the mark (it left the group).
    pub fn kill(&self) {
        kill_group(self.group);
        let me = std::process::id() as i32;
        for pid in marked(&format!("{TREE_MARK}={}", self.mark)) {
            if pid != me {
                // SAFETY: kill only sends a signal, to a process that carries this command's mark.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// The processes whose environment holds `entry` (`NAME=value`), as far as /proc shows them.
fn marked(entry: &str) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// What a running command's threads (and the server, for a cancel) report.
pub enum Event {
    Stdout(Captured),
    Stderr(Captured),
    Exited(std::io::Result<ExitStatus>),
    Cancel,
}

/// Runs `request` in `workdir`. `events` is the command's own channel: its threads report on
/// `sender`, and the server sends [`Event::Cancel`] on a clone of it. `started` gets the
/// command's [`Tree`] as soon as there is one (the server kills it when the worker goes).
pub fn run(
    request: &RunRequest,
    workdir: &Path,
    (sender, events): (Sender<Event>, Receiver<Event>),
    started: impl FnOnce(Tree),
) -> Outcome {
    let mark = Tree::new_mark();
    let mut command = match request.argv.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args);
            command
        }
        None => {
            let mut command = Command::new("sh");
            command.arg("-c").arg(&request.command);
            command
        }
    };
    command
        .envs(request.env.iter().cloned())
        .env(TREE_MARK, &mark)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match reaper::spawn(&mut command) {
        Ok(child) => child,
        Err(e) => return outcome(request, Ending::SpawnFailed(e.to_string()), None, None),
    };
    let tree = Tree {
        group: child.id() as i32,
        mark,
    };
    started(tree.clone());
    let cap = request.cap_bytes;
    if let Some(pipe) = child.stdout.take() {
        let tx = sender.clone();
        std::thread::spawn(move || tx.send(Event::Stdout(read_capped(pipe, cap, false))));
    }
    if let Some(pipe) = child.stderr.take() {
        let tx = sender.clone();
        let tail = request.stderr_tail;
        std::thread::spawn(move || tx.send(Event::Stderr(read_capped(pipe, cap, tail))));
    }
    std::thread::spawn(move || {
        let status = child.wait();
        reaper::forget(child.id());
        sender.send(Event::Exited(status))
    });
    collect(request, &tree, &events)
}

/// Waits for the exit and both pipes' ends, or a timeout or cancel (then kills the group and
/// drains what it can).
fn collect(request: &RunRequest, tree: &Tree, events: &Receiver<Event>) -> Outcome {
    let mut seen = Seen::default();
    let mut deadline = Instant::now() + Duration::from_millis(request.timeout_ms);
    let mut interrupted = None;
    while !seen.complete() {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Cancel) if interrupted.is_none() => {
                interrupted = Some(Ending::Cancelled);
            }
            Ok(Event::Cancel) => continue,
            Ok(event) => {
                seen.take(event);
                continue;
            }
            Err(RecvTimeoutError::Timeout) if interrupted.is_none() => {
                interrupted = Some(Ending::TimedOut);
            }
            Err(_) => break,
        }
        tree.kill();
        deadline = Instant::now() + DRAIN_AFTER_KILL;
    }
    let ending = match interrupted {
        Some(ending) => ending,
        None => match seen.exited {
            Some(Ok(status)) => status.code().map_or(Ending::Signalled, Ending::Exited),
            Some(Err(e)) => Ending::SpawnFailed(e.to_string()),
            None => Ending::Signalled,
        },
    };
    outcome(request, ending, seen.stdout, seen.stderr)
}

#[derive(Default)]
struct Seen {
    stdout: Option<Captured>,
    stderr: Option<Captured>,
    exited: Option<std::io::Result<ExitStatus>>,
}

impl Seen {
    fn take(&mut self, event: Event) {
        match event {
            Event::Stdout(c) => self.stdout = Some(c),
            Event::Stderr(c) => self.stderr = Some(c),
            Event::Exited(s) => self.exited = Some(s),
            Event::Cancel => {}
        }
    }

    fn complete(&self) -> bool {
        self.stdout.is_some() && self.stderr.is_some() && self.exited.is_some()
    }
}

fn outcome(
    request: &RunRequest,
    ending: Ending,
    stdout: Option<Captured>,
    stderr: Option<Captured>,
) -> Outcome {
    let (stdout, stderr, dropped) = within_cap(
        stdout.unwrap_or_default(),
        stderr.unwrap_or_default(),
        request.cap_bytes,
        request.stderr_tail,
    );
    Outcome {
        id: request.id.clone(),
        ending,
        stdout,
        stderr,
        dropped,
    }
}

/// Reads a pipe to its end, keeping at most `cap` bytes (its first, or with `tail` its last)
/// and counting the rest.
fn read_capped(mut pipe: impl Read, cap: usize, tail: bool) -> Captured {
    let mut kept = Vec::new();
    let mut total = 0usize;
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) if tail => {
                total += n;
                kept.extend_from_slice(&buf[..n]);
                // Dropped in cap-sized pieces, not on every read: at most 2 caps are held.
                if kept.len() > 2 * cap.max(1) {
                    kept.drain(..kept.len() - cap);
                }
            }
            Ok(n) => {
                total += n;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    if tail {
        return tail_text(&kept, total, cap);
    }
    capped_text(&kept, total, cap)
}

/// SIGKILL to a whole process group.
fn kill_group(group: i32) {
    // SAFETY: killpg only sends a signal; the group is one this executor started.
    unsafe {
        libc::killpg(group, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn request(command: &str, timeout_ms: u64, cap_bytes: usize) -> RunRequest {
        RunRequest {
            id: "1".into(),
            command: command.into(),
            argv: vec![],
            stderr_tail: false,
            env: vec![("BATON_STEP".into(), "4".into())],
            timeout_ms,
            cap_bytes,
        }
    }

    fn sh(command: &str, timeout_ms: u64) -> Outcome {
        run(
            &request(command, timeout_ms, 64 * 1024),
            Path::new("/tmp"),
            channel(),
            |_| {},
        )
    }

    #[test]
    fn reports_output_exit_code_and_the_step_env() {
        let o = sh(
            "echo out; echo err >&2; echo step=$BATON_STEP; pwd; exit 3",
            5000,
        );
        assert_eq!(o.ending, Ending::Exited(3));
        assert_eq!(o.stdout, "out\nstep=4\n/tmp\n");
        assert_eq!(o.stderr, "err\n");
    }

    #[test]
    fn huge_output_is_capped_and_counted() {
        let o = run(
            &request("head -c 200000 /dev/zero | tr '\\0' a", 10_000, 65_536),
            Path::new("/tmp"),
            channel(),
            |_| {},
        );
        assert_eq!(o.ending, Ending::Exited(0));
        assert_eq!(o.stdout.len(), 65_536);
        assert_eq!(o.dropped, 200_000 - 65_536);
    }

    #[test]
    fn non_utf8_output_is_converted_lossily() {
        assert_eq!(
            sh("printf 'ok \\377\\376 end'", 5000).stdout,
            "ok \u{fffd}\u{fffd} end"
        );
    }

    #[test]
    fn a_timeout_kills_the_whole_group() {
        let started = Instant::now();
        let o = sh("echo before; sleep 30 & sleep 30; echo never", 300);
        assert_eq!(o.ending, Ending::TimedOut);
        assert_eq!(o.stdout, "before\n");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the background sleep was killed too"
        );
    }

    /// A process that left the command's group (`setsid`) dies with its timeout all the same.
    #[test]
    fn a_timeout_kills_a_process_that_left_the_group() {
        let pid_file =
            std::env::temp_dir().join(format!("baton-exec-setsid-{}", std::process::id()));
        let command = format!(
            "setsid sh -c 'echo $$ > {}; exec sleep 30' & sleep 30",
            pid_file.display()
        );
        let o = sh(&command, 500);
        assert_eq!(o.ending, Ending::TimedOut);
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("the escaped process wrote its pid")
            .trim()
            .parse()
            .unwrap();
        let _ = std::fs::remove_file(&pid_file);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "process {pid} outlived its command"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Running, not exited and not a zombie waiting for its parent.
    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
    }

    #[test]
    fn a_cancel_kills_the_command() {
        let (tx, rx) = channel();
        let cancel = tx.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let _ = cancel.send(Event::Cancel);
        });
        let o = run(
            &request("sleep 30", 60_000, 100),
            Path::new("/tmp"),
            (tx, rx),
            |_| {},
        );
        assert_eq!(o.ending, Ending::Cancelled);
    }

    #[test]
    fn a_command_that_cannot_start_says_why() {
        let o = run(
            &request("true", 1000, 100),
            Path::new("/nonexistent-workdir"),
            channel(),
            |_| {},
        );
        assert!(matches!(o.ending, Ending::SpawnFailed(_)), "{o:?}");
    }
}
