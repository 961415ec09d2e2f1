use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::*;
use crate::crd::v1alpha1::{AgentRun, AgentThread};

/// Every leaf field of `kind`'s spec in its CRD schema, `[]` for array items; a map
/// (`additionalProperties`) or an object kept whole is a leaf.
fn schema_leaves(crd: Value) -> Vec<String> {
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut leaves = Vec::new();
    walk(schema, "", &mut leaves);
    leaves
}

fn walk(schema: &Value, path: &str, leaves: &mut Vec<String>) {
    let mut branched = false;
    if let Some(props) = schema["properties"].as_object() {
        for (key, child) in props {
            let at = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            walk(child, &at, leaves);
        }
        branched = true;
    }
    if schema["items"].is_object() {
        walk(&schema["items"], &format!("{path}[]"), leaves);
        branched = true;
    }
    for alt in ["anyOf", "oneOf", "allOf"] {
        for branch in schema[alt].as_array().into_iter().flatten() {
            if branch["properties"].is_object() || branch["items"].is_object() {
                walk(branch, path, leaves);
                branched = true;
            }
        }
    }
    if !branched && !path.is_empty() {
        leaves.push(path.to_string());
    }
}

fn crd_json<K: CustomResourceExt>() -> Value {
    serde_json::to_value(K::crd()).unwrap()
}

#[test]
fn every_field_of_every_spec_is_sorted_into_borrowed_or_not() {
    for (kind, crd) in [
        (Kind::AgentRun, crd_json::<AgentRun>()),
        (Kind::AgentThread, crd_json::<AgentThread>()),
    ] {
        let leaves = schema_leaves(crd);
        assert!(leaves.len() > 40, "{kind:?}: only {leaves:?}");
        let unsorted: Vec<&String> = leaves.iter().filter(|l| !is_sorted(kind, l)).collect();
        assert!(
            unsorted.is_empty(),
            "{kind:?}: these fields are neither in BORROWED (src/webhook/borrow.rs) nor in \
             NOT_BORROWED; does each reach a pod or a request on someone's behalf? {unsorted:?}"
        );
    }
}

#[test]
fn every_row_names_a_field_that_exists() {
    let run = schema_leaves(crd_json::<AgentRun>());
    let thread = schema_leaves(crd_json::<AgentThread>());
    let exists = |kind: Kind, path: &str| {
        let leaves = if kind == Kind::AgentRun {
            &run
        } else {
            &thread
        };
        leaves.iter().any(|l| {
            l == path || l.starts_with(&format!("{path}.")) || l.starts_with(&format!("{path}["))
        })
    };
    for row in BORROWED {
        for kind in row.on {
            assert!(exists(*kind, row.path), "{kind:?} has no {}", row.path);
        }
    }
    for (path, _) in NOT_BORROWED {
        assert!(
            exists(Kind::AgentRun, path) || exists(Kind::AgentThread, path),
            "no spec has {path}"
        );
    }
}

#[test]
fn the_walk_finds_what_a_new_field_would_be() {
    let schema = json!({"spec": {"versions": [{"schema": {"openAPIV3Schema": {"properties": {
    "spec": {"properties": {
        "agent": {"properties": {"model": {"properties": {"endpoint": {"type": "string"}}}}},
        "worker": {"properties": {"hostPath": {"type": "string"}}},
        "tools": {"items": {"properties": {"url": {"type": "string"}}}}
    }}}}}}]}});
    let leaves = schema_leaves(schema);
    assert_eq!(
        leaves,
        ["agent.model.endpoint", "tools[].url", "worker.hostPath"]
    );
    assert!(is_sorted(Kind::AgentRun, "agent.model.endpoint"));
    assert!(
        !is_sorted(Kind::AgentRun, "worker.hostPath"),
        "a new pod field"
    );
    assert!(!is_sorted(Kind::AgentRun, "tools[].url"));
    assert!(!is_sorted(Kind::AgentThread, "workspace"), "runs only");
}

fn spec_with(agent: Value, worker: Value) -> Value {
    json!({"input": "hi", "agent": agent, "worker": worker})
}

fn keyed_model(endpoint: &str) -> Value {
    json!({"model": {"provider": "openai", "endpoint": endpoint,
                     "apiKeySecretRef": {"name": "model-key", "key": "k"}}})
}

fn asked(asks: &[Ask]) -> Vec<(String, &'static str, Option<String>)> {
    asks.iter()
        .map(|a| (a.field.clone(), a.resource, a.name.clone()))
        .collect()
}

#[test]
fn repointing_an_endpoint_asks_for_the_secret_it_would_receive() {
    let old = spec_with(keyed_model("https://models.example"), json!({}));
    let new = spec_with(keyed_model("https://attacker.example"), json!({}));
    assert_eq!(
        asked(&asks(Kind::AgentThread, Some(&old), &new)),
        [(
            "spec.agent.model.apiKeySecretRef.name".to_string(),
            "secrets",
            Some("model-key".to_string())
        )]
    );
    assert_eq!(asks(Kind::AgentThread, Some(&old), &old), vec![]);
}

#[test]
fn pod_fields_claims_and_mcp_secrets_are_asked_when_set_or_changed() {
    let agent = json!({"model": {"provider": "scripted"}, "tools": [
        {"name": "a", "kind": "shell"},
        {"name": "b", "kind": "mcp", "mcp": {"url": "http://m", "headersFromSecret": "h"}}]});
    let worker = json!({"nodeSelector": {"pool": "gpu"}, "resources": {"limits": {"cpu": "8"}}});
    let mut new = spec_with(agent, worker);
    new["workspace"] = json!({"size": "1Gi"});
    assert_eq!(
        asked(&asks(Kind::AgentRun, None, &new)),
        [
            (
                "spec.agent.tools[1].mcp.headersFromSecret".into(),
                "secrets",
                Some("h".into())
            ),
            ("spec.worker.nodeSelector".into(), "pods", None),
            ("spec.worker.resources".into(), "pods", None),
            ("spec.workspace".into(), "persistentvolumeclaims", None),
        ]
    );
    let mut moved = new.clone();
    moved["worker"]["nodeSelector"] = json!({"pool": "cpu"});
    assert_eq!(
        asked(&asks(Kind::AgentRun, Some(&new), &moved)),
        [("spec.worker.nodeSelector".into(), "pods", None)]
    );
    assert_eq!(
        asked(&asks(Kind::AgentThread, None, &new)),
        asked(&asks(Kind::AgentRun, None, &new))[..3],
        "a thread has no workspace row"
    );
}
