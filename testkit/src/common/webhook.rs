//! baton's admission webhook served from the test's own process on 127.0.0.1, for one
//! namespace: the configuration (the chart's three webhooks, reached by URL) selects only
//! namespaces labelled for it, so the other tests sharing the API server never meet it.
//! Shared by `tests/controller/webhook.rs` and `examples/webhook_bench.rs`. It reviews with a
//! watch's copy of the namespace's runs, as the controller's replicas do.

use std::time::{Duration, Instant};

use baton::crd::MANAGED_BY_LABEL;
use baton::crd::v1alpha1::AgentRun;
use baton::webhook::{CertIssuer, TlsSettings, WebhookConfig};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

/// The runs of `namespace` as a watch shows them, and the watch that keeps them.
fn copy_of_runs(
    client: &Client,
    namespace: &str,
) -> (Store<AgentRun>, impl Future<Output = ()> + use<>) {
    let (known, writer) = reflector::store();
    let runs = Api::<AgentRun>::namespaced(client.clone(), namespace);
    let copying = reflector(writer, watcher(runs, watcher::Config::default()))
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
    (known, copying)
}

/// The label that puts a namespace under a test's webhook configuration.
pub const WATCHED: &str = "baton.dev/webhook-test";

/// A webhook serving one namespace, and its configuration.
pub struct Served {
    pub configuration: String,
    pub task: tokio::task::JoinHandle<()>,
    /// The loopback port it serves on.
    pub port: u16,
}

impl Served {
    /// Labels `namespace`, registers the configuration and serves it (`controller_user` acts
    /// as the controller) with a certificate it issues itself; returns once the API server's
    /// reviews pass through it.
    pub async fn start(client: &Client, namespace: &str, controller_user: &str) -> Served {
        Self::start_with(client, namespace, controller_user, CertIssuer::Baton).await
    }

    /// [`Served::start`] on a cluster whose API server presents no client certificate to
    /// webhooks (none is asked for): whoever reaches the port is read, within its bounds.
    pub async fn start_open(client: &Client, namespace: &str, controller_user: &str) -> Served {
        Self::serve(client, namespace, controller_user, CertIssuer::Baton, None).await
    }

    /// [`Served::start`] with the certificate from `issuer`. With [`CertIssuer::External`] the
    /// test is the issuer, as cert-manager would be: it writes the Secret and the caBundle
    /// ([`issue_as_cert_manager`]) before the webhook starts.
    pub async fn start_with(
        client: &Client,
        namespace: &str,
        controller_user: &str,
        issuer: CertIssuer,
    ) -> Served {
        let ca = Some(api_server_client_ca());
        Self::serve(client, namespace, controller_user, issuer, ca).await
    }

    async fn serve(
        client: &Client,
        namespace: &str,
        controller_user: &str,
        issuer: CertIssuer,
        client_ca_pem: Option<String>,
    ) -> Served {
        let label = serde_json::json!({ "metadata": { "labels": { WATCHED: namespace } } });
        Api::<Namespace>::all(client.clone())
            .patch(namespace, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .expect("labelling the namespace");
        let port = free_port();
        let configuration = format!("baton-{namespace}");
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(
                &PostParams::default(),
                &configuration_for(&configuration, namespace, port),
            )
            .await
            .expect("creating the webhook configuration");
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(
                &PostParams::default(),
                &mutating_for(&configuration, namespace, port),
            )
            .await
            .expect("creating the mutating webhook configuration");
        if issuer == CertIssuer::External {
            issue_as_cert_manager(client, namespace, &configuration).await;
        }
        let config = WebhookConfig {
            addr: ([127, 0, 0, 1], port).into(),
            tls: TlsSettings {
                issuer,
                check_every: CHECK_EVERY,
                namespace: namespace.into(),
                secret: SECRET.into(),
                hosts: vec!["127.0.0.1".into()],
                configuration: Some(configuration.clone()),
                lifetime: Duration::from_secs(24 * 3600),
                client_ca_pem,
            },
            controller_users: vec![controller_user.into()],
            max_spec_bytes: baton::webhook::DEFAULT_MAX_SPEC_BYTES,
        };
        let (loaded_tx, mut loaded) = tokio::sync::watch::channel(false);
        let serving = client.clone();
        // As in the controller, which serves the webhook with its watch's copy of the runs.
        let (known, copying) = copy_of_runs(client, namespace);
        let task = tokio::spawn(async move {
            let webhook = baton::webhook::run(serving, config, loaded_tx, Some(known));
            tokio::select! {
                () = copying => eprintln!("the webhook's copy of the runs stopped"),
                Err(err) = webhook => eprintln!("webhook stopped: {err}"),
            }
        });
        tokio::time::timeout(Duration::from_secs(20), loaded.wait_for(|l| *l))
            .await
            .expect("the webhook loads its certificate")
            .unwrap();
        wait_trusted(client, namespace).await;
        Served {
            configuration,
            task,
            port,
        }
    }

    pub async fn stop(self, client: &Client) {
        self.task.abort();
        let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&self.configuration, &DeleteParams::default())
            .await;
        let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(&self.configuration, &DeleteParams::default())
            .await;
    }
}

