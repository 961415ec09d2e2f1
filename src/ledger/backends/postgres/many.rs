//! Several runs' ledgers in one query: a turn's history, its thread's earlier turns kept in
//! PostgreSQL, read in one round trip however many turns there are.

use std::collections::HashMap;

use tokio_postgres::Row;

use super::PgLedger;
use super::sql::LIST_RUNS;
use crate::crd::v1alpha1::LedgerSegment;
use crate::ledger::served::RunRef;
use crate::ledger::{LedgerError, check_contiguous_after};

impl PgLedger {
    /// The whole ledger of each run of `runs` in `namespace`, in their order, each checked
    /// contiguous from position 1. A row with one of their UIDs that names another run is no
    /// run's (as a read of one run's ledger takes it).
    pub async fn list_runs(
        &self,
        namespace: &str,
        runs: &[RunRef],
    ) -> Result<Vec<Vec<LedgerSegment>>, LedgerError> {
        let uids: Vec<&str> = runs.iter().map(|r| r.uid.as_str()).collect();
        let rows = self.in_namespace(namespace, LIST_RUNS, &[&uids]).await?;
        let by_uid = rows_by_uid(rows);
        runs.iter()
            .map(|r| {
                let rows = by_uid.get(&r.uid).map(Vec::as_slice).unwrap_or_default();
                let segments = self.for_run(namespace, &r.run, &r.uid).own_segments(rows)?;
                check_contiguous_after(0, &segments)?;
                Ok(segments)
            })
            .collect()
    }
}

/// `rows` by their run's UID, each run's in the order read (by position).
fn rows_by_uid(rows: Vec<Row>) -> HashMap<String, Vec<Row>> {
    let mut by_uid: HashMap<String, Vec<Row>> = HashMap::new();
    for row in rows {
        by_uid.entry(row.get("run_uid")).or_default().push(row);
    }
    by_uid
}
