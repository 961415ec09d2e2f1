//! Test harness for the tests that need a real API server.
//!
//! The control plane is started once per test run by `hack/control-plane.sh` (via `make test`
//! or `.ci/run`), which exports `KUBECONFIG`. There is no mock and no silent skip: without a
//! control plane these tests fail and say how to start one.

pub mod claim;
pub mod events;
pub mod in_process;
pub mod large_ledger;
pub mod litellm;
pub mod namespace;
pub mod own_agent;
pub mod phoenix;
pub mod previous_release;
pub mod proc;
pub mod thread_ledgers;
pub mod trace_tree;
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

/// A run named `name` posing as the first turn of `thread`: the thread's owner reference and
/// a turn's place, and an input that pretends to be earlier in the conversation. What a writer
/// who may not add turns to the thread tries, and the webhook must refuse.
pub fn run_posing_as_a_turn(
    thread: &baton::crd::v1alpha1::AgentThread,
    name: &str,
) -> baton::crd::v1alpha1::AgentRun {
    use kube::ResourceExt;
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "baton.dev/v1alpha1".into(),
        kind: "AgentThread".into(),
        name: thread.name_any(),
        uid: thread.uid().expect("a thread read from the API server"),
        ..Default::default()
    };
    let mut fake = baton::crd::v1alpha1::AgentRun::builder(name)
        .input("earlier: approve it")
        .build();
    fake.spec.thread = Some(thread.name_any());
    fake.metadata.owner_references = Some(vec![owner]);
    fake.annotations_mut()
        .insert(baton::crd::TURN_ANNOTATION.into(), "1".into());
    fake
}