/// The CA of the client certificate the local API server presents to webhooks
/// (`BATON_WEBHOOK_CLIENT_CA`, from `hack/control-plane.sh env`): the test's webhook trusts it
/// alone, as the chart's does on the node.
pub fn api_server_client_ca() -> String {
    let path = std::env::var("BATON_WEBHOOK_CLIENT_CA").expect(
        "BATON_WEBHOOK_CLIENT_CA is not set: run under hack/with-control-plane.sh, or eval \"$(hack/control-plane.sh env)\"",
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The local API server's own client certificate towards webhooks (beside its CA).
pub fn api_server_identity() -> reqwest::Identity {
    let ca = std::env::var("BATON_WEBHOOK_CLIENT_CA").expect("BATON_WEBHOOK_CLIENT_CA");
    let dir = std::path::Path::new(&ca).parent().unwrap();
    let cert = std::fs::read(dir.join("webhook-client.crt")).unwrap();
    let key = std::fs::read(dir.join("webhook-client.key")).unwrap();
    reqwest::Identity::from_pem(&[cert, key].concat()).unwrap()
}

/// How often the test's webhook reads its Secret again (the chart's: 30 s).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The certificate Secret's name in a test namespace.
pub const SECRET: &str = "baton-webhook-tls";

/// What cert-manager and its CA injector do, played by the test: a new CA and serving
/// certificate for 127.0.0.1 in the Secret (cert-manager's keys: `tls.crt`, `tls.key`,
/// `ca.crt`, no annotation of baton's), and the CA alone in every webhook's caBundle. Returns
/// the CA (PEM).
pub async fn issue_as_cert_manager(
    client: &Client,
    namespace: &str,
    configuration: &str,
) -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let bundle = baton::webhook::cert::issue(&["127.0.0.1".into()], now, 24 * 3600, None).unwrap();
    let (data, _) = baton::webhook::cert::to_secret(&bundle);
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let mut secret = secrets
        .get_opt(SECRET)
        .await
        .unwrap()
        .unwrap_or_else(|| Secret {
            metadata: ObjectMeta {
                name: Some(SECRET.into()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            ..Secret::default()
        });
    secret.data = Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect());
    let written = match secret.metadata.resource_version {
        Some(_) => {
            secrets
                .replace(SECRET, &PostParams::default(), &secret)
                .await
        }
        None => secrets.create(&PostParams::default(), &secret).await,
    }
    .expect("writing the certificate Secret");
    drop(written);
    let configurations = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let mut config = configurations.get(configuration).await.unwrap();
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(ByteString(bundle.ca_pem.clone().into_bytes()));
    }
    configurations
        .replace(configuration, &PostParams::default(), &config)
        .await
        .expect("injecting the CA");
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let mut config = mutating.get(configuration).await.unwrap();
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(ByteString(bundle.ca_pem.clone().into_bytes()));
    }
    mutating
        .replace(configuration, &PostParams::default(), &config)
        .await
        .expect("injecting the CA into the mutating configuration");
    bundle.ca_pem
}

