//! What the webhook admits (pure): the permissions a run's manifest borrows, the size of its
//! spec, a thread's turns and their stamps. Who may append to a ledger or edit a run Lease is
//! `crate::access`, shared with `baton server`. The I/O (SubjectAccessReviews, reading the
//! run) is in `review.rs`; every refusal here names the field and the reason.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use super::borrow::{self, Kind};
use crate::access::Ask;
use crate::crd::v1alpha1::{AgentRunSpec, AgentThreadSpec};

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

/// Why an update that changes a run's `traceparent` annotation is refused, or None. Every
/// process computes the run's trace from it (`crate::traces::RunTrace`): changed mid-run, the
/// later attempts and claims would go to another trace than the earlier ones.
pub fn trace_refusal(
    old: Option<&kube::api::ObjectMeta>,
    new: &kube::api::ObjectMeta,
) -> Option<String> {
    let key = crate::traces::TRACEPARENT_ANNOTATION;
    let given = |meta: &kube::api::ObjectMeta| meta.annotations.as_ref()?.get(key).cloned();
    let old = old?;
    (given(old) != given(new)).then(|| {
        format!(
            "metadata.annotations[{key}]: it is set when the run is created and never changed: \
             every attempt of the run is in the trace it names"
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

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
