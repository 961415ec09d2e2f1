//! Who may do what through the server, and what its answers say.

use baton::crd::v1alpha1::{AgentRun, ApprovalPolicy, LeaseSpec, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

async fn wait_phase(runs: &Api<AgentRun>, name: &str, phase: Phase) {
    wait_until(T, &format!("{name} {phase}"), || async {
        runs.get(name)
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.phase == phase)
    })
    .await;
}

#[tokio::test]
async fn each_request_is_the_callers_own_and_kubernetes_rbac_decides() {
    let ns = TestNamespace::new("server-auth").await;
    let other = TestNamespace::new("server-auth-other").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    // Mallory may see runs but not read transcripts.
    let mallory = person(
        &ns,
        "mallory",
        vec![rule(&["agentruns"], &["get", "list", "watch"])],
    )
    .await;
    let runs: Api<AgentRun> = ns.api();
    let run = scripted_run(
        "quiet",
        vec![final_turn("hi", 0)],
        vec![],
        LeaseSpec::default(),
    );
    runs.create(&PostParams::default(), &run).await.unwrap();
    let base = format!("{url}/api/v1/namespaces/{}", ns.name);

    let (code, body) = get(&format!("{base}/runs"), None).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (401, Some("Unauthorized")),
        "{body}"
    );
    let (code, body) = get(&format!("{base}/runs"), Some("not a token")).await;
    assert_eq!(code, 401, "{body}");

    let (code, body) = get(&format!("{base}/runs"), Some(&alice)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["items"][0]["metadata"]["name"], "quiet");
    let (code, body) = get(&format!("{base}/runs/quiet"), Some(&mallory)).await;
    assert_eq!(code, 200, "{body}");

    // The stream is refused before it opens, with the API server's own words.
    let (code, body) = get(&format!("{base}/runs/quiet/events"), Some(&mallory)).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (403, Some("Forbidden")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("ledgersegments"),
        "{body}"
    );
    let (code, _) = get(&format!("{base}/threads"), Some(&mallory)).await;
    assert_eq!(code, 403);
    let (code, _) = post(&format!("{base}/runs/quiet/stop"), &mallory, json!({})).await;
    assert_eq!(code, 403, "mallory may not patch runs");

    // Alice's rights end at her namespace.
    let elsewhere = format!("{url}/api/v1/namespaces/{}/runs", other.name);
    let (code, body) = get(&elsewhere, Some(&alice)).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (403, Some("Forbidden")),
        "{body}"
    );
    let (code, body) = get(&format!("{base}/runs/nope"), Some(&alice)).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (404, Some("NotFound")),
        "{body}"
    );
    let (code, body) = get(&format!("{base}/runs?phase=Sleeping"), Some(&alice)).await;
    assert_eq!(code, 400);
    assert!(
        body["message"].as_str().unwrap().starts_with("phase: "),
        "{body}"
    );
    let (code, body) = get(&format!("{base}/runs/quiet/events?after=x"), Some(&alice)).await;
    assert_eq!(code, 400);
    assert!(
        body["message"].as_str().unwrap().starts_with("after: "),
        "{body}"
    );
    ns.cleanup().await;
    other.cleanup().await;
}

