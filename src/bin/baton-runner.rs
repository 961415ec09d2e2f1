//! `baton-runner`: the local pod runner (a stand-in for the kubelet on a bare API server, for
//! development, the demo and the end-to-end tests; see `baton::runner`).
//!
//!   baton-runner run [--node baton-local] [--namespace NS] [--selector SEL] [--baton-bin PATH]
//!                    [--image-bin IMAGE=PATH]... [--log-dir DIR] [--control-addr 127.0.0.1:7391] [--orphan-on-force-delete]
//!   baton-runner ctl [--addr 127.0.0.1:7391] kill|pause|resume|term|detach|pid NS/POD
//!   baton-runner ctl [--addr 127.0.0.1:7391] list|drain
//!
//! On SIGINT or SIGTERM `run` kills every process group it started and waits for them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton::runner::{self, PodKey, Runner, RunnerConfig, control};
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    name = "baton-runner",
    version,
    about = "Local pod runner: runs baton's worker pods as local processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Register a node, bind and run pods as local processes, serve the control endpoint.
    Run(RunArgs),
    /// Inject a fault through a running runner's control endpoint.
    Ctl(CtlArgs),
}

#[derive(Args)]
struct RunArgs {
    /// The Node to register and bind pods to.
    #[arg(long, env = "BATON_RUNNER_NODE", default_value = runner::DEFAULT_NODE_NAME)]
    node: String,
    /// Only this namespace (default: all namespaces).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Label selector of the pods to run ("" for all pods).
    #[arg(long, default_value = runner::DEFAULT_SELECTOR)]
    selector: String,
    /// The binary that runs for the container command `baton` (default: `baton` next to this one).
    #[arg(long, env = "BATON_BIN")]
    baton_bin: Option<PathBuf>,
    /// IMAGE=PATH: pods with this image run PATH for `baton` (repeatable).
    #[arg(long = "image-bin", value_parser = parse_image_bin)]
    image_bins: Vec<(String, PathBuf)>,
    /// Where the per-pod logs go (default: $TMPDIR/baton-runner/logs).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Address of the control endpoint (127.0.0.1 only; port 0 picks one).
    #[arg(long, env = "BATON_RUNNER_ADDR", default_value = control::DEFAULT_CONTROL_ADDR)]
    control_addr: SocketAddr,
    /// Write the control endpoint's bound address to this file.
    #[arg(long)]
    control_addr_file: Option<PathBuf>,
    /// NAME=VALUE added to every process's environment (repeatable); a pod's own variable of
    /// the same name wins, as on a node.
    #[arg(long = "env", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Keep the processes of force-deleted pods running (simulates a lost node).
    #[arg(long)]
    orphan_on_force_delete: bool,
    /// Delete the Node when stopping.
    #[arg(long)]
    remove_node: bool,
}

#[derive(Args)]
struct CtlArgs {
    /// Address of the runner's control endpoint.
    #[arg(long, env = "BATON_RUNNER_ADDR", default_value = control::DEFAULT_CONTROL_ADDR)]
    addr: SocketAddr,
    /// kill | pause | resume | term | detach | pid (with NS/POD), or list | drain.
    action: String,
    /// The pod, as NAMESPACE/NAME.
    pod: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Ctl(args) => ctl(args).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    anyhow::ensure!(
        args.control_addr.ip().is_loopback(),
        "the control endpoint listens on loopback only"
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let listener = tokio::net::TcpListener::bind(args.control_addr).await?;
    let bound = listener.local_addr()?;
    if let Some(file) = &args.control_addr_file {
        std::fs::write(file, format!("{bound}\n"))?;
    }
    let mut config = RunnerConfig::new(baton::kube_util::client_for("runner").await?);
    config.node_name = args.node;
    config.namespace = args.namespace;
    config.label_selector = Some(args.selector).filter(|s| !s.is_empty());
    config.baton_bin = args.baton_bin.unwrap_or(config.baton_bin);
    config.image_bins = args.image_bins.into_iter().collect();
    config.extra_env = args.env;
    config.log_dir = args.log_dir.unwrap_or(config.log_dir);
    config.orphan_on_force_delete = args.orphan_on_force_delete;
    config.remove_node_on_shutdown = args.remove_node;
    tracing::info!(control = %bound, baton_bin = %config.baton_bin.display(), log_dir = %config.log_dir.display(), "starting");
    let handle = Runner::start(config).await?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(control::serve(handle.clone(), listener, async {
        let _ = stop_rx.await;
    }));
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
    handle.shutdown().await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    Ok(ExitCode::SUCCESS)
}

async fn ctl(args: CtlArgs) -> anyhow::Result<ExitCode> {
    let (method, path) = match (args.action.as_str(), args.pod.as_deref()) {
        ("list", None) => ("GET", "/pods".to_string()),
        ("drain", None) => ("POST", "/drain".to_string()),
        (action @ ("kill" | "pause" | "resume" | "term" | "detach" | "pid"), Some(pod)) => {
            let key = PodKey::parse(pod)
                .ok_or_else(|| anyhow::anyhow!("expected NAMESPACE/NAME, got {pod:?}"))?;
            let method = if action == "pid" { "GET" } else { "POST" };
            (
                method,
                format!("/pods/{}/{}/{action}", key.namespace, key.name),
            )
        }
        (action, _) => anyhow::bail!(
            "unknown or malformed action {action:?}: use kill|pause|resume|term|detach|pid NS/POD, or list|drain"
        ),
    };
    let (code, body) = control::request(args.addr, method, &path).await?;
    print!("{body}");
    Ok(if code == 200 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

fn parse_image_bin(s: &str) -> Result<(String, PathBuf), String> {
    let (image, path) = s
        .split_once('=')
        .ok_or_else(|| format!("expected IMAGE=PATH, got {s:?}"))?;
    Ok((image.to_string(), PathBuf::from(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_flags_are_name_equals_value() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_env("EMPTY="), Ok(("EMPTY".into(), String::new())));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("novalue").is_err());
    }
}
