//! The chart's `baton server`: two replicas behind a Service, probes, its own selector (never
//! taken in by the controller's Services or PDB), and a ServiceAccount bound to nothing.

use serde_json::json;

use crate::helm_support::*;

#[test]
fn the_server_runs_two_replicas_behind_a_service_and_is_bound_to_no_role() {
    let objects = render(json!({}), &[]).unwrap();
    let deploy = named(&objects, "Deployment", "baton-server");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "baton-server");
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0], "server");
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/livez", "port": "http"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "http"})
    );
    let selector = &deploy["spec"]["selector"]["matchLabels"];
    assert_eq!(selector["app.kubernetes.io/component"], "server");
    let svc = named(&objects, "Service", "baton-server");
    assert_eq!(&svc["spec"]["selector"], selector);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
    let pdb = named(&objects, "PodDisruptionBudget", "baton-server");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector);

    // No selector of the controller's takes a server pod in (its webhook Service included).
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for kind in ["Service", "PodDisruptionBudget", "Deployment"] {
        for object in of_kind(&objects, kind) {
            if object["metadata"]["name"] == "baton-server" {
                continue;
            }
            let wanted = if kind == "Service" {
                &object["spec"]["selector"]
            } else {
                &object["spec"]["selector"]["matchLabels"]
            };
            let takes_it = wanted
                .as_object()
                .is_some_and(|w| w.iter().all(|(k, v)| labels[k] == *v));
            assert!(
                !takes_it,
                "{kind} {} selects server pods",
                object["metadata"]["name"]
            );
        }
    }

    // Bound to nothing: the server acts with each caller's credential, never its own.
    for kind in ["RoleBinding", "ClusterRoleBinding"] {
        for binding in of_kind(&objects, kind) {
            let subjects = binding["subjects"].as_array().cloned().unwrap_or_default();
            assert!(
                subjects.iter().all(|s| s["name"] != "baton-server"),
                "{kind} {} binds the server",
                binding["metadata"]["name"]
            );
        }
    }

    // The flags the chart passes are flags `baton server` accepts.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["server", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in c["args"].as_array().unwrap().iter().skip(1) {
        let flag = arg.as_str().unwrap().split('=').next().unwrap();
        assert!(help.contains(flag), "`baton server` has no {flag}");
    }

    let off = render(json!({"server": {"enabled": false}}), &[]).unwrap();
    assert!(
        of_kind(&off, "Deployment")
            .iter()
            .all(|d| d["metadata"]["name"] != "baton-server")
    );
}

#[test]
fn behind_a_proxy_only_the_proxys_identity_may_impersonate() {
    let values = json!({"server": {"proxyAuth": {
        "userHeader": "X-Remote-User",
        "groupsHeader": "X-Remote-Group",
        "impersonator": {"name": "oauth2-proxy", "namespace": "auth"},
    }}});
    let objects = render(values, &[]).unwrap();
    let deploy = named(&objects, "Deployment", "baton-server");
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--proxy-user-header=X-Remote-User"), "{args}");
    assert!(
        args.contains("--proxy-groups-header=X-Remote-Group"),
        "{args}"
    );
    let role = named(&objects, "ClusterRole", "baton-server-proxy");
    assert_eq!(role["rules"][0]["verbs"], json!(["impersonate"]));
    let binding = named(&objects, "ClusterRoleBinding", "baton-server-proxy");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "oauth2-proxy", "namespace": "auth"})
    );
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["server", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--proxy-user-header") && help.contains("--proxy-groups-header"));
    // Off by default: no header is read, nobody is granted anything.
    let plain = render(json!({}), &[]).unwrap();
    assert!(
        of_kind(&plain, "ClusterRole")
            .iter()
            .all(|r| r["metadata"]["name"] != "baton-server-proxy")
    );
    assert!(
        !named(&plain, "Deployment", "baton-server")
            .to_string()
            .contains("--proxy-")
    );
}
