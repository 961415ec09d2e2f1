//! Per-run least privilege (pure): the ServiceAccount, Role and RoleBinding a run's worker pods
//! run as, all owned by the run so they are garbage-collected with it.
//!
//! The controller creates these before a run's first worker pod (see [`RunRbac::objects`]);
//! this module only builds them. Naming convention, relied on by the chart's
//! ValidatingAdmissionPolicy: a run's worker ServiceAccount is `baton-run-<run>`, so the run a
//! request comes from is `username` minus `system:serviceaccount:<namespace>:baton-run-`.
//!
//! What the Role grants, and why each rule is shaped as it is:
//! - `agentruns` get, list, watch **restricted to the run's name**. RBAC authorizes a list or
//!   watch by name only when the request carries the field selector `metadata.name=<run>`,
//!   which is exactly how the worker watches its run (`spec.stop`, fence moves). A plain list
//!   of the namespace's runs is refused.
//! - `agentruns/status` get, update, restricted to the run's name: fenced status writes.
//! - `leases` (coordination.k8s.io) get, update, restricted to `run.<run>`: renew and release
//!   its own run Lease; it cannot create, delete or touch another run's Lease or a thread Lease.
//! - `ledgersegments` create, get, list in the namespace: RBAC cannot restrict `create` or
//!   `list` by name. No update, no patch, no delete: the ledger is append-only by RBAC. The
//!   chart's ValidatingAdmissionPolicy (Kubernetes >= 1.30) narrows `create` to the run's own
//!   segments.
//! - `events` (events.k8s.io) create, patch: Warning Events for unknown effects.
//! - `pods` get, restricted to `<run>-w1`, the run's first attempt's pod: a pod started ahead
//!   for a thread's turn (`controller::warm`) reads itself, and starts only once the run has
//!   adopted it. It shows the pod's spec, which the run's spec gives anyway (a Secret only by
//!   reference).
//! - Nothing else: no Secrets (the model key reaches the worker through the pod's
//!   environment), no other pods, no other runs.
//!
//! The controller may create this Role without `escalate` or `bind`: the API server lets a
//! subject grant only permissions it holds itself, and the chart's ClusterRole gives the
//! controller every verb above (unrestricted by name).

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::ObjectMeta;

use crate::crd::GROUP;
use crate::crd::v1alpha1::AgentRun;
use crate::fence::{Fence, run_lease_name, worker_pod_name};
use crate::owned::{Ownership, owned_meta};

/// Prefix of every per-run worker ServiceAccount, Role and RoleBinding name.
pub const WORKER_SA_PREFIX: &str = "baton-run-";
/// Prefix of a ServiceAccount's user name in the API server's authentication.
pub const SA_USERNAME_PREFIX: &str = "system:serviceaccount:";
/// Longest object name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Errors building a run's RBAC objects.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    /// The run was not read from the API server (no UID or namespace): nothing could own the objects.
    #[error("run {run} has no {missing}: read it from the API server first")]
    NotPersisted { run: String, missing: &'static str },
    /// `baton-run-<run>` would exceed the API server's name limit.
    #[error("run name {run:?} is too long for a worker ServiceAccount (at most {max} characters)")]
    NameTooLong { run: String, max: usize },
}

impl RbacError {
    /// Low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            RbacError::NotPersisted { .. } => "not_persisted",
            RbacError::NameTooLong { .. } => "name_too_long",
        }
    }
}

/// The worker ServiceAccount (and Role, RoleBinding) name of `run`.
pub fn worker_service_account_name(run: &str) -> String {
    format!("{WORKER_SA_PREFIX}{run}")
}

/// The ServiceAccount a run's worker pods should run as: the one the run names
/// (`spec.worker.serviceAccountName`, the user's choice, not isolated by baton), else its own.
pub fn pod_service_account(run: &AgentRun) -> String {
    run.spec
        .worker
        .service_account_name
        .clone()
        .unwrap_or_else(|| worker_service_account_name(&run.name_any()))
}

