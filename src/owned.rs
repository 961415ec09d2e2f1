//! What baton makes for a run belongs to it: one builder for the labels and owner reference
//! of every object baton creates on a run's behalf (worker pod, workspace claim, Lease,
//! ServiceAccount and Role, ledger segments), so each is found by the same labels and
//! garbage-collected with its run.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::crd::v1alpha1::AgentRun;
use crate::crd::{MANAGED_BY_LABEL, RUN_LABEL};
use crate::fence::label_value;

/// How an object belongs to its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The run controls it (the worker pod, the workspace claim, the run Lease, the worker's
    /// ServiceAccount, Role and RoleBinding). `blockOwnerDeletion` stays unset: deleting the
    /// run need not wait for any of them.
    Controller,
    /// The run owns it without controlling it (ledger segments, a thread's Lease shared by the
    /// thread's runs): the garbage collector takes it with the run, and nothing reads it as
    /// the run's controller.
    Reference,
}

/// The run's owner reference for an object that belongs to it so. None for a run not read
/// from the API server (no UID).
pub fn owner_reference(run: &AgentRun, how: Ownership) -> Option<OwnerReference> {
    run.uid()?;
    let owner = run.controller_owner_ref(&())?;
    Some(match how {
        Ownership::Controller => owner,
        Ownership::Reference => OwnerReference {
            controller: Some(false),
            ..owner
        },
    })
}

/// The label every object baton makes carries.
pub fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_string(), "baton".to_string())])
}

/// The labels of an object made for the run named `run`: baton's, and the run's name.
pub fn run_labels(run: &str) -> BTreeMap<String, String> {
    let mut labels = managed_labels();
    labels.insert(RUN_LABEL.to_string(), label_value(run));
    labels
}

/// The metadata of an object named `name` made for `run`: in its namespace, with
/// [`run_labels`], owned as `how` says.
pub fn owned_meta(run: &AgentRun, name: String, how: Ownership) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: run.namespace(),
        labels: Some(run_labels(&run.name_any())),
        owner_references: owner_reference(run, how).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ownership_is_the_runs_reference_shaped_for_it() {
        let run = AgentRun::builder("r").namespace("ns").stored("u").build();
        let controller = owner_reference(&run, Ownership::Controller).unwrap();
        assert_eq!(
            (
                controller.uid.as_str(),
                controller.controller,
                controller.block_owner_deletion
            ),
            ("u", Some(true), None)
        );
        let reference = owner_reference(&run, Ownership::Reference).unwrap();
        assert_eq!(reference.controller, Some(false));
        let unsaved = AgentRun::builder("r").build();
        assert_eq!(owner_reference(&unsaved, Ownership::Controller), None);
    }

    #[test]
    fn an_owned_object_is_named_labelled_and_placed_for_its_run() {
        let run = AgentRun::builder("r").namespace("ns").stored("u").build();
        let meta = owned_meta(&run, "r-w1".into(), Ownership::Controller);
        assert_eq!(meta.name.as_deref(), Some("r-w1"));
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        let labels = meta.labels.unwrap();
        assert_eq!(labels[RUN_LABEL], "r");
        assert_eq!(labels[MANAGED_BY_LABEL], "baton");
        assert_eq!(meta.owner_references.unwrap().len(), 1);
    }
}
