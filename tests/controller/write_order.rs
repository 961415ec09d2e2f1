//! The order of a claim's writes and of a terminal claim's (docs/protocol.md, "The claim" and
//! "The terminal claim"), as the controller's own code sends them to the local API server
//! through a client that records every write: the seal before the status, the status before
//! the Lease, the Lease before the pod; the terminal status before the `closed` record, and
//! the Lease released and the old pod deleted only after it. An order that changed would let
//! a crash between two writes leave a run that no later pass can read right.

use std::sync::{Arc, Mutex};

use baton::controller::decide::{Action, Claim, ClaimReason, Close, CloseReason};
use baton::controller::testing::{self, Applied};
use baton_testkit::controller::*;
use kube::client::{Body, ClientBuilder};

/// Every write (`METHOD path`) a client of the bed sends, in order.
#[derive(Clone, Default)]
struct Writes(Arc<Mutex<Vec<String>>>);

impl Writes {
    /// A client of the local API server that records its writes here.
    async fn client(&self) -> kube::Client {
        let config = kube::Config::infer().await.expect("KUBECONFIG");
        let writes = self.clone();
        let record = tower::util::MapRequestLayer::new(move |request: http::Request<Body>| {
            if request.method() != http::Method::GET {
                let write = format!("{} {}", request.method(), request.uri().path());
                writes.0.lock().unwrap().push(write);
            }
            request
        });
        ClientBuilder::try_from(config)
            .expect("a client of the bed")
            .with_layer(&record)
            .build()
    }

    fn taken(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// The positions of the writes with `method` whose path ends with `end`.
fn positions(writes: &[String], method: &str, end: &str) -> Vec<usize> {
    let matches = |w: &String| w.starts_with(&format!("{method} ")) && w.ends_with(end);
    let found = writes.iter().enumerate().filter(|(_, w)| matches(w));
    found.map(|(i, _)| i).collect()
}

/// The position of the one such write.
fn one(writes: &[String], method: &str, end: &str) -> usize {
    match positions(writes, method, end)[..] {
        [at] => at,
        ref other => panic!("{other:?}: not one {method} …{end} among {writes:#?}"),
    }
}

#[tokio::test]
async fn a_claim_seals_then_writes_the_status_then_moves_the_lease_then_creates_the_pod() {
    let ns = TestNamespace::new("write-order-claim").await;
    let run = create(&ns, agent_run("r", 60)).await;
    let writes = Writes::default();
    let ctx = testing::detached(writes.client().await);
    let claim = Action::Claim(Claim {
        reason: ClaimReason::Start,
        failed: false,
    });
    let applied = testing::apply_on(&ctx, &run, &claim).await.unwrap();
    assert_eq!(applied, Applied::Done);
    let w = writes.taken();
    let seal = one(&w, "POST", "/ledgersegments");
    let status = one(&w, "PUT", "/agentruns/r/status");
    let lease = one(&w, "POST", "/leases");
    let pod = one(&w, "POST", "/pods");
    assert!(seal < status, "the seal before the status: {w:#?}");
    assert!(status < lease, "the status before the Lease: {w:#?}");
    assert!(lease < pod, "the Lease before the pod: {w:#?}");
    ns.cleanup().await;
}

#[tokio::test]
async fn a_terminal_claim_seals_then_ends_the_status_then_records_then_releases() {
    let ns = TestNamespace::new("write-order-close").await;
    let run = create(&ns, agent_run("r", 60)).await;
    let ctx = testing::detached(ns.client.clone());
    let claim = Action::Claim(Claim {
        reason: ClaimReason::Start,
        failed: false,
    });
    assert_eq!(
        testing::apply_on(&ctx, &run, &claim).await.unwrap(),
        Applied::Done
    );
    let running = get(&ns, "r").await;
    let writes = Writes::default();
    let ctx = testing::detached(writes.client().await);
    let stop = Action::Close(Close {
        reason: CloseReason::StopRequested,
        message: "stopped by the test".into(),
        failed: false,
    });
    let applied = testing::apply_on(&ctx, &running, &stop).await.unwrap();
    assert_eq!(applied, Applied::Done);
    let w = writes.taken();
    let [seal, record] = positions(&w, "POST", "/ledgersegments")[..] else {
        panic!("the seal and the record, two appends: {w:#?}");
    };
    let ended = one(&w, "PUT", "/agentruns/r/status");
    let lease = format!("/leases/{}", baton::fence::run_lease_name("r"));
    let released = one(&w, "PUT", &lease);
    let deleted = one(&w, "DELETE", "/pods/r-w1");
    assert!(seal < ended, "the seal before the terminal status: {w:#?}");
    assert!(
        ended < record,
        "the terminal status before the record: {w:#?}"
    );
    assert!(
        ended < released,
        "the Lease released after the status: {w:#?}"
    );
    assert!(
        ended < deleted,
        "the old pod deleted after the status: {w:#?}"
    );
    let now = status(&get(&ns, "r").await);
    assert!(now.phase.is_terminal(), "{now:?}");
    ns.cleanup().await;
}
