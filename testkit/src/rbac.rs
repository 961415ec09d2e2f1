//! Shared by the RBAC, chart and trust tests: mint ServiceAccount tokens (TokenRequest), build
//! a client that uses one, ask the API server `kubectl auth can-i --as=...`, and the segment a
//! hostile worker identity forges.

use baton::fence::Fence;
use std::process::Command;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::config::AuthInfo;
use kube::{Api, Client, Config};

/// A token for `namespace/sa`, valid for an hour, from the TokenRequest API.
pub async fn mint_token(client: &Client, namespace: &str, sa: &str) -> String {
    request_token(client, namespace, sa, vec![], None).await
}

/// A token for `namespace/sa` issued for `audience`, bound to `pod` (name, UID) when given,
/// as the kubelet projects one into a pod's volume.
pub async fn mint_token_for(
    client: &Client,
    namespace: &str,
    sa: &str,
    audience: &str,
    pod: Option<(&str, &str)>,
) -> String {
    use k8s_openapi::api::authentication::v1::BoundObjectReference;
    let bound = pod.map(|(name, uid)| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
    });
    request_token(client, namespace, sa, vec![audience.to_string()], bound).await
}

/// The TokenRequest API's token for `namespace/sa`, valid for an hour.
async fn request_token(
    client: &Client,
    namespace: &str,
    sa: &str,
    audiences: Vec<String>,
    bound_object_ref: Option<k8s_openapi::api::authentication::v1::BoundObjectReference>,
) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences,
            expiration_seconds: Some(3600),
            bound_object_ref,
        },
        ..Default::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let minted = api
        .create_token_request(sa, &Default::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{sa}: {e}"));
    minted.status.expect("a minted token").token
}

/// A client for the same API server that authenticates with `token` only.
pub async fn client_with_token(token: &str) -> Client {
    let mut config = Config::infer().await.expect("kubeconfig");
    config.auth_info = serde_json::from_value::<AuthInfo>(serde_json::json!({ "token": token }))
        .expect("an AuthInfo with a token");
    Client::try_from(config).expect("a client with the token")
}

/// `kubectl auth can-i VERB RESOURCE[/NAME] [--subresource=SUB] -n NS --as=USER`.
pub fn can_i(
    namespace: &str,
    user: &str,
    verb: &str,
    resource: &str,
    subresource: Option<&str>,
) -> bool {
    let mut cmd = Command::new("kubectl");
    cmd.args([
        "auth",
        "can-i",
        verb,
        resource,
        "-n",
        namespace,
        &format!("--as={user}"),
    ]);
    if let Some(sub) = subresource {
        cmd.arg(format!("--subresource={sub}"));
    }
    let out = cmd.output().expect("running kubectl (it must be on PATH)");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        _ => panic!(
            "kubectl auth can-i {verb} {resource} -n {namespace} --as={user}: {answer:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// One `can-i` question and the answer expected.
pub struct Check<'a> {
    pub verb: &'a str,
    pub resource: String,
    pub subresource: Option<&'a str>,
    pub namespace: String,
    pub allowed: bool,
}

/// Asks every question and fails listing every wrong answer at once.
pub fn assert_checks(user: &str, checks: &[Check]) {
    let wrong: Vec<String> = checks
        .iter()
        .filter(|c| can_i(&c.namespace, user, c.verb, &c.resource, c.subresource) != c.allowed)
        .map(|c| {
            let sub = c
                .subresource
                .map(|s| format!(" (subresource {s})"))
                .unwrap_or_default();
            let want = if c.allowed { "allowed" } else { "refused" };
            format!(
                "{} {}{sub} in {}: expected {want}",
                c.verb, c.resource, c.namespace
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "RBAC for {user} is wrong:\n  {}",
        wrong.join("\n  ")
    );
}

/// Shorthand for a check.
pub fn check<'a>(
    namespace: &str,
    verb: &'a str,
    resource: &str,
    subresource: Option<&'a str>,
    allowed: bool,
) -> Check<'a> {
    Check {
        verb,
        resource: resource.to_string(),
        subresource,
        namespace: namespace.to_string(),
        allowed,
    }
}

/// Gives user `user` a Role of `rules` in `namespace` (a Role and a RoleBinding named `user`):
/// a person with exactly these rights, to impersonate (`kubectl --as=user`).
pub async fn grant_user(client: &Client, namespace: &str, user: &str, rules: Vec<PolicyRule>) {
    let subject = Subject {
        kind: "User".into(),
        name: user.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Subject::default()
    };
    bind_role(client, namespace, user, rules, subject).await;
}

/// A ServiceAccount `name` in `namespace` with a Role of `rules` (Role and RoleBinding named
/// like it): a person who signs in with a token; that token.
pub async fn person(
    client: &Client,
    namespace: &str,
    name: &str,
    rules: Vec<PolicyRule>,
) -> String {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
        .unwrap_or_else(|e| panic!("creating ServiceAccount {namespace}/{name}: {e}"));
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
        ..Subject::default()
    };
    bind_role(client, namespace, name, rules, subject).await;
    mint_token(client, namespace, name).await
}

/// A rule on baton's resources.
pub fn rule(resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec!["baton.dev".into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..PolicyRule::default()
    }
}

/// A Role `name` of `rules` in `namespace`, bound to `subject`.
async fn bind_role(
    client: &Client,
    namespace: &str,
    name: &str,
    rules: Vec<PolicyRule>,
    subject: Subject,
) {
    let meta = || ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta(),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: meta(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![subject]),
    };
    let params = PostParams::default();
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&params, &role)
        .await
        .unwrap_or_else(|e| panic!("creating Role {namespace}/{name}: {e}"));
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&params, &binding)
        .await
        .unwrap_or_else(|e| panic!("creating RoleBinding {namespace}/{name}: {e}"));
}

/// Run `run`'s worker identity: a client with its ServiceAccount's own token.
pub async fn worker_client(client: &Client, namespace: &str, run: &str) -> Client {
    let sa = baton::rbac::worker_service_account_name(run);
    client_with_token(&mint_token(client, namespace, &sa).await).await
}

/// A segment named for run `name` (position 1, fence 1) that claims to be `victim`'s by its
/// UID label, carrying `events`: what another run's worker identity may create where no
/// webhook checks who writes.
pub fn forged_segment(
    name: &str,
    victim: &baton::crd::v1alpha1::AgentRun,
    events: Vec<baton::crd::v1alpha1::LedgerEvent>,
) -> baton::crd::v1alpha1::LedgerSegment {
    use baton::crd::{MANAGED_BY_LABEL, RUN_LABEL, RUN_UID_LABEL};
    use kube::ResourceExt;
    let labels = std::collections::BTreeMap::from([
        (RUN_LABEL.to_string(), name.to_string()),
        (RUN_UID_LABEL.to_string(), victim.uid().unwrap()),
        (MANAGED_BY_LABEL.to_string(), "baton".to_string()),
    ]);
    baton::crd::v1alpha1::LedgerSegment {
        metadata: ObjectMeta {
            name: Some(baton::fence::segment_name(name, 1)),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: baton::crd::v1alpha1::LedgerSegmentSpec {
            run: name.into(),
            seq: 1,
            fence: Fence::new(1),
            format: baton::crd::v1alpha1::LEDGER_FORMAT_VERSION,
            events,
        },
    }
}
