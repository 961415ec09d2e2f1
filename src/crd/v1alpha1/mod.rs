//! `baton.dev/v1alpha1`: the AgentRun and its ledger.

mod agent_run;
mod ledger_segment;

pub use agent_run::*;
pub use ledger_segment::*;
