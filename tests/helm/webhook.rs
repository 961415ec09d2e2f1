//! The chart's admission webhook, rendered: served by every controller replica behind its
//! Service, with its certificate from the controller or from cert-manager.

use baton_testkit::helm::{named, of_kind, one, render};
use serde_json::json;

#[test]
fn the_webhook_is_served_by_every_replica_behind_a_service() {
    let objects = render(json!({}), &[]).unwrap();
    let svc = named(&objects, "Service", "baton-webhook");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    let deploy = named(&objects, "Deployment", "baton-controller");
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert!(
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "webhook" && p["containerPort"] == 9443)
    );
    let args = c["args"].to_string();
    for want in [
        "--webhook-addr=0.0.0.0:9443",
        "--webhook-hosts=baton-webhook.baton-system.svc,",
        "--webhook-configuration=baton",
        "--controller-user=system:serviceaccount:baton-system:baton",
    ] {
        assert!(args.contains(want), "missing {want} in {args}");
    }
    let config = one(&objects, "ValidatingWebhookConfiguration");
    let hooks = config["webhooks"].as_array().unwrap();
    let resources: Vec<&str> = hooks
        .iter()
        .map(|h| h["rules"][0]["resources"][0].as_str().unwrap())
        .collect();
    assert_eq!(
        resources,
        ["agentruns", "agentthreads", "ledgersegments", "leases"]
    );
    for hook in hooks {
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(
            hook["clientConfig"]["service"],
            json!({"name": "baton-webhook", "namespace": "baton-system", "path": baton::webhook::PATH, "port": 443})
        );
        assert!(
            hook["clientConfig"].get("caBundle").is_none(),
            "the controller keeps the caBundle"
        );
    }
    assert_eq!(
        hooks[3]["objectSelector"]["matchLabels"][baton::crd::MANAGED_BY_LABEL],
        "baton"
    );
    // The mutating half: it stamps a new turn with its thread's generation.
    let mutating = one(&objects, "MutatingWebhookConfiguration");
    let stamp = &mutating["webhooks"][0];
    assert_eq!(stamp["rules"][0]["resources"], json!(["agentruns"]));
    assert_eq!(stamp["rules"][0]["operations"], json!(["CREATE"]));
    assert_eq!(stamp["failurePolicy"], "Fail");
    assert_eq!(
        stamp["clientConfig"]["service"]["path"],
        baton::webhook::MUTATE_PATH
    );
    let role = named(&objects, "ClusterRole", "baton-webhook");
    assert_eq!(
        role["rules"][0]["resources"],
        json!(["subjectaccessreviews"])
    );
    assert_eq!(role["rules"][1]["resourceNames"], json!(["baton"]));
    assert_eq!(
        role["rules"][1]["resources"],
        json!([
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations"
        ])
    );
    let secrets = named(&objects, "Role", "baton-webhook");
    assert_eq!(
        secrets["rules"][1]["resourceNames"],
        json!(["baton-webhook-tls"])
    );

    let off = render(json!({"webhook": {"enabled": false}}), &[]).unwrap();
    assert!(of_kind(&off, "ValidatingWebhookConfiguration").is_empty());
    assert!(of_kind(&off, "MutatingWebhookConfiguration").is_empty());
    assert!(
        !named(&off, "Deployment", "baton-controller")
            .to_string()
            .contains("--webhook")
    );
}

