//! What both the admission webhook and `baton server` judge, so that neither process imports
//! the other: who may write a run's ledger and Lease (pure, `writers.rs`), and whether a user
//! holds a right (`Ask`), asked of the API server (`review.rs`).

mod ask;
mod review;
mod writers;

pub use ask::Ask;
pub use review::user_may;
pub use writers::{
    RunFacts, Writer, lease_refusal, lease_update_is_plain, segment_refusal, worker_pod_refusal,
};
