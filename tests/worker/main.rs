//! A real `baton worker` process against a real API server (the local control plane), the
//! tests playing the controller. One test binary for all of it (each file is a module):
//! - `crash`: kill -9 at each write-ahead boundary, then the next worker resumes;
//! - `limits`: the ledger's size cap and events split across segments;
//! - `openai`: the OpenAI-compatible provider end to end against a local server;
//! - `resume`: zombies, effect probes, idempotent re-runs, askUser answered later;
//! - `run`: a run from claim to Finishing, handoff on SIGTERM, stop.

#[path = "../common/mod.rs"]
mod common;
#[path = "../providers_support/mod.rs"]
mod server;
#[path = "../worker_support/mod.rs"]
mod support;

mod crash;
mod limits;
mod openai;
mod resume;
mod run;
