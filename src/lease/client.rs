//! The Lease I/O edge. Every write is a compare-and-swap on the resourceVersion last read (or,
//! for a worker, last written by it), and every worker write also checks holder and fence in
//! that same write.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec as K8sLeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use std::sync::{Arc, Mutex};

use super::{LeaseError, held_by, lease_fence};
use crate::crd::{FENCE_ANNOTATION, controlled_by_run, controlling_run};
use crate::fence::{Fence, run_lease_name};
use crate::kube_util::{is_conflict, is_not_found};

/// How many times a write is retried on 409 while the Lease still shows our claim.
const CONFLICT_RETRIES: usize = 5;

/// Controller-side access to run Leases.
#[derive(Clone)]
pub struct LeaseClient {
    api: Api<Lease>,
}

impl LeaseClient {
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
        }
    }

    /// Reads the run's Lease from the API server (not a cache).
    pub async fn get(&self, run: &str) -> Result<Option<Lease>, LeaseError> {
        Ok(self.api.get_opt(&run_lease_name(run)).await?)
    }

    /// Moves the run's Lease to `holder` under `fence` (creating it, owned by the run, if
    /// missing). A Lease already at this fence or a newer one is left alone. On 409 it re-reads
    /// and tries again: a renewal by the old holder in between does not undo the claim.
    pub async fn move_to(
        &self,
        run: &str,
        owner: OwnerReference,
        holder: &str,
        fence: Fence,
        duration_seconds: i32,
    ) -> Result<Lease, LeaseError> {
        let current = self.get(run).await?;
        let (lease, _) = self
            .move_loop(run, current, owner, holder, fence, duration_seconds)
            .await?;
        Ok(lease)
    }

    /// Like [`move_to`](Self::move_to), but starting from `current`, the Lease as the caller
    /// last read it (None: it saw none), instead of reading it first. A stale `current` costs
    /// only a refused write (409 or AlreadyExists) and a re-read. Returns None, writing
    /// nothing, when the Lease is (or turns out to be) at this fence or a newer one: then the
    /// caller did not move it.
    pub async fn move_from(
        &self,
        run: &str,
        current: Option<Lease>,
        owner: OwnerReference,
        holder: &str,
        fence: Fence,
        duration_seconds: i32,
    ) -> Result<Option<Lease>, LeaseError> {
        let (lease, moved) = self
            .move_loop(run, current, owner, holder, fence, duration_seconds)
            .await?;
        Ok(moved.then_some(lease))
    }

    /// The run's Lease as the end of the run `uid` at `fence` leaves it: no holder, the
    /// higher of its fence and `fence` ([`crate::fence::lease_released_at`]). None when
    /// there is nothing to release: no Lease, no holder, or a Lease the run does not control
    /// (never touched). Written with [`put`](Self::put).
    pub async fn released(
        &self,
        run: &str,
        uid: &str,
        fence: Fence,
    ) -> Result<Option<Lease>, LeaseError> {
        let Some(mut lease) = self.get(run).await? else {
            return Ok(None);
        };
        if super::lease_holder(&lease).is_none() || !controlled_by_run(&lease, uid) {
            return Ok(None);
        }
        let fence = crate::fence::lease_released_at(lease_fence(&lease), fence);
        lease
            .annotations_mut()
            .insert(FENCE_ANNOTATION.into(), fence.to_string());
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        Ok(Some(lease))
    }

    /// Writes `lease` as read and changed: one CAS on its resourceVersion, refused (409)
    /// when it changed meanwhile. The API server's answer is returned as it is, for the
    /// controller's writer to classify.
    pub async fn put(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        let params = PostParams::default();
        self.api.replace(&lease.name_any(), &params, lease).await
    }

    /// The Lease after the move, and whether this call moved it.
    async fn move_loop(
        &self,
        run: &str,
        mut current: Option<Lease>,
        owner: OwnerReference,
        holder: &str,
        fence: Fence,
        duration_seconds: i32,
    ) -> Result<(Lease, bool), LeaseError> {
        for _ in 0..CONFLICT_RETRIES {
            if let Some(lease) = &current {
                not_the_runs(lease, &owner)?;
                if crate::fence::lease_reached(lease_fence(lease), fence) {
                    return Ok((lease.clone(), false));
                }
            }
            let desired = moved_lease(current, run, owner.clone(), holder, fence, duration_seconds);
            let result = match desired.resource_version() {
                Some(_) => {
                    self.api
                        .replace(&desired.name_any(), &PostParams::default(), &desired)
                        .await
                }
                None => self.api.create(&PostParams::default(), &desired).await,
            };
            match result {
                Ok(lease) => return Ok((lease, true)),
                Err(err) if is_conflict(&err) || crate::kube_util::is_already_exists(&err) => {
                    current = self.get(run).await?;
                }
                Err(err) => return Err(err.into()),
            }
        }
        Err(LeaseError::Kube(kube::Error::Api(Box::new(
            conflict_status(run),
        ))))
    }
}

