//! `baton.dev/v1alpha1`: the AgentRun, the AgentThread and the ledger.

mod agent;
mod agent_run;
mod agent_thread;
mod builder;
mod ledger_segment;
mod run_status;

pub use agent::*;
pub use agent_run::*;
pub use agent_thread::*;
pub use builder::AgentRunBuilder;
pub use ledger_segment::*;
pub use run_status::*;
