//! Test harness for the tests that need a real API server.
//!
//! The control plane is started once per test run by `hack/control-plane.sh` (via `make test`
//! or `.ci/run`), which exports `KUBECONFIG`. There is no mock and no silent skip: without a
//! control plane these tests fail and say how to start one.

#![allow(dead_code)]

pub mod claim;
pub mod events;
pub mod in_process;
pub mod litellm;
pub mod namespace;
pub mod webhook;
pub mod worker_proc;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::{Api, Client};
use tokio::sync::OnceCell;

static CRDS: OnceCell<()> = OnceCell::const_new();

/// A client for the local control plane, with baton's CRDs installed and Established.
pub async fn client() -> Client {
    if std::env::var_os("KUBECONFIG").is_none() {
        panic!(
            "KUBECONFIG is not set: these tests need a real API server. Start one with \
             `hack/control-plane.sh up` and `eval \"$(hack/control-plane.sh env)\"`, or run `make test`."
        );
    }
    let client = Client::try_default()
        .await
        .expect("building a client from KUBECONFIG");
    CRDS.get_or_init(|| async {
        baton::crd::install(client.clone(), Duration::from_secs(60))
            .await
            .expect("installing baton CRDs");
    })
    .await;
    client
}

/// A namespace of its own for one test, deleted by `cleanup`.
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

impl TestNamespace {
    /// Creates a fresh namespace named after the test.
    pub async fn new(test: &str) -> Self {
        let client = client().await;
        let suffix: u32 = rand::random::<u32>() % 1_000_000;
        let name = format!(
            "t-{}-{suffix}",
            test.replace('_', "-").chars().take(40).collect::<String>()
        );
        namespace::create_namespace(&client, &name)
            .await
            .expect("creating test namespace");
        Self { client, name }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace. (Nothing runs a namespace controller on the local control plane,
    /// so the namespace stays Terminating; its name is unique, so that harms no later test.)
    pub async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}
