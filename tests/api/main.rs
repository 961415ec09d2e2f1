//! baton's API edges against a real API server (the local control plane). One test binary
//! (each file is a module):
//! - `platform`: the API server behaviour the protocol relies on (409 on stale writes,
//!   AlreadyExists on create, schema validation of bad manifests, the fenced append);
//! - `rbac`: per-run least privilege, checked with `kubectl auth can-i` and a minted token;
//! - `cli`: the `baton` and `kubectl baton` verbs (its helpers in `cli_support`).

mod cli;
mod cli_support;
mod platform;
mod rbac;
