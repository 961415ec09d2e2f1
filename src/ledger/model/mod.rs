//! The ledger read as a model, pure: segments folded into a conversation, a step record and a
//! salvage (`replay`), events too large for one segment split and put back together
//! (`chunk`), segments released in ledger order to a follower (`contiguous`), and the history
//! a turn's model request is rebuilt from (`history`), and an agent container's model calls
//! (`journal`, `model_api`). No I/O: the backends below read and write, these only fold what
//! they read.

pub(crate) mod chunk;
pub(crate) mod contiguous;
pub(crate) mod history;
pub mod journal;
pub mod model_api;
pub(crate) mod replay;
