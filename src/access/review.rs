//! Whether a user holds a right, asked of the API server (I/O).

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::Ask;

/// Whether `user` holds `ask` in `namespace`, asked of the API server with `client` (a
/// SubjectAccessReview on the user's behalf: RBAC, or whatever authorizer the cluster runs,
/// decides).
pub async fn user_may(
    client: &Client,
    user: &UserInfo,
    namespace: &str,
    ask: &Ask,
) -> Result<bool, kube::Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some(ask.verb.to_string()),
                group: Some(ask.group.to_string()),
                resource: Some(ask.resource.to_string()),
                name: ask.name.clone(),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}
