//! How many streams one credential may hold open at once on a replica. A stream holds a task,
//! its cursor's segments and a share of its hub; without a bound, one caller opening streams
//! and never reading them could hold the server's memory. Past the bound a new stream is
//! refused (429) until one of the caller's ends: a client that follows many runs opens a
//! thread's stream, or another replica takes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The streams one credential may hold open at once, by default (`--max-streams-per-credential`):
/// an application that follows many runs with one token shares one hub among them, and
/// `make bench-stream` follows 1,000 that way.
pub const MAX_STREAMS_PER_CREDENTIAL: usize = 1000;

/// The open streams, counted per credential.
#[derive(Clone)]
pub struct StreamSlots {
    open: Arc<Mutex<HashMap<Arc<str>, usize>>>,
    limit: usize,
}

/// One open stream of a credential; dropping it frees its place.
pub struct Slot {
    slots: StreamSlots,
    key: Arc<str>,
}

impl StreamSlots {
    pub fn new(limit: usize) -> Self {
        Self {
            open: Arc::default(),
            limit,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for one more stream of `credential`, or None when it holds `limit` already.
    pub fn take(&self, credential: &Arc<str>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(credential.clone()).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Slot {
            slots: self.clone(),
            key: credential.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_holds_at_most_its_limit_and_a_closed_stream_frees_its_place() {
        let slots = StreamSlots::new(2);
        let (alice, bob): (Arc<str>, Arc<str>) = (Arc::from("alice"), Arc::from("bob"));
        let first = slots.take(&alice).unwrap();
        let _second = slots.take(&alice).unwrap();
        assert!(slots.take(&alice).is_none());
        assert!(
            slots.take(&bob).is_some(),
            "another credential's count is its own"
        );
        drop(first);
        assert!(slots.take(&alice).is_some());
        assert!(
            slots.open.lock().unwrap().get(&bob).is_none(),
            "forgotten at zero"
        );
    }
}
