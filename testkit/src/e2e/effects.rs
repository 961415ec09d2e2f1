//! The side effects as `hack/effects.py` recorded them, outside baton.

use std::collections::BTreeMap;
use std::path::Path;

/// The effects as `hack/effects.py` recorded them: one line per tool execution, `run turn step fence`.
pub struct Effects {
    pub lines: Vec<(String, usize, i64, i64)>,
}

impl Effects {
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((
                    it.next()?.to_string(),
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                ))
            })
            .collect();
        Self { lines }
    }

    pub fn count(&self, run: &str, turn: usize) -> usize {
        self.lines
            .iter()
            .filter(|(r, t, _, _)| r == run && *t == turn)
            .count()
    }

    /// turn → executions, for one run.
    pub fn per_turn(&self, run: &str) -> BTreeMap<usize, usize> {
        let mut m = BTreeMap::new();
        for (r, t, _, _) in &self.lines {
            if r == run {
                *m.entry(*t).or_default() += 1;
            }
        }
        m
    }
}
