//! Orphans, reaped. The executor is the tools container's PID 1, so every process a command
//! left behind (`server &`) becomes its child when its parent exits, and a zombie when it
//! exits itself, until someone waits for it. Over a long run those would pile up against the
//! container's process limit. The commands' own shells are waited for by their runners; the
//! reaper waits only for the others: it peeks (`WNOWAIT`) and reaps what it does not know.
//! A command is spawned under the same lock the reaper checks with, so no runner loses its
//! child's exit status to the reaper.

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static CHILDREN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn children() -> MutexGuard<'static, BTreeSet<i32>> {
    CHILDREN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Spawns `command` as a known child: the reaper leaves it to its runner.
pub fn spawn(command: &mut Command) -> std::io::Result<Child> {
    let mut known = children();
    let child = command.spawn()?;
    known.insert(child.id() as i32);
    Ok(child)
}

/// The runner has waited for its child.
pub fn forget(pid: u32) {
    children().remove(&(pid as i32));
}

/// When this process is PID 1 (a container's init), reaps orphans once a second.
pub fn start_if_init() {
    if std::process::id() == 1 {
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                reap_orphans();
            }
        });
    }
}

/// Reaps every exited child that is not a known one; returns how many.
pub fn reap_orphans() -> usize {
    let known = children();
    let mut reaped = 0;
    loop {
        // SAFETY: waitid fills `info` (zeroed, plain data); WNOWAIT leaves the child waitable.
        let pid = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            if libc::waitid(libc::P_ALL, 0, &mut info, flags) != 0 {
                break;
            }
            info.si_pid()
        };
        // No exited child, or a known one first (its runner reaps it soon): next time.
        if pid == 0 || known.contains(&pid) {
            break;
        }
        // SAFETY: reaps exactly the orphan just seen exited.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        }
        reaped += 1;
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::run;
    use crate::protocol::{Ending, RunRequest};

    #[test]
    fn orphans_are_reaped_and_a_commands_own_shell_is_not() {
        // As a subreaper, this test process gets the orphans a PID 1 would get.
        // SAFETY: sets a flag of this process.
        assert_eq!(
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) },
            0
        );
        let request = RunRequest {
            id: "1".into(),
            command: "sleep 0.2 > /dev/null 2>&1 & echo left one behind".into(),
            argv: vec![],
            stderr_tail: false,
            env: vec![],
            timeout_ms: 5000,
            cap_bytes: 1000,
        };
        let outcome = run(
            &request,
            std::path::Path::new("/tmp"),
            std::sync::mpsc::channel(),
            |_| {},
        );
        assert_eq!(outcome.ending, Ending::Exited(0), "{outcome:?}");
        std::thread::sleep(Duration::from_millis(600));
        assert!(reap_orphans() >= 1, "the sleep left behind was not reaped");
    }
}
