//! A ledger append the controller's copy of its run admits is admitted without a read; any
//! other is decided on the run read afresh. The client here reaches nothing (port 1 of
//! loopback): a check that reads fails, so each case shows whether a read was made.

use kube::runtime::reflector::store::Writer as StoreWriter;
use kube::runtime::watcher;

use super::*;
use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::Phase;
use crate::fence::test_segment;
use crate::rbac::worker_username;

const NS: &str = "ns";
const CONTROLLER: &str = "system:serviceaccount:baton-system:baton";

fn unreachable() -> Client {
    let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a URL"));
    Client::try_from(config).expect("a client")
}

/// A reviewer whose copy of the runs holds run `r` at `fence` (none: no copy).
fn reviewer(fence: Option<i64>) -> Reviewer {
    let known = fence.map(|fence| {
        let run = AgentRun::builder("r")
            .namespace(NS)
            .stored("uid-r")
            .at(Phase::Running, fence, 0)
            .build();
        let mut writer = StoreWriter::<AgentRun>::default();
        writer.apply_watcher_event(&watcher::Event::Apply(run));
        writer.as_reader()
    });
    Reviewer::new(unreachable(), vec![CONTROLLER.into()], 1024).with_known_runs(known)
}

/// The review of `user` creating position 1 of run `r` at `fence`, labelled with `uid`.
fn append(user: &str, fence: i64, uid: &str) -> AdmissionRequest<DynamicObject> {
    let mut segment = test_segment(1, fence, vec![]);
    segment.metadata.namespace = Some(NS.into());
    segment.metadata.labels = Some([(RUN_UID_LABEL.to_string(), uid.to_string())].into());
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "baton.dev", "version": "v1alpha1", "kind": "LedgerSegment"},
            "resource": {"group": "baton.dev", "version": "v1alpha1", "resource": "ledgersegments"},
            "name": segment.metadata.name,
            "namespace": NS,
            "operation": "CREATE",
            "userInfo": {"username": user},
            "object": segment,
            "dryRun": false,
        }
    });
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review).expect("a review");
    review.try_into().expect("a request")
}

async fn outcome(reviewer: &Reviewer, request: &AdmissionRequest<DynamicObject>) -> &'static str {
    match reviewer.check(request).await {
        Ok(()) => "admitted",
        Err(ReviewError::Api(_)) => "read the run",
        Err(ReviewError::Refused(_)) => "refused",
        Err(ReviewError::Malformed { .. }) => "malformed",
    }
}

#[tokio::test]
async fn an_append_the_copy_admits_is_admitted_without_a_read() {
    let worker = worker_username(NS, "r");
    let known = reviewer(Some(3));
    // (case, user, the segment's fence, its UID label, what the review does)
    let cases = [
        (
            "the worker, at the run's fence",
            &*worker,
            3,
            "uid-r",
            "admitted",
        ),
        (
            "the worker, at an earlier fence",
            &worker,
            2,
            "uid-r",
            "admitted",
        ),
        (
            "the controller's seal, at fence + 1",
            CONTROLLER,
            4,
            "uid-r",
            "admitted",
        ),
        // The claim the copy has not shown yet: the live run decides.
        (
            "the worker, ahead of the copy",
            &worker,
            4,
            "uid-r",
            "read the run",
        ),
        ("another UID", &worker, 3, "uid-other", "read the run"),
        ("another user", "mallory", 3, "uid-r", "read the run"),
    ];
    for (case, user, fence, uid, expected) in cases {
        let request = append(user, fence, uid);
        assert_eq!(outcome(&known, &request).await, expected, "{case}");
    }
    let no_copy = reviewer(None);
    let request = append(&worker, 3, "uid-r");
    assert_eq!(outcome(&no_copy, &request).await, "read the run", "no copy");
    let misnamed = {
        let mut request = append(&worker, 3, "uid-r");
        request.name = "r-9".into();
        if let Some(object) = request.object.as_mut() {
            object.metadata.name = Some("r-9".into());
        }
        request
    };
    assert_eq!(
        outcome(&known, &misnamed).await,
        "read the run",
        "a name that is not its position's is refused on the live run, as before"
    );
}
