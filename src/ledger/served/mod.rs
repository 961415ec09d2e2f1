//! The ledger served by `baton server` (runs kept in PostgreSQL), both sides of its wire:
//! what travels (`wire`: the paths, the append's request and outcome, the read's query), and
//! the writers' and readers' client (`client`: `LedgerClient` for the server, `ServedLedger`
//! for one run's ledger through it). The server's side is `crate::server::LedgerService`.

mod client;
mod wire;

pub use client::{LedgerClient, LedgerToken, ServedLedger};
pub use wire::*;