/// Refuses a Lease the run `owner` names does not control: a Lease of that name made by
/// something else (or left by a deleted namesake) is never taken over.
fn not_the_runs(lease: &Lease, owner: &OwnerReference) -> Result<(), LeaseError> {
    if controlled_by_run(lease, &owner.uid) {
        return Ok(());
    }
    let by = controlling_run(lease);
    let described = match (by, lease.owner_references().first()) {
        (Some(run), _) => format!("controlled by AgentRun {} with UID {}", run.name, run.uid),
        (None, Some(o)) => format!("owned by {} {}", o.kind, o.name),
        (None, None) => "made by something else: no owner".to_string(),
    };
    Err(LeaseError::NotTheRuns {
        name: lease.name_any(),
        owner: described,
        leftover: by.is_some(),
    })
}

fn conflict_status(run: &str) -> kube::core::Status {
    kube::core::Status::failure(&format!("lease for run {run} kept changing"), "Conflict")
        .with_code(409)
}

/// The Lease as it looks right after a claim: new holder and fence, not yet renewed.
fn moved_lease(
    current: Option<Lease>,
    run: &str,
    owner: OwnerReference,
    holder: &str,
    fence: Fence,
    duration_seconds: i32,
) -> Lease {
    let mut lease = current.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(run_lease_name(run)),
            owner_references: Some(vec![owner]),
            labels: Some(crate::owned::run_labels(run)),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    lease
        .annotations_mut()
        .insert(FENCE_ANNOTATION.to_string(), fence.to_string());
    lease.spec = Some(K8sLeaseSpec {
        holder_identity: Some(holder.to_string()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time: Some(MicroTime(Timestamp::now())),
        renew_time: None,
        lease_transitions: Some(fence.get() as i32),
        ..K8sLeaseSpec::default()
    });
    lease
}

/// A worker's claim on its run Lease.
#[derive(Clone)]
pub struct WorkerLease {
    api: Api<Lease>,
    name: String,
    holder: String,
    fence: Fence,
    /// The UID of the run the Lease must belong to, once known.
    run_uid: Option<String>,
    /// The Lease as this worker last read or wrote it, while it named us under our fence
    /// (shared by the clones: the heartbeat and the finish write the same Lease).
    known: Arc<Mutex<Option<Lease>>>,
}

impl WorkerLease {
    pub fn new(client: Client, namespace: &str, run: &str, holder: &str, fence: Fence) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: run_lease_name(run),
            holder: holder.into(),
            fence,
            run_uid: None,
            known: Arc::default(),
        }
    }

    /// Holds only a Lease owned by the run with this UID: a run deleted and re-created under
    /// the same name is another run, whose Lease may name a pod of ours at our fence.
    pub fn of_run(mut self, uid: &str) -> Self {
        self.run_uid = Some(uid.into());
        self
    }

    /// Reads the Lease and checks that it names us under our fence.
    pub async fn verify(&self) -> Result<Lease, LeaseError> {
        let lease = self
            .api
            .get_opt(&self.name)
            .await?
            .ok_or_else(|| LeaseError::Missing {
                name: self.name.clone(),
            })?;
        let other_run = self
            .run_uid
            .as_ref()
            .is_some_and(|uid| !controlled_by_run(&lease, uid));
        if other_run || !held_by(&lease, &self.holder, self.fence) {
            self.remember(None);
            return Err(self.lost(&lease));
        }
        self.remember(Some(&lease));
        Ok(lease)
    }

    /// Renews the claim: a CAS that only lands while the Lease still names us under our fence.
    pub async fn renew(&self) -> Result<Lease, LeaseError> {
        self.update(|spec| spec.renew_time = Some(MicroTime(Timestamp::now())))
            .await
    }

    /// Releases the claim (handoff, input wait, finish): the holder is cleared, the fence kept.
    pub async fn release(&self) -> Result<Lease, LeaseError> {
        self.update(|spec| {
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        })
        .await
    }

    /// One write, a compare-and-swap from the Lease as we last knew it: in the steady state
    /// nobody else writes it, so a renewal is one request (no read before it). A 409 means
    /// someone did (a claim moves it): then it is read and verified again, so a moved Lease
    /// ends in `Lost`, and a write that lands proves the Lease still named us.
    async fn update(&self, change: impl Fn(&mut K8sLeaseSpec)) -> Result<Lease, LeaseError> {
        let mut known = self.known.lock().expect("lease lock").take();
        for _ in 0..CONFLICT_RETRIES {
            let mut lease = match known.take() {
                Some(lease) => lease,
                None => self.verify().await?,
            };
            change(lease.spec.get_or_insert_with(K8sLeaseSpec::default));
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(lease) => {
                    let ours = held_by(&lease, &self.holder, self.fence);
                    self.remember(ours.then_some(&lease));
                    return Ok(lease);
                }
                Err(err) if is_conflict(&err) => continue,
                Err(err) if is_not_found(&err) => {
                    return Err(LeaseError::Missing {
                        name: self.name.clone(),
                    });
                }
                Err(err) => return Err(err.into()),
            }
        }
        Err(LeaseError::Kube(kube::Error::Api(Box::new(
            conflict_status(&self.name),
        ))))
    }

    fn remember(&self, lease: Option<&Lease>) {
        *self.known.lock().expect("lease lock") = lease.cloned();
    }

    fn lost(&self, lease: &Lease) -> LeaseError {
        LeaseError::Lost {
            name: self.name.clone(),
            holder: super::lease_holder(lease).map(Into::into),
            fence: lease_fence(lease),
            ours: self.fence,
        }
    }
}
