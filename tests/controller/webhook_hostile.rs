//! Anyone who reaches the webhook's port. Where the API server presents a client certificate
//! (`--webhook-client-ca-file`), a client without one, or with one of another CA, ends in the
//! TLS handshake: not a byte of its review is read, so nothing is answered to it (no
//! SubjectAccessReview asked, no run's UID told). Where none is configured, large reviews
//! announced and withheld are answered at once past the sender's budget (503, unread), the
//! ones held end within seconds, and the API server's reviews are answered as before once they
//! end. (Each address has a budget of its own, `baton::serving::bounds::BodyBudget`; here the test
//! and the API server share 127.0.0.1, so the API server's reviews are checked after the burst.)

use std::time::{Duration, Instant};

use crate::webhook::Watched;
use baton::crd::v1alpha1::AgentRun;
use baton::serving::bounds::BODY_FRAME_TIMEOUT;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::webhook::{self, Served, api_server_client_ca, api_server_identity};
use futures::StreamExt;
use kube::api::PostParams;

/// A review as the API server would send it, asking about a run in `namespace`.
fn forged_review(namespace: &str) -> serde_json::Value {
    let run = AgentRun::builder("forged").input("hi").build();
    webhook::forged_review(namespace, serde_json::to_value(run).unwrap())
}

/// A client certificate for the API server's name, from a CA of the attacker's own.
fn foreign_identity() -> reqwest::Identity {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let name = "kube-apiserver-webhook-client";
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.self_signed(&key).unwrap();
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    reqwest::Identity::from_pem(pem.as_bytes()).unwrap()
}

async fn post_review(
    identity: Option<reqwest::Identity>,
    url: &str,
    ns: &str,
) -> Result<u16, String> {
    let mut builder = reqwest::Client::builder().danger_accept_invalid_certs(true);
    if let Some(identity) = identity {
        builder = builder.identity(identity);
    }
    let answer = builder
        .build()
        .unwrap()
        .post(url)
        .json(&forged_review(ns))
        .send()
        .await;
    answer
        .map(|a| a.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn only_the_api_servers_certificate_gets_a_review_read() {
    let w = Watched::new("webhook-client-cert").await;
    baton::kube_util::ensure_crypto_provider();
    assert!(!api_server_client_ca().is_empty());
    let url = format!(
        "https://127.0.0.1:{}{}",
        w.served.port,
        baton::webhook::PATH
    );
    let ns = &w.ns.name;
    let none = post_review(None, &url, ns).await;
    assert!(
        none.is_err(),
        "a client with no certificate was answered: {none:?}"
    );
    let foreign = post_review(Some(foreign_identity()), &url, ns).await;
    assert!(
        foreign.is_err(),
        "a certificate of another CA was answered: {foreign:?}"
    );
    // The same request with the API server's certificate is read and answered: what refused
    // the two above is the certificate, nothing else.
    let own = post_review(Some(api_server_identity()), &url, ns).await;
    assert_eq!(own, Ok(200), "the API server's certificate");
    let run = AgentRun::builder("through-the-api-server")
        .input("hi")
        .build();
    w.ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .expect("the API server's review is answered");
    w.cleanup().await;
}

/// A review announced at 4 MiB of which 1 KiB is sent, then nothing: what it was answered,
/// and when.
async fn withheld_review(client: reqwest::Client, url: String) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let first = futures::stream::once(async { Ok::<_, std::io::Error>(vec![b' '; 1024]) });
    let body = first.chain(futures::stream::pending());
    let answer = client
        .post(url)
        .header("content-type", "application/json")
        .header("content-length", (4 * 1024 * 1024).to_string())
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await;
    (answer.ok().map(|a| a.status().as_u16()), started.elapsed())
}

#[tokio::test]
async fn large_withheld_reviews_from_anyone_cost_a_bounded_budget_and_end() {
    let ns = TestNamespace::new("webhook-hostile").await;
    let served = Served::start_open(&ns.client, &ns.name, "admin").await;
    baton::kube_util::ensure_crypto_provider();
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{}{}", served.port, baton::webhook::PATH);
    let burst: Vec<_> = (0..8)
        .map(|_| tokio::spawn(withheld_review(client.clone(), url.clone())))
        .collect();
    let mut answers = Vec::new();
    for sent in burst {
        answers.push(sent.await.unwrap());
    }
    let busy = answers.iter().filter(|(code, _)| *code == Some(503));
    let quick = busy
        .filter(|(_, after)| *after < Duration::from_secs(5))
        .count();
    assert_eq!(
        quick, 4,
        "16 MiB of an address's budget hold four: {answers:?}"
    );
    let patience = BODY_FRAME_TIMEOUT + Duration::from_secs(10);
    for (code, after) in &answers {
        assert!(
            *after < patience,
            "a withheld review held its request {after:?} ({code:?})"
        );
    }
    let run = AgentRun::builder("after-the-burst").input("hi").build();
    ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .expect("the API server's review is answered");
    served.stop(&ns.client).await;
    ns.cleanup().await;
}
