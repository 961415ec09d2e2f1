//! The process edge: start a pod's process as the leader of a session of its own (the local
//! stand-in for a container) with its output in a log file, signal every process in that
//! session, and read how it ended.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use tokio::process::{Child, Command};

use super::spec::ProcessSpec;
use super::status::Exit;

/// Signals the runner sends to a pod's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: graceful termination.
    Term,
    /// SIGKILL: kill -9.
    Kill,
    /// SIGSTOP: pause.
    Stop,
    /// SIGCONT: resume.
    Cont,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Sends `signal` to every process of the container led by `leader`: its session. A tool the
/// worker started in a process group of its own is still in the session, so a kill takes it too,
/// as a container's cgroup would. A container that no longer exists is not an error.
pub fn signal_container(leader: u32, signal: Signal) -> io::Result<()> {
    let sid =
        libc::pid_t::try_from(leader).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if sid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    send(-sid, signal)?;
    for pid in session_members(sid) {
        send(pid, signal)?;
    }
    Ok(())
}

/// kill(2), where a process that is already gone is not an error.
fn send(pid: libc::pid_t, signal: Signal) -> io::Result<()> {
    // SAFETY: kill(2) only sends a signal; it touches no memory.
    let rc = unsafe { libc::kill(pid, signal.raw()) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// The processes whose session id is `sid`, read from /proc.
fn session_members(sid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| session_of_stat(&stat) == Some(sid))
        })
        .collect()
}

/// The session id in a /proc/PID/stat line: the 4th field after the command, which is in
/// parentheses and may itself hold spaces and parentheses.
fn session_of_stat(stat: &str) -> Option<libc::pid_t> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(3)?.parse().ok()
}

/// Starts `spec` as the leader of a new session (the container: a kill of the session takes
/// every process it started with it), stdin from /dev/null, stdout and stderr appended to
/// `log`. Returns the child; its pid is also the session and group id.
pub fn spawn(spec: &ProcessSpec, log: &Path) -> io::Result<Child> {
    let mut out = open_log(log)?;
    writeln!(
        out,
        "--- baton-runner {}: starting {} {}",
        k8s_openapi::jiff::Timestamp::now(),
        spec.program.display(),
        spec.args.join(" ")
    )?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(false);
    // SAFETY: setsid(2) is async-signal-safe and the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if let Some(dir) = &spec.working_dir {
        cmd.current_dir(dir);
    }
    cmd.spawn()
}

fn open_log(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

/// Appends one line from the runner itself to a pod's log.
pub fn log_line(path: &Path, line: &str) {
    if let Ok(mut f) = open_log(path) {
        let _ = writeln!(
            f,
            "--- baton-runner {}: {line}",
            k8s_openapi::jiff::Timestamp::now()
        );
    }
}

/// How a reaped process ended.
pub fn exit_of(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(sig)) => Exit::Signal(sig),
        (None, None) => Exit::Lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn sh(script: &str) -> ProcessSpec {
        ProcessSpec {
            program: PathBuf::from("sh"),
            args: vec!["-c".into(), script.into()],
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            working_dir: None,
        }
    }

    fn log_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "baton-runner-unit-{}-{name}.log",
            std::process::id()
        ))
    }

    #[tokio::test]
    async fn exit_code_and_log() {
        let log = log_path("exit");
        let mut child = spawn(&sh("echo hello; echo oops >&2; exit 3"), &log).unwrap();
        assert_eq!(exit_of(child.wait().await.unwrap()), Exit::Code(3));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("hello") && text.contains("oops"), "{text}");
        let _ = std::fs::remove_file(log);
    }

    #[tokio::test]
    async fn own_session_and_container_kill() {
        let log = log_path("group");
        let mut child = spawn(&sh("sleep 30"), &log).unwrap();
        let pid = child.id().unwrap();
        // SAFETY: getsid reads the session of a live child.
        let sid = unsafe { libc::getsid(pid as libc::pid_t) };
        assert_eq!(sid as u32, pid, "the child leads its own session");
        signal_container(pid, Signal::Kill).unwrap();
        assert_eq!(
            exit_of(child.wait().await.unwrap()),
            Exit::Signal(libc::SIGKILL)
        );
        signal_container(pid, Signal::Kill).expect("a vanished container is not an error");
        let _ = std::fs::remove_file(log);
    }

    #[tokio::test]
    async fn a_kill_reaches_a_grandchild_in_a_process_group_of_its_own() {
        let dir = std::env::temp_dir().join(format!("baton-runner-unit-{}-pg", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("grandchild.pid");
        // A process group of its own inside the same session, as the worker's shell tool makes
        // for each command (`setsid` would leave the session: no container does that by itself).
        let script = format!(
            "python3 -c 'import os, time; os.setpgid(0, 0); open(\"{}\", \"w\").write(str(os.getpid())); time.sleep(30)' & wait",
            pidfile.display()
        );
        let mut child = spawn(&sh(&script), &log_path("pg")).unwrap();
        let grandchild = wait_for_pid_file(&pidfile).await;
        // SAFETY: getpgid reads the process group of a live process.
        let pgid = unsafe { libc::getpgid(grandchild) };
        assert_ne!(
            pgid as u32,
            child.id().unwrap(),
            "the grandchild has a group of its own"
        );
        signal_container(child.id().unwrap(), Signal::Kill).unwrap();
        let _ = child.wait().await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let alive = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
            .is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "the grandchild outlived its container");
        let _ = std::fs::remove_dir_all(dir);
    }

    async fn wait_for_pid_file(path: &Path) -> libc::pid_t {
        for _ in 0..100 {
            if let Some(pid) = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return pid;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("no pid file at {}", path.display());
    }

    #[test]
    fn the_session_is_read_past_a_command_with_spaces_and_parentheses() {
        assert_eq!(session_of_stat("42 (a (b) c) S 1 42 42 0 -1"), Some(42));
        assert_eq!(session_of_stat("garbage"), None);
    }

    #[test]
    fn refuses_to_signal_init_or_everything() {
        assert!(signal_container(0, Signal::Kill).is_err());
        assert!(signal_container(1, Signal::Kill).is_err());
    }
}
