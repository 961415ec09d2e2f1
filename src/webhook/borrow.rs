//! The one borrow rule (docs/security.md, "One borrow rule"): every field, on any resource,
//! that makes baton use something of the namespace on someone's behalf (read a Secret, shape a
//! pod, create a claim, read other runs' ledgers) is a row of [`BORROWED`], with the right its
//! writer must hold. The webhook asks the *writer* of such a field for that right, whatever
//! resource the field sits on; [`NOT_BORROWED`] lists every other field of the specs, so a
//! test that walks the CRD schemas fails on a field that is in neither (a new field must be
//! sorted into one of them in the change that adds it).
//!
//! Paths are relative to `spec`; `[]` stands for every item of an array.

use serde_json::Value;

pub use crate::access::Ask;

/// The refusal when the user lacks `ask`, on a resource of `kind`.
pub fn refusal(ask: &Ask, user: &str, namespace: &str, kind: Kind) -> String {
    let what = match &ask.name {
        Some(name) => format!("{} {} {name:?}", ask.verb, ask.resource),
        None => format!("{} {}", ask.verb, ask.resource),
    };
    format!(
        "{}: {user} may not {what} in namespace {namespace}, and {}",
        ask.field,
        kind.acts_for()
    )
}

/// The resources whose specs borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AgentRun,
    AgentThread,
}

impl Kind {
    /// How a refusal says who acts on the writer's behalf.
    pub fn acts_for(self) -> &'static str {
        match self {
            Kind::AgentRun => "a run does it on its creator's behalf",
            Kind::AgentThread => "the thread's turns do it on its writer's behalf",
        }
    }
}

/// The right a borrowed field needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Reading the Secret named at `name_at` (relative to the field). Whoever writes anything
    /// under the field must hold it: the field also holds what receives the Secret (the
    /// endpoint, the provider, the MCP URL), and re-pointing it sends the Secret elsewhere.
    ReadSecret { name_at: &'static str },
    /// Creating pods: the field shapes the worker pod (its image, identity, placement,
    /// resources), which only a user who may create pods could choose.
    CreatePods,
    /// Creating PersistentVolumeClaims: baton makes one for the run.
    CreateClaims,
    /// Listing LedgerSegments: a turn's worker reads its thread's earlier turns.
    ReadLedgers,
}

/// One borrowed field.
#[derive(Debug, Clone, Copy)]
pub struct Borrowed {
    pub path: &'static str,
    pub right: Right,
    pub on: &'static [Kind],
}

const BOTH: &[Kind] = &[Kind::AgentRun, Kind::AgentThread];
const RUN: &[Kind] = &[Kind::AgentRun];

const fn pods(path: &'static str) -> Borrowed {
    Borrowed {
        path,
        right: Right::CreatePods,
        on: BOTH,
    }
}

/// Every borrowed field. A run's turn borrows its thread's `agent` and `worker` as well, as if
/// written in it (`rules::turn_as_joined`).
pub const BORROWED: &[Borrowed] = &[
    Borrowed {
        path: "thread",
        right: Right::ReadLedgers,
        on: RUN,
    },
    Borrowed {
        path: "agent.model",
        right: Right::ReadSecret {
            name_at: "apiKeySecretRef.name",
        },
        on: BOTH,
    },
    Borrowed {
        path: "agent.tools[].mcp",
        right: Right::ReadSecret {
            name_at: "headersFromSecret",
        },
        on: BOTH,
    },
    pods("worker.image"),
    pods("worker.toolsImage"),
    pods("worker.serviceAccountName"),
    pods("worker.runtimeClassName"),
    pods("worker.tolerations"),
    pods("worker.nodeSelector"),
    pods("worker.resources"),
    pods("worker.toolsResources"),
    pods("worker.workspaceSizeLimit"),
    // The whole block: its image, command and environment are what the pod runs.
    pods("agent.container"),
    Borrowed {
        path: "workspace",
        right: Right::CreateClaims,
        on: RUN,
    },
];

