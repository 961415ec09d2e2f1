use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A fold that sums the positions it was given, counting how often it is copied.
#[derive(Default)]
struct Sum {
    total: i64,
    weight: usize,
    copies: Arc<AtomicUsize>,
}

impl Clone for Sum {
    fn clone(&self) -> Self {
        self.copies.fetch_add(1, Ordering::SeqCst);
        Self {
            total: self.total,
            weight: self.weight,
            copies: self.copies.clone(),
        }
    }
}

impl FoldState for Sum {
    fn weight(&self) -> usize {
        self.weight
    }
}

/// Advances `folding` to `position`; true if it folded the position itself.
fn advance(folding: &mut Folding<Sum>, position: i64) -> bool {
    let mut folded = false;
    let step = folding.advance(position, |sum| {
        folded = true;
        sum.total += position;
        vec![Rendered {
            number: position,
            name: "n".into(),
            json: sum.total.to_string(),
        }]
    });
    assert_eq!(step.events[0].json, folding.state().total.to_string());
    folded
}

#[test]
fn followers_at_the_same_place_fold_a_position_once() {
    let folds = Folds::default();
    let mut a = folds.join::<Sum>("v", "uid", "k".into());
    let mut b = folds.join::<Sum>("v", "uid", "k".into());
    for position in 1..=5 {
        assert!(advance(&mut a, position));
        assert!(
            !advance(&mut b, position),
            "position {position} folded twice"
        );
    }
    assert_eq!(b.state().total, 15);
    // Another key, another run or another view shares nothing.
    for (view, uid, key) in [
        ("v", "uid", "other"),
        ("v", "other", "k"),
        ("w", "uid", "k"),
    ] {
        let mut c = folds.join::<Sum>(view, uid, key.into());
        assert!(advance(&mut c, 1));
    }
}

#[test]
fn a_lone_followers_state_is_never_copied() {
    let folds = Folds::default();
    let mut a = folds.join::<Sum>("v", "uid", "k".into());
    for position in 1..=50 {
        assert!(advance(&mut a, position));
    }
    assert_eq!(a.state().copies.load(Ordering::SeqCst), 0);
}

#[test]
fn a_follower_behind_what_is_kept_folds_on_itself_and_catches_up() {
    let folds = Folds::default();
    let mut a = folds.join::<Sum>("v", "uid", "k".into());
    let mut b = folds.join::<Sum>("v", "uid", "k".into());
    for position in 1..=100 {
        advance(&mut a, position);
    }
    let mut folded_by_b = 0;
    for position in 1..=100 {
        folded_by_b += usize::from(advance(&mut b, position));
    }
    assert_eq!(b.state().total, a.state().total);
    assert_eq!(
        folded_by_b,
        100 - KEPT_STEPS,
        "the last {KEPT_STEPS} were taken"
    );
    // Caught up, it folds the head for the other.
    assert!(advance(&mut b, 101));
    assert!(!advance(&mut a, 101));
}

#[test]
fn a_heavy_state_is_folded_by_each_follower() {
    let folds = Folds::default();
    let mut a = folds.join::<Sum>("v", "uid", "k".into());
    let mut b = folds.join::<Sum>("v", "uid", "k".into());
    advance(&mut a, 1);
    assert!(!advance(&mut b, 1));
    Arc::make_mut(&mut a.state).weight = MAX_WEIGHT + 1;
    Arc::make_mut(&mut b.state).weight = MAX_WEIGHT + 1;
    assert!(advance(&mut a, 2));
    assert!(advance(&mut b, 2));
}

#[test]
fn once_a_follower_leaves_nothing_is_kept() {
    let folds = Folds::default();
    let mut a = folds.join::<Sum>("v", "uid", "k".into());
    let b = folds.join::<Sum>("v", "uid", "k".into());
    advance(&mut a, 1);
    drop(b);
    let shared = a.shared.as_ref().map(|m| m.0.clone()).unwrap();
    assert_eq!(shared.kept().steps.len(), 0);
    let copies = a.state().copies.load(Ordering::SeqCst);
    advance(&mut a, 2);
    assert_eq!(
        a.state().copies.load(Ordering::SeqCst),
        copies,
        "not copied again"
    );
}

#[test]
fn a_follower_out_of_order_shares_nothing() {
    let folds = Folds::default();
    let mut a = folds.join::<Sum>("v", "uid", "k".into());
    let mut b = folds.join::<Sum>("v", "uid", "k".into());
    advance(&mut a, 1);
    advance(&mut a, 2);
    assert!(advance(&mut b, 2), "b skipped position 1");
    assert!(b.shared.is_none());
}
