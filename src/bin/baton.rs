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

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Crd(args) => crd(args).await,
        Command::Controller(args) => baton::controller::cli::main(args)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into),
        Command::Worker(args) => Ok(ExitCode::from(baton::worker::cli_main(args).await)),
        Command::Cli(verb) => baton::cli::main(verb)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
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
