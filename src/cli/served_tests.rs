use super::*;
use serde_json::json;

fn kubeconfig(user: AuthInfo) -> kube::Config {
    let mut config = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
    config.root_cert = Some(vec![b"the cluster's CA".to_vec()]);
    config.tls_server_name = Some("kubernetes".into());
    config.auth_info = user;
    config
}

fn with_token() -> AuthInfo {
    AuthInfo {
        token: Some("a-token".to_string().into()),
        client_certificate_data: Some("a certificate".into()),
        ..AuthInfo::default()
    }
}

#[test]
fn the_server_is_sent_the_users_bearer_credential_and_nothing_of_the_api_servers() {
    let config = server_config("http://127.0.0.1:8080", None, &kubeconfig(with_token())).unwrap();
    assert_eq!(config.cluster_url, "http://127.0.0.1:8080/");
    assert!(config.auth_info.token.is_some());
    assert_eq!(config.auth_info.client_certificate_data, None);
    assert_eq!(config.root_cert, None);
    assert_eq!(config.tls_server_name, None);
}

#[test]
fn a_token_file_given_is_used_instead_of_the_kubeconfigs() {
    let file = Path::new("/run/me.token");
    let config = server_config("http://s:80", Some(file), &kubeconfig(with_token())).unwrap();
    assert!(config.auth_info.token.is_none());
    assert_eq!(
        config.auth_info.token_file.as_deref(),
        Some("/run/me.token")
    );
}

#[test]
fn a_certificate_only_or_impersonating_user_is_refused_by_name() {
    let certificate = AuthInfo {
        client_certificate_data: Some("a certificate".into()),
        ..AuthInfo::default()
    };
    let err = server_config("http://s:80", None, &kubeconfig(certificate)).unwrap_err();
    assert!(
        err.contains("no bearer token") && err.contains("--token-file"),
        "{err}"
    );
    let impersonating = AuthInfo {
        impersonate: Some("bob".into()),
        ..with_token()
    };
    let err = server_config("http://s:80", None, &kubeconfig(impersonating)).unwrap_err();
    assert!(err.contains("impersonates"), "{err}");
}

#[test]
fn a_server_that_is_no_url_is_named() {
    for bad in ["", "localhost:8080/x y", "/only/a/path"] {
        let err = server_config(bad, None, &kubeconfig(with_token())).unwrap_err();
        assert!(err.starts_with("--server "), "{bad:?}: {err}");
    }
}

fn event(run: &str, uid: &str, seq: i64) -> String {
    json!({"run": run, "uid": uid, "seq": seq, "fence": 2, "events": []}).to_string()
}

#[test]
fn the_next_segment_is_taken_with_the_runs_marks() {
    let segment = segment_of_event(&event("r", "u1", 3), "r", "u1", 2)
        .unwrap()
        .unwrap();
    assert!(crate::ledger::is_segment_of(&segment, "r", "u1"));
    assert_eq!((segment.spec.seq, segment.spec.fence.get()), (3, 2));
}

#[test]
fn a_repeat_is_dropped_and_a_gap_or_another_runs_segment_refused() {
    assert!(
        segment_of_event(&event("r", "u1", 2), "r", "u1", 2)
            .unwrap()
            .is_none()
    );
    let gap = segment_of_event(&event("r", "u1", 5), "r", "u1", 2).unwrap_err();
    assert!(gap.contains("from position 2 to 5"), "{gap}");
    let namesake = segment_of_event(&event("r", "u0", 3), "r", "u1", 2).unwrap_err();
    assert!(namesake.contains("UID u0"), "{namesake}");
    let other = segment_of_event(&event("s", "u1", 3), "r", "u1", 2).unwrap_err();
    assert!(other.contains("segment of s"), "{other}");
    let garbage = segment_of_event("{\"run\":", "r", "u1", 2).unwrap_err();
    assert!(garbage.contains("does not read"), "{garbage}");
}
