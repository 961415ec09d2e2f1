//! The worker: what runs inside a worker pod. It proves it holds the run, resumes the turn
//! from the ledger, and drives the agent loop with every write fenced.

pub mod model;
