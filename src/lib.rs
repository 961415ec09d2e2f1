//! baton: a Kubernetes operator that keeps long-lived AI agent runs alive across pod deaths,
//! node drains and rollouts. See docs/protocol.md for the protocol this crate implements.

pub mod access;
pub mod approval;
mod causes;
pub mod cli;
pub mod controller;
pub mod crd;
pub(crate) mod cut;
pub mod display;
mod events;
pub mod fence;
pub mod kube_util;
pub mod lease;
pub mod ledger;
mod owned;
pub mod rbac;
pub mod requests;
pub mod server;
pub mod serving;
pub mod status;
pub mod telemetry;
pub mod traces;
pub mod webhook;
pub mod worker;

/// Errors that reach the binary's `main`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("serializing CRDs: {0}")]
    CrdYaml(#[from] serde_yaml::Error),
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("installing CRDs: {0}")]
    CrdInstall(#[from] crd::InstallError),
    #[error("controller: {0}")]
    Controller(#[from] controller::Error),
    #[error("{0}")]
    Cli(#[from] cli::CliError),
}
