//! A worker container's log followed into a file while its pod lives (`kubectl logs -f`), for
//! a failure message after the pod is gone: an evicted pod's log goes with it.

use super::*;

/// `kubectl logs -f` of one container, written to a file; stopped (by its PID) when dropped.
pub struct LogFollower {
    file: PathBuf,
    child: Child,
}

impl LogFollower {
    /// Follows the `worker` container of `pod` in `ns` into `dir`.
    pub fn worker(ns: &str, pod: &str, dir: &Path) -> Self {
        let file = dir.join(format!("{pod}.worker.log"));
        let out = std::fs::File::create(&file).expect("the log file");
        let child = Command::new("kubectl")
            .env("KUBECONFIG", kubeconfig())
            .args(["-n", ns, "logs", "-f", pod, "-c", "worker"])
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl logs -f");
        Self { file, child }
    }

    /// What was followed so far: its last `lines` lines.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for LogFollower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
