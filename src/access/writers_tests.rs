use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::crd::v1alpha1::LedgerSegmentSpec;

fn facts() -> RunFacts {
    RunFacts {
        uid: "u-1".into(),
        fence: Fence::new(3),
        worker_user: "system:serviceaccount:ns:baton-run-r".into(),
        thread_uid: Some("t-1".into()),
    }
}

fn with_thread_label(mut seg: LedgerSegment, thread_uid: &str) -> LedgerSegment {
    seg.labels_mut()
        .insert(THREAD_UID_LABEL.into(), thread_uid.into());
    seg
}

fn segment(name: &str, run: &str, fence: i64, uid: Option<&str>) -> LedgerSegment {
    let mut seg = LedgerSegment::new(
        name,
        LedgerSegmentSpec {
            run: run.into(),
            seq: 4,
            fence: Fence::new(fence),
            format: 1,
            events: vec![],
        },
    );
    if let Some(uid) = uid {
        seg.metadata.labels = Some([(RUN_UID_LABEL.to_string(), uid.to_string())].into());
    }
    seg
}

/// A case: its name, the segment, who writes it, the run it names, the field a refusal names.
type SegmentCase<'a> = (
    &'a str,
    LedgerSegment,
    Writer,
    Option<&'a RunFacts>,
    Option<&'a str>,
);

#[test]
fn segment_cases() {
    let run = facts();
    let no_turn = RunFacts {
        thread_uid: None,
        ..facts()
    };
    let worker = Writer::RunWorker;
    let good = segment("r-000004", "r", 3, Some("u-1"));
    let cases: Vec<SegmentCase> = vec![
        (
            "the worker at its fence",
            good.clone(),
            worker,
            Some(&run),
            None,
        ),
        (
            "the controller's seal at fence + 1",
            segment("r-000004", "r", 4, Some("u-1")),
            Writer::Controller,
            Some(&run),
            None,
        ),
        (
            "a worker ahead of the run",
            segment("r-000004", "r", 4, Some("u-1")),
            worker,
            Some(&run),
            Some("spec.fence"),
        ),
        (
            "the controller two ahead",
            segment("r-000004", "r", 5, Some("u-1")),
            Writer::Controller,
            Some(&run),
            Some("spec.fence"),
        ),
        (
            "anyone else",
            good.clone(),
            Writer::Other,
            Some(&run),
            Some("only its worker"),
        ),
        (
            "a name of another run",
            segment("victim-000004", "r", 3, Some("u-1")),
            worker,
            Some(&run),
            Some("metadata.name"),
        ),
        (
            "a name off by a position",
            segment("r-000005", "r", 3, Some("u-1")),
            worker,
            Some(&run),
            Some("metadata.name"),
        ),
        (
            "another run's UID",
            segment("r-000004", "r", 3, Some("u-2")),
            worker,
            Some(&run),
            Some("metadata.labels"),
        ),
        (
            "no UID label",
            segment("r-000004", "r", 3, None),
            worker,
            Some(&run),
            Some("metadata.labels"),
        ),
        (
            "its thread's UID label",
            with_thread_label(good.clone(), "t-1"),
            worker,
            Some(&run),
            None,
        ),
        (
            "another thread's UID label",
            with_thread_label(good.clone(), "t-2"),
            worker,
            Some(&run),
            Some("metadata.labels[baton.dev/thread-uid]"),
        ),
        (
            "a thread label on a run that is no turn",
            with_thread_label(good.clone(), "t-1"),
            worker,
            Some(&no_turn),
            Some("metadata.labels[baton.dev/thread-uid]"),
        ),
        (
            "a run that does not exist",
            good.clone(),
            Writer::Controller,
            None,
            Some("spec.run"),
        ),
    ];
    for (case, seg, writer, run, want) in cases {
        let got = segment_refusal(&seg, writer, "someone", run);
        match (want, &got) {
            (None, None) => {}
            (Some(field), Some(text)) if text.contains(field) => {}
            _ => panic!("{case}: got {got:?}, want {want:?}"),
        }
    }
}