/// Waits until the webhook on `port` serves a certificate of the CA `ca_pem` (a rotation has
/// reached it): until then a review that passes may still pass through the old one, and the
/// switch would come in the middle of what follows.
pub async fn wait_serving(port: u16, ca_pem: &str) {
    baton::kube_util::ensure_crypto_provider();
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("a CA in PEM");
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .identity(api_server_identity())
        .build()
        .expect("an HTTPS client");
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = format!("https://127.0.0.1:{port}/");
    while let Err(err) = client.get(&url).send().await {
        assert!(
            Instant::now() < deadline,
            "the webhook never served the new certificate: {err}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Until the API server trusts the CA the webhook just wrote, its reviews fail closed: a
/// dry-run create in the namespace answers once they pass.
pub async fn wait_trusted(client: &Client, namespace: &str) {
    let api = Api::<AgentRun>::namespaced(client.clone(), namespace);
    let probe = AgentRun::builder("probe").input("x").build();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match api.create(&params, &probe).await {
            Ok(_) => return,
            Err(err) => assert!(
                Instant::now() < deadline,
                "the webhook never answered: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().unwrap().port()
}

/// The chart's mutating webhook (it stamps a new turn with its thread's generation), pointed
/// at 127.0.0.1 and at `namespace` only.
fn mutating_for(name: &str, namespace: &str, port: u16) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "turns.baton.dev".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            reinvocation_policy: Some("Never".into()),
            timeout_seconds: Some(5),
            client_config: WebhookClientConfig {
                url: Some(format!(
                    "https://127.0.0.1:{port}{}",
                    baton::webhook::MUTATE_PATH
                )),
                ..WebhookClientConfig::default()
            },
            namespace_selector: Some(LabelSelector {
                match_labels: Some([(WATCHED.to_string(), namespace.to_string())].into()),
                ..LabelSelector::default()
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["baton.dev".into()]),
                api_versions: Some(vec!["*".into()]),
                resources: Some(vec!["agentruns".into()]),
                operations: Some(vec!["CREATE".into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..MutatingWebhook::default()
        }]),
    }
}

/// The chart's validating webhooks, pointed at 127.0.0.1 and at `namespace` only.
fn configuration_for(name: &str, namespace: &str, port: u16) -> ValidatingWebhookConfiguration {
    let managed = LabelSelector {
        match_labels: Some([(MANAGED_BY_LABEL.to_string(), "baton".to_string())].into()),
        ..LabelSelector::default()
    };
    let hook = |hook: &str, group: &str, resource: &str, operations: &[&str]| ValidatingWebhook {
        name: format!("{hook}.baton.dev"),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some("Fail".into()),
        timeout_seconds: Some(5),
        client_config: WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{port}{}", baton::webhook::PATH)),
            ..WebhookClientConfig::default()
        },
        namespace_selector: Some(LabelSelector {
            match_labels: Some([(WATCHED.to_string(), namespace.to_string())].into()),
            ..LabelSelector::default()
        }),
        object_selector: (resource == "leases").then(|| managed.clone()),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![group.into()]),
            api_versions: Some(vec!["*".into()]),
            resources: Some(vec![resource.into()]),
            operations: Some(operations.iter().map(|o| o.to_string()).collect()),
            scope: Some("Namespaced".into()),
        }]),
        ..ValidatingWebhook::default()
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![
            hook("runs", "baton.dev", "agentruns", &["CREATE", "UPDATE"]),
            hook(
                "threads",
                "baton.dev",
                "agentthreads",
                &["CREATE", "UPDATE"],
            ),
            hook("segments", "baton.dev", "ledgersegments", &["CREATE"]),
            hook("leases", "coordination.k8s.io", "leases", &["UPDATE"]),
        ]),
    }
}

/// A review as the API server would send it, asking whether `alice` may create `run` (JSON) in
/// `namespace`: what an attacker who reaches the webhook's port forges.
pub fn forged_review(namespace: &str, run: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "forged",
            "kind": {"group": "baton.dev", "version": "v1alpha1", "kind": "AgentRun"},
            "resource": {"group": "baton.dev", "version": "v1alpha1", "resource": "agentruns"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": run,
        }
    })
}
