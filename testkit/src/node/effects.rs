//! The effects server: the shell tools' side effects counted outside baton.

use super::*;

/// `hack/effects.py` inside the node's namespace: the shell tools' effects, counted outside baton.
pub struct EffectsServer {
    child: Child,
    pub addr: String,
    pub file: PathBuf,
}

impl EffectsServer {
    pub fn start(dir: &Path) -> Self {
        let port = 20_000 + rand::random::<u16>() % 20_000;
        let addr = format!("{NODE_IP}:{port}");
        let file = dir.join("effects.log");
        std::fs::write(&file, "").unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={NETNS}"))
            .arg("python3")
            .arg(root().join("hack/effects.py"))
            .arg(&addr)
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting hack/effects.py in the node's namespace");
        // Listening once it accepts a connection made from inside the namespace.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Command::new("nsenter")
            .arg(format!("--net={NETNS}"))
            .args(["bash", "-c", &format!("exec 3<>/dev/tcp/{NODE_IP}/{port}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "hack/effects.py did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, addr, file }
    }
}

impl Drop for EffectsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
