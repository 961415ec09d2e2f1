//! The `baton` binary: thin argument parsing over the library.

use clap::{Parser, Subcommand};

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
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
}

fn main() -> Result<(), baton::Error> {
    match Cli::parse().command {
        Command::Crd => print!("{}", baton::crd::crds_yaml()?),
    }
    Ok(())
}
