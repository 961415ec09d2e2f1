//! The `baton` binary: thin argument parsing over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Keeps long-lived AI agent runs alive on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions as YAML, or write/check the files in a directory.
    Crd(CrdArgs),
    /// Run the controller: admission, claims, takeovers, finish, rollouts.
    Controller(baton::controller::cli::ControllerArgs),
    /// Serve the HTTP API (runs, threads, their live streams) with each caller's own identity.
    Server(baton::server::ServerArgs),
    /// Open the web console on a loopback port, acting as your kubeconfig's user.
    Console(baton::server::ConsoleArgs),
    /// Run one attempt of an AgentRun (what runs inside a worker pod).
    Worker(baton::worker::WorkerArgs),
    #[command(flatten)]
    Cli(baton::cli::Verb),
}

#[derive(Args)]
struct CrdArgs {
    /// Write one file per CRD into this directory (what `crds/` holds).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// With --dir: do not write; fail if the files differ from the Rust types.
    #[arg(long, requires = "dir")]
    check: bool,
    /// Apply the CRDs to the cluster in KUBECONFIG and wait until they are Established.
    #[arg(long, conflicts_with = "dir")]
    apply: bool,
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run(Cli::parse())),
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Caps glibc's malloc arenas at 2 before any thread starts. By default glibc gives each
/// thread that meets contention an arena of its own (up to 8 per core), and each arena keeps
/// its freed pages: at 5,000 runs that was ~11 MiB of the controller's resident memory
/// (146 vs 134 MiB, with `MALLOC_ARENA_MAX=2`), for nothing, as a few async worker threads
/// allocate little at a time. A `MALLOC_ARENA_MAX` set in the environment still wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in main, before any other thread exists; mallopt only
        // sets an allocator parameter (its result, 0 on an unknown parameter, is ignored).
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Crd(args) => crd(args).await,
        Command::Controller(args) => baton::controller::cli::main(args)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into),
        Command::Server(args) => baton::server::main(args).await.map(|()| ExitCode::SUCCESS),
        Command::Console(args) => baton::server::console_main(args)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Worker(args) => Ok(ExitCode::from(baton::worker::cli_main(args).await)),
        Command::Cli(verb) => baton::cli::main(verb)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", baton::cli::neutralize(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn crd(args: CrdArgs) -> Result<ExitCode, baton::Error> {
    match (args.dir, args.check, args.apply) {
        (Some(dir), true, _) => {
            let stale = baton::crd::stale_crd_files(&dir)?;
            if stale.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!(
                "stale generated CRDs in {}: {} (run `make generate`)",
                dir.display(),
                stale.join(", ")
            );
            Ok(ExitCode::FAILURE)
        }
        (Some(dir), false, _) => baton::crd::write_crd_dir(&dir).map(|()| ExitCode::SUCCESS),
        (None, _, true) => {
            let client = baton::kube_util::client_for("crd-installer").await?;
            baton::crd::install(client, std::time::Duration::from_secs(60)).await?;
            Ok(ExitCode::SUCCESS)
        }
        (None, _, false) => {
            print!("{}", baton::crd::crds_yaml()?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