/// Every other field of the AgentRun and AgentThread specs, and why it borrows nothing.
pub const NOT_BORROWED: &[(&str, &str)] = &[
    ("input", "text for the model"),
    ("inputs", "text for the model"),
    ("approvals", "decisions on the run's own calls"),
    ("approvalTimeoutSeconds", "timing"),
    ("threadKey", "an admission key: runs take turns"),
    ("agent.systemPrompt", "text for the model"),
    ("agent.maxSteps", "a bound"),
    ("agent.approval", "a policy of the run's own calls"),
    (
        "agent.tools[].name",
        "what the model calls the tool; shell and probe commands run in the tools container, \
         which holds no credential",
    ),
    ("agent.tools[].kind", "the tool's kind"),
    ("agent.tools[].description", "text for the model"),
    ("agent.tools[].idempotent", "a resume policy"),
    ("agent.tools[].timeoutSeconds", "a bound"),
    ("agent.tools[].probe", "a command in the tools container"),
    ("agent.tools[].approval", "a policy of the run's own calls"),
    ("lease", "timing"),
    ("maxAttempts", "a bound"),
    ("stop", "a request to stop"),
    (
        "ttlSecondsAfterFinished",
        "cleanup of the run's own objects",
    ),
    ("budget", "a bound"),
    ("onBusy", "a policy of the thread's own turns"),
    ("context", "a bound"),
    (
        "warm",
        "timing: the next turn's pod, built from what the thread lends (each field asked \
         above), started before the turn and serving only a turn that was admitted",
    ),
];

/// The rights `kind`'s spec `new` borrows, written over `old` (None: created): each borrowed
/// field that is set and differs from what it was.
pub fn asks(kind: Kind, old: Option<&Value>, new: &Value) -> Vec<Ask> {
    let mut asks = Vec::new();
    for row in BORROWED.iter().filter(|row| row.on.contains(&kind)) {
        for (field, value) in values_at(new, row.path, "spec") {
            let before = old.and_then(|old| value_at(old, &field["spec.".len()..]));
            if value.is_null() || before == Some(value) {
                continue;
            }
            if let Some(ask) = ask_for(row.right, &field, value) {
                asks.push(ask);
            }
        }
    }
    asks
}

fn ask_for(right: Right, field: &str, value: &Value) -> Option<Ask> {
    match right {
        Right::ReadSecret { name_at } => {
            let name = value_at(value, name_at)?.as_str()?;
            Some(Ask::get_secret(format!("{field}.{name_at}"), name))
        }
        Right::CreatePods => Some(Ask::create(field, "", "pods")),
        Right::CreateClaims => Some(Ask::create(field, "", "persistentvolumeclaims")),
        Right::ReadLedgers => Some(Ask::read_ledgers(field)),
    }
}

/// The values at `path` in `value`, each with its concrete path (`[]` expanded to indices),
/// `prefix` first.
fn values_at<'v>(value: &'v Value, path: &str, prefix: &str) -> Vec<(String, &'v Value)> {
    let Some((head, rest)) = split_first(path) else {
        return vec![(prefix.to_string(), value)];
    };
    let (key, each) = match head.strip_suffix("[]") {
        Some(key) => (key, true),
        None => (head, false),
    };
    let Some(child) = value.get(key) else {
        return Vec::new();
    };
    let at = format!("{prefix}.{key}");
    if !each {
        return values_at(child, rest, &at);
    }
    let items = child.as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .enumerate()
        .flat_map(|(i, item)| values_at(item, rest, &format!("{at}[{i}]")))
        .collect()
}

/// The value at a concrete path (`agent.tools[0].mcp`).
fn value_at<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    let Some((head, rest)) = split_first(path) else {
        return Some(value);
    };
    let child = match head.split_once('[') {
        Some((key, index)) => {
            let index: usize = index.strip_suffix(']')?.parse().ok()?;
            value.get(key)?.get(index)?
        }
        None => value.get(head)?,
    };
    value_at(child, rest)
}

fn split_first(path: &str) -> Option<(&str, &str)> {
    if path.is_empty() {
        return None;
    }
    Some(path.split_once('.').unwrap_or((path, "")))
}

/// Whether `leaf` (a schema path, `[]` for items) is sorted: under a row of [`BORROWED`] for
/// `kind` or of [`NOT_BORROWED`].
pub fn is_sorted(kind: Kind, leaf: &str) -> bool {
    let under = |prefix: &str| {
        leaf == prefix
            || leaf
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    };
    BORROWED
        .iter()
        .filter(|row| row.on.contains(&kind))
        .any(|row| under(row.path))
        || NOT_BORROWED.iter().any(|(path, _)| under(path))
}

#[cfg(test)]
#[path = "borrow_tests.rs"]
mod tests;
