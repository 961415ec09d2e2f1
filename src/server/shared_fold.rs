//! One fold of a run's ledger for all the followers that view it alike. A protocol's view
//! (`responses`, `a2a`) folds the ledger from its first position and makes each position's
//! events from the fold: 1,000 followers of a run would each make the same events, as JSON
//! values then text, 1,000 times. The fold is deterministic (a position's segments never
//! change, and every follower folds from the first position in order), so the first follower
//! to reach a position folds it and the others take what it made: the events, rendered once,
//! and the state after them, shared by reference.
//!
//! A follower keeps its own reference to the state at its place, so one that falls behind the
//! shared positions (a slow client) folds on from there itself: sharing only ever saves work.
//! A fold is shared only while it has two followers or more (a lone follower's state is never
//! copied) and while its state is light enough to copy once per position ([`MAX_WEIGHT`]).
//! Folds are kept per hub, that is per credential and namespace: what one caller's followers
//! made is never handed to another caller's.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A view's fold state.
pub trait FoldState: Clone + Default + Send + Sync + 'static {
    /// About the bytes a copy of it copies.
    fn weight(&self) -> usize;
}

/// Most bytes a shared state may weigh: whoever folds a shared position copies the state
/// before it once (the others hold it), so a heavier one is folded by each follower alone.
pub const MAX_WEIGHT: usize = 1 << 20;
/// Most positions kept per shared fold, and most bytes of their events: followers further
/// behind than that fold on themselves.
const KEPT_STEPS: usize = 32;
const KEPT_BYTES: usize = 4 << 20;

/// One event a position made, rendered once: its number in the view's order, its name and its
/// data as one line of JSON.
pub struct Rendered {
    pub number: i64,
    pub name: String,
    pub json: String,
}

/// A position folded: the events it made and the state after it.
pub struct Step<S> {
    pub events: Vec<Rendered>,
    state: Arc<S>,
}

impl<S> Step<S> {
    fn bytes(&self) -> usize {
        self.events
            .iter()
            .map(|e| e.json.len() + e.name.len())
            .sum()
    }
}

/// The positions of a run's fold made last, shared by its followers.
pub struct SharedFold<S> {
    kept: Mutex<Kept<S>>,
}

struct Kept<S> {
    /// Followers of the fold now.
    members: usize,
    steps: VecDeque<(i64, Arc<Step<S>>)>,
    bytes: usize,
}

impl<S> Kept<S> {
    fn find(&self, position: i64) -> Option<&Arc<Step<S>>> {
        let first = self.steps.front()?.0;
        let at = usize::try_from(position - first).ok()?;
        self.steps.get(at).map(|(_, step)| step)
    }

    /// True when `position` is past every position kept: the fold's head.
    fn is_head(&self, position: i64) -> bool {
        self.steps.back().is_none_or(|(last, _)| position > *last)
    }

    /// Keeps `step`, the new head (the others are dropped if it does not follow the last kept:
    /// the kept positions are consecutive), and drops the oldest beyond the bounds.
    fn keep(&mut self, position: i64, step: Arc<Step<S>>) {
        if self
            .steps
            .back()
            .is_some_and(|(last, _)| *last + 1 != position)
        {
            self.clear();
        }
        self.bytes += step.bytes();
        self.steps.push_back((position, step));
        while self.steps.len() > 1 && (self.steps.len() > KEPT_STEPS || self.bytes > KEPT_BYTES) {
            if let Some((_, old)) = self.steps.pop_front() {
                self.bytes -= old.bytes();
            }
        }
    }

    fn clear(&mut self) {
        self.steps.clear();
        self.bytes = 0;
    }
}

impl<S> SharedFold<S> {
    fn kept(&self) -> MutexGuard<'_, Kept<S>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The key of a shared fold: the view, the run's UID, and what else the view's events say
/// (followers that differ in it do not share).
type FoldKey = (&'static str, String, String);

/// A hub's shared folds.
#[derive(Default)]
pub struct Folds {
    live: Mutex<HashMap<FoldKey, Weak<dyn Any + Send + Sync>>>,
}

impl Folds {
    /// A follower's place in the fold of run `uid` through `view`, shared with every other
    /// follower of the same key.
    pub fn join<S: FoldState>(&self, view: &'static str, uid: &str, key: String) -> Folding<S> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, fold| fold.strong_count() > 0);
        let key = (view, uid.to_string(), key);
        let found = live.get(&key).and_then(Weak::upgrade);
        let shared = match found.map(|any| any.downcast::<SharedFold<S>>()) {
            Some(Ok(shared)) => shared,
            // A key names one view, so one state type; a mismatch would share nothing.
            _ => {
                let shared = Arc::new(SharedFold {
                    kept: Mutex::new(Kept {
                        members: 0,
                        steps: VecDeque::new(),
                        bytes: 0,
                    }),
                });
                let any: Arc<dyn Any + Send + Sync> = shared.clone();
                live.insert(key, Arc::downgrade(&any));
                shared
            }
        };
        shared.kept().members += 1;
        Folding {
            state: Arc::default(),
            position: 0,
            shared: Some(Member(shared)),
        }
    }
}

/// A follower counted in its shared fold until it is dropped.
struct Member<S>(Arc<SharedFold<S>>);

impl<S> Drop for Member<S> {
    fn drop(&mut self) {
        let mut kept = self.0.kept();
        kept.members -= 1;
        if kept.members < 2 {
            kept.clear();
        }
    }
}

/// A follower's place in a run's fold: the state after the last position it folded or took.
pub struct Folding<S> {
    state: Arc<S>,
    position: i64,
    shared: Option<Member<S>>,
}

impl<S: FoldState> Folding<S> {
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The events of `position`, the next after this follower's place: what another follower
    /// made of it, or what `fold` makes of this follower's state (kept for the others when
    /// it is shared).
    pub fn advance(
        &mut self,
        position: i64,
        fold: impl FnOnce(&mut S) -> Vec<Rendered>,
    ) -> Arc<Step<S>> {
        if self.position + 1 != position {
            // Not the fold every follower makes (never seen: the stream hands a view every
            // position in order): nothing of it may be shared.
            self.shared = None;
        }
        let Some(Member(shared)) = &self.shared else {
            return self.fold(position, fold);
        };
        let shared = shared.clone();
        // Held while folding: the followers woken by one segment fold it once between them.
        let mut kept = shared.kept();
        if let Some(step) = kept.find(position) {
            self.state = step.state.clone();
            self.position = position;
            return step.clone();
        }
        let head = kept.is_head(position);
        if !head || kept.members < 2 || self.state.weight() > MAX_WEIGHT {
            // Behind what is kept (folded on alone), or nothing to keep for anyone.
            if head {
                kept.clear();
            }
            drop(kept);
            return self.fold(position, fold);
        }
        let step = self.fold(position, fold);
        kept.keep(position, step.clone());
        step
    }

    /// Folds `position` into this follower's state (copied first if others hold it).
    fn fold(&mut self, position: i64, fold: impl FnOnce(&mut S) -> Vec<Rendered>) -> Arc<Step<S>> {
        let events = fold(Arc::make_mut(&mut self.state));
        self.position = position;
        Arc::new(Step {
            events,
            state: self.state.clone(),
        })
    }
}

#[cfg(test)]
#[path = "shared_fold_tests.rs"]
mod tests;
