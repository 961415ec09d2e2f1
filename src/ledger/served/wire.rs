//! The ledger as `baton server` serves it to workers and the controller, for runs kept in
//! PostgreSQL: the wire form of a fenced append and of a read. The database's credential
//! stays in the server; a writer proves who it is with its pod-bound ServiceAccount token,
//! issued for [`LEDGER_AUDIENCE`] (docs/ledger-backends.md, "Who may write").

use serde::{Deserialize, Serialize};

use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment};
use crate::fence::Fence;
use crate::ledger::{Appended, LedgerError};

/// The audience a writer's token is issued for: a token for the API server (or anything
/// else) is refused, and a ledger token is worth nothing to the API server.
pub const LEDGER_AUDIENCE: &str = "baton.dev/ledger";

/// The path of one run's ledger on the server.
pub fn ledger_path(namespace: &str, run: &str) -> String {
    format!("/ledger/v1/namespaces/{namespace}/runs/{run}/segments")
}

/// The path of a read of several runs' ledgers at once (a turn's history: its thread's
/// earlier turns kept in PostgreSQL, in one request however many there are).
pub fn ledgers_path(namespace: &str) -> String {
    format!("/ledger/v1/namespaces/{namespace}/ledgers")
}

/// The most runs one read of several ledgers names: a longer history is read in as many
/// requests of this many (a 1,000-turn thread in one).
pub const MAX_RUNS_PER_READ: usize = 1000;

/// The largest body of a read of several ledgers: [`MAX_RUNS_PER_READ`] names and UIDs.
pub const LEDGERS_READ_BODY_LIMIT: usize = 256 * 1024;

/// A read of several runs' ledgers, whole: each run named with its UID (a namesake's ledger
/// is not read). Answered with their segments, ordered by run and position.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgersRequest {
    pub runs: Vec<RunRef>,
}

/// One run whose ledger is read: its name and UID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    pub run: String,
    pub uid: String,
}

impl LedgersRequest {
    /// Why the request is refused (the field named), or None.
    pub fn refusal(&self) -> Option<String> {
        if self.runs.len() > MAX_RUNS_PER_READ {
            return Some(format!(
                "runs: {} runs named; a read names at most {MAX_RUNS_PER_READ}",
                self.runs.len()
            ));
        }
        self.runs.iter().enumerate().find_map(|(i, r)| {
            (r.run.is_empty() || r.uid.is_empty())
                .then(|| format!("runs[{i}]: a run is named by its run and its uid, both set"))
        })
    }
}

/// A fenced append: `events` at `tail + 1` onwards under `fence`, to the run with `uid`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendRequest {
    pub uid: String,
    pub tail: i64,
    pub fence: Fence,
    pub events: Vec<LedgerEvent>,
}

/// What a fenced append came to: stored, or the run lost (to a newer fence, a seal or its
/// deletion: an answer, not a failure; the writer stops writing, as it would on
/// LedgerSegments).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum AppendOutcome {
    #[serde(rename_all = "camelCase")]
    Appended {
        tail: i64,
        written: Vec<LedgerSegment>,
        slipped: Vec<LedgerSegment>,
    },
    #[serde(rename_all = "camelCase")]
    Superseded {
        seq: i64,
        ours: Fence,
        theirs: Fence,
    },
    #[serde(rename_all = "camelCase")]
    Closed { seq: i64, fence: Fence },
    #[serde(rename_all = "camelCase")]
    Deleted { seq: i64 },
}

impl AppendOutcome {
    /// The answer for an append's result; None: a failure the server answers as an error.
    pub fn of(result: Result<Appended, LedgerError>) -> Result<Self, LedgerError> {
        match result {
            Ok(a) => Ok(AppendOutcome::Appended {
                tail: a.tail,
                written: a.written,
                slipped: a.slipped,
            }),
            Err(LedgerError::Superseded { seq, ours, theirs }) => {
                Ok(AppendOutcome::Superseded { seq, ours, theirs })
            }
            Err(LedgerError::Closed { seq, fence }) => Ok(AppendOutcome::Closed { seq, fence }),
            Err(LedgerError::Deleted { seq }) => Ok(AppendOutcome::Deleted { seq }),
            Err(other) => Err(other),
        }
    }

    /// The append's result, as the writer's own store would have given it.
    pub fn into_result(self) -> Result<Appended, LedgerError> {
        match self {
            AppendOutcome::Appended {
                tail,
                written,
                slipped,
            } => Ok(Appended {
                tail,
                written,
                slipped,
            }),
            AppendOutcome::Superseded { seq, ours, theirs } => {
                Err(LedgerError::Superseded { seq, ours, theirs })
            }
            AppendOutcome::Closed { seq, fence } => Err(LedgerError::Closed { seq, fence }),
            AppendOutcome::Deleted { seq } => Err(LedgerError::Deleted { seq }),
        }
    }
}

/// What a deletion of a run's ledger removed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    pub segments: i64,
}

/// A read: the run's segments after position `after` (0: all). A deletion names the run's
/// UID the same way.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadQuery {
    pub uid: String,
    #[serde(default)]
    pub after: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_comes_back_as_the_result_it_was() {
        let lost = [
            LedgerError::Superseded {
                seq: 4,
                ours: Fence::new(2),
                theirs: Fence::new(3),
            },
            LedgerError::Closed {
                seq: 5,
                fence: Fence::new(2),
            },
            LedgerError::Deleted { seq: 6 },
        ];
        for err in lost {
            let text = err.to_string();
            let outcome = AppendOutcome::of(Err(err)).expect("an answer");
            let wire = serde_json::to_string(&outcome).unwrap();
            let back: AppendOutcome = serde_json::from_str(&wire).unwrap();
            let again = back.into_result().unwrap_err();
            assert!(again.is_lost());
            assert_eq!(again.to_string(), text);
        }
        let stored = AppendOutcome::of(Ok(Appended {
            tail: 7,
            ..Appended::default()
        }))
        .unwrap();
        let wire = serde_json::to_string(&stored).unwrap();
        assert!(wire.contains(r#""outcome":"appended""#), "{wire}");
        let back: AppendOutcome = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.into_result().unwrap().tail, 7);
        let failure = LedgerError::Gap {
            expected: 1,
            found: 2,
        };
        assert!(
            AppendOutcome::of(Err(failure)).is_err(),
            "a failure is no answer"
        );
    }
}
