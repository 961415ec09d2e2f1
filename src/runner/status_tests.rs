use super::*;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn pod(node: Option<&str>, phase: Option<&str>, deleting: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            deletion_timestamp: deleting.then(|| Time(Timestamp::now())),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_string),
            ..Default::default()
        }),
        status: phase.map(|p| PodStatus {
            phase: Some(p.to_string()),
            ..Default::default()
        }),
    }
}

#[test]
fn decide_for_unknown_pods() {
    assert_eq!(
        decide(&pod(None, Some("Pending"), false), "n"),
        Action::Bind
    );
    assert_eq!(decide(&pod(None, None, true), "n"), Action::Ignore);
    assert_eq!(
        decide(&pod(Some("other"), Some("Pending"), false), "n"),
        Action::Ignore
    );
    assert_eq!(
        decide(&pod(Some("n"), Some("Pending"), false), "n"),
        Action::Start
    );
    assert_eq!(decide(&pod(Some("n"), None, false), "n"), Action::Start);
    assert_eq!(
        decide(&pod(Some("n"), Some("Running"), false), "n"),
        Action::Lost
    );
    assert_eq!(
        decide(&pod(Some("n"), Some("Failed"), false), "n"),
        Action::Ignore
    );
    assert_eq!(
        decide(&pod(Some("n"), Some("Succeeded"), false), "n"),
        Action::Ignore
    );
    assert_eq!(
        decide(&pod(Some("n"), Some("Running"), true), "n"),
        Action::ConfirmDeletion
    );
    assert_eq!(
        decide(&pod(Some("n"), Some("Failed"), true), "n"),
        Action::ConfirmDeletion
    );
}

#[test]
fn pending_with_waiting_container_is_not_started() {
    let mut p = pod(Some("n"), Some("Pending"), false);
    let info = ContainerInfo {
        name: "c".into(),
        image: "i".into(),
        pid: None,
    };
    let now = Timestamp::now();
    let waiting = ContainerRun::Waiting {
        reason: "CreateContainerConfigError".into(),
        message: None,
    };
    p.status = Some(pod_status(&waiting, &info, now, now));
    assert_eq!(decide(&p, "n"), Action::Start);
    p.status = Some(pod_status(
        &ContainerRun::Running { started_at: now },
        &info,
        now,
        now,
    ));
    assert_eq!(decide(&p, "n"), Action::Lost);
}

fn info() -> ContainerInfo {
    ContainerInfo {
        name: "worker".into(),
        image: "baton:dev".into(),
        pid: Some(42),
    }
}

#[test]
fn running_status() {
    let now = Timestamp::now();
    let s = pod_status(
        &ContainerRun::Running { started_at: now },
        &info(),
        now,
        now,
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.pod_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(s.host_ip.as_deref(), Some("127.0.0.1"));
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert!(cs.ready);
    assert_eq!(cs.container_id.as_deref(), Some("baton-runner://42"));
    assert_eq!(
        cs.state
            .as_ref()
            .unwrap()
            .running
            .as_ref()
            .unwrap()
            .started_at,
        Some(Time(now))
    );
    let ready = s
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
}

fn terminated_status(exit: Exit) -> (String, ContainerStateTerminated) {
    let now = Timestamp::now();
    let run = ContainerRun::Terminated {
        started_at: Some(now),
        finished_at: now,
        exit,
    };
    let s = pod_status(&run, &info(), now, now);
    let cs = s.container_statuses.unwrap().remove(0);
    (s.phase.unwrap(), cs.state.unwrap().terminated.unwrap())
}

#[test]
fn exits_map_to_phases_and_reasons() {
    let (phase, t) = terminated_status(Exit::Code(0));
    assert_eq!(
        (phase.as_str(), t.exit_code, t.reason.as_deref()),
        ("Succeeded", 0, Some("Completed"))
    );
    let (phase, t) = terminated_status(Exit::Code(3));
    assert_eq!(
        (phase.as_str(), t.exit_code, t.reason.as_deref()),
        ("Failed", 3, Some("Error"))
    );
    let (phase, t) = terminated_status(Exit::Signal(9));
    assert_eq!(
        (phase.as_str(), t.exit_code, t.signal, t.reason.as_deref()),
        ("Failed", 137, Some(9), Some("Killed"))
    );
    let (phase, t) = terminated_status(Exit::StartError("no such file".into()));
    assert_eq!(
        (phase.as_str(), t.exit_code, t.reason.as_deref()),
        ("Failed", 128, Some("StartError"))
    );
    let (phase, t) = terminated_status(Exit::Lost);
    assert_eq!(
        (phase.as_str(), t.reason.as_deref()),
        ("Failed", Some("ContainerStatusUnknown"))
    );
}

#[test]
fn waiting_status_is_pending() {
    let now = Timestamp::now();
    let run = ContainerRun::Waiting {
        reason: "CreateContainerConfigError".into(),
        message: Some("secret".into()),
    };
    let s = pod_status(&run, &info(), now, now);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let w = s
        .container_statuses
        .unwrap()
        .remove(0)
        .state
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("CreateContainerConfigError"));
}
