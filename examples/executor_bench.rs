//! Figures: what the tools container's executor adds to a tool step. The same tiny command
//! (`true`) run N times through a real `baton-exec serve` process and the worker's client
//! (what a shell step does in a pod), and N times directly as a child of this process (what a
//! shell step did before the split: `sh -c` in its own group, stdout and stderr piped).
//! Prints p50 / p90 / p99 of each and the added latency (make bench-executor).
//!
//!   cargo run --release --example executor_bench -- [--steps N] [--exec PATH]

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use baton::worker::tools::executor::Executor;
use tokio_util::sync::CancellationToken;

const COMMAND: &str = "true";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (steps, exec) = args()?;
    let dir = std::env::temp_dir().join(format!("baton-exec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("exec.sock");
    let mut server = std::process::Command::new(&exec)
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--workspace")
        .arg(&dir)
        .stderr(Stdio::null())
        .spawn()?;
    let executor = Executor::connect(&socket, Duration::from_secs(10)).await?;
    let cancel = CancellationToken::new();
    // Warm both paths (page cache, the executor's first thread) before measuring.
    for _ in 0..20 {
        executor
            .run(COMMAND, &[], Duration::from_secs(10), 65_536, &cancel)
            .await?;
        direct().await?;
    }
    let mut through = Vec::with_capacity(steps);
    let mut plain = Vec::with_capacity(steps);
    // Interleaved, so that a noisy moment on the machine hits both alike.
    for _ in 0..steps {
        let t = Instant::now();
        let done = executor
            .run(COMMAND, &[], Duration::from_secs(10), 65_536, &cancel)
            .await?;
        through.push(t.elapsed());
        anyhow::ensure!(
            done.ending == baton_exec::protocol::Ending::Exited(0),
            "{done:?}"
        );
        let t = Instant::now();
        direct().await?;
        plain.push(t.elapsed());
    }
    drop(executor);
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let (t, p) = (percentiles(&mut through), percentiles(&mut plain));
    println!("tool step `{COMMAND}`, {steps} runs each (ms)      p50     p90     p99");
    println!(
        "through the executor (socket + baton-exec)  {:7.3} {:7.3} {:7.3}",
        t.0, t.1, t.2
    );
    println!(
        "directly (sh -c as a child)                 {:7.3} {:7.3} {:7.3}",
        p.0, p.1, p.2
    );
    println!(
        "added by the executor, p50: {:.3} ms (target <= 5 ms); ratio {:.2}",
        t.0 - p.0,
        t.0 / p.0
    );
    Ok(())
}

/// What the worker did before the split: `sh -c` in its own process group, piped.
async fn direct() -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", COMMAND])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let out = tokio::process::Command::from(cmd).output().await?;
    anyhow::ensure!(out.status.success());
    Ok(())
}

fn percentiles(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.5), at(0.9), at(0.99))
}

fn args() -> anyhow::Result<(usize, PathBuf)> {
    let mut steps = 500;
    let mut exec = PathBuf::from("target/release/baton-exec");
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--steps" => steps = value.parse()?,
            "--exec" => exec = value.into(),
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(
        exec.exists(),
        "{} is missing: cargo build --release -p baton-exec",
        exec.display()
    );
    Ok((steps, exec))
}
