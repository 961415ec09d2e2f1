//! The controller against a real API server (the local control plane), with the tests playing
//! the worker. One test binary for all of it (each file is a module):
//! - `claims`: the claim protocol, takeovers and terminal claims;
//! - `ops`: the admin endpoints, ttlSecondsAfterFinished, re-created runs, the controller's memory;
//! - `protocol_trust`: a response (the Responses API) or a task (A2A) asks its caller for what
//!   its thread lends, as a run or a turn does;
//! - `race`: two controllers without an election still make one claim per expiry;
//! - `rbac`: per-run least privilege before a run's first worker pod;
//! - `restart`: a controller that dies between the steps of a claim completes it;
//! - `trust`: nothing deleted or replaced on a guess; a Lease speaks only for its own run;
//! - `versions`: the previous release's controller beside this tree's;
//! - `terminal`: a terminal claim decided on a stale view of the run is a claim like any other;
//! - `threads`: thread admission;
//! - `warm`: a thread's next turn started ahead: adopted by that turn only;
//! - `thread_trust`: a thread lends only what its writer holds; a turn joins only the thread
//!   its creator was asked about; only the controller makes a run a turn;
//! - `webhook`: baton's admission webhook refuses what the requesting user could not do;
//! - `webhook_hostile`: large withheld reviews from anyone cost a bounded budget and end.

mod claims;
mod ops;
mod protocol_trust;
mod race;
mod rbac;
mod restart;
mod terminal;
mod thread_trust;
mod threads;
mod trace_annotation;
mod trust;
mod versions;
mod warm;
mod webhook;
mod webhook_hostile;
mod write_order;
