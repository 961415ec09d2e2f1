//! A PostgreSQL of one test's own, for a test that crashes it: the bed's is shared by the
//! tests running beside it. Started, crashed and started again by the project's script
//! (hack/postgres.sh) in a state dir of its own, on a free port; taken down when dropped.

use std::path::PathBuf;

/// A throwaway PostgreSQL, up.
pub struct OwnPostgres {
    dir: PathBuf,
    /// Its `postgres://` URL (the `baton` role).
    pub url: String,
}

impl OwnPostgres {
    /// Starts one named after `name`.
    pub async fn up(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("baton-pg-{name}-{:08x}", rand::random::<u32>()));
        let mut own = Self {
            dir,
            url: String::new(),
        };
        own.script("up").await;
        let env = own.script("env").await;
        own.url = env
            .trim()
            .strip_prefix("export BATON_TEST_POSTGRES_URL=")
            .unwrap_or_else(|| panic!("hack/postgres.sh env printed {env:?}"))
            .to_string();
        own
    }

    /// Stops it the way a crash does (`pg_ctl -m immediate`).
    pub async fn crash(&self) {
        self.script("crash").await;
    }

    /// Starts it again after a crash: same data, same port.
    pub async fn start(&self) {
        self.script("start").await;
    }

    /// Runs `hack/postgres.sh command` for this state dir; its standard output.
    async fn script(&self, command: &str) -> String {
        let output = tokio::process::Command::new("bash")
            .arg(script_path())
            .arg(command)
            .env("BATON_PG_DIR", &self.dir)
            // The bed's own port is taken; a free one is chosen.
            .env_remove("BATON_PG_PORT")
            .output()
            .await
            .expect("running hack/postgres.sh");
        assert!(
            output.status.success(),
            "hack/postgres.sh {command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script_path())
            .arg("down")
            .env("BATON_PG_DIR", &self.dir)
            .env_remove("BATON_PG_PORT")
            .status();
    }
}

fn script_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("hack/postgres.sh")
}
