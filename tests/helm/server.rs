//! The chart's `baton server`: two replicas behind a Service, probes, its own selector (never
//! taken in by the controller's Services or PDB), and a ServiceAccount bound to nothing.

use serde_json::json;

use baton_testkit::helm::*;

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
        json!({"path": "/livez", "port": "http", "scheme": "HTTP"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "http", "scheme": "HTTP"})
    );
    // Every replica seals the console's sessions under one key, from the chart's Secret.
    let session = named(&objects, "Secret", "baton-console-session");
    let key = session["data"]["key"].as_str().unwrap();
    assert!(key.len() >= 64, "{key}");
    assert!(
        c["args"]
            .to_string()
            .contains("--console-session-key-file=/etc/baton/console-session/key")
    );
    assert_eq!(
        pod["volumes"][0],
        json!({"name": "console-session", "secret": {"secretName": "baton-console-session"}})
    );
    let secure = render(json!({"server": {"consoleSecureCookies": true}}), &[]).unwrap();
    let args = named(&secure, "Deployment", "baton-server")["spec"]["template"]["spec"]
        ["containers"][0]["args"]
        .to_string();
    assert!(args.contains("--console-secure-cookies"), "{args}");
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
    assert_flags_taken("server", &c["args"]);

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
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]}]),
        "users only: no group, system:masters included"
    );
    let listed = json!({"server": {"proxyAuth": {
        "userHeader": "X-Remote-User",
        "impersonator": {"name": "oauth2-proxy", "namespace": "auth", "groups": ["team-a"]},
    }}});
    let objects_listed = render(listed, &[]).unwrap();
    let role = named(&objects_listed, "ClusterRole", "baton-server-proxy");
    assert_eq!(
        role["rules"][1],
        json!({"apiGroups": [""], "resources": ["groups"], "resourceNames": ["team-a"],
               "verbs": ["impersonate"]})
    );
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

/// The values that keep new runs' ledgers in PostgreSQL.
fn in_postgres() -> serde_json::Value {
    json!({"ledger": {"backend": "PostgreSQL", "postgres": {"urlSecret": {"name": "baton-db"}}}})
}

#[test]
fn a_postgresql_ledger_gives_its_credential_to_the_server_alone_and_reviews_to_it() {
    let objects = render(in_postgres(), &[]).unwrap();
    let server = named(&objects, "Deployment", "baton-server");
    let c = &server["spec"]["template"]["spec"]["containers"][0];
    let url = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "BATON_LEDGER_POSTGRES_URL")
        .expect("the server is given the database URL");
    assert_eq!(
        url["valueFrom"]["secretKeyRef"],
        json!({"name": "baton-db", "key": "url"})
    );
    let args = c["args"].to_string();
    assert!(
        args.contains("--controller-user=system:serviceaccount:baton-system:baton"),
        "{args}"
    );
    // Its own identity may review tokens and access, and read runs: nothing else.
    let role = named(&objects, "ClusterRole", "baton-server-ledger");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            {"apiGroups": ["baton.dev"], "resources": ["agentruns"], "verbs": ["get"]},
        ])
    );
    let binding = named(&objects, "ClusterRoleBinding", "baton-server-ledger");
    assert_eq!(binding["subjects"][0]["name"], "baton-server");

    // The controller writes through the server with a token for ledgers, never the database.
    let controller = named(&objects, "Deployment", "baton-controller");
    let pod = &controller["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("--ledger-server=http://baton-server.baton-system.svc:80"),
        "{args}"
    );
    assert!(args.contains("--new-runs-ledger=PostgreSQL"), "{args}");
    let token = &pod["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(token["audience"], "baton.dev/ledger");
    assert_eq!(
        pod["containers"][0]["volumeMounts"][0]["mountPath"],
        "/var/run/secrets/baton.dev/ledger"
    );
    for (_, object) in &objects {
        let text = object.to_string();
        if text.contains("baton-db") {
            assert_eq!(object["metadata"]["name"], "baton-server", "{text}");
        }
    }
    // Every flag the chart passes is one the binaries take.
    assert_flags_taken("controller", &pod["containers"][0]["args"]);
    assert_flags_taken("server", &c["args"]);
}

#[test]
fn a_postgresql_ca_goes_to_the_server_alone_and_a_server_url_to_the_controller() {
    let mut values = in_postgres();
    values["ledger"]["postgres"]["caSecret"] = json!({"name": "baton-db-ca"});
    values["ledger"]["serverURL"] = json!("http://10.96.0.20:80");
    let objects = render(values, &[]).unwrap();
    let server = named(&objects, "Deployment", "baton-server");
    let pod = &server["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args = c["args"].to_string();
    assert!(
        args.contains("--ledger-postgres-ca-file=/etc/baton/ledger-postgres-ca/ca.crt"),
        "{args}"
    );
    assert_eq!(
        c["volumeMounts"][1]["mountPath"],
        "/etc/baton/ledger-postgres-ca"
    );
    assert_eq!(pod["volumes"][1]["secret"]["secretName"], "baton-db-ca");
    for (_, object) in &objects {
        let text = object.to_string();
        if text.contains("baton-db-ca") {
            assert_eq!(object["metadata"]["name"], "baton-server", "{text}");
        }
    }
    let controller = named(&objects, "Deployment", "baton-controller");
    let args = controller["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--ledger-server=http://10.96.0.20:80"),
        "{args}"
    );
    // A server URL with a path, or not HTTP, is refused.
    let mut bad = in_postgres();
    bad["ledger"]["serverURL"] = json!("baton-server:80/x");
    assert!(render(bad, &[]).is_err());
}

