//! The fence itself: a number, apart from the rules (`super`) so the wire types can carry it
//! without depending on what reads them.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A fence: the attempt number a claim hands out, strictly increasing per run. 0 means the
/// run was never claimed. On the wire it is a plain integer (`serde(transparent)`): the
/// Lease's annotation, the run's `status.fence`, a segment's `spec.fence`, the seals'.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(transparent)]
pub struct Fence(i64);

impl Fence {
    pub const fn new(value: i64) -> Self {
        Self(value)
    }

    pub const fn get(self) -> i64 {
        self.0
    }

    /// The fence the next claim hands out.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }

    /// True for the fence of a run's first claim: no earlier attempt can have left a pod, a
    /// Lease or a segment, so whatever bears the run's name is a deleted namesake's.
    pub const fn is_first(self) -> bool {
        self.0 == 1
    }

    /// True for a run never claimed (0): it has no attempt, pod or Lease of its own.
    pub const fn never_claimed(self) -> bool {
        self.0 <= 0
    }

    /// The fence of the attempt this claim follows (None for the first claim).
    pub const fn previous(self) -> Option<Self> {
        if self.0 > 1 {
            Some(Self(self.0 - 1))
        } else {
            None
        }
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Parsed from a plain integer (the worker's `--fence` flag, the Lease's annotation).
impl std::str::FromStr for Fence {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse().map(Self)
    }
}
