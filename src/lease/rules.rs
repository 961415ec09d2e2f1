//! Pure lease rules: names, the fence annotation, and expiry judged on the observer's clock.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::crd::FENCE_ANNOTATION;
use crate::crd::v1alpha1::LeaseSpec;
use crate::fence::Fence;

/// Name of a thread's admission Lease.
pub fn thread_lease_name(thread_key: &str) -> String {
    format!("thread.{thread_key}")
}

/// The fence a Lease carries, if any.
pub fn lease_fence(lease: &Lease) -> Option<Fence> {
    lease
        .annotations()
        .get(FENCE_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .map(Fence::new)
}

/// The holder a Lease names, if any.
pub fn lease_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// True when the Lease names `holder` under `fence`.
pub fn held_by(lease: &Lease, holder: &str, fence: Fence) -> bool {
    crate::fence::lease_held(lease_holder(lease), lease_fence(lease), holder, fence)
}

/// True once the holder has renewed at least once since the Lease was moved to it (the
/// controller moves a Lease with no `renewTime`).
pub fn has_renewed(lease: &Lease) -> bool {
    lease.spec.as_ref().is_some_and(|s| s.renew_time.is_some())
}

/// What the observer last saw of a Lease, and when, on its own clock. Worker and observer
/// clocks are never compared: a Lease has expired when it has not changed for its allowance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSighting {
    /// The Lease's resourceVersion: any renewal changes it.
    pub version: String,
    /// When the observer first saw this version.
    pub seen_at: Instant,
    /// Whether the holder had renewed (else the startup allowance applies).
    pub renewed: bool,
    /// Whether the Lease names a holder at all (a released Lease has none).
    pub held: bool,
}

impl LeaseSighting {
    /// Records a new sighting of `lease` at `now`, keeping the earlier time if it did not change.
    pub fn observe(previous: Option<&LeaseSighting>, lease: &Lease, now: Instant) -> LeaseSighting {
        let version = lease.resource_version().unwrap_or_default();
        match previous {
            Some(prev) if prev.version == version => prev.clone(),
            _ => LeaseSighting {
                version,
                seen_at: now,
                renewed: has_renewed(lease),
                held: lease_holder(lease).is_some(),
            },
        }
    }

    /// How long the Lease may stay unchanged before it has expired.
    pub fn allowance(&self, spec: &LeaseSpec) -> Duration {
        let secs = if self.renewed {
            spec.duration_seconds
        } else {
            spec.startup_seconds
        };
        Duration::from_secs(secs.max(0) as u64)
    }

    /// When the Lease expires unless it changes first.
    pub fn deadline(&self, spec: &LeaseSpec) -> Instant {
        self.seen_at + self.allowance(spec)
    }

    /// True when the Lease has not changed for its whole allowance.
    pub fn expired(&self, spec: &LeaseSpec, now: Instant) -> bool {
        now >= self.deadline(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec as K8sLeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(version: &str, holder: Option<&str>, renewed: bool) -> Lease {
        let mut l = Lease::default();
        l.metadata.resource_version = Some(version.into());
        l.spec = Some(K8sLeaseSpec {
            holder_identity: holder.map(Into::into),
            renew_time: renewed.then_some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..K8sLeaseSpec::default()
        });
        l
    }

    fn spec() -> LeaseSpec {
        LeaseSpec {
            duration_seconds: 30,
            renew_seconds: 10,
            startup_seconds: 300,
        }
    }

    #[test]
    fn an_unchanged_lease_expires_after_its_duration_on_the_observers_clock() {
        let t0 = Instant::now();
        let first = LeaseSighting::observe(None, &lease("1", Some("p"), true), t0);
        let again = LeaseSighting::observe(
            Some(&first),
            &lease("1", Some("p"), true),
            t0 + Duration::from_secs(29),
        );
        assert_eq!(again.seen_at, t0);
        assert!(!again.expired(&spec(), t0 + Duration::from_secs(29)));
        assert!(again.expired(&spec(), t0 + Duration::from_secs(30)));
    }

    #[test]
    fn a_renewal_restarts_the_allowance() {
        let t0 = Instant::now();
        let first = LeaseSighting::observe(None, &lease("1", Some("p"), true), t0);
        let later = t0 + Duration::from_secs(25);
        let renewed = LeaseSighting::observe(Some(&first), &lease("2", Some("p"), true), later);
        assert_eq!(renewed.deadline(&spec()), later + Duration::from_secs(30));
    }

    #[test]
    fn before_the_first_renewal_the_startup_allowance_applies() {
        let t0 = Instant::now();
        let s = LeaseSighting::observe(None, &lease("1", Some("p"), false), t0);
        assert!(!s.expired(&spec(), t0 + Duration::from_secs(299)));
        assert!(s.expired(&spec(), t0 + Duration::from_secs(300)));
    }

    #[test]
    fn fence_and_holder_are_read_from_the_lease() {
        let mut l = lease("1", Some("pod-a"), true);
        l.metadata.annotations = Some([(FENCE_ANNOTATION.to_string(), "7".to_string())].into());
        assert_eq!(lease_fence(&l), Some(Fence::new(7)));
        assert!(held_by(&l, "pod-a", Fence::new(7)));
        assert!(!held_by(&l, "pod-a", Fence::new(6)));
        assert!(!held_by(&l, "pod-b", Fence::new(7)));
    }
}
