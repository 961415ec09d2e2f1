//! The runs of the end-to-end tests and what is checked after them: scripted runs whose shell
//! tools record their side effects outside baton (with `hack/effects.py`, over TCP), the effects
//! as recorded, a watch that records every ledger segment as it first appears, and the ledger
//! invariants (contiguous, no stale-fence write after a seal, nothing changed, every worker
//! segment written as `baton-worker`). Nothing here talks to the node itself: `node_support`
//! does. Used by `tests/node_*.rs` and `benches/node_figures.rs`.

#![allow(dead_code)]

mod checks;
mod effects;
mod recorder;
mod runs;

pub use checks::*;
pub use effects::*;
pub use recorder::*;
pub use runs::*;

use std::time::{Duration, Instant};

/// Retries a read through short API hiccups (the API server test restarts it).
pub async fn retry<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                eprintln!("API read failed (retrying): {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("API read failed: {e}"),
        }
    }
}
