//! How long a run waits after a failed reconcile (pure): by the class of the error, doubling
//! with each failure in a row of that run, so a flaky API server is retried at once while a
//! run stuck on something only a person can fix (a ServiceAccount that is not baton's, a
//! forbidden write, a corrupt ledger) does not spin.

use std::time::Duration;

use super::Error;
use crate::ledger::LedgerError;

/// What kind of failure a reconcile met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The API server was slow, unreachable, overloaded or in between (5xx, 429, a timeout, a
    /// Lease moved under a write): it will likely pass on the next try.
    Transient,
    /// The controller is not allowed to do what it must (403): the chart's RBAC or an
    /// admission policy is wrong; a person fixes it.
    Forbidden,
    /// The run's objects are not what the protocol needs (a worker ServiceAccount that is not
    /// the run's, a ledger with a gap or a foreign segment): a person looks at it.
    Stuck,
}

impl ErrorClass {
    pub fn of(err: &Error) -> Self {
        match err {
            Error::Kube(e) if crate::kube_util::is_forbidden(e) => ErrorClass::Forbidden,
            Error::Rbac(_) => ErrorClass::Stuck,
            Error::Ledger(
                LedgerError::Gap { .. }
                | LedgerError::ForeignSegment { .. }
                | LedgerError::CorruptChunk { .. }
                | LedgerError::Encode(_),
            ) => ErrorClass::Stuck,
            Error::Ledger(LedgerError::Kube(e)) if crate::kube_util::is_forbidden(e) => {
                ErrorClass::Forbidden
            }
            // `baton server` refused the controller's token (401) or its write (403): a
            // person fixes that (the token's audience, --controller-user), not a retry.
            Error::Ledger(LedgerError::Served {
                code: Some(401 | 403),
                ..
            }) => ErrorClass::Forbidden,
            Error::Ledger(LedgerError::BackendUnavailable { .. }) => ErrorClass::Stuck,
            _ => ErrorClass::Transient,
        }
    }

    /// The first wait and the longest.
    fn bounds(self) -> (Duration, Duration) {
        match self {
            ErrorClass::Transient => (Duration::from_millis(500), Duration::from_secs(30)),
            ErrorClass::Forbidden => (Duration::from_secs(10), Duration::from_secs(300)),
            ErrorClass::Stuck => (Duration::from_secs(5), Duration::from_secs(120)),
        }
    }

    /// The wait after the `failures`-th failure in a row (1 for the first).
    pub fn backoff(self, failures: u32) -> Duration {
        let (first, longest) = self.bounds();
        let doublings = failures.saturating_sub(1).min(16);
        first.saturating_mul(1 << doublings).min(longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transient_failure_is_retried_soon_then_less_often() {
        let t = ErrorClass::Transient;
        assert_eq!(t.backoff(1), Duration::from_millis(500));
        assert_eq!(t.backoff(2), Duration::from_secs(1));
        assert_eq!(t.backoff(4), Duration::from_secs(4));
        assert_eq!(t.backoff(100), Duration::from_secs(30));
    }

    #[test]
    fn what_a_person_must_fix_waits_longer_from_the_start() {
        for class in [ErrorClass::Forbidden, ErrorClass::Stuck] {
            assert!(class.backoff(1) > ErrorClass::Transient.backoff(3));
            assert!(class.backoff(u32::MAX) <= Duration::from_secs(300));
        }
    }

    #[test]
    fn errors_are_classed_by_what_fixes_them() {
        let forbidden = kube::Error::Api(Box::new(
            kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
        ));
        assert_eq!(
            ErrorClass::of(&Error::Kube(forbidden)),
            ErrorClass::Forbidden
        );
        let gap = LedgerError::Gap {
            expected: 2,
            found: 3,
        };
        assert_eq!(ErrorClass::of(&Error::Ledger(gap)), ErrorClass::Stuck);
        assert_eq!(ErrorClass::of(&Error::Rbac("x".into())), ErrorClass::Stuck);
        // An earlier run's object in the way was just removed: the next try goes through.
        let removed = Error::LeftoverRemoved("x".into());
        assert_eq!(ErrorClass::of(&removed), ErrorClass::Transient);
        let unavailable = kube::Error::Api(Box::new(
            kube::core::Status::failure("unavailable", "ServiceUnavailable").with_code(503),
        ));
        assert_eq!(
            ErrorClass::of(&Error::Kube(unavailable)),
            ErrorClass::Transient
        );
        let served = |code| {
            Error::Ledger(LedgerError::Served {
                code,
                message: "x".into(),
            })
        };
        assert_eq!(ErrorClass::of(&served(Some(403))), ErrorClass::Forbidden);
        assert_eq!(ErrorClass::of(&served(Some(401))), ErrorClass::Forbidden);
        assert_eq!(ErrorClass::of(&served(Some(503))), ErrorClass::Transient);
        assert_eq!(ErrorClass::of(&served(None)), ErrorClass::Transient);
        let elsewhere = LedgerError::BackendUnavailable {
            backend: crate::crd::v1alpha1::LedgerBackend::PostgreSQL,
        };
        assert_eq!(ErrorClass::of(&Error::Ledger(elsewhere)), ErrorClass::Stuck);
    }
}