#[tokio::test]
async fn stop_inputs_and_approvals_answer_what_happened() {
    let ns = TestNamespace::new("server-requests").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let runs: Api<AgentRun> = ns.api();
    let counter = counter_file("server-approval");
    let mut deploy = shell_tool("deploy", false);
    deploy.approval = Some(ApprovalPolicy::Required);
    let cmd = format!("echo x >> {}", counter.display());
    let script = vec![
        shell_turn("deploying", "deploy", &cmd, 0),
        final_turn("done", 0),
    ];
    let run = scripted_run("gated", script, vec![deploy], LeaseSpec::default());
    runs.create(&PostParams::default(), &run).await.unwrap();
    let base = format!("{url}/api/v1/namespaces/{}/runs/gated", ns.name);

    let (code, body) = post(
        &format!("{base}/approvals"),
        &alice,
        json!({"decision": "Approve"}),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("NotWaitingForApproval")),
        "{body}"
    );

    let mut first = run_pod(&ns, "gated", 1).await;
    assert_eq!(first.wait(T).await, 0, "{}", first.log_text());
    wait_phase(&runs, "gated", Phase::WaitingApproval).await;

    // Bad bodies name the field and change nothing.
    let (code, body) = post(
        &format!("{base}/approvals"),
        &alice,
        json!({"decision": "Maybe"}),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("decision"),
        "{body}"
    );
    let (code, body) = post(
        &format!("{base}/approvals"),
        &alice,
        json!({"decision": "Deny"}),
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        body["message"].as_str().unwrap().starts_with("reason: "),
        "{body}"
    );
    let (code, body) = post(&format!("{base}/inputs"), &alice, json!({})).await;
    assert_eq!(code, 400);
    assert!(body["message"].as_str().unwrap().contains("text"), "{body}");
    let (code, body) = post(&format!("{base}/inputs"), &alice, json!({"text": "hello"})).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("NotWaitingForInput")),
        "{body}"
    );
    let (code, body) = post(
        &format!("{base}/approvals"),
        &alice,
        json!({"decision": "Approve", "step": 7}),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("OtherStep")),
        "{body}"
    );
    assert!(runs.get("gated").await.unwrap().spec.approvals.is_empty());

    // The approval shows the whole call it approved; a second one is refused.
    let (code, body) = post(
        &format!("{base}/approvals"),
        &alice,
        json!({"decision": "Approve", "reason": "ok"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (body["step"].as_i64(), body["call"]["tool"].as_str()),
        (Some(1), Some("deploy"))
    );
    assert!(
        body["call"]["arguments"]
            .as_str()
            .unwrap()
            .contains("echo x"),
        "{body}"
    );
    let (code, body) = post(
        &format!("{base}/approvals"),
        &alice,
        json!({"decision": "Approve"}),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("AlreadyDecided")),
        "{body}"
    );

    let mut second = run_pod(&ns, "gated", 2).await;
    assert_eq!(second.wait(T).await, 0, "{}", second.log_text());
    wait_phase(&runs, "gated", Phase::Succeeded).await;
    assert_eq!(count(&counter), 1, "the approved call ran once");
    let (code, body) = post(&format!("{base}/stop"), &alice, json!({})).await;
    assert_eq!(
        (code, body["stopRequested"].as_bool()),
        (200, Some(false)),
        "{body}"
    );
    assert_eq!(body["phase"], "Succeeded");
    ns.cleanup().await;
}

