//! baton installed on the node by its chart, and its controller Deployment driven as an
//! operator would: values, install, upgrade, restart, scale, the leader.

use super::*;

static INSTALLED: OnceCell<()> = OnceCell::const_new();

/// baton installed by its chart (once per test binary; an existing release is kept), with
/// both controller replicas Ready.
pub async fn installed(client: &Client) {
    INSTALLED
        .get_or_init(|| async {
            let exists =
                kubectl(&["-n", SYSTEM_NS, "get", "deployment", &deployment_name()]).is_ok();
            if !exists {
                helm_install(&serde_json::json!({}));
            }
            wait_controllers_ready(client, Duration::from_secs(180)).await;
            wait_webhook_answers(client, Duration::from_secs(60)).await;
        })
        .await;
}

/// Ready controller pods are not yet a reachable webhook: the Service's endpoints and
/// kube-proxy's rules follow a moment later, and until then every create of an AgentRun is
/// refused ("failed calling webhook … connection refused"). A server-side dry run of a valid
/// run reaches the webhook (dry runs are admitted like writes) without creating anything.
pub async fn wait_webhook_answers(client: &Client, timeout: Duration) {
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), "default");
    let probe = scripted_run(
        "127.0.0.1:1",
        "webhook-probe",
        &Script {
            turns: 1,
            think_ms: 1,
            tool_ms: 1,
        },
    );
    let deadline = Instant::now() + timeout;
    loop {
        let err = match runs
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &probe,
            )
            .await
        {
            Ok(_) => return,
            Err(err) => err.to_string(),
        };
        if !err.contains("failed calling webhook") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook does not answer after {timeout:?}: {err}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn deployment_name() -> String {
    format!("{RELEASE}-controller")
}

/// The label that takes a test namespace out of the webhook's `namespaceSelector`
/// ([`NodeEnv::start_without_webhook`]): there only the readers' own checks stand.
pub const WITHOUT_WEBHOOK: &str = "baton.dev/test-without-webhook";

/// The values every install on the node uses: the image imported into containerd, never
/// pulled; the webhook for every namespace but those labelled [`WITHOUT_WEBHOOK`], reading
/// only the API server (the CA of its client certificate towards webhooks, `hack/node.sh`).
pub fn values(extra: &serde_json::Value) -> serde_json::Value {
    let mut values = serde_json::json!({
        "image": {"repository": "baton", "tag": "dev", "pullPolicy": "Never"},
        "controller": {"leaderLeaseSeconds": 6},
        "webhook": {
            "namespaceSelector": {"matchExpressions": [
                {"key": WITHOUT_WEBHOOK, "operator": "DoesNotExist"}
            ]},
            "clientCA": api_server_client_ca(),
        },
    });
    merge(&mut values, extra);
    values
}

