//! Resume (docs/protocol.md, "Resume"): what a new worker does with the ledger it found.
//! `plan` decides, purely, from the replay and the spec (each open step unknown, re-run,
//! probed or awaiting a decision; the ledger's standing); `carry_out` makes the first append
//! and the probes and re-runs the plan names, reporting each.

mod carry_out;
mod plan;

pub use carry_out::{Resumed, resume};
pub use plan::*;
