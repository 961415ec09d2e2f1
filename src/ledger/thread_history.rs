//! Reading a turn's history (docs/protocol.md, "Threads"): its thread's earlier turns'
//! ledgers, each up to the position its first seal fixed. The turns kept as LedgerSegments are
//! read with one list of the thread's segments (the thread UID label), however many there are;
//! the turns kept in PostgreSQL with one request to `baton server` (one query); a turn of
//! LedgerSegments that list does not hold whole (its ledger predates the label) is read on its
//! own, as every turn was before the label.

use super::run_ledger::Ledgers;
use super::served::RunRef;
use super::{HistoryError, LedgerError, ReplayedMessage};
use super::{turn_conversation, turns_in_listing};
use crate::crd::v1alpha1::{HistoryTurn, LedgerBackend, LedgerSegment};

/// Each earlier turn with its conversation, in order; or why the history cannot be rebuilt
/// (none will: the turn ends `HistoryUnavailable`).
pub type EarlierTurns = Result<Vec<(HistoryTurn, Vec<ReplayedMessage>)>, HistoryError>;

impl Ledgers {
    /// The conversation of each turn of `turns` (in namespace `namespace`, of the thread of UID
    /// `thread_uid`). The outer error is the API server's (a retry may pass); the inner one is
    /// the history's own.
    pub async fn read_history(
        &self,
        namespace: &str,
        thread_uid: Option<&str>,
        turns: &[HistoryTurn],
    ) -> Result<EarlierTurns, kube::Error> {
        let in_segments =
            |t: &HistoryTurn| t.ledger_backend.unwrap_or_default() == LedgerBackend::LedgerSegments;
        let listed = match thread_uid.filter(|_| turns.iter().any(in_segments)) {
            Some(thread) => self.list_thread(namespace, thread).await?,
            None => Vec::new(),
        };
        let found = turns_in_listing(listed, turns);
        let ledgers = match self.read_the_rest(namespace, turns, found).await {
            Ok(ledgers) => ledgers,
            Err((turn, err)) => return unreadable(turn, err).map(Err),
        };
        let mut history = Vec::new();
        for (turn, ledger) in turns.iter().zip(ledgers) {
            match conversation_of(turn, ledger)? {
                Ok(messages) => history.push((turn.clone(), messages)),
                Err(err) => return Ok(Err(err)),
            }
        }
        Ok(Ok(history))
    }
}

impl Ledgers {
    /// Each turn's ledger: as `found` in the thread's listing, else read. The turns kept in
    /// PostgreSQL are read together, in one request; a turn of LedgerSegments the listing
    /// did not hold (its ledger predates the thread label) is read on its own.
    /// Fails with the first turn kept in PostgreSQL when their read fails.
    async fn read_the_rest<'t>(
        &self,
        namespace: &str,
        turns: &'t [HistoryTurn],
        found: Vec<Option<Vec<LedgerSegment>>>,
    ) -> Result<Vec<Result<Vec<LedgerSegment>, LedgerError>>, (&'t HistoryTurn, LedgerError)> {
        let in_postgres = |t: &HistoryTurn| t.ledger_backend == Some(LedgerBackend::PostgreSQL);
        let missing = turns.iter().zip(&found).filter(|(_, f)| f.is_none());
        let postgres: Vec<&HistoryTurn> =
            missing.map(|(t, _)| t).filter(|t| in_postgres(t)).collect();
        let refs: Vec<RunRef> = postgres
            .iter()
            .map(|t| RunRef {
                run: t.run.clone(),
                uid: t.uid.clone(),
            })
            .collect();
        let mut from_postgres = match self.read_runs_in_postgres(namespace, &refs).await {
            Ok(ledgers) => ledgers.into_iter().map(Ok),
            Err(err) => return Err((postgres[0], err)),
        };
        let reads = turns.iter().zip(found).map(|(turn, found)| {
            let from_postgres = match (&found, in_postgres(turn)) {
                (None, true) => from_postgres.next(),
                _ => None,
            };
            async move {
                match (found, from_postgres) {
                    (Some(segments), _) => Ok(segments),
                    (None, Some(ledger)) => ledger,
                    (None, None) => {
                        let backend = turn.ledger_backend.unwrap_or_default();
                        self.read_run(backend, namespace, &turn.run, &turn.uid)
                            .await
                    }
                }
            }
        });
        Ok(futures::future::join_all(reads).await)
    }
}

/// One earlier turn's conversation from its ledger as read.
fn conversation_of(
    turn: &HistoryTurn,
    ledger: Result<Vec<LedgerSegment>, LedgerError>,
) -> Result<Result<Vec<ReplayedMessage>, HistoryError>, kube::Error> {
    match ledger {
        Ok(segments) => Ok(turn_conversation(turn, &segments)),
        Err(err) => unreadable(turn, err).map(Err),
    }
}

/// Why `turn`'s ledger could not be read: the API server's error (a retry may pass), or the
/// history's own.
fn unreadable(turn: &HistoryTurn, err: LedgerError) -> Result<HistoryError, kube::Error> {
    match err {
        LedgerError::Kube(err) => Err(err),
        err => Ok(HistoryError::Unreadable {
            run: turn.run.clone(),
            detail: err.to_string(),
        }),
    }
}
