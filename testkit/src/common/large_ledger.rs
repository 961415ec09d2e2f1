//! A large ledger, written fast: messages of 95 KiB (ten fill a segment, whose budget is
//! 1 MB), appended 50 at a time at fence 1. The replay benchmark and the node's bounds test
//! fill their runs' ledgers so.

use baton::crd::v1alpha1::{LedgerEvent, Role};
use baton::fence::Fence;
use baton::ledger::{LedgerError, SegmentStore};

/// One message's size.
const MESSAGE: usize = 95 * 1024;

/// Appends `megabytes` MB of assistant messages to `store` after position `tail`; the new tail.
pub async fn fill(
    store: &SegmentStore,
    mut tail: i64,
    megabytes: usize,
) -> Result<i64, LedgerError> {
    let messages = megabytes * 1024 * 1024 / MESSAGE;
    for chunk in (0..messages).collect::<Vec<_>>().chunks(50) {
        let events = chunk
            .iter()
            .map(|i| LedgerEvent::Message {
                role: Role::Assistant,
                content: format!("{i} {}", "x".repeat(MESSAGE)),
            })
            .collect();
        tail = store.append(tail, Fence::new(1), events).await?.tail;
    }
    Ok(tail)
}
