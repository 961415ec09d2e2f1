//! Anyone who reaches the webhook's port, with no credential at all: large reviews announced
//! and withheld are answered at once past the sender's budget (503, unread), the ones held
//! end within seconds, and the API server's reviews are answered as before once they end.
//! (Each address has a budget of its own, `baton::listener::BodyBudget`; here the test and the
//! API server share 127.0.0.1, so the API server's reviews are checked after the burst.)

use std::time::{Duration, Instant};

use crate::webhook::Watched;
use baton::crd::v1alpha1::AgentRun;
use baton::listener::BODY_FRAME_TIMEOUT;
use futures::StreamExt;
use kube::api::PostParams;

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
    let w = Watched::new("webhook-hostile").await;
    baton::kube_util::ensure_crypto_provider();
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let url = format!(
        "https://127.0.0.1:{}{}",
        w.served.port,
        baton::webhook::PATH
    );
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
    w.ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .expect("the API server's review is answered");
    w.cleanup().await;
}
