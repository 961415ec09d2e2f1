//! The chart's own `baton server` pods on the real node: clients follow a run through one
//! server pod, that pod is deleted mid-run, and the clients reconnect through the Service to
//! the other replica with their last event id: the stream each client saw, put together,
//! equals the run's ledger, nothing lost and nothing twice. The server acts with the client's
//! token: a token without transcript rights is refused. Behind an authenticating proxy (the
//! chart's `server.proxyAuth`), the proxy's token cannot make anyone `system:masters`, neither
//! through baton nor straight at the API server.

use std::time::Duration;

use baton_testkit::e2e::Script;
use baton_testkit::node::rbac::grant_user;
use baton_testkit::node::*;
use baton_testkit::sse::{Sse, SseReader};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

const FOLLOWERS: usize = 3;

/// Reads until the stream is cut or ends; what it read.
async fn read_until_cut(reader: &mut SseReader) -> Vec<Sse> {
    let mut out = Vec::new();
    while let Some(e) = reader.next().await {
        let end = e.event == "end";
        out.push(e);
        if end {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_clients_follow_a_run_across_a_server_pod_deletion_and_lose_nothing() {
    let env = NodeEnv::start("server-follow").await;
    let servers = servers_ready(&env.client).await;
    let alice = person(
        &env.client,
        &env.ns,
        "alice",
        vec![
            rule(&["agentruns"], &["get", "list", "watch"]),
            rule(&["ledgersegments"], &["get", "list", "watch"]),
        ],
    )
    .await;
    let mallory = person(
        &env.client,
        &env.ns,
        "mallory",
        vec![rule(&["agentruns"], &["get"])],
    )
    .await;
    let doomed = &servers[0];
    let doomed_name = doomed.metadata.name.clone().unwrap();
    let pod_ip = doomed
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let cluster_ip = server_cluster_ip(&env.client).await;
    let direct = Relay::start(&format!("{pod_ip}:8080"));
    let service = Relay::start(&format!("{cluster_ip}:80"));

    env.create(&env.scripted("followed", &Script::new(8, 800)))
        .await;
    let path = format!("/api/v1/namespaces/{}/runs/followed/events", env.ns);
    let refused = SseReader::try_open(&format!("{}{path}", service.url()), &mallory, None).await;
    let refused = refused.err().expect("mallory may not read the transcript");
    assert!(refused.contains("403"), "{refused}");

    // The followers all go through the pod about to be deleted.
    let mut readers = Vec::new();
    for _ in 0..FOLLOWERS {
        readers.push(SseReader::open(&format!("{}{path}", direct.url()), &alice, None).await);
    }
    let mut seen: Vec<Vec<Sse>> = vec![Vec::new(); FOLLOWERS];
    for (reader, seen) in readers.iter_mut().zip(seen.iter_mut()) {
        while seen.iter().filter(|e| e.event == "segment").count() < 3 {
            seen.push(reader.next().await.expect("the first segments"));
        }
    }
    Api::<Pod>::namespaced(env.client.clone(), SYSTEM_NS)
        .delete(&doomed_name, &DeleteParams::default())
        .await
        .unwrap();
    for (reader, seen) in readers.iter_mut().zip(seen.iter_mut()) {
        seen.extend(read_until_cut(reader).await);
    }

    // Each comes back through the Service, to the other replica, with its last id.
    for seen in seen.iter_mut() {
        while seen.last().is_none_or(|e| e.event != "end") {
            let last = seen.iter().rev().find_map(|e| e.id.clone()).unwrap();
            let url = format!("{}{path}", service.url());
            match SseReader::try_open(&url, &alice, Some(&last)).await {
                Ok(mut again) => seen.extend(read_until_cut(&mut again).await),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    env.wait_succeeded("followed").await;
    let ledger = env.ledger("followed").await;
    let want: Vec<String> = ledger.iter().map(|s| s.spec.seq.to_string()).collect();
    for seen in &seen {
        let got: Vec<String> = seen
            .iter()
            .filter(|e| e.event == "segment")
            .map(|e| e.data["seq"].to_string())
            .collect();
        assert_eq!(got, want, "each follower saw every position once, in order");
        for (event, segment) in seen.iter().filter(|e| e.event == "segment").zip(&ledger) {
            assert_eq!(
                event.data["events"],
                serde_json::to_value(&segment.spec.events).unwrap()
            );
        }
        assert_eq!(seen.last().unwrap().data["phase"], "Succeeded");
    }
    drop((direct, service));
    env.finish().await;
}

/// The authenticating proxy's ServiceAccount, granted `impersonate` by the chart.
const GATEWAY: &str = "gateway";

/// Puts the release back as the other node tests expect it (no proxy), even when a check fails.
struct ProxyModeOff;

impl Drop for ProxyModeOff {
    fn drop(&mut self) {
        helm_upgrade(&serde_json::json!({}));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_behind_a_proxy_no_one_becomes_system_masters() {
    let env = NodeEnv::start("server-proxy").await;
    servers_ready(&env.client).await;
    let gateway = person(&env.client, &env.ns, GATEWAY, vec![]).await;
    grant_user(
        &env.client,
        &env.ns,
        "alice",
        vec![rule(&["agentruns"], &["get", "list", "watch"])],
    )
    .await;
    let _off = ProxyModeOff;
    helm_upgrade(&serde_json::json!({ "server": { "proxyAuth": {
        "userHeader": "X-Remote-User", "groupsHeader": "X-Remote-Group",
        "impersonator": { "name": GATEWAY, "namespace": env.ns },
    }}}));
    wait_only_current_pods(&env.client, SERVER, Duration::from_secs(180)).await;
    let service = Relay::start(&format!("{}:80", server_cluster_ip(&env.client).await));
    let list = format!("{}/api/v1/namespaces/{}/runs", service.url(), env.ns);
    let http = reqwest::Client::new();
    let ask = |user: &str, groups: &str| {
        let mut request = http.get(&list).bearer_auth(&gateway);
        if !user.is_empty() {
            request = request.header("X-Remote-User", user);
        }
        if !groups.is_empty() {
            request = request.header("X-Remote-Group", groups);
        }
        request.send()
    };
    // The proxy works for the person it names.
    let alice = ask("alice", "").await.unwrap();
    assert_eq!(alice.status(), 200, "{}", alice.text().await.unwrap());
    // system:masters in the groups header is dropped: "nobody" alone may list nothing.
    let masters = ask("nobody", "system:masters").await.unwrap();
    assert_eq!(masters.status(), 403, "{}", masters.text().await.unwrap());
    // A system user is refused by name, and the proxy's token naming nobody is refused.
    let admin = ask("system:admin", "").await.unwrap();
    assert_eq!(admin.status(), 403);
    assert!(admin.text().await.unwrap().contains("no system: user"));
    let bare = ask("", "").await.unwrap();
    assert_eq!(bare.status(), 403, "{}", bare.text().await.unwrap());

    // The proxy's token taken straight to the API server: the chart granted users only.
    let as_masters = client_with_token(&gateway, "nobody", &["system:masters"]).await;
    let pods: Api<Pod> = Api::namespaced(as_masters, SYSTEM_NS);
    match pods.list(&Default::default()).await {
        Err(kube::Error::Api(e)) => {
            assert!(e.code == 403 && e.message.contains("impersonate"), "{e:?}")
        }
        other => panic!("the proxy's token became system:masters: {other:?}"),
    }
    let as_alice = client_with_token(&gateway, "alice", &[]).await;
    Api::<baton::crd::v1alpha1::AgentRun>::namespaced(as_alice, &env.ns)
        .list(&Default::default())
        .await
        .expect("impersonating a user is what the chart grants");
    drop((service, _off));
    wait_only_current_pods(&env.client, SERVER, Duration::from_secs(180)).await;
    env.finish().await;
}
