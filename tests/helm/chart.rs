//! The Helm chart, linted and rendered with Helm's own SDK (PyPI's helm-python-sdk, driven by
//! hack/helm.py): restricted pods, exactly the controller's RBAC, the admission policy
//! render-checked for Kubernetes >= 1.30, values validated by the schema, CRDs in sync.

use baton::fence::Fence;
use std::collections::{BTreeMap, BTreeSet};

use baton_testkit::helm::{CHART, helm, named, of_kind, one, render, yaml_docs};
use kube::ResourceExt;
use serde_json::{Value, json};

const VAP: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

/// Values a CI or production install might use: one namespace, ServiceMonitor, overrides.
fn ci_values() -> Value {
    json!({
        "replicaCount": 3,
        "image": {"repository": "registry.example/baton", "tag": "1.2.3"},
        "workerImage": "registry.example/baton-worker:1.2.3",
        "controller": {"watchNamespace": "agents", "rolloutPolicy": "keep", "maxConcurrentHandoffs": 4},
        "metrics": {
            "serviceMonitor": {"enabled": true, "labels": {"release": "prom"}},
            "podMonitor": {"enabled": true, "labels": {"release": "prom"}}
        },
        "admissionPolicy": {"enabled": true}
    })
}

#[test]
fn the_chart_lints_clean_with_default_and_ci_values() {
    for values in [json!({}), ci_values()] {
        let report = match helm(&["lint", CHART, "--values", &values.to_string()]) {
            Ok(report) => report,
            Err(err) => panic!("helm lint failed with values {values}:\n{err}"),
        };
        assert_eq!(report["total_charts_linted"], 1, "{report}");
        let problems: Vec<&Value> = report["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["severity"].as_i64().unwrap_or(0) >= 2)
            .collect();
        assert!(problems.is_empty(), "lint warnings or errors: {problems:?}");
    }
}

#[test]
fn the_controller_runs_two_replicas_with_election_probes_and_a_pdb() {
    let objects = render(json!({}), &[]).unwrap();
    let deploy = named(&objects, "Deployment", "baton-controller");
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(
        deploy["spec"]["minReadySeconds"], 5,
        "the webhook reaches the API server first"
    );
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "baton");
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "controller");
    for want in [
        "--leader-election=true",
        "--admin-addr=0.0.0.0:8080",
        "--rollout-policy=handoff",
    ] {
        assert!(args.contains(&want), "missing {want} in {args:?}");
    }
    // The chart's default is the controller's own.
    let concurrency = format!("--concurrency={}", baton::controller::DEFAULT_CONCURRENCY);
    assert!(args.contains(&concurrency.as_str()), "{args:?}");
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/livez", "port": "admin"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "admin"})
    );
    assert_eq!(
        c["ports"][0],
        json!({"name": "admin", "containerPort": 8080, "protocol": "TCP"})
    );
    let env: BTreeSet<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        env.contains("POD_NAMESPACE") && env.contains("POD_NAME"),
        "{env:?}"
    );
    let pdb = named(&objects, "PodDisruptionBudget", "baton-controller");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    // baton server has its own: with ledger.backend PostgreSQL every append goes through it.
    let server_pdb = named(&objects, "PodDisruptionBudget", "baton-server");
    assert_eq!(server_pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        server_pdb["spec"]["selector"]["matchLabels"],
        named(&objects, "Deployment", "baton-server")["spec"]["selector"]["matchLabels"]
    );
    let svc = named(&objects, "Service", "baton-metrics");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "admin");
    assert!(
        of_kind(&objects, "ServiceMonitor").is_empty(),
        "ServiceMonitor is opt-in"
    );
    assert!(
        of_kind(&objects, "PodMonitor").is_empty(),
        "PodMonitor is opt-in"
    );
    // The flags the chart passes are flags `baton controller` accepts.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["controller", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in &args[1..] {
        let flag = arg.split('=').next().unwrap();
        assert!(help.contains(flag), "`baton controller` has no {flag}");
    }
}

