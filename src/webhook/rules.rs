//! What the webhook admits (pure): the permissions a run's manifest borrows, the size of its
//! spec, and who may append to a ledger or edit a run Lease. The I/O (SubjectAccessReviews,
//! reading the run) is in `review.rs`; every refusal here names the field and the reason.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use serde_json::Value;

pub use super::borrow::Ask;
use super::borrow::{self, Kind};
use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::{AgentRun, AgentRunSpec, AgentThreadSpec, LedgerSegment};
use crate::fence::{Fence, append_ceiling, may_append_at, segment_name, worker_pod_name};
use crate::rbac::{pod_service_account, service_account_username};

/// The permissions `new` borrows (the one borrow rule, `borrow.rs`): each borrowed field
/// set and changed since `old`. An update that leaves them as they were (an input, an
/// approval, a stop) borrows nothing new: those were asked when they were set.
pub fn run_asks(old: Option<&AgentRunSpec>, new: &AgentRunSpec) -> Vec<Ask> {
    spec_asks(Kind::AgentRun, old, new)
}

/// The permissions a thread's `new` spec borrows for its turns, asked of its writer.
pub fn thread_asks(old: Option<&AgentThreadSpec>, new: &AgentThreadSpec) -> Vec<Ask> {
    spec_asks(Kind::AgentThread, old, new)
}

fn spec_asks<S: serde::Serialize>(kind: Kind, old: Option<&S>, new: &S) -> Vec<Ask> {
    let json = |spec: &S| serde_json::to_value(spec).unwrap_or_default();
    let old = old.map(json);
    borrow::asks(kind, old.as_ref(), &json(new))
}

/// A turn as it will run once it joins `thread`: with the thread's agent and worker, which its
/// creator borrows as if they were written in the turn.
pub fn turn_as_joined(turn: &AgentRunSpec, thread: &AgentThreadSpec) -> AgentRunSpec {
    AgentRunSpec {
        agent: Some(thread.agent.clone()),
        worker: thread.worker.clone(),
        ..turn.clone()
    }
}

/// Why an update of a turn that has joined its thread is refused, or None: what it took from
/// its thread (and the thread it is a turn of) never changes, so every attempt of the turn
/// runs the agent it was admitted with. Its input, later inputs, approvals and stop are the
/// user's to change as on any run.
pub fn joined_turn_refusal(old: &AgentRunSpec, new: &AgentRunSpec) -> Option<String> {
    let thread = old.thread.as_deref().filter(|_| old.agent.is_some())?;
    let fixed = [
        ("spec.thread", old.thread != new.thread),
        ("spec.agent", old.agent != new.agent),
        ("spec.budget", old.budget != new.budget),
        ("spec.worker", old.worker != new.worker),
        ("spec.lease", old.lease != new.lease),
        ("spec.maxAttempts", old.max_attempts != new.max_attempts),
    ];
    let (field, _) = fixed.into_iter().find(|(_, changed)| *changed)?;
    Some(format!(
        "{field}: a turn of thread {thread} keeps what it took from its thread when it was \
         admitted; edit the thread instead (the turns admitted after that take it)"
    ))
}

/// True when `old` → `new` is a turn joining its thread (the controller's one write of a
/// turn's spec): the agent set where there was none, the thread unchanged. Its creator was
/// asked for what the thread borrows when the turn was created.
pub fn is_join(old: &AgentRunSpec, new: &AgentRunSpec) -> bool {
    old.thread.is_some() && old.thread == new.thread && old.agent.is_none() && new.agent.is_some()
}

/// Why a write of an AgentRun's metadata (`new` over `old`; None: a create) by anyone but
/// baton's controller is refused, or None. Only the controller makes a run a turn of a thread
/// (an AgentThread owner reference, the turn's place) and stamps the thread generation the
/// turn was admitted with: taken from a user, they would let any run pose as a turn of any
/// thread (its history for the next turn) or carry a proof nobody checked. Removing an owner
/// reference is let through: it only makes a run no turn (the garbage collector orphans a
/// thread's turns that way), as deleting it would.
pub fn membership_refusal(
    old: Option<&kube::api::ObjectMeta>,
    new: &kube::api::ObjectMeta,
    user: &str,
) -> Option<String> {
    let thread_refs = |meta: &kube::api::ObjectMeta| -> Vec<OwnerReference> {
        let refs = meta.owner_references.iter().flatten();
        refs.filter(|o| o.kind == "AgentThread").cloned().collect()
    };
    let before = old.map(thread_refs).unwrap_or_default();
    if let Some(added) = thread_refs(new).into_iter().find(|r| !before.contains(r)) {
        return Some(format!(
            "metadata.ownerReferences: {user} may not make this run a turn of AgentThread {:?}: \
             only baton's controller joins a run to a thread (create the run with spec.thread)",
            added.name
        ));
    }
    let annotation = |meta: Option<&kube::api::ObjectMeta>, key: &str| {
        meta.and_then(|m| m.annotations.as_ref()?.get(key).cloned())
    };
    let turn = crate::crd::TURN_ANNOTATION;
    let placed = annotation(Some(new), turn);
    if placed.is_some() && placed != annotation(old, turn) {
        return Some(format!(
            "metadata.annotations[{turn}]: {user} may not place a run in a thread: only baton's \
             controller does, when the run joins it"
        ));
    }
    let stamp = crate::crd::THREAD_GENERATION_ANNOTATION;
    let stamped = annotation(Some(new), stamp);
    (old.is_some() && stamped != annotation(old, stamp)).then(|| {
        format!(
            "metadata.annotations[{stamp}]: {user} may not change it: baton's webhook stamps it \
             when the turn is created"
        )
    })
}