/// The API server user name of a run's worker ServiceAccount.
pub fn worker_username(namespace: &str, run: &str) -> String {
    service_account_username(namespace, &worker_service_account_name(run))
}

/// The API server user name of ServiceAccount `namespace/name`.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("{SA_USERNAME_PREFIX}{namespace}:{name}")
}

/// The `(namespace, run)` a request user name belongs to, if it is a run's worker ServiceAccount.
/// The inverse of [`worker_username`]; the chart's admission policy applies the same rule in CEL.
pub fn run_of_username(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix(SA_USERNAME_PREFIX)?;
    let (namespace, sa) = rest.split_once(':')?;
    let run = sa.strip_prefix(WORKER_SA_PREFIX)?;
    (!namespace.is_empty() && !run.is_empty()).then_some((namespace, run))
}

/// The three objects that give one run's worker pods exactly what they need.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRbac {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
}

impl RunRbac {
    /// Builds the objects for `run`, which must have been read from the API server (its UID
    /// makes it their owner, so they are garbage-collected with it).
    pub fn for_run(run: &AgentRun) -> Result<Self, RbacError> {
        let name = run.name_any();
        let max = MAX_NAME - WORKER_SA_PREFIX.len();
        if name.len() > max {
            return Err(RbacError::NameTooLong { run: name, max });
        }
        Ok(Self::with_meta(&name, object_meta(run)?))
    }

    /// Whether a run named `run` can have these objects (their names have room for it).
    pub fn name_fits(run: &str) -> bool {
        run.len() <= MAX_NAME - WORKER_SA_PREFIX.len()
    }

    /// The objects for a run named `run` that does not exist yet (a thread's next turn, whose
    /// pod is started ahead), with `meta` (their owner: the thread). They grant what they
    /// would grant the run: rights on objects of that name only.
    pub fn with_meta(run: &str, meta: ObjectMeta) -> Self {
        let namespace = meta.namespace.clone().unwrap_or_default();
        Self {
            service_account: ServiceAccount {
                metadata: meta.clone(),
                ..ServiceAccount::default()
            },
            role: Role {
                metadata: meta.clone(),
                rules: Some(worker_rules(run)),
            },
            role_binding: role_binding(meta, &namespace),
        }
    }

    /// The objects' name (shared by all three).
    pub fn name(&self) -> String {
        self.service_account.name_any()
    }
}

/// Metadata shared by the three objects: name, namespace, labels and the run as owner.
fn object_meta(run: &AgentRun) -> Result<ObjectMeta, RbacError> {
    let name = run.name_any();
    let missing = |what| RbacError::NotPersisted {
        run: name.clone(),
        missing: what,
    };
    run.namespace().ok_or_else(|| missing("namespace"))?;
    run.uid().ok_or_else(|| missing("uid"))?;
    let name = worker_service_account_name(&name);
    Ok(owned_meta(run, name, Ownership::Controller))
}

/// The Role's rules for run `run` (see the module documentation for why each is shaped so).
pub fn worker_rules(run: &str) -> Vec<PolicyRule> {
    let named = |group: &str, resource: &str, names: Vec<String>, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        resource_names: (!names.is_empty()).then_some(names),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        non_resource_urls: None,
    };
    let own = vec![run.to_string()];
    vec![
        named(GROUP, "agentruns", own.clone(), &["get", "list", "watch"]),
        named(GROUP, "agentruns/status", own, &["get", "update"]),
        named(
            "coordination.k8s.io",
            "leases",
            vec![run_lease_name(run)],
            &["get", "update"],
        ),
        named(GROUP, "ledgersegments", vec![], &["create", "get", "list"]),
        named("events.k8s.io", "events", vec![], &["create", "patch"]),
        // A pod started ahead for a thread's turn is its first attempt's: its worker reads it
        // to start only once the run has adopted it.
        named(
            "",
            "pods",
            vec![worker_pod_name(run, Fence::new(1))],
            &["get"],
        ),
    ]
}