#[test]
fn every_pod_is_restricted() {
    for values in [json!({}), ci_values()] {
        let objects = render(values, &[]).unwrap();
        for deploy in of_kind(&objects, "Deployment") {
            let pod = &deploy["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"],
                "RuntimeDefault"
            );
            for c in pod["containers"].as_array().unwrap() {
                let sc = &c["securityContext"];
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", c["name"]);
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", c["name"]);
                assert_eq!(sc["runAsNonRoot"], true, "{}", c["name"]);
                assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{}", c["name"]);
                assert_eq!(
                    sc["seccompProfile"]["type"], "RuntimeDefault",
                    "{}",
                    c["name"]
                );
            }
        }
    }
}

type Rules = BTreeMap<(String, String), BTreeSet<String>>;

fn rules_of(role: &Value) -> Rules {
    let mut rules = Rules::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none(),
            "the controller's rules are not by name"
        );
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                let verbs = rule["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string());
                rules
                    .entry((
                        group.as_str().unwrap().into(),
                        resource.as_str().unwrap().into(),
                    ))
                    .or_default()
                    .extend(verbs);
            }
        }
    }
    rules
}

#[test]
fn the_controller_gets_exactly_the_verbs_it_uses() {
    let objects = render(json!({}), &[]).unwrap();
    let role = named(&objects, "ClusterRole", "baton-controller");
    let expected: Rules = [
        ("baton.dev", "agentruns", "get list watch update delete"),
        ("baton.dev", "agentruns/status", "get update"),
        ("baton.dev", "agentthreads", "get list watch"),
        ("baton.dev", "agentthreads/status", "get update"),
        ("baton.dev", "agentruns/finalizers", "update"),
        ("baton.dev", "ledgersegments", "create get list delete"),
        (
            "coordination.k8s.io",
            "leases",
            "get list watch create update delete",
        ),
        ("", "pods", "get list watch create patch delete"),
        ("", "persistentvolumeclaims", "get create delete"),
        ("events.k8s.io", "events", "create patch"),
        ("", "serviceaccounts", "get create delete"),
        ("rbac.authorization.k8s.io", "roles", "get create delete"),
        (
            "rbac.authorization.k8s.io",
            "rolebindings",
            "get create delete",
        ),
    ]
    .into_iter()
    .map(|(g, r, v)| {
        (
            (g.into(), r.into()),
            v.split(' ').map(String::from).collect(),
        )
    })
    .collect();
    assert_eq!(rules_of(role), expected);
    let binding = named(&objects, "ClusterRoleBinding", "baton-controller");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "baton", "namespace": "baton-system"})
    );
}

#[test]
fn the_controller_holds_every_permission_it_grants_a_worker() {
    // The API server lets a subject create a Role only with permissions it holds (no
    // `escalate` needed): every worker rule must be covered by the controller's ClusterRole.
    let objects = render(json!({}), &[]).unwrap();
    let held = rules_of(named(&objects, "ClusterRole", "baton-controller"));
    for rule in baton::rbac::worker_rules("any-run") {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                let verbs = held
                    .get(&(group.clone(), resource.clone()))
                    .cloned()
                    .unwrap_or_default();
                for verb in &rule.verbs {
                    assert!(
                        verbs.contains(verb),
                        "controller lacks {verb} {group}/{resource}"
                    );
                }
            }
        }
    }
}

