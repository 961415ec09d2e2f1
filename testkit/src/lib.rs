//! baton's test kit: what the integration tests, benchmarks and node suites share, under one
//! name each (a dev-dependency of baton, so every test target reaches it the same way).
//!
//! - `common`: the bed (a client of the local control plane with the CRDs installed, a
//!   namespace per test), the controller and workers in this process or as processes, the
//!   webhook, fenced claims played by hand, Events, LiteLLM, the previous release;
//! - `controller`, `worker`, `server`, `helm`: what the suites of each share;
//! - `model`: the fake model server (scripted replies over raw TCP);
//! - `rbac`: users and service accounts with only the rights a test gives;
//! - `sse`: a Server-Sent Events reader;
//! - `node`, `e2e`: the real node (`hack/node.sh`) with the chart installed, and the scripted
//!   runs, effects and checks the node suites and benchmarks play on it;
//! - `metrics`: the controller's, the server's and the API server's metrics scraped, a
//!   process's RSS (the benchmarks' figures).
//!
//! There is no mock of the API server here: a test that needs one fails and says how to start
//! it (`hack/with-control-plane.sh`).

pub mod clients;
pub mod common;
pub mod controller;
pub mod e2e;
pub mod helm;
pub mod metrics;
pub mod model;
pub mod node;
pub mod rbac;
pub mod server;
pub mod sse;
pub mod worker;

use std::path::{Path, PathBuf};

/// The repository's root (scripts, charts, fixtures are found from it).
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// True once a GET of `url` answers 2xx, polled every 250 ms for at most `within`.
pub async fn answers_within(url: &str, within: std::time::Duration) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < within {
        if let Ok(r) = reqwest::get(url).await
            && r.status().is_success()
        {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    false
}

/// A loopback port free a moment ago, for a server a test starts.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// Where hack/setup.sh and hack/images.sh keep what they build (`$BATON_CACHE_DIR`, by default
/// `~/.cache/baton`): venvs, images, the previous release.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("BATON_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/baton")
        })
}

/// The `baton` binary of the build the running test belongs to: `target/<profile>/baton`, beside
/// the `deps/` folder the test binary runs from. Cargo names it to a package's own tests only
/// (`CARGO_BIN_EXE_baton`), so the kit finds it from where the test runs.
pub fn baton_bin() -> PathBuf {
    let test = std::env::current_exe().expect("the running test's path");
    let profile = test
        .parent()
        .and_then(Path::parent)
        .expect("a test binary runs from target/<profile>/deps");
    let baton = profile.join("baton");
    assert!(
        baton.exists(),
        "{} is missing: build it with `cargo build` (cargo test builds it for baton's tests)",
        baton.display()
    );
    baton
}
