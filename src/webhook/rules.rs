//! What the webhook admits (pure): the permissions a run's manifest borrows, the size of its
//! spec, and who may append to a ledger or edit a run Lease. The I/O (SubjectAccessReviews,
//! reading the run) is in `review.rs`; every refusal here names the field and the reason.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use serde_json::Value;

use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::{AgentRun, AgentRunSpec, AgentThreadSpec, LedgerSegment};
use crate::fence::{Fence, append_ceiling, may_append_at, segment_name, worker_pod_name};
use crate::rbac::{pod_service_account, service_account_username};

/// A permission the requesting user must hold, because a field of the manifest would make
/// baton use it on their behalf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The field that needs it, as the user wrote it (`spec.worker.image`).
    pub field: String,
    pub verb: &'static str,
    /// The API group of `resource` (`""`: the core group).
    pub group: &'static str,
    pub resource: &'static str,
    /// The object, when the permission is on one object (a Secret); None: the namespace.
    pub name: Option<String>,
}

impl Ask {
    fn get_secret(field: String, name: &str) -> Ask {
        Ask {
            field,
            verb: "get",
            group: "",
            resource: "secrets",
            name: Some(name.to_string()),
        }
    }

    fn create_pods(field: &str) -> Ask {
        Ask {
            field: field.to_string(),
            verb: "create",
            group: "",
            resource: "pods",
            name: None,
        }
    }

    /// A turn's worker reads its thread's earlier turns' ledgers: its creator must be able
    /// to read them too.
    pub(crate) fn read_ledgers(field: &str) -> Ask {
        Ask {
            field: field.to_string(),
            verb: "list",
            group: crate::crd::GROUP,
            resource: "ledgersegments",
            name: None,
        }
    }

    /// The refusal when the user lacks it.
    pub fn refusal(&self, user: &str, namespace: &str) -> String {
        let what = match &self.name {
            Some(name) => format!("{} {} {name:?}", self.verb, self.resource),
            None => format!("{} {}", self.verb, self.resource),
        };
        format!(
            "{}: {user} may not {what} in namespace {namespace}, and a run does it on its \
             creator's behalf",
            self.field
        )
    }
}

/// The permissions `new` borrows. An update that leaves `agent` and `worker` as they were
/// (an input, an approval, a stop) borrows nothing new: those were asked when they were set.
pub fn run_asks(old: Option<&AgentRunSpec>, new: &AgentRunSpec) -> Vec<Ask> {
    if old.is_some_and(|old| same_borrowing_fields(old, new)) {
        return Vec::new();
    }
    let mut asks = Vec::new();
    if new.thread.is_some() {
        asks.push(Ask::read_ledgers("spec.thread"));
    }
    let agent = new.agent();
    if let Some(key) = agent.and_then(|a| a.model.api_key_secret_ref.as_ref()) {
        asks.push(Ask::get_secret(
            "spec.agent.model.apiKeySecretRef.name".into(),
            &key.name,
        ));
    }
    for (i, tool) in new.tools().iter().enumerate() {
        if let Some(secret) = tool
            .mcp
            .as_ref()
            .and_then(|m| m.headers_from_secret.as_ref())
        {
            let field = format!("spec.agent.tools[{i}].mcp.headersFromSecret");
            asks.push(Ask::get_secret(field, secret));
        }
    }
    let worker = &new.worker;
    let pod_fields = [
        ("spec.worker.image", worker.image.is_some()),
        ("spec.worker.toolsImage", worker.tools_image.is_some()),
        (
            "spec.worker.serviceAccountName",
            worker.service_account_name.is_some(),
        ),
        (
            "spec.worker.runtimeClassName",
            worker.runtime_class_name.is_some(),
        ),
        ("spec.worker.tolerations", !worker.tolerations.is_empty()),
    ];
    for (field, set) in pod_fields {
        if set {
            asks.push(Ask::create_pods(field));
        }
    }
    asks
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

fn same_borrowing_fields(old: &AgentRunSpec, new: &AgentRunSpec) -> bool {
    old.agent == new.agent && old.worker == new.worker && old.thread == new.thread
}

/// A spec larger than `max` bytes (as JSON): the message names its size and largest field.
pub fn oversized_spec(spec: &AgentRunSpec, max: usize) -> Option<String> {
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
    let by_controller = match writer {
        Writer::Controller => true,
        Writer::RunWorker => false,
        Writer::Other => {
            return Some(format!(
                "{user} may not append to the ledger of run {of:?}: only its worker \
                 ({}) and baton's controller may",
                run.worker_user
            ));
        }
    };
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