#[test]
fn one_namespace_mode_binds_only_there_and_in_the_release_namespace() {
    let objects = render(ci_values(), &[]).unwrap();
    // Only the webhook's, for SubjectAccessReviews: reviews come from every namespace.
    let cluster_wide: Vec<&Value> = of_kind(&objects, "ClusterRoleBinding");
    assert_eq!(cluster_wide.len(), 1);
    assert_eq!(cluster_wide[0]["metadata"]["name"], "baton-webhook");
    let namespaces: BTreeSet<&str> = of_kind(&objects, "RoleBinding")
        .iter()
        .map(|b| b["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["agents", "baton-system"]));
    let deploy = named(&objects, "Deployment", "baton-controller");
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--namespace=agents")
            && args.contains("--worker-image=registry.example/baton-worker:1.2.3"),
        "{args}"
    );
    let monitor = one(&objects, "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    // Worker pods: the port name and labels the controller gives them, in the watched namespace.
    let workers = one(&objects, "PodMonitor");
    let pod = baton::controller::pod::worker_pod(&sample_run(), Fence::new(1), "img");
    let spec = &workers["spec"];
    assert_eq!(
        spec["podMetricsEndpoints"][0]["port"],
        baton::controller::pod::METRICS_PORT_NAME
    );
    for (key, value) in spec["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            pod.labels().get(key).map(String::as_str),
            value.as_str(),
            "{key}"
        );
    }
    for expr in spec["selector"]["matchExpressions"].as_array().unwrap() {
        let key = expr["key"].as_str().unwrap();
        assert!(pod.labels().contains_key(key), "worker pods lack {key}");
    }
    assert_eq!(spec["namespaceSelector"]["matchNames"], json!(["agents"]));
}

#[test]
fn the_admission_policy_renders_for_servers_that_serve_it() {
    // `auto` (the default): only when the server has the API (not the local 1.20 server).
    let old = render(json!({}), &[]).unwrap();
    assert!(of_kind(&old, "ValidatingAdmissionPolicy").is_empty());
    let off = render(json!({"admissionPolicy": {"enabled": false}}), &[VAP]).unwrap();
    assert!(of_kind(&off, "ValidatingAdmissionPolicy").is_empty());

    let new = render(json!({}), &[VAP]).unwrap();
    let policy = one(&new, "ValidatingAdmissionPolicy");
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    let rule = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["resources"], json!(["ledgersegments"]));
    assert_eq!(rule["operations"], json!(["CREATE"]));
    // The CEL applies src/rbac's naming convention: user `system:serviceaccount:<ns>:baton-run-<run>`.
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    let prefix = format!(
        "'{}' + request.namespace + ':{}'",
        baton::rbac::SA_USERNAME_PREFIX,
        baton::rbac::WORKER_SA_PREFIX
    );
    assert!(condition.contains(&prefix), "{condition}");
    let validations = policy["spec"]["validations"].as_array().unwrap();
    assert!(
        validations[0]["expression"]
            .as_str()
            .unwrap()
            .contains(&format!("{prefix} + object.spec.run"))
    );
    assert!(
        validations[1]["expression"]
            .as_str()
            .unwrap()
            .contains("object.metadata.name.startsWith(object.spec.run + '-')")
    );
    let binding = one(&new, "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    // Offline (Helm's default capabilities) the PDB is policy/v1; a 1.20 server, which lacks
    // it, gets policy/v1beta1 (checked by tests/helm/install.rs).
    assert_eq!(
        named(&old, "PodDisruptionBudget", "baton-controller")["apiVersion"],
        "policy/v1"
    );
}

/// The first container of Deployment `name` as the chart renders it with `values`.
fn container_of(name: &str, values: Value) -> Value {
    let objects = render(values, &[]).unwrap();
    let deploy = named(&objects, "Deployment", name);
    deploy["spec"]["template"]["spec"]["containers"][0].clone()
}

/// The controller's container as the chart renders it with `values`.
fn controller_container(values: Value) -> Value {
    container_of("baton-controller", values)
}

/// The controller's arguments as the chart renders them with `values`.
fn controller_args(values: Value) -> Vec<String> {
    let container = controller_container(values);
    let args = container["args"].as_array().unwrap().iter();
    args.map(|a| a.as_str().unwrap().to_string()).collect()
}

/// The `OTEL_*` variables of Deployment `name` as the chart renders them with `values`.
fn otel_env(name: &str, values: Value) -> Vec<(String, String)> {
    let container = container_of(name, values);
    let vars = container["env"].as_array().cloned().unwrap_or_default();
    vars.iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["value"].as_str()?)))
        .filter(|(name, _)| name.starts_with("OTEL_"))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[test]
