//! Leader election among controller replicas with a Lease of their own
//! (`baton-controller-leader`). It only saves wasted work: every controller write is a CAS on
//! what it read, so two replicas that both act still make one claim.
//!
//! The holder renews every third of the lease duration by CAS. A candidate takes over once
//! the Lease has not changed for its duration on the candidate's own clock (clocks are never
//! compared). A replica counts itself leader only until `duration` after the start of its
//! last successful renewal, so a deposed (partitioned, paused) leader stops writing by itself.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::LEADER_LEASE_NAME;
use crate::kube_util::{is_already_exists, is_conflict};

/// Whether this replica leads, and until when (its own clock).
#[derive(Debug)]
pub struct Leadership {
    always: bool,
    until: Mutex<Option<Instant>>,
    changes: watch::Sender<bool>,
}

impl Leadership {
    /// Without election: this replica always writes.
    pub fn always() -> Self {
        Self {
            always: true,
            until: Mutex::new(None),
            changes: watch::channel(true).0,
        }
    }

    pub fn elected() -> Self {
        Self {
            always: false,
            until: Mutex::new(None),
            changes: watch::channel(false).0,
        }
    }

    pub fn is_leader(&self, now: Instant) -> bool {
        self.always || self.until.lock().expect("lock").is_some_and(|u| now < u)
    }

    /// Notified with `true` when this replica becomes leader, `false` when it stops.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// Stop leading now (on shutdown, before the Lease is released).
    pub fn resign(&self) {
        if !self.always {
            self.set(None);
        }
    }

    fn set(&self, until: Option<Instant>) {
        self.set_at(until, Instant::now());
    }

    /// Leading until `until`, as of `now`. Subscribers hear `true` whenever this replica leads
    /// again after not leading as of `now`, whether it had stepped down or only let its
    /// leadership lapse on its clock (a renewal that hung while the API server was paused, so
    /// the Lease came back without ever being lost): every run is reconciled then, including
    /// those whose reconcile was refused for not leading in between (they wait for a change).
    fn set_at(&self, until: Option<Instant>, now: Instant) {
        let mut current = self.until.lock().expect("lock");
        let was = current.is_some_and(|u| now < u);
        *current = until;
        drop(current);
        let is = until.is_some_and(|u| now < u);
        if is && !was {
            self.changes.send_replace(true);
        } else if was && !is {
            self.changes.send_replace(false);
        }
    }
}

/// The election loop: runs until an unrecoverable error. Transient API errors only make this
/// replica stop leading until the next successful renewal.
///
/// A standby also watches the Lease and tries again at once when it changes, so a leader that
/// releases it on shutdown ([`release`]) is followed within a round trip, not a third of the
/// lease duration later.
pub async fn run(
    client: Client,
    namespace: &str,
    identity: &str,
    duration: Duration,
    leadership: &Leadership,
) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let changes = watcher::watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={LEADER_LEASE_NAME}")),
    );
    let mut changes = std::pin::pin!(changes);
    let mut seen: Option<(String, Instant)> = None;
    loop {
        let started = Instant::now();
        match try_lead(&api, identity, duration, &mut seen, started).await {
            Ok(true) => leadership.set(Some(started + duration)),
            Ok(false) => leadership.set(None),
            Err(err) => {
                tracing::warn!(%err, "leader election");
                if !leadership.is_leader(Instant::now()) {
                    leadership.set(None);
                }
            }
        }
        let pause = tokio::time::sleep(duration / 3);
        if leadership.is_leader(Instant::now()) {
            pause.await;
        } else {
            tokio::select! {
                _ = pause => {}
                _ = changes.next() => {}
            }
        }
    }
}

/// On shutdown: give the Lease up (no holder, CAS on what was read), so a standby takes over at
/// once instead of waiting for it to expire. Ok(false) when this replica did not hold it.
pub async fn release(client: Client, namespace: &str, identity: &str) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let Some(mut lease) = api.get_opt(LEADER_LEASE_NAME).await? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    replace(&api, &lease).await
}

/// One round: acquire or renew; Ok(true) when this replica holds the Lease now.
async fn try_lead(
    api: &Api<Lease>,
    identity: &str,
    duration: Duration,
    seen: &mut Option<(String, Instant)>,
    now: Instant,
) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(LEADER_LEASE_NAME).await? else {
        return create(api, identity, duration).await;
    };
    let version = lease.resource_version().unwrap_or_default();
    let first_seen = match seen.take() {
        Some((v, at)) if v == version => at,
        _ => now,
    };
    *seen = Some((version, first_seen));
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let ours = spec.holder_identity.as_deref() == Some(identity);
    let free = spec.holder_identity.as_deref().is_none_or(str::is_empty);
    if !ours && !free && now < first_seen + duration {
        return Ok(false);
    }
    if !ours {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
    }
    fill(spec, identity, duration);
    replace(api, &lease).await
}

/// The Lease written back as read (CAS on its resourceVersion): Ok(false) when someone else
/// wrote it meanwhile.
async fn replace(api: &Api<Lease>, lease: &Lease) -> Result<bool, kube::Error> {
    match api
        .replace(LEADER_LEASE_NAME, &PostParams::default(), lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(err) if is_conflict(&err) => Ok(false),
        Err(err) => Err(err),
    }
}

fn fill(spec: &mut LeaseSpec, identity: &str, duration: Duration) {
    spec.holder_identity = Some(identity.into());
    spec.lease_duration_seconds = Some(duration.as_secs().max(1) as i32);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
}

async fn create(api: &Api<Lease>, identity: &str, duration: Duration) -> Result<bool, kube::Error> {
    let mut spec = LeaseSpec {
        acquire_time: Some(MicroTime(Timestamp::now())),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    };
    fill(&mut spec, identity, duration);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEADER_LEASE_NAME.into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    };
    match api.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(err) if is_already_exists(&err) => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leadership_lapses_on_its_own_clock() {
        let l = Leadership::elected();
        let t0 = Instant::now();
        assert!(!l.is_leader(t0));
        l.set(Some(t0 + Duration::from_secs(15)));
        assert!(l.is_leader(t0 + Duration::from_secs(14)));
        assert!(!l.is_leader(t0 + Duration::from_secs(15)));
        assert!(Leadership::always().is_leader(t0));
    }

    #[test]
    fn leading_again_after_a_lapse_on_the_clock_is_announced() {
        let l = Leadership::elected();
        let mut rx = l.subscribe();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        l.set_at(Some(t0 + s(6)), t0);
        assert!(rx.has_changed().unwrap() && *rx.borrow_and_update());
        // A renewal while still leading: nothing to announce.
        l.set_at(Some(t0 + s(8)), t0 + s(2));
        assert!(!rx.has_changed().unwrap());
        // The next renewal hung past the lease (the API server paused), then landed: it
        // started before the lapse, so it leaves this replica's lead in the past...
        l.set_at(Some(t0 + s(7)), t0 + s(20));
        assert!(!rx.has_changed().unwrap(), "not leading either way");
        // ...and the one after it makes it lead again, without ever having stepped down.
        l.set_at(Some(t0 + s(26)), t0 + s(22));
        assert!(rx.has_changed().unwrap() && *rx.borrow_and_update());
        l.set_at(None, t0 + s(23));
        assert!(rx.has_changed().unwrap() && !*rx.borrow_and_update());
    }
}