/// With cert-manager, the certificate is cert-manager's (into the same Secret, its CA injected
/// into the caBundle) and the controller only reads the Secret: it may no longer write the
/// Secret or the configuration.
#[test]
fn with_cert_manager_the_controller_only_serves_its_certificate() {
    let objects = render(json!({"webhook": {"certManager": {"enabled": true}}}), &[]).unwrap();
    let serving = named(&objects, "Certificate", "baton-webhook");
    assert_eq!(serving["spec"]["secretName"], "baton-webhook-tls");
    assert_eq!(
        serving["spec"]["dnsNames"],
        json!([
            "baton-webhook.baton-system.svc",
            "baton-webhook.baton-system.svc.cluster.local"
        ])
    );
    assert_eq!(serving["spec"]["duration"], "8760h");
    assert_eq!(serving["spec"]["renewBefore"], "2920h");
    assert_eq!(
        serving["spec"]["issuerRef"],
        json!({"name": "baton-webhook-ca", "kind": "Issuer"})
    );
    assert_eq!(
        named(&objects, "Certificate", "baton-webhook-ca")["spec"]["isCA"],
        true
    );
    assert_eq!(of_kind(&objects, "Issuer").len(), 2);
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let config = one(&objects, kind);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "baton-system/baton-webhook"
        );
    }
    let args =
        named(&objects, "Deployment", "baton-controller")["spec"]["template"]["spec"]["containers"]
            [0]["args"]
            .to_string();
    assert!(args.contains("--webhook-cert-issuer=external"), "{args}");
    assert!(!args.contains("--webhook-configuration"), "{args}");
    let role = named(&objects, "ClusterRole", "baton-webhook");
    assert_eq!(role["rules"].as_array().unwrap().len(), 1, "{role}");
    let secrets = named(&objects, "Role", "baton-webhook");
    assert_eq!(
        secrets["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"],
                "resourceNames": ["baton-webhook-tls"], "verbs": ["get"]}])
    );

    let theirs = json!({"webhook": {"certManager": {"enabled": true,
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}});
    let objects = render(theirs, &[]).unwrap();
    assert!(of_kind(&objects, "Issuer").is_empty());
    assert_eq!(
        named(&objects, "Certificate", "baton-webhook")["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer"})
    );
    let nameless = json!({"webhook": {"certManager": {"enabled": true,
        "issuerRef": {"kind": "ClusterIssuer"}}}});
    let err = render(nameless, &[]).unwrap_err();
    assert!(err.contains("issuerRef"), "{err}");
}

const A_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";

#[test]
fn with_a_client_ca_the_webhook_reads_only_the_api_server() {
    let plain = render(json!({}), &[]).unwrap();
    assert!(of_kind(&plain, "ConfigMap").is_empty());
    let deploy = named(&plain, "Deployment", "baton-controller");
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(!args.contains("--webhook-client-ca-file"), "{args}");

    let objects = render(json!({"webhook": {"clientCA": A_CA}}), &[]).unwrap();
    let ca = named(&objects, "ConfigMap", "baton-webhook-client-ca");
    assert_eq!(ca["data"]["ca.crt"].as_str().unwrap().trim(), A_CA);
    let pod = &named(&objects, "Deployment", "baton-controller")["spec"]["template"];
    let c = &pod["spec"]["containers"][0];
    assert!(
        c["args"]
            .to_string()
            .contains("--webhook-client-ca-file=/etc/baton/webhook-client-ca/ca.crt")
    );
    assert!(
        c["volumeMounts"]
            .to_string()
            .contains("/etc/baton/webhook-client-ca")
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["configMap"]["name"],
        "baton-webhook-client-ca"
    );
    assert!(
        pod["metadata"]["annotations"]["baton.dev/webhook-client-ca"].is_string(),
        "a new CA rolls the replicas"
    );
    let err = render(json!({"webhook": {"clientCA": "not a certificate"}}), &[]).unwrap_err();
    assert!(err.contains("clientCA"), "{err}");
}

#[test]
fn network_policies_admit_each_port_only_its_peers() {
    let plain = render(json!({}), &[]).unwrap();
    assert!(
        of_kind(&plain, "NetworkPolicy").is_empty(),
        "off by default"
    );
    let api_server = json!([{"ipBlock": {"cidr": "10.0.0.10/32"}}]);
    let monitoring = json!([{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]);
    let values = json!({"networkPolicy": {
        "enabled": true, "apiServer": api_server, "metrics": monitoring,
    }});
    let objects = render(values, &[]).unwrap();
    let controller = named(&objects, "NetworkPolicy", "baton-controller");
    let deploy = named(&objects, "Deployment", "baton-controller");
    assert_eq!(
        controller["spec"]["podSelector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    let ingress = controller["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress[0]["ports"][0]["port"], "webhook");
    assert_eq!(ingress[0]["from"], api_server);
    assert_eq!(ingress[1]["ports"][0]["port"], "admin");
    assert_eq!(ingress[1]["from"], monitoring);
    assert_eq!(
        ingress.len(),
        2,
        "no other port of the controller is admitted"
    );
    let server = named(&objects, "NetworkPolicy", "baton-server");
    let servers = named(&objects, "Deployment", "baton-server");
    assert_eq!(
        server["spec"]["podSelector"]["matchLabels"],
        servers["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(server["spec"]["ingress"][0]["ports"][0]["port"], "http");
    assert!(
        server["spec"]["ingress"][0].get("from").is_none(),
        "any client by default"
    );
}
