//! The process edge: start a pod's process in a process group of its own with its output in a
//! log file, signal the whole group, and read how it ended.

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

/// Sends `signal` to every process in the group `pgid`. A group that no longer exists is not
/// an error (the processes are already gone).
pub fn signal_group(pgid: u32, signal: Signal) -> io::Result<()> {
    let pgid =
        libc::pid_t::try_from(pgid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
    let rc = unsafe { libc::kill(-pgid, signal.raw()) };
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

/// Starts `spec` as the leader of a new process group (as a container's cgroup, a kill of the
/// group takes every process it started with it), stdin from /dev/null, stdout and stderr
/// appended to `log`. Returns the child; its pid is also the group id.
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
        .process_group(0)
        .kill_on_drop(false);
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
    async fn own_group_and_group_kill() {
        let log = log_path("group");
        let mut child = spawn(&sh("sleep 30"), &log).unwrap();
        let pid = child.id().unwrap();
        // SAFETY: getpgid reads the process group of a live child.
        let pgid = unsafe { libc::getpgid(pid as libc::pid_t) };
        assert_eq!(pgid as u32, pid, "the child leads its own process group");
        signal_group(pid, Signal::Kill).unwrap();
        assert_eq!(
            exit_of(child.wait().await.unwrap()),
            Exit::Signal(libc::SIGKILL)
        );
        signal_group(pid, Signal::Kill).expect("a vanished group is not an error");
        let _ = std::fs::remove_file(log);
    }

    #[test]
    fn refuses_to_signal_init_or_everything() {
        assert!(signal_group(0, Signal::Kill).is_err());
        assert!(signal_group(1, Signal::Kill).is_err());
    }
}
