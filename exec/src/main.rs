//! `baton-exec install DIR` | `baton-exec serve --socket PATH --workspace DIR [--accept-timeout-seconds N]`
//!
//! Arguments are read by hand: two subcommands do not justify a parser in a binary meant to
//! stay small and static.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_exec::server::{self, Config, log};

const USAGE: &str = "usage: baton-exec install DIR\n       baton-exec serve --socket PATH --workspace DIR [--accept-timeout-seconds N]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("install") if args.len() == 2 => match baton_exec::install(args[1].as_ref()) {
            Ok(path) => {
                log(&format!("installed {}", path.display()));
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("install into {}: {e}", args[1])),
        },
        Some("serve") => match serve_config(&args[1..]) {
            Ok(config) => match server::serve(&config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e.to_string()),
            },
            Err(e) => fail(&format!("{e}\n{USAGE}")),
        },
        _ => fail(USAGE),
    }
}

fn serve_config(args: &[String]) -> Result<Config, String> {
    let mut socket = None;
    let mut workspace = None;
    let mut accept_timeout = Duration::from_secs(300);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--socket" => socket = Some(PathBuf::from(value)),
            "--workspace" => workspace = Some(PathBuf::from(value)),
            "--accept-timeout-seconds" => {
                let secs = value
                    .parse()
                    .map_err(|_| format!("--accept-timeout-seconds: not a number: {value}"))?;
                accept_timeout = Duration::from_secs(secs);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Config {
        socket: socket.ok_or("--socket is required")?,
        workspace: workspace.ok_or("--workspace is required")?,
        accept_timeout,
    })
}

fn fail(message: &str) -> ExitCode {
    log(message);
    ExitCode::from(2)
}
