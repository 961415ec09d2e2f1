//! Trust boundaries on the real node (`hack/node.sh`), with baton installed by its chart and
//! its admission webhook served by the controller pods: each attacker is played for real with
//! `kubectl --as=` (a user holding only AgentRun rights, or another run's worker identity), and
//! each refusal comes back through the API server from the webhook behind its Service. The same
//! attacks succeed without the webhook (tests/controller/webhook.rs shows each in a namespace
//! it does not watch).

mod e2e_support;
mod node_support;

use baton::crd::v1alpha1::{AgentRun, Phase};
use e2e_support::Script;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use node_support::*;

/// A user who may do anything with AgentRuns in the namespace, and nothing else.
const MALLORY: &str = "mallory";

async fn mallory_may_only_make_runs(env: &NodeEnv) {
    let role = Role {
        metadata: ObjectMeta {
            name: Some(MALLORY.into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["baton.dev".into()]),
            resources: Some(vec!["agentruns".into()]),
            verbs: vec!["*".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(MALLORY.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: MALLORY.into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: MALLORY.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    let params = PostParams::default();
    Api::<Role>::namespaced(env.client.clone(), &env.ns)
        .create(&params, &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(env.client.clone(), &env.ns)
        .create(&params, &binding)
        .await
        .unwrap();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("model-key".into()),
            ..ObjectMeta::default()
        },
        string_data: Some([("key".to_string(), "sk-live-secret".to_string())].into()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .create(&params, &secret)
        .await
        .unwrap();
}

/// `kubectl --as=USER -n NS create -f FILE` of `object`: Err(the API server's answer) expected.
fn create_as(
    env: &NodeEnv,
    user: &str,
    object: &impl serde::Serialize,
    file: &str,
) -> Result<String, String> {
    let path = env.dir.join(file);
    std::fs::write(&path, serde_json::to_string(object).unwrap()).unwrap();
    kubectl(&[
        &format!("--as={user}"),
        "-n",
        &env.ns,
        "create",
        "-f",
        path.to_str().unwrap(),
    ])
}

fn refused(answer: Result<String, String>, why: &str) {
    match answer {
        Err(text) => assert!(text.contains(why), "refused, but not for {why:?}: {text}"),
        Ok(out) => panic!("admitted, expected a refusal for {why:?}: {out}"),
    }
}

/// A user with only AgentRun rights cannot lend a Secret or choose a pod field; another run's
/// worker cannot write a victim's ledger or re-point its Lease; the victim is undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_webhook_refuses_what_the_asker_could_not_do_themselves() {
    let env = NodeEnv::start("trust-webhook").await;
    mallory_may_only_make_runs(&env).await;

    let mut proxy = env.scripted("proxy", &Script::new(1, 100));
    proxy.spec.agent.model.endpoint = Some("https://attacker.invalid/v1".into());
    proxy.spec.agent.model.api_key_secret_ref = Some(baton::crd::v1alpha1::SecretKeyRef {
        name: "model-key".into(),
        key: "key".into(),
    });
    refused(
        create_as(&env, MALLORY, &proxy, "proxy.json"),
        "spec.agent.model.apiKeySecretRef.name: mallory may not get secrets \"model-key\"",
    );
    let mut identity = env.scripted("identity", &Script::new(1, 100));
    identity.spec.worker.service_account_name = Some("default".into());
    refused(
        create_as(&env, MALLORY, &identity, "identity.json"),
        "spec.worker.serviceAccountName: mallory may not create pods",
    );
    // A plain run borrows nothing: Mallory may make it.
    create_as(
        &env,
        MALLORY,
        &env.scripted("plain", &Script::new(1, 100)),
        "plain.json",
    )
    .expect("a run that borrows nothing is admitted");

    env.create(&env.scripted("victim", &Script::new(4, 1500)))
        .await;
    env.create(&env.scripted("other", &Script::new(4, 1500)))
        .await;
    env.wait_worker("victim", 1).await;
    env.wait_worker("other", 1).await;
    let victim: AgentRun = env.runs().get("victim").await.unwrap();
    let next = env.ledger("victim").await.len() as i64 + 1;
    let forged = serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "LedgerSegment",
        "metadata": {
            "name": baton::fence::segment_name("victim", next),
            "labels": { baton::crd::RUN_UID_LABEL: victim.uid().unwrap() }
        },
        "spec": { "run": "victim", "seq": next, "fence": 1, "events": [
            { "type": "stepIntent", "step": 1, "callId": "forged", "tool": "sh",
              "input": "{\"cmd\":\"echo pwned\"}", "idempotent": true }
        ] }
    });
    let other_worker = format!("system:serviceaccount:{}:baton-run-other", env.ns);
    refused(
        create_as(&env, &other_worker, &forged, "forged.json"),
        "only its worker",
    );

    // The worker may get and update its Lease (no patch): it reads it and replaces it with
    // the owner reference pointing at the victim.
    let as_worker = format!("--as={other_worker}");
    let lease = kubectl(&[
        &as_worker,
        "-n",
        &env.ns,
        "get",
        "lease",
        "run.other",
        "-o",
        "json",
    ])
    .expect("a worker reads its own Lease");
    let mut lease: serde_json::Value = serde_json::from_str(&lease).unwrap();
    lease["metadata"]["ownerReferences"] = serde_json::json!([{
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun", "name": "victim",
        "uid": victim.uid().unwrap()
    }]);
    let path = env.dir.join("lease.json");
    std::fs::write(&path, lease.to_string()).unwrap();
    let lease_patch = kubectl(&[
        &as_worker,
        "-n",
        &env.ns,
        "replace",
        "-f",
        path.to_str().unwrap(),
    ]);
    refused(lease_patch, "metadata.ownerReferences");

    for name in ["victim", "other", "plain"] {
        let st = env.wait_succeeded(name).await;
        assert_eq!(st.phase, Phase::Succeeded);
    }
    env.check_invariants(&["victim".into(), "other".into()])
        .await;
    env.finish().await;
}
