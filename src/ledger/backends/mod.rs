//! Where a run's ledger is kept: LedgerSegments in the API server (`store`), or rows in
//! PostgreSQL (`postgres`). Each makes the fenced append of `super::append` and the ordered
//! list; neither decides ownership itself (`crate::fence` does).

pub mod postgres;
pub(crate) mod store;
