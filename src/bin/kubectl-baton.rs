//! `kubectl-baton`: the CLI verbs as a kubectl plugin. Put it on PATH and run `kubectl baton get`.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = baton::cli::PluginCli::parse();
    match baton::cli::main(cli.verb).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", baton::cli::neutralize(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}