/// The CA of the node's API server's client certificate towards webhooks.
pub fn api_server_client_ca() -> String {
    let path = node_dir().join("pki/webhook-client-ca.crt");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

fn helm_install(extra: &serde_json::Value) {
    helm("install", THIS_CHART, &["--create-namespace"], extra);
}

/// `helm upgrade` of the release with these values (on top of [`values`]).
pub fn helm_upgrade(extra: &serde_json::Value) {
    helm("upgrade", THIS_CHART, &[], extra);
}

/// This tree's chart, as the README's commands name it (relative to the repository).
pub const THIS_CHART: &str = "charts/baton";

/// `hack/helm.py ACTION` (Helm's SDK) of `chart` (a directory) as the release, with
/// [`values`] and `extra`.
pub fn helm(action: &str, chart: &str, flags: &[&str], extra: &serde_json::Value) {
    let values = values(extra).to_string();
    let args = [action, chart, "--values", &values];
    assert_succeeded(
        &format!("helm {action} {chart}"),
        &helm_py(&[&args[..], flags].concat()),
    );
}

/// `helm rollback` of the release to its revision before the current one, as docs/operations.md,
/// "Upgrading" says to undo a failed upgrade.
pub fn helm_rollback() {
    assert_succeeded("helm rollback", &helm_py(&["rollback"]));
}

/// `hack/helm.py ARGS` on the release.
fn helm_py(args: &[&str]) -> std::process::Output {
    Command::new("python3")
        .env("KUBECONFIG", kubeconfig())
        .arg(root().join("hack/helm.py"))
        .args(args)
        .args(["--name", RELEASE, "--namespace", SYSTEM_NS])
        .current_dir(root())
        .output()
        .expect("running hack/helm.py")
}

/// Waits until the controller Deployment has all its replicas updated and Ready.
pub async fn wait_controllers_ready(client: &Client, timeout: Duration) {
    wait_rolled_out(client, &deployment_name(), timeout).await;
}

/// Waits until Deployment `name` of the release has all its replicas updated and Ready.
pub async fn wait_rolled_out(client: &Client, name: &str, timeout: Duration) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NS);
    let deadline = Instant::now() + timeout;
    loop {
        let d = retry(|| api.get(name)).await;
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.clone().unwrap_or_default();
        let generation_seen = st.observed_generation >= d.metadata.generation;
        if generation_seen
            && st.updated_replicas == Some(want)
            && st.ready_replicas == Some(want)
            && st.replicas == Some(want)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Deployment {name} not ready after {timeout:?}: {st:?}\n{}",
            kubectl(&["-n", SYSTEM_NS, "describe", "pods"]).unwrap_or_else(|e| e)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until Deployment `name` has rolled out and none of its old pods is left, not even
/// terminating. Its status counts only the pods not terminating, and an old pod told to stop
/// serves on a few seconds (`baton server`'s linger): a request sent right after the status
/// says "rolled out" could still be answered by the old version's replica.
pub async fn wait_only_current_pods(client: &Client, name: &str, timeout: Duration) {
    let started = Instant::now();
    wait_rolled_out(client, name, timeout).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NS);
    let d = retry(|| api.get(name)).await;
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) as usize;
    let labels = d
        .spec
        .and_then(|s| s.selector.match_labels)
        .unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let params = ListParams::default().labels(&selector.join(","));
    loop {
        let listed = retry(|| pods.list(&params)).await.items;
        let terminating = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some());
        let old = terminating.map(|p| p.name_any()).collect::<Vec<_>>();
        if listed.len() == want && old.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "Deployment {name}: pods still going after {timeout:?}: {old:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `kubectl rollout restart` of the controller Deployment.
pub fn restart_controllers() {
    kubectl(&[
        "-n",
        SYSTEM_NS,
        "rollout",
        "restart",
        "deployment",
        &deployment_name(),
    ])
    .expect("kubectl rollout restart");
}

/// Scales the controller Deployment (0: no controller runs at all).
pub fn scale_controllers(replicas: u32) {
    kubectl(&[
        "-n",
        SYSTEM_NS,
        "scale",
        "deployment",
        &deployment_name(),
        &format!("--replicas={replicas}"),
    ])
    .expect("kubectl scale");
}

/// The controller pods of the Deployment, and which one holds the leader Lease.
pub async fn controller_pods(client: &Client) -> (Vec<Pod>, Option<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    // The release's baton server pods share its instance label; the component tells them apart.
    let params = ListParams::default().labels(&format!(
        "app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller"
    ));
    let list = retry(|| pods.list(&params)).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM_NS);
    let holder = leases
        .get_opt(baton::controller::LEADER_LEASE_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty());
    (list.items, holder)
}

/// Samples the leader Lease during a controller rollout until both replicas are new and Ready:
/// the longest time no controller pod that was not being deleted held it.
pub async fn leaderless_until_rolled(client: &Client, timeout: Duration) -> Duration {
    let deadline = Instant::now() + timeout;
    let mut longest = Duration::ZERO;
    let mut gap_since: Option<Instant> = None;
    // The rollout has begun once the Deployment's generation moved; it ends with all Ready.
    tokio::time::sleep(Duration::from_millis(500)).await;
    loop {
        let (pods, holder) = controller_pods(client).await;
        let led = holder
            .as_deref()
            .and_then(|h| leader_pod(&pods, h))
            .is_some_and(|name| {
                pods.iter()
                    .any(|p| p.name_any() == name && p.metadata.deletion_timestamp.is_none())
            });
        match (led, gap_since) {
            (false, None) => gap_since = Some(Instant::now()),
            (true, Some(since)) => {
                longest = longest.max(since.elapsed());
                gap_since = None;
            }
            _ => {}
        }
        let rolled = pods.len() == 2
            && pods
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p));
        if rolled && led {
            return longest;
        }
        assert!(
            Instant::now() < deadline,
            "controller rollout not done after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod whose name the leader identity (`<pod>-<suffix>`) starts with.
pub fn leader_pod(pods: &[Pod], holder: &str) -> Option<String> {
    pods.iter()
        .map(|p| p.name_any())
        .find(|name| holder.starts_with(&format!("{name}-")))
}
