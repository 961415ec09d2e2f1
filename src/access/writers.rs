//! Who may append to a run's ledger and write its Lease (pure): the same rule whether the
//! write reaches the API server (the admission webhook) or `baton server` (the ledger in
//! PostgreSQL). Every refusal names the field and the reason.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::crd::{RUN_UID_LABEL, THREAD_UID_LABEL};
use crate::fence::{Fence, append_ceiling, may_append_at, segment_name, worker_pod_name};
use crate::rbac::{pod_service_account, service_account_username};

/// What is known of the run a segment or Lease claims to belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFacts {
    pub uid: String,
    /// `status.fence`: the attempt that holds the run.
    pub fence: Fence,
    /// The user name the run's worker pods authenticate as.
    pub worker_user: String,
    /// The UID of the thread the run is a turn of (it joined), or None.
    pub thread_uid: Option<String>,
}

impl RunFacts {
    /// The facts of `run` as read from the API server.
    pub fn of(run: &AgentRun) -> Self {
        let RunId { namespace, uid, .. } = run.id();
        RunFacts {
            uid,
            fence: Fence::of_run(run),
            worker_user: service_account_username(&namespace, &pod_service_account(run)),
            thread_uid: run.thread_owner().map(|o| o.uid.clone()),
        }
    }
}

/// Who is asking, as far as a ledger or a run Lease is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// baton's controller: it seals a claim at the run's fence + 1 before moving the status.
    Controller,
    /// The identity the run's worker pods run as.
    RunWorker,
    /// Anyone else.
    Other,
}

impl Writer {
    pub fn of(user: &str, controller_users: &[String], run: Option<&RunFacts>) -> Writer {
        if controller_users.iter().any(|c| c == user) {
            Writer::Controller
        } else if run.is_some_and(|r| r.worker_user == user) {
            Writer::RunWorker
        } else {
            Writer::Other
        }
    }
}

/// Why a segment is refused, or None: admitted. `run` is the live run named by `spec.run`.
pub fn segment_refusal(
    seg: &LedgerSegment,
    writer: Writer,
    user: &str,
    run: Option<&RunFacts>,
) -> Option<String> {
    let name = seg.name_any();
    let of = &seg.spec.run;
    let expected = segment_name(of, seg.spec.seq);
    if name != expected {
        return Some(format!(
            "metadata.name: {name:?} is not the name of position {} of run {of:?} ({expected:?})",
            seg.spec.seq
        ));
    }
    // Anyone but the run's worker and the controller is told only that: not whether the run
    // exists, nor its UID, its fence or its worker's name, which it may not be able to read.
    let by_controller = match writer {
        Writer::Controller => true,
        Writer::RunWorker => false,
        Writer::Other => {
            return Some(format!(
                "{user} may not append to the ledger of run {of:?}: only its worker and baton's \
                 controller may"
            ));
        }
    };
    let Some(run) = run else {
        return Some(format!(
            "spec.run: no AgentRun {of:?} exists in this namespace"
        ));
    };
    let label = seg.labels().get(RUN_UID_LABEL).map(String::as_str);
    if label != Some(run.uid.as_str()) {
        return Some(format!(
            "metadata.labels[{RUN_UID_LABEL}]: {label:?} is not the UID of run {of:?} ({})",
            run.uid
        ));
    }
    if let Some(refusal) = thread_label_refusal(seg, run) {
        return Some(refusal);
    }
    let (at, status) = (Fence::of_segment(seg), run.fence);
    (!may_append_at(at, status, by_controller)).then(|| {
        let ceiling = append_ceiling(status, by_controller);
        format!(
            "spec.fence: {at} is ahead of run {of:?}, which is at fence {status} (a segment may \
             carry at most {ceiling})"
        )
    })
}

/// Why a segment's thread label is refused, or None: absent, or the UID of the thread its run
/// is a turn of. Readers check the run and UID of what the label finds, so a wrong one could
/// not change a history; refused all the same, it cannot make another thread's reads larger.
fn thread_label_refusal(seg: &LedgerSegment, run: &RunFacts) -> Option<String> {
    let label = seg.labels().get(THREAD_UID_LABEL)?;
    (run.thread_uid.as_ref() != Some(label)).then(|| {
        format!(
            "metadata.labels[{THREAD_UID_LABEL}]: {label:?} is not the UID of the thread run {:?} \
             is a turn of ({})",
            seg.spec.run,
            run.thread_uid.as_deref().unwrap_or("it is no turn")
        )
    })
}

/// Why a ledger write through `baton server` by a run's worker is refused, or None: beyond
/// [`segment_refusal`], its token must be bound to the pod of the attempt whose fence it
/// writes under (`pod`: the pod the API server says the token is bound to), so another
/// pod of the same ServiceAccount cannot write as that attempt.
pub fn worker_pod_refusal(run: &str, fence: Fence, pod: Option<&str>) -> Option<String> {
    let expected = worker_pod_name(run, fence);
    match pod {
        Some(pod) if pod == expected => None,
        Some(pod) => Some(format!(
            "fence: {fence} is the attempt of pod {expected:?}; this token is bound to pod {pod:?}"
        )),
        None => Some(format!(
            "a run's worker writes its ledger with its pod-bound token (for pod {expected:?}); \
             this token is bound to no pod"
        )),
    }
}

/// Why an update of the run Lease of `run` is refused, or None. A run's worker renews and
/// releases its Lease; it may not re-point it (its ownerReferences) at anything else.
pub fn lease_refusal(old: &Lease, new: &Lease, writer: Writer, user: &str) -> Option<String> {
    match writer {
        Writer::Controller => None,
        Writer::RunWorker if old.metadata.owner_references != new.metadata.owner_references => {
            Some(format!(
                "metadata.ownerReferences: {user} may renew or release Lease {} but not change \
                 what owns it",
                new.name_any()
            ))
        }
        Writer::RunWorker => None,
        Writer::Other if crate::rbac::run_of_username(user).is_some() => Some(format!(
            "{user} is another run's worker: it may not write Lease {}",
            new.name_any()
        )),
        Writer::Other => None,
    }
}

/// Whether a run Lease's update is admitted without reading its run: what owns the Lease is
/// unchanged and the writer is the controller or the run's own default worker identity
/// (`baton-run-<run>`). Those are the renewals, one per live run every few seconds, the
/// webhook's busiest traffic, so they skip the read. [`lease_refusal`] admits each of them
/// with one exception: `baton-run-<run>` on a run whose pods use a custom ServiceAccount. No
/// baton pod runs as that identity then; only a namespace user who may create pods (or
/// ServiceAccount tokens) can hold it, and such a user is outside what the webhook defends
/// (docs/security.md, "The threat table"). Letting them renew the run's own Lease gives them
/// nothing.
pub fn lease_update_is_plain(
    old: &Lease,
    new: &Lease,
    user: &str,
    controller_users: &[String],
    namespace: &str,
    run: &str,
) -> bool {
    old.metadata.owner_references == new.metadata.owner_references
        && (controller_users.iter().any(|c| c == user)
            || user == crate::rbac::worker_username(namespace, run))
}

#[cfg(test)]
#[path = "writers_tests.rs"]
mod tests;