/// Another writer learns nothing it may not read: the same words whether the run exists,
/// and never its UID, fence or worker.
#[test]
fn a_stranger_is_told_nothing_of_the_run() {
    let run = facts();
    let forged = segment("r-000004", "r", 3, Some("u-2"));
    let told = segment_refusal(&forged, Writer::Other, "mallory", Some(&run)).unwrap();
    let unknown = segment_refusal(&forged, Writer::Other, "mallory", None).unwrap();
    assert_eq!(told, unknown, "whether the run exists is not told");
    for secret in [run.uid.as_str(), run.worker_user.as_str(), "fence"] {
        assert!(!told.contains(secret), "{secret} told: {told}");
    }
}

#[test]
fn writers_are_told_apart() {
    let run = facts();
    let controller = vec!["system:serviceaccount:baton:baton".to_string()];
    assert_eq!(
        Writer::of("system:serviceaccount:baton:baton", &controller, Some(&run)),
        Writer::Controller
    );
    assert_eq!(
        Writer::of(&run.worker_user, &controller, Some(&run)),
        Writer::RunWorker
    );
    assert_eq!(
        Writer::of(
            "system:serviceaccount:ns:baton-run-x",
            &controller,
            Some(&run)
        ),
        Writer::Other
    );
    assert_eq!(
        Writer::of(&run.worker_user, &controller, None),
        Writer::Other
    );
}

fn lease(owner: &str) -> Lease {
    let mut lease = Lease::default();
    lease.metadata.name = Some("run.r".into());
    lease.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "baton.dev/v1alpha1".into(),
        kind: "AgentRun".into(),
        name: owner.into(),
        uid: format!("uid-{owner}"),
        ..OwnerReference::default()
    }]);
    lease
}

#[test]
fn lease_cases() {
    let (mine, other) = (lease("r"), lease("victim"));
    let worker = "system:serviceaccount:ns:baton-run-r";
    let stranger = "system:serviceaccount:ns:baton-run-x";
    assert_eq!(lease_refusal(&mine, &mine, Writer::RunWorker, worker), None);
    let repointed = lease_refusal(&mine, &other, Writer::RunWorker, worker).unwrap();
    assert!(
        repointed.starts_with("metadata.ownerReferences"),
        "{repointed}"
    );
    assert_eq!(lease_refusal(&mine, &other, Writer::Controller, "c"), None);
    assert!(lease_refusal(&mine, &mine, Writer::Other, stranger).is_some());
    assert_eq!(lease_refusal(&mine, &mine, Writer::Other, "alice"), None);
}

#[test]
fn only_renewals_by_the_controller_or_the_runs_own_worker_skip_the_read() {
    let (mine, other) = (lease("r"), lease("victim"));
    let controller = vec!["system:serviceaccount:baton:baton".to_string()];
    let plain =
        |old, new, user: &str| lease_update_is_plain(old, new, user, &controller, "ns", "r");
    assert!(plain(&mine, &mine, "system:serviceaccount:ns:baton-run-r"));
    assert!(plain(&mine, &mine, &controller[0]));
    // A re-pointing, another run's worker, a configured identity or a stranger: read the run.
    assert!(!plain(
        &mine,
        &other,
        "system:serviceaccount:ns:baton-run-r"
    ));
    assert!(!plain(&mine, &other, &controller[0]));
    assert!(!plain(&mine, &mine, "system:serviceaccount:ns:baton-run-x"));
    assert!(!plain(
        &mine,
        &mine,
        "system:serviceaccount:other:baton-run-r"
    ));
    assert!(!plain(&mine, &mine, "system:serviceaccount:ns:deployer"));
    assert!(!plain(&mine, &mine, "alice"));
}
