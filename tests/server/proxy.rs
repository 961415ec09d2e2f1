//! Behind an authenticating proxy: the proxy's own token plus the header naming its signed-in
//! person. The API server decides whether the proxy may impersonate that person and what the
//! person may do; baton trusts no header by itself.

use std::sync::Arc;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec};
use baton::serving::Stop::WithTheProcess;
use baton::serving::Tls::Plain;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::rbac::grant_user;
use baton_testkit::server::*;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

/// `baton server --proxy-user-header X-Remote-User [--proxy-groups-header X-Remote-Group]`,
/// on a loopback port.
async fn start_proxied_server_with(groups: Option<&str>) -> (String, Running) {
    let config = kube::Config::infer().await.unwrap();
    let settings = baton::server::ConsoleSettings::default();
    let state = baton::server::ServerState::behind_proxy(config, settings, "X-Remote-User", groups);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = baton::server::router(Arc::new(state));
    (
        url,
        Running::spawn(async move {
            let _ = baton::serving::serve("test", listener, app, Plain, WithTheProcess).await;
        }),
    )
}

async fn start_proxied_server() -> (String, Running) {
    start_proxied_server_with(None).await
}

/// Lets ServiceAccount `ns/sa` impersonate the user `user` (a cluster-wide grant, named
/// after the namespace so the test can remove it).
async fn may_impersonate(ns: &TestNamespace, sa: &str, user: &str) -> String {
    let rule = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["users".into()]),
        resource_names: Some(vec![user.into()]),
        verbs: vec!["impersonate".into()],
        ..Default::default()
    };
    grant_cluster_wide(ns, sa, "impersonates", rule).await
}

/// A ClusterRole of `rule` bound to ServiceAccount `ns/sa`, named `<ns>-<suffix>` (for the
/// test to remove); its name.
async fn grant_cluster_wide(
    ns: &TestNamespace,
    sa: &str,
    suffix: &str,
    rule: PolicyRule,
) -> String {
    let name = format!("{}-{suffix}", ns.name);
    let meta = || ObjectMeta {
        name: Some(name.clone()),
        ..Default::default()
    };
    let pp = PostParams::default();
    Api::<ClusterRole>::all(ns.client.clone())
        .create(
            &pp,
            &ClusterRole {
                metadata: meta(),
                rules: Some(vec![rule]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: meta(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(ns.name.clone()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(ns.client.clone())
        .create(&pp, &binding)
        .await
        .unwrap();
    name
}

/// Removes what [`grant_cluster_wide`] made.
async fn revoke_cluster_wide(ns: &TestNamespace, name: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<ClusterRoleBinding>::all(ns.client.clone())
        .delete(name, &dp)
        .await;
    let _ = Api::<ClusterRole>::all(ns.client.clone())
        .delete(name, &dp)
        .await;
}

async fn get_as(url: &str, token: &str, user: Option<&str>) -> (u16, String) {
    let mut request = http().get(url).bearer_auth(token);
    if let Some(user) = user {
        request = request.header("X-Remote-User", user);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn behind_a_proxy_the_api_server_decides_who_the_header_may_name() {
    let ns = TestNamespace::new("server-proxy").await;
    let (url, _server) = start_proxied_server().await;
    let gateway = person(&ns, "gateway", vec![]).await;
    let stranger = person(&ns, "stranger", vec![]).await;
    let grant = may_impersonate(&ns, "gateway", "alice").await;
    grant_user(&ns.client, &ns.name, "alice", run_user_rules()).await;
    let runs: Api<AgentRun> = ns.api();
    let run = scripted_run(
        "proxied",
        vec![final_turn("hi", 0)],
        vec![],
        LeaseSpec::default(),
    );
    runs.create(&PostParams::default(), &run).await.unwrap();
    let list = format!("{url}/api/v1/namespaces/{}/runs", ns.name);

    let (code, body) = get_as(&list, &gateway, Some("alice")).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"proxied\""), "{body}");
    // A person the proxy may not impersonate, the proxy as itself, and a token that may not
    // impersonate at all: each refused by the API server.
    for (token, user) in [
        (&gateway, Some("mallory")),
        (&gateway, None),
        (&stranger, Some("alice")),
    ] {
        let (code, body) = get_as(&list, token, user).await;
        assert_eq!(code, 403, "{user:?}: {body}");
    }

    // The proxy adds its credential to any request a browser sends it: a write needs the
    // CSRF token the console's pages carry.
    let stop = format!("{url}/api/v1/namespaces/{}/runs/proxied/stop", ns.name);
    let refused = http()
        .post(&stop)
        .bearer_auth(&gateway)
        .header("X-Remote-User", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(!runs.get("proxied").await.unwrap().spec.stop);
    let (code, page) = get_as(
        &format!("{url}/console?ns={}", ns.name),
        &gateway,
        Some("alice"),
    )
    .await;
    assert_eq!(code, 200, "{page}");
    let csrf = page
        .split("data-csrf=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap();
    let done = http()
        .post(&stop)
        .bearer_auth(&gateway)
        .header("X-Remote-User", "alice")
        .header("x-baton-csrf", csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    assert!(runs.get("proxied").await.unwrap().spec.stop);

    revoke_cluster_wide(&ns, &grant).await;
    ns.cleanup().await;
}

/// A proxy granted `impersonate` on every user and group (as the chart once granted it): the
/// headers still cannot make anyone `system:masters` or a system component through baton.
#[tokio::test]
async fn behind_a_proxy_no_header_makes_anyone_a_system_user_or_group() {
    let ns = TestNamespace::new("server-proxy-system").await;
    let (url, _server) = start_proxied_server_with(Some("X-Remote-Group")).await;
    let gateway = person(&ns, "gateway", vec![]).await;
    let rule = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["users".into(), "groups".into()]),
        verbs: vec!["impersonate".into()],
        ..Default::default()
    };
    let name = grant_cluster_wide(&ns, "gateway", "impersonates-all", rule).await;
    let list = format!("{url}/api/v1/namespaces/{}/runs", ns.name);
    let ask = |user: &'static str, groups: &'static str| {
        http()
            .get(&list)
            .bearer_auth(&gateway)
            .header("X-Remote-User", user)
            .header("X-Remote-Group", groups)
            .send()
    };
    // Nobody, with system:masters in the groups header: the group is dropped, and nobody may
    // list nothing (the API server answers for "nobody" alone).
    let masters = ask("nobody", "system:masters").await.unwrap();
    assert_eq!(masters.status(), 403, "{}", masters.text().await.unwrap());
    // A system component's name is refused outright.
    let component = ask("system:kube-controller-manager", "").await.unwrap();
    assert_eq!(component.status(), 403);
    assert!(component.text().await.unwrap().contains("no system: user"));
    // The proxy's own token naming nobody is refused: the proxy never acts as itself.
    let bare = http()
        .get(&list)
        .bearer_auth(&gateway)
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 403);
    revoke_cluster_wide(&ns, &name).await;
    ns.cleanup().await;
}