/// Why a turn whose creation stamped `stamped` (the thread generation that the mutating
/// webhook saw) is refused when the thread is at `generation` now, or None. The creator is
/// asked about the thread as it is now; a thread edited in between is a thread they were
/// not asked about.
pub fn stamp_refusal(thread: &str, stamped: Option<&str>, generation: i64) -> Option<String> {
    let stamp = crate::crd::THREAD_GENERATION_ANNOTATION;
    match stamped.map(str::parse::<i64>) {
        Some(Ok(seen)) if seen == generation => None,
        Some(Ok(seen)) => Some(format!(
            "metadata.annotations[{stamp}]: thread {thread} changed while this turn was \
             admitted (generation {seen}, now {generation}); create the turn again"
        )),
        Some(Err(_)) => Some(format!(
            "metadata.annotations[{stamp}]: {:?} is not a generation",
            stamped.unwrap_or_default()
        )),
        None => Some(format!(
            "metadata.annotations[{stamp}]: not stamped; baton's mutating webhook stamps every \
             turn when it is created (is the chart's MutatingWebhookConfiguration installed?)"
        )),
    }
}

/// The JSON patch that stamps `generation` on a turn (`has_annotations`: whether it has an
/// annotations map to add the key to).
pub fn stamp_patch(has_annotations: bool, generation: i64) -> json_patch::Patch {
    let key = crate::crd::THREAD_GENERATION_ANNOTATION;
    let op = match has_annotations {
        // RFC 6901: '/' in a key is written "~1".
        true => serde_json::json!({
            "op": "add",
            "path": format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1")),
            "value": generation.to_string(),
        }),
        false => serde_json::json!({
            "op": "add",
            "path": "/metadata/annotations",
            "value": { key: generation.to_string() },
        }),
    };
    serde_json::from_value(serde_json::json!([op])).expect("a JSON patch of one add")
}

/// A spec larger than `max` bytes (as JSON): the message names its size and largest field.
pub fn oversized_spec<S: serde::Serialize>(spec: &S, max: usize) -> Option<String> {
    let value = serde_json::to_value(spec).ok()?;
    let size = value.to_string().len();
    if size <= max {
        return None;
    }
    let (field, field_size) = largest_field(&value, "spec");
    Some(format!(
        "spec is {size} bytes, over the limit of {max} bytes (--max-spec-bytes); its largest \
         field is {field} ({field_size} bytes)"
    ))
}

/// The deepest field that holds most of `value`'s bytes.
fn largest_field(value: &Value, path: &str) -> (String, usize) {
    let size = value.to_string().len();
    let children: Vec<(String, &Value)> = match value {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (format!("{path}.{k}"), v))
            .collect(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("{path}[{i}]"), v))
            .collect(),
        _ => Vec::new(),
    };
    children
        .into_iter()
        .map(|(p, v)| largest_field(v, &p))
        .filter(|(_, s)| *s * 2 > size)
        .max_by_key(|(_, s)| *s)
        .unwrap_or((path.to_string(), size))
}

/// What the webhook knows of the run a segment or Lease claims to belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFacts {
    pub uid: String,
    /// `status.fence`: the attempt that holds the run.
    pub fence: Fence,
    /// The user name the run's worker pods authenticate as.
    pub worker_user: String,
}

impl RunFacts {
    /// The facts of `run` as read from the API server.
    pub fn of(run: &AgentRun) -> Self {
        let namespace = run.namespace().unwrap_or_default();
        RunFacts {
            uid: run.uid().unwrap_or_default(),
            fence: Fence::of_run(run),
            worker_user: service_account_username(&namespace, &pod_service_account(run)),
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
    let (at, status) = (Fence::of_segment(seg), run.fence);
    (!may_append_at(at, status, by_controller)).then(|| {
        let ceiling = append_ceiling(status, by_controller);
        format!(
            "spec.fence: {at} is ahead of run {of:?}, which is at fence {status} (a segment may \
             carry at most {ceiling})"
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
/// (README, the threat table). Letting them renew the run's own Lease gives them nothing.
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
#[path = "rules_tests.rs"]
mod tests;