#[test]
fn a_postgresql_ledger_needs_its_secret_and_the_server() {
    let no_secret = json!({"ledger": {"backend": "PostgreSQL"}});
    assert!(render(no_secret, &[]).is_err());
    let mut no_server = in_postgres();
    no_server["server"] = json!({"enabled": false});
    let err = render(no_server, &[]).unwrap_err();
    assert!(err.contains("server.enabled"), "{err}");
    // By default no credential, no review right, no ledger flag anywhere.
    let plain = render(json!({}), &[]).unwrap();
    for (_, object) in &plain {
        let text = object.to_string();
        assert!(!text.contains("BATON_LEDGER_POSTGRES_URL"), "{text}");
        assert!(!text.contains("--ledger-server"), "{text}");
        assert!(!text.contains("tokenreviews"), "{text}");
    }
}

#[test]
fn a_tls_secret_gives_the_server_its_key_and_the_controller_its_ca_alone() {
    let mut values = in_postgres();
    values["server"]["tls"] = json!({"secretName": "baton-server-tls"});
    let objects = render(values, &[]).unwrap();
    let server = named(&objects, "Deployment", "baton-server");
    let pod = &server["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_flags_taken("server", &c["args"]);
    let args = c["args"].to_string();
    for flag in [
        "--tls-cert-file=/etc/baton/server-tls/tls.crt",
        "--tls-key-file=/etc/baton/server-tls/tls.key",
    ] {
        assert!(args.contains(flag), "{args}");
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(c["livenessProbe"]["httpGet"]["scheme"], "HTTPS");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "baton-server-tls")
        .expect("the server mounts its Secret");
    let keys: Vec<&str> = volume["secret"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["tls.crt", "tls.key"]);

    // The controller gets the CA alone, reaches the server by https, and gives the CA on.
    let controller = named(&objects, "Deployment", "baton-controller");
    let pod = &controller["spec"]["template"]["spec"];
    assert_flags_taken("controller", &pod["containers"][0]["args"]);
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("--ledger-server=https://baton-server.baton-system.svc:80"),
        "{args}"
    );
    assert!(
        args.contains("--ledger-server-ca-file=/etc/baton/ledger-server-ca/ca.crt"),
        "{args}"
    );
    let ca = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "baton-server-tls")
        .expect("the controller mounts the CA");
    assert_eq!(
        ca["secret"]["items"],
        json!([{"key": "ca.crt", "path": "ca.crt"}])
    );

    // Without it: plain HTTP, and no flag the binary would not take.
    let plain = render(in_postgres(), &[]).unwrap();
    let server = named(&plain, "Deployment", "baton-server");
    let c = &server["spec"]["template"]["spec"]["containers"][0];
    assert!(!c["args"].to_string().contains("--tls-cert-file"));
    assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTP");
}

/// Every flag in `args` (after the subcommand) is one `baton COMMAND --help` lists.
fn assert_flags_taken(command: &str, args: &serde_json::Value) {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args([command, "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in args.as_array().unwrap().iter().skip(1) {
        let flag = arg.as_str().unwrap().split('=').next().unwrap();
        assert!(help.contains(flag), "`baton {command}` has no {flag}");
    }
}

#[test]
fn the_way_back_from_postgresql_keeps_the_database_for_the_runs_kept_there() {
    let mut values = in_postgres();
    values["ledger"]["newRuns"] = json!("LedgerSegments");
    let objects = render(values, &[]).unwrap();
    let controller = named(&objects, "Deployment", "baton-controller");
    let args = controller["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--new-runs-ledger=LedgerSegments"), "{args}");
    assert!(
        args.contains("--ledger-server="),
        "seals still go to the server: {args}"
    );
    let server = named(&objects, "Deployment", "baton-server");
    let env = server["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains("BATON_LEDGER_POSTGRES_URL"), "{env}");
    // Unset, new runs follow the backend; PostgreSQL without the database is refused.
    let args = named(
        &render(in_postgres(), &[]).unwrap(),
        "Deployment",
        "baton-controller",
    )["spec"]["template"]["spec"]["containers"][0]["args"]
        .to_string();
    assert!(args.contains("--new-runs-ledger=PostgreSQL"), "{args}");
    let stray = json!({"ledger": {"newRuns": "PostgreSQL"}});
    let refused = render(stray, &[]).unwrap_err();
    assert!(
        refused.contains("ledger.newRuns PostgreSQL needs"),
        "{refused}"
    );
}
