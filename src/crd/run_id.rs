//! A stored run's identity, in one place.

use kube::ResourceExt;

use super::v1alpha1::AgentRun;

/// A run as the API server stores it: its namespace, its name and its UID (a run re-created
/// under the same name is another run). Taken once from a run read from the API server, which
/// sets all three; a run that was never stored (a manifest, a literal in a test) has empty
/// ones, and an empty UID matches no stored object's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl RunId {
    /// The identity of `run`.
    pub fn of(run: &AgentRun) -> Self {
        Self {
            namespace: run.namespace().unwrap_or_default(),
            name: run.name_any(),
            uid: run.uid().unwrap_or_default(),
        }
    }
}

impl AgentRun {
    /// This run's identity ([`RunId::of`]).
    pub fn id(&self) -> RunId {
        RunId::of(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_run_is_known_by_namespace_name_and_uid_and_a_literal_by_none() {
        let stored: AgentRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u-1"},
            "spec": {"input": "hi"}
        }))
        .expect("a run");
        let id = stored.id();
        assert_eq!(
            (id.namespace.as_str(), id.name.as_str(), id.uid.as_str()),
            ("ns", "r", "u-1")
        );
        let mut literal = stored.clone();
        literal.metadata.uid = None;
        literal.metadata.namespace = None;
        assert_eq!(literal.id().uid, "");
        assert_ne!(literal.id(), id);
    }
}
