//! Creating a namespace on the bed, for the tests and the benchmarks alike.

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// Creates the namespace `name`.
pub async fn create_namespace(client: &Client, name: &str) -> kube::Result<Namespace> {
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
}