fn role_binding(meta: ObjectMeta, namespace: &str) -> RoleBinding {
    let name = meta.name.clone().unwrap_or_default();
    RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(namespace.to_string()),
            api_group: None,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str) -> AgentRun {
        AgentRun::builder(name)
            .namespace("team-a")
            .stored("u-1")
            .build()
    }

    #[test]
    fn names_follow_the_convention_and_invert() {
        assert_eq!(worker_service_account_name("r1"), "baton-run-r1");
        let user = worker_username("team-a", "r1");
        assert_eq!(user, "system:serviceaccount:team-a:baton-run-r1");
        assert_eq!(run_of_username(&user), Some(("team-a", "r1")));
        assert_eq!(
            run_of_username("system:serviceaccount:team-a:default"),
            None
        );
        assert_eq!(
            run_of_username("system:serviceaccount:team-a:baton-run-"),
            None
        );
        assert_eq!(run_of_username("alice"), None);
    }

    #[test]
    fn the_three_objects_share_a_name_and_are_owned_by_the_run() {
        let rbac = RunRbac::for_run(&run("r1")).unwrap();
        assert_eq!(rbac.name(), "baton-run-r1");
        for meta in [
            &rbac.service_account.metadata,
            &rbac.role.metadata,
            &rbac.role_binding.metadata,
        ] {
            assert_eq!(meta.name.as_deref(), Some("baton-run-r1"));
            assert_eq!(meta.namespace.as_deref(), Some("team-a"));
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("AgentRun", "u-1")
            );
            assert_eq!(owner.controller, Some(true));
        }
        let subject = &rbac.role_binding.subjects.as_ref().unwrap()[0];
        assert_eq!(subject.name, "baton-run-r1");
        assert_eq!(subject.namespace.as_deref(), Some("team-a"));
        assert_eq!(rbac.role_binding.role_ref.kind, "Role");
    }

    #[test]
    fn own_objects_are_named_and_the_ledger_has_no_update_or_delete() {
        let rules = worker_rules("r1");
        let find = |res: &str| {
            rules
                .iter()
                .find(|r| r.resources.as_ref().unwrap()[0] == res)
                .unwrap()
        };
        assert_eq!(
            find("agentruns").resource_names,
            Some(vec!["r1".to_string()])
        );
        assert_eq!(
            find("agentruns/status").resource_names,
            Some(vec!["r1".to_string()])
        );
        assert_eq!(
            find("leases").resource_names,
            Some(vec!["run.r1".to_string()])
        );
        assert_eq!(find("ledgersegments").verbs, ["create", "get", "list"]);
        let pods = find("pods");
        assert_eq!(pods.resource_names, Some(vec!["r1-w1".to_string()]));
        assert_eq!(pods.verbs, ["get"]);
        for rule in &rules {
            assert!(
                !rule
                    .verbs
                    .iter()
                    .any(|v| v == "delete" || v == "*" || v == "deletecollection")
            );
            assert!(
                !rule
                    .resources
                    .as_ref()
                    .unwrap()
                    .iter()
                    .any(|r| r == "secrets" || r == "*")
            );
        }
    }

    #[test]
    fn a_run_not_read_from_the_server_or_too_long_is_refused() {
        let mut unsaved = run("r1");
        unsaved.metadata.uid = None;
        assert!(matches!(
            RunRbac::for_run(&unsaved),
            Err(RbacError::NotPersisted { missing: "uid", .. })
        ));
        let long = run(&"a".repeat(250));
        assert_eq!(
            RunRbac::for_run(&long).unwrap_err().label(),
            "name_too_long"
        );
    }

    #[test]
    fn the_pod_runs_as_the_runs_own_account_unless_the_user_names_one() {
        let mut r = run("r1");
        assert_eq!(pod_service_account(&r), "baton-run-r1");
        r.spec.worker.service_account_name = Some("custom".into());
        assert_eq!(pod_service_account(&r), "custom");
    }
}