fn traces_are_off_unless_an_endpoint_is_given() {
    let off = controller_args(json!({}));
    assert!(
        !off.iter()
            .any(|a| a.contains("otlp") || a.contains("trace")),
        "{off:?}"
    );
    for deployment in ["baton-controller", "baton-server"] {
        assert_eq!(otel_env(deployment, json!({})), vec![], "{deployment}");
    }
    let values = json!({"tracing": {"endpoint": "http://c:4318", "sampling": 0.5}});
    let on = controller_args(values.clone());
    for want in [
        "--worker-otlp-endpoint=http://c:4318",
        "--worker-trace-sampling=0.5",
    ] {
        assert!(on.iter().any(|a| a == want), "missing {want} in {on:?}");
    }
    assert!(
        !on.iter().any(|a| a.contains("content")),
        "content is opted into, never on by default: {on:?}"
    );
    let content = json!({"tracing": {"endpoint": "http://c:4318", "content": true}});
    let with_content = controller_args(content);
    assert!(
        with_content.iter().any(|a| a == "--worker-trace-content"),
        "{with_content:?}"
    );
    // The controller's and the server's own spans go to the same place, sampled alike.
    let told = |n: &str, v: &str| (n.to_string(), v.to_string());
    for deployment in ["baton-controller", "baton-server"] {
        assert_eq!(
            otel_env(deployment, values.clone()),
            vec![
                told("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                told("OTEL_TRACES_SAMPLER", "traceidratio"),
                told("OTEL_TRACES_SAMPLER_ARG", "0.5"),
            ],
            "{deployment}"
        );
    }
}

#[test]
fn the_values_schema_refuses_unsafe_or_unknown_values() {
    for bad in [
        json!({"controller": {"rolloutPolicy": "yolo"}}),
        json!({"securityContext": {"allowPrivilegeEscalation": true, "readOnlyRootFilesystem": true, "capabilities": {}}}),
        json!({"podSecurityContext": {"runAsNonRoot": false}}),
        json!({"replicaCount": "two"}),
        json!({"no-such-value": 1}),
        json!({"admissionPolicy": {"enabled": "sometimes"}}),
        json!({"tracing": {"endpoint": "collector:4318"}}),
        json!({"tracing": {"endpoint": "http://c:4318", "sampling": 2}}),
        json!({"tracing": {"endpoint": "http://c:4318", "content": "yes"}}),
    ] {
        assert!(render(bad.clone(), &[]).is_err(), "values accepted: {bad}");
    }
}

#[test]
fn the_charts_crds_are_the_generated_ones_and_notes_show_a_first_run() {
    let rendered = helm(&["render", CHART]).unwrap();
    let crds = rendered["crds"].as_object().unwrap();
    for (name, yaml) in baton::crd::crd_files().unwrap() {
        let in_chart = crds
            .get(&format!("crds/{name}"))
            .unwrap_or_else(|| panic!("chart lacks crds/{name}"));
        assert_eq!(
            in_chart.as_str().unwrap(),
            yaml,
            "charts/baton/crds/{name} is stale: make generate"
        );
    }
    let notes = rendered["manifests"]["baton/templates/NOTES.txt"]
        .as_str()
        .unwrap();
    assert!(
        notes.contains("kind: AgentRun")
            && notes.contains("kubectl wait --for=jsonpath='{.status.phase}'=Succeeded"),
        "{notes}"
    );
    // The first run in NOTES.txt is a valid AgentRun.
    let manifest: String = notes
        .split("kubectl apply -f -\n")
        .nth(1)
        .and_then(|rest| rest.split("  YAML\n").next())
        .unwrap()
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    let docs = yaml_docs(&manifest);
    let run: baton::crd::v1alpha1::AgentRun =
        serde_json::from_value(docs[0].clone()).expect("NOTES' AgentRun parses");
    assert_eq!(run.spec.tools()[0].name, "sh");
}

/// A run as the API server would hand it to the controller (name, namespace, UID).
fn sample_run() -> baton::crd::v1alpha1::AgentRun {
    baton::crd::v1alpha1::AgentRun::builder("r1")
        .namespace("agents")
        .stored("u-1")
        .reply("x")
        .build()
}
