//! The fenced append's every case, over an in-memory store of positions (the backends' own
//! primitive is tested against the API server and PostgreSQL in `tests/`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;
use crate::crd::v1alpha1::Role;
use crate::fence::CloseReason;

/// Positions in memory: create-if-absent under a lock, as the API server or a primary key.
struct Memory {
    segments: Mutex<BTreeMap<i64, LedgerSegment>>,
    budget: usize,
}

impl Memory {
    fn holding(segments: Vec<LedgerSegment>) -> Self {
        Self {
            segments: Mutex::new(segments.into_iter().map(|s| (s.spec.seq, s)).collect()),
            budget: crate::ledger::SEGMENT_BUDGET_BYTES,
        }
    }

    fn positions(&self) -> Vec<(i64, i64)> {
        let segments = self.segments.lock().unwrap();
        segments
            .values()
            .map(|s| (s.spec.seq, s.spec.fence.get()))
            .collect()
    }
}

impl Positions for Memory {
    fn run(&self) -> (&str, &str) {
        ("r", "u")
    }

    fn budget(&self) -> usize {
        self.budget
    }

    async fn create_at(
        &self,
        seq: i64,
        fence: Fence,
        events: &[LedgerEvent],
    ) -> Result<AtPosition, LedgerError> {
        let mut segments = self.segments.lock().unwrap();
        if let Some(existing) = segments.get(&seq) {
            return Ok(AtPosition::Taken(existing.clone()));
        }
        let created = segment_of_run("r", "u", seq, fence, events.to_vec());
        segments.insert(seq, created.clone());
        Ok(AtPosition::Created(created))
    }
}

fn said(text: &str) -> Vec<LedgerEvent> {
    vec![LedgerEvent::Message {
        role: Role::Assistant,
        content: text.into(),
    }]
}

fn at(seq: i64, fence: i64, events: Vec<LedgerEvent>) -> LedgerSegment {
    segment_of_run("r", "u", seq, Fence::new(fence), events)
}

fn append(store: &Memory, tail: i64, fence: i64, text: &str) -> Result<Appended, LedgerError> {
    futures::executor::block_on(append_fenced(store, tail, Fence::new(fence), said(text)))
}

#[test]
fn a_free_position_takes_the_events() {
    let store = Memory::holding(vec![at(1, 1, said("a"))]);
    let appended = append(&store, 1, 1, "b").unwrap();
    assert_eq!(appended.tail, 2);
    assert_eq!(appended.written.len(), 1);
    assert!(appended.slipped.is_empty());
    assert_eq!(store.positions(), vec![(1, 1), (2, 1)]);
}

#[test]
fn our_own_earlier_try_is_success_and_not_written_twice() {
    let store = Memory::holding(vec![at(1, 2, said("a"))]);
    let appended = append(&store, 0, 2, "a").unwrap();
    assert_eq!(appended.tail, 1);
    assert_eq!(appended.written[0].spec.events, said("a"));
    assert_eq!(store.positions(), vec![(1, 2)]);
}

#[test]
fn other_content_under_our_fence_is_read_as_lost() {
    let store = Memory::holding(vec![at(1, 2, said("a"))]);
    let err = append(&store, 0, 2, "b").unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert_eq!(store.positions(), vec![(1, 2)]);
}

#[test]
fn an_older_owners_segment_is_history_and_we_move_past_it() {
    let store = Memory::holding(vec![at(1, 1, said("old"))]);
    let appended = append(&store, 0, 2, "new").unwrap();
    assert_eq!(appended.tail, 2);
    assert_eq!(appended.slipped.len(), 1);
    assert_eq!(appended.slipped[0].spec.seq, 1);
    assert_eq!(store.positions(), vec![(1, 1), (2, 2)]);
}

#[test]
fn a_newer_owner_ends_the_append_and_nothing_is_written() {
    let store = Memory::holding(vec![at(1, 3, said("newer"))]);
    match append(&store, 0, 2, "ours") {
        Err(LedgerError::Superseded { seq, ours, theirs }) => {
            assert_eq!((seq, ours.get(), theirs.get()), (1, 2, 3));
        }
        other => panic!("expected Superseded, got {other:?}"),
    }
    assert_eq!(store.positions(), vec![(1, 3)]);
}

#[test]
fn a_seal_in_the_way_closes_the_ledger_even_from_an_older_fence() {
    let closed = vec![LedgerEvent::Closed {
        fence: Fence::new(1),
        reason: CloseReason::StopRequested,
    }];
    let store = Memory::holding(vec![at(1, 1, closed)]);
    assert!(matches!(
        append(&store, 0, 2, "late"),
        Err(LedgerError::Closed { seq: 1, .. })
    ));
    assert_eq!(store.positions(), vec![(1, 1)]);
}

#[test]
fn a_segment_of_another_run_in_the_way_stops_the_append() {
    let foreign = segment_of_run("x", "u", 1, Fence::new(1), said("x"));
    let store = Memory::holding(vec![foreign]);
    assert!(matches!(
        append(&store, 0, 2, "ours"),
        Err(LedgerError::ForeignSegment { .. })
    ));
}

#[test]
fn events_over_the_budget_take_one_position_each_group() {
    let mut store = Memory::holding(vec![]);
    store.budget = 200;
    let events = (0..6).flat_map(|i| said(&"x".repeat(60 + i))).collect();
    let appended =
        futures::executor::block_on(append_fenced(&store, 0, Fence::new(1), events)).unwrap();
    assert!(appended.written.len() > 1, "split into several segments");
    assert_eq!(appended.tail, appended.written.len() as i64);
    assert_eq!(store.positions().len(), appended.written.len());
}