#[tokio::test]
async fn a_stop_request_stops_a_live_run_and_its_stream_ends() {
    let ns = TestNamespace::new("server-stop").await;
    let _controller = start_controller(&ns);
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let runs: Api<AgentRun> = ns.api();
    let script = (1..=40)
        .map(|i| shell_turn("working", "sh", &format!("echo {i}"), 500))
        .collect();
    let run = scripted_run(
        "long",
        script,
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    runs.create(&PostParams::default(), &run).await.unwrap();
    let base = format!("{url}/api/v1/namespaces/{}/runs/long", ns.name);
    let mut stream = SseReader::open(&format!("{base}/events"), &alice, None).await;
    let mut worker = run_pod(&ns, "long", 1).await;
    wait_phase(&runs, "long", Phase::Running).await;
    let (code, body) = post(&format!("{base}/stop"), &alice, json!({})).await;
    assert_eq!(
        (code, body["stopRequested"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    let end = stream.until_end().await.pop().unwrap();
    assert_eq!(
        (end.event.as_str(), end.data["phase"].as_str()),
        ("end", Some("Stopped")),
        "{end:?}"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_name_that_is_not_a_kubernetes_name_never_reaches_the_api_server() {
    let ns = TestNamespace::new("server-names").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    for (path, param) in [
        ("/api/v1/namespaces/Default/runs", "ns"),
        ("/api/v1/namespaces/x/runs/..%2F..%2Fsecrets", "run"),
        ("/api/v1/namespaces/x/threads/a%20b/events", "thread"),
    ] {
        let (code, body) = get(&format!("{url}{path}"), Some(&alice)).await;
        assert_eq!(code, 400, "{path}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{param}: ")),
            "{path}: {message}"
        );
    }
    ns.cleanup().await;
}

/// An open stream ends once its caller's rights are revoked (asked again every
/// `ACCESS_RECHECK`, a second here), with an `error` event saying why.
#[tokio::test]
async fn a_stream_ends_when_its_callers_access_is_revoked() {
    let ns = TestNamespace::new("server-revoked").await;
    let recheck = std::time::Duration::from_secs(1);
    let (url, _server) = start_server_with(|s| s.with_access_recheck(recheck)).await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let runs: Api<AgentRun> = ns.api();
    let run = scripted_run(
        "watched",
        vec![final_turn("hi", 0)],
        vec![],
        LeaseSpec::default(),
    );
    runs.create(&PostParams::default(), &run).await.unwrap();
    let events = format!("{url}/api/v1/namespaces/{}/runs/watched/events", ns.name);
    let mut stream = SseReader::open(&events, &alice, None).await;
    let first = stream.next().await.expect("the run's status");
    assert_eq!(first.event, "status", "{first:?}");
    // The stream has read the (empty) ledger and waits on the hub: nothing but the recheck
    // would end it now.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    ns.api::<k8s_openapi::api::rbac::v1::RoleBinding>()
        .delete("alice", &Default::default())
        .await
        .unwrap();
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = Some(event);
    }
    let last = last.expect("an event before the stream closed");
    assert_eq!(last.event, "error", "{last:?}");
    assert!(
        last.data["message"]
            .as_str()
            .unwrap()
            .starts_with("access revoked"),
        "{last:?}"
    );
    ns.cleanup().await;
}

/// One credential holds at most its limit of streams open on a replica (two here): the next
/// is refused (429) until one of them ends.
#[tokio::test]
async fn a_credential_holds_at_most_its_limit_of_open_streams() {
    let ns = TestNamespace::new("server-stream-cap").await;
    let (url, _server) = start_server_with(|s| s.with_stream_limit(2)).await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let bob = person(&ns, "bob", run_user_rules()).await;
    let run = scripted_run("r", vec![final_turn("hi", 0)], vec![], LeaseSpec::default());
    ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .unwrap();
    let events = format!("{url}/api/v1/namespaces/{}/runs/r/events", ns.name);
    let first = SseReader::open(&events, &alice, None).await;
    let _second = SseReader::open(&events, &alice, None).await;
    let third = SseReader::try_open(&events, &alice, None).await;
    let refusal = third.err().expect("a third stream refused");
    assert!(
        refusal.contains("429") && refusal.contains("2 streams open already"),
        "{refusal}"
    );
    SseReader::open(&events, &bob, None).await;
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while SseReader::try_open(&events, &alice, None).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "a closed stream never freed its place"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    ns.cleanup().await;
}

/// The server follows at most its limit of credential-and-namespace pairs at once (one here):
/// another credential's stream is refused (503) while the first's hub lives, a stream that
/// shares it is not, and the place is free again once its streams end.
#[tokio::test]
async fn a_server_keeps_at_most_its_limit_of_hubs() {
    let ns = TestNamespace::new("server-hub-cap").await;
    let (url, _server) = start_server_with(|s| s.with_hub_limit(1)).await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let bob = person(&ns, "bob", run_user_rules()).await;
    let run = scripted_run("r", vec![final_turn("hi", 0)], vec![], LeaseSpec::default());
    ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .unwrap();
    let events = format!("{url}/api/v1/namespaces/{}/runs/r/events", ns.name);
    let first = SseReader::open(&events, &alice, None).await;
    let _shared = SseReader::open(&events, &alice, None).await;
    let refusal = SseReader::try_open(&events, &bob, None).await.err();
    let refusal = refusal.expect("a second credential's hub refused");
    assert!(refusal.contains("503"), "{refusal}");
    drop(first);
    drop(_shared);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while SseReader::try_open(&events, &bob, None).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the hub's place was never freed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    ns.cleanup().await;
}
