//! A PostgreSQL of one test's own, for a test that crashes it or gives it a configuration of
//! its own (TLS): the bed's is shared by the tests running beside it. Started, crashed and
//! started again by the project's script (hack/postgres.sh) in a state dir of its own, on a
//! free port; taken down when dropped.

#![allow(dead_code)]

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
        Self::up_with(name, &[]).await
    }

    /// Starts one that takes TCP clients over TLS only, with the certificate `cert_pem` and
    /// its key `key_pem`; its URL says `sslmode=require`.
    pub async fn up_tls(name: &str, cert_pem: &str, key_pem: &str) -> Self {
        let files = scratch_dir(&format!("{name}-tls"));
        std::fs::create_dir_all(&files).unwrap();
        let (cert, key) = (files.join("server.crt"), files.join("server.key"));
        std::fs::write(&cert, cert_pem).unwrap();
        std::fs::write(&key, key_pem).unwrap();
        let env = [
            ("BATON_PG_TLS_CERT", cert.to_string_lossy().into_owned()),
            ("BATON_PG_TLS_KEY", key.to_string_lossy().into_owned()),
        ];
        let own = Self::up_with(name, &env).await;
        let _ = std::fs::remove_dir_all(files);
        own
    }

    async fn up_with(name: &str, env: &[(&str, String)]) -> Self {
        let mut own = Self {
            dir: scratch_dir(name),
            url: String::new(),
        };
        own.script("up", env).await;
        let printed = own.script("env", &[]).await;
        own.url = printed
            .trim()
            .strip_prefix("export BATON_TEST_POSTGRES_URL=")
            .unwrap_or_else(|| panic!("hack/postgres.sh env printed {printed:?}"))
            .to_string();
        own
    }

    /// Stops it the way a crash does (`pg_ctl -m immediate`).
    pub async fn crash(&self) {
        self.script("crash", &[]).await;
    }

    /// Starts it again after a crash: same data, same port.
    pub async fn start(&self) {
        self.script("start", &[]).await;
    }

    /// Runs `hack/postgres.sh command` for this state dir, with `env`; its standard output.
    async fn script(&self, command: &str, env: &[(&str, String)]) -> String {
        let output = tokio::process::Command::new("bash")
            .arg(script_path())
            .arg(command)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
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

fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("baton-pg-{name}-{:08x}", rand::random::<u32>()))
}

fn script_path() -> PathBuf {
    crate::repo_root().join("hack/postgres.sh")
}
