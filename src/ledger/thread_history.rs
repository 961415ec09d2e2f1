//! Reading a turn's history (docs/protocol.md, "Threads"): its thread's earlier turns'
//! ledgers, each up to the position its first seal fixed. The turns kept as LedgerSegments are
//! read with one list of the thread's segments (the thread UID label), however many there are;
//! a turn that list does not hold whole (its ledger predates the label, or is in PostgreSQL)
//! is read on its own, as every turn was before the label.

use super::run_ledger::Ledgers;
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
        let reads = turns.iter().zip(found).map(|(turn, found)| async move {
            match found {
                Some(segments) => Ok(segments),
                None => {
                    let backend = turn.ledger_backend.unwrap_or_default();
                    self.read_run(backend, namespace, &turn.run, &turn.uid)
                        .await
                }
            }
        });
        let ledgers = futures::future::join_all(reads).await;
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

/// One earlier turn's conversation from its ledger as read.
fn conversation_of(
    turn: &HistoryTurn,
    ledger: Result<Vec<LedgerSegment>, LedgerError>,
) -> Result<Result<Vec<ReplayedMessage>, HistoryError>, kube::Error> {
    match ledger {
        Ok(segments) => Ok(turn_conversation(turn, &segments)),
        Err(LedgerError::Kube(err)) => Err(err),
        Err(err) => Ok(Err(HistoryError::Unreadable {
            run: turn.run.clone(),
            detail: err.to_string(),
        })),
    }
}
