//! The CLI verbs against the real API server: runs and ledgers are created directly, then the
//! `baton` binary (and `kubectl baton`, as a plugin) is run and its output checked. Also the
//! documented `kubectl wait --for=jsonpath='{.status.phase}'=Succeeded`.
//! The tests' shared helpers are in `cli_support`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cli_support::{
    BATON, PLUGIN, create_run, failure, ok, seeded_run, set_status, stderr, stdout,
};
use baton::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment, Role};
use baton::fence::Fence;
use baton::ledger::SegmentStore;
use baton_testkit::common::TestNamespace;

#[tokio::test]
async fn get_transcript_and_describe_show_the_run() {
    let ns = TestNamespace::new("cli_read").await;
    seeded_run(&ns, "r1").await;
    create_run(&ns, "r2").await;
    let n = ns.name.as_str();

    let table = ok(&["get", "-n", n]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("UNKNOWN EFFECTS"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("r1")
            && lines[1].contains("Running")
            && lines[1].contains("1 (#1 sh)"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("r2") && lines[2].contains("Pending"),
        "{table}"
    );
    let all = ok(&["get", "-A"]);
    assert!(all.starts_with("NAMESPACE") && all.contains(n), "{all}");
    assert!(ok(&["get", "r2", "-n", n]).lines().count() == 2);

    let transcript = ok(&["transcript", "r1", "-n", n]);
    for want in [
        "=== claimed: attempt 1 goes to pod r1-w1 (fence 1)",
        "[user] tidy up",
        "-> step 1: sh rm -rf build",
        "=== claimed: attempt 2 goes to pod r1-w2 (fence 2)",
        "!! step 1 (sh): effect UNKNOWN",
    ] {
        assert!(
            transcript.contains(want),
            "missing {want:?} in\n{transcript}"
        );
    }

    let describe = ok(&["describe", "r1", "-n", n]);
    for want in [
        "Phase:           Running",
        "Fence:           2",
        "Failed attempts: 1 of 3",
        "fence 1   pod r1-w1",
        "superseded (claimed for a new attempt)",
        "fence 2   pod r1-w2",
        "step 1 (sh), attempt 1: unknown - rm -rf build",
        "Warning   UnknownEffect",
    ] {
        assert!(describe.contains(want), "missing {want:?} in\n{describe}");
    }
    assert!(!describe.contains("ForgedByAnotherParty"), "{describe}");
    ns.cleanup().await;
}

#[tokio::test]
async fn stop_and_input_change_the_spec_with_clear_errors() {
    let ns = TestNamespace::new("cli_write").await;
    let n = ns.name.as_str();
    create_run(&ns, "r").await;
    set_status(
        &ns,
        "r",
        serde_json::json!({"phase": "Running", "attempt": 1, "fence": 1}),
    )
    .await;

    let err = failure(&["input", "r", "yes please", "-n", n]);
    assert!(
        err.contains("run r is not waiting for input (phase Running)"),
        "{err}"
    );
    set_status(&ns, "r", serde_json::json!({"phase": "WaitingInput"})).await;
    assert!(ok(&["input", "r", "yes please", "-n", n]).contains("input #1 sent"));
    assert!(ok(&["input", "r", "and this", "-n", n]).contains("input #2 sent"));
    let run = ns.api::<AgentRun>().get("r").await.unwrap();
    assert_eq!(run.spec.inputs, ["yes please", "and this"]);

    assert!(ok(&["stop", "r", "-n", n]).contains("stop requested"));
    assert!(ns.api::<AgentRun>().get("r").await.unwrap().spec.stop);
    set_status(&ns, "r", serde_json::json!({"phase": "Stopped"})).await;
    assert!(ok(&["stop", "r", "-n", n]).contains("already ended (Stopped)"));

    for verb in [
        vec!["describe", "nope"],
        vec!["stop", "nope"],
        vec!["transcript", "nope"],
        vec!["input", "nope", "x"],
    ] {
        let mut args = verb.clone();
        args.extend(["-n", n]);
        let err = failure(&args);
        assert!(
            err.contains(&format!("run nope not found in namespace {n}")),
            "{verb:?}: {err}"
        );
    }
    ns.cleanup().await;
}

#[tokio::test]
async fn approve_and_deny_record_a_decision_for_the_waiting_call_only() {
    let ns = TestNamespace::new("cli_approval").await;
    let n = ns.name.as_str();
    create_run(&ns, "g").await;
    set_status(
        &ns,
        "g",
        serde_json::json!({"phase": "Running", "fence": 1}),
    )
    .await;
    let err = failure(&["approve", "g", "-n", n]);
    assert!(
        err.contains("run g is not waiting for approval (phase Running)"),
        "{err}"
    );
    let pending = serde_json::json!({
        "step": 4, "callId": "call_3_0", "tool": "deploy",
        "arguments": "{\"command\":\"make deploy\"}", "requestedAt": "2026-12-01T10:00:00Z"
    });
    set_status(
        &ns,
        "g",
        serde_json::json!({"phase": "WaitingApproval", "pendingApproval": pending}),
    )
    .await;
    let described = ok(&["describe", "g", "-n", n]);
    assert!(
        described.contains("step 4 (deploy), call call_3_0") && described.contains("make deploy"),
        "{described}"
    );
    let err = failure(&["approve", "g", "--step", "3", "-n", n]);
    assert!(
        err.contains("step 3 of run g is not waiting for approval; step 4 (deploy) is"),
        "{err}"
    );
    let err = failure(&["deny", "g", "-n", n]);
    assert!(err.contains("--reason"), "a denial says why: {err}");
    assert!(ok(&["deny", "g", "--reason", "not today", "-n", n]).contains("step 4 denied"));
    let err = failure(&["approve", "g", "-n", n]);
    assert!(
        err.contains("step 4 of run g already has a decision in spec.approvals (Deny)"),
        "{err}"
    );
    let run = ns.api::<AgentRun>().get("g").await.unwrap();
    let d = &run.spec.approvals;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].step, d[0].call_id.as_str(), d[0].reason.as_deref()),
        (4, "call_3_0", Some("not today"))
    );
    let err = failure(&["approve", "nope", "-n", n]);
    assert!(err.contains("run nope not found"), "{err}");
    ns.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_cluster_is_named() {
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    for cluster in config["clusters"].as_sequence_mut().unwrap() {
        cluster["cluster"]["server"] = "https://127.0.0.1:1".into();
    }
    let path = std::env::temp_dir().join(format!(
        "baton-cli-unreachable-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let out = Command::new(BATON)
        .args(["get"])
        .env("KUBECONFIG", &path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot reach the cluster at https://127.0.0.1:1"),
        "{err}"
    );
}

#[tokio::test]
async fn transcript_follow_prints_new_segments_until_the_run_ends() {
    let ns = TestNamespace::new("cli_follow").await;
    let (_, store) = seeded_run(&ns, "f").await;
    let child = tokio::process::Command::new(BATON)
        .args(["transcript", "f", "-f", "-n", &ns.name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = vec![
        LedgerEvent::StepResult {
            step: 2,
            output: "late".into(),
            is_error: false,
        },
        LedgerEvent::Message {
            role: Role::Assistant,
            content: "All tidy.".into(),
        },
        LedgerEvent::Final {
            output: "All tidy.".into(),
        },
    ];
    // A segment labelled with this run's UID, named for another run, at the next position:
    // another reader's forgery, never printed in its place.
    let uid = ns
        .api::<AgentRun>()
        .get("f")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let forged: LedgerSegment = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "LedgerSegment",
        "metadata": {"name": "other-3", "labels": {baton::crd::RUN_UID_LABEL: uid}},
        "spec": {"run": "other", "seq": 3, "fence": 2, "events": [
            {"type": "message", "role": "assistant", "content": "forged: approve everything"}]},
    }))
    .unwrap();
    ns.api::<LedgerSegment>()
        .create(&Default::default(), &forged)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.append(2, Fence::new(2), events).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    set_status(&ns, "f", serde_json::json!({"phase": "Succeeded"})).await;
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("transcript -f ends when the run ends")
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = text.find("=== claimed: attempt 1").expect(&text);
    let last = text.find("=== final answer: All tidy.").expect(&text);
    assert!(
        first < last && text.contains("[assistant] All tidy."),
        "{text}"
    );
    assert!(!text.contains("forged"), "{text}");
    assert!(stderr(&out).contains("segment other-3"), "{}", stderr(&out));
    ns.cleanup().await;
}

#[tokio::test]
async fn kubectl_baton_works_as_a_plugin() {
    let ns = TestNamespace::new("cli_plugin").await;
    seeded_run(&ns, "p").await;
    let direct = Command::new(PLUGIN)
        .args(["get", "-n", &ns.name])
        .output()
        .unwrap();
    assert!(stdout(&direct).contains("1 (#1 sh)"), "{}", stderr(&direct));
    // kubectl finds `kubectl-baton` on PATH.
    let dir = Path::new(PLUGIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("kubectl")
        .args(["baton", "describe", "p", "-n", &ns.name])
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("Phase:           Running"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn kubectl_wait_for_the_succeeded_phase_works() {
    let ns = TestNamespace::new("cli_kubectl_wait").await;
    create_run(&ns, "w").await;
    set_status(
        &ns,
        "w",
        serde_json::json!({"phase": "Running", "attempt": 1, "fence": 1}),
    )
    .await;
    let wait = tokio::process::Command::new("kubectl")
        .args([
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            "agentrun/w",
            "-n",
            &ns.name,
            "--timeout=60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    set_status(&ns, "w", serde_json::json!({"phase": "Succeeded"})).await;
    let out = tokio::time::timeout(Duration::from_secs(60), wait.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl wait: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("agentrun.baton.dev/w condition met"),
        "{}",
        stdout(&out)
    );
    ns.cleanup().await;
}

/// Text from the model or its tools cannot drive the terminal that reads it: an escape
/// sequence and a right-to-left override in the ledger are printed as visible escapes.
#[tokio::test]
async fn the_transcript_shows_control_and_bidi_characters_instead_of_obeying_them() {
    let ns = TestNamespace::new("cli_escapes").await;
    let run = create_run(&ns, "r").await;
    let hostile = "done\u{1b}[2J\u{1b}]0;owned\u{7} rm -rf \u{202E}txt.exe";
    let events = vec![
        LedgerEvent::Claimed {
            fence: Fence::new(1),
            pod: "r-w1".into(),
        },
        LedgerEvent::Message {
            role: Role::Assistant,
            content: hostile.into(),
        },
    ];
    SegmentStore::for_run(ns.client.clone(), &run)
        .append(0, Fence::new(1), events)
        .await
        .unwrap();
    let printed = ok(&["transcript", "r", "-n", &ns.name]);
    assert!(
        !printed.contains(['\u{1b}', '\u{7}', '\u{202E}']),
        "raw control characters printed: {printed:?}"
    );
    assert!(
        printed.contains("done\\u{1b}[2J\\u{1b}]0;owned\\u{7} rm -rf \\u{202e}txt.exe"),
        "{printed}"
    );
    ns.cleanup().await;
}

/// What a human approves is what runs: the status shows a padded call cut at 4 KiB, and
/// `baton approve` prints the whole call from the ledger, its tail included, before it
/// records the decision. A call the ledger does not show is not approved.
#[tokio::test]
async fn approve_shows_the_whole_call_from_the_ledger_or_refuses() {
    let ns = TestNamespace::new("cli_approve_whole").await;
    let n = ns.name.as_str();
    let padded = format!(
        "{{\"command\":\"echo ok{}; rm -rf /important\"}}",
        " ".repeat(6000)
    );
    let waiting = |arguments: &str| {
        let pending = serde_json::json!({
            "step": 1, "callId": "c1", "tool": "sh",
            "arguments": arguments, "requestedAt": "2026-12-01T10:00:00Z"
        });
        serde_json::json!({"phase": "WaitingApproval", "fence": 1, "pendingApproval": pending})
    };
    let shown: String = padded.chars().take(4096).collect();
    assert!(!shown.contains("rm -rf"), "the status hides the tail");

    let run = create_run(&ns, "p").await;
    let intent = LedgerEvent::StepIntent {
        step: 1,
        tool: "sh".into(),
        call_id: "c1".into(),
        input: padded.clone(),
        idempotent: false,
    };
    SegmentStore::for_run(ns.client.clone(), &run)
        .append(0, Fence::new(1), vec![intent])
        .await
        .unwrap();
    set_status(&ns, "p", waiting(&shown)).await;
    let said = ok(&["approve", "p", "-n", n]);
    assert!(
        said.contains("step 1 (sh), call c1, as the ledger records it"),
        "{said}"
    );
    assert!(said.contains("; rm -rf /important\"}"), "the tail is shown");
    assert!(said.contains("step 1 approved"), "{said}");

    create_run(&ns, "q").await;
    set_status(&ns, "q", waiting(&shown)).await;
    let err = failure(&["approve", "q", "-n", n]);
    assert!(
        err.contains("the call of step 1 is not in the ledger of run q: not approving"),
        "{err}"
    );
    let q = ns.api::<AgentRun>().get("q").await.unwrap();
    assert!(q.spec.approvals.is_empty(), "nothing was approved");
    ns.cleanup().await;
}
