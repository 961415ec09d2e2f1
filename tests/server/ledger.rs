//! The PostgreSQL ledger served to its writers (`/ledger/v1/…`), against a real PostgreSQL
//! and real tokens the API server reviews. The attackers are played for real: the same
//! ServiceAccount's token bound to an older attempt's pod, another run's worker, a user with
//! AgentRun rights only who mints a ledger token for herself, a reader of another namespace.

use crate::pg_runs::{ledger_server_and_controller, start_pg_controller, start_pg_worker};
use baton::controller::ledger_rows::LEDGER_FINALIZER;
use baton::crd::v1alpha1::{AgentRun, AgentRunStatus, LeaseSpec, LedgerBackend, Phase};
use baton::fence::{Fence, worker_pod_name};
use baton::ledger::served::{LEDGER_AUDIENCE, ledger_path};
use baton::rbac::worker_service_account_name;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::rbac::mint_token_for;
use baton_testkit::server::*;
use baton_testkit::sse::{SseReader, segments};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// Run `name` at `fence`, its ledger kept in PostgreSQL, its worker account able to read
/// ledgers (as the controller's per-run Role makes it), and one pod object per attempt up to
/// `fence` (no kubelet runs them: they are what a token is bound to). Its UID.
async fn run_at(ns: &TestNamespace, name: &str, fence: i64) -> String {
    let runs: Api<AgentRun> = ns.api();
    let run = scripted_run(
        name,
        vec![final_turn("hi", 0)],
        vec![],
        LeaseSpec::default(),
    );
    let mut run = runs.create(&PostParams::default(), &run).await.unwrap();
    run.status = Some(AgentRunStatus {
        phase: Phase::Running,
        fence: Fence::new(fence),
        attempt: fence,
        worker: Some(worker_pod_name(name, Fence::new(fence))),
        ledger_backend: Some(LedgerBackend::PostgreSQL),
        ..AgentRunStatus::default()
    });
    runs.replace_status(name, &PostParams::default(), &run)
        .await
        .unwrap();
    let account = worker_service_account_name(name);
    person(
        ns,
        &account,
        vec![rule(&["ledgersegments"], &["get", "list"])],
    )
    .await;
    for attempt in 1..=fence {
        pod(ns, &worker_pod_name(name, Fence::new(attempt)), &account).await;
    }
    run.uid().unwrap()
}

async fn pod(ns: &TestNamespace, name: &str, account: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": false,
            "containers": [{"name": "worker", "image": "baton:never-run"}]
        }
    }))
    .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// The ledger token of the pod `pod` (of `account`), as the kubelet would project it.
pub(crate) async fn pod_token(ns: &TestNamespace, account: &str, pod: &str) -> String {
    let uid = ns.api::<Pod>().get(pod).await.unwrap().uid().unwrap();
    mint_token_for(
        &ns.client,
        &ns.name,
        account,
        LEDGER_AUDIENCE,
        Some((pod, &uid)),
    )
    .await
}

fn events(text: &str) -> Value {
    json!([{"type": "message", "role": "assistant", "content": text}])
}

async fn append(
    url: &str,
    token: &str,
    uid: &str,
    tail: i64,
    fence: i64,
    text: &str,
) -> (u16, Value) {
    let body = json!({"uid": uid, "tail": tail, "fence": fence, "events": events(text)});
    post(url, token, body).await
}

async fn read(url: &str, token: &str, uid: &str) -> (u16, Value) {
    get(&format!("{url}?uid={uid}"), Some(token)).await
}

#[tokio::test]
async fn only_the_attempt_holding_the_fence_and_the_controller_write_a_served_ledger() {
    let ns = TestNamespace::new("served-ledger").await;
    let (base, _server, seal_token) = ledger_server_and_controller(&ns).await;
    let uid = run_at(&ns, "r", 2).await;
    let other_uid = run_at(&ns, "s", 1).await;
    let url = format!("{base}{}", ledger_path(&ns.name, "r"));
    let account = worker_service_account_name("r");
    let current = pod_token(&ns, &account, "r-w2").await;

    // The attempt that holds the run writes, and reads back what it wrote.
    let (code, body) = append(&url, &current, &uid, 0, 2, "first").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (body["outcome"].as_str(), body["tail"].as_i64()),
        (Some("appended"), Some(1))
    );
    let (code, body) = read(&url, &current, &uid).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body[0]["spec"]["events"], events("first"));

    // The same account's token bound to the older attempt's pod may not write as fence 2.
    let older = pod_token(&ns, &account, "r-w1").await;
    let (code, body) = append(&url, &older, &uid, 1, 2, "forged").await;
    assert_eq!(code, 403, "{body}");
    assert!(body["message"].as_str().unwrap().contains("r-w1"), "{body}");
    // Nor may the current attempt write ahead of the run's fence.
    let (code, body) = append(&url, &current, &uid, 1, 3, "ahead").await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("spec.fence"),
        "{body}"
    );
    // A token of the account bound to no pod is refused too.
    let unbound = mint_token_for(&ns.client, &ns.name, &account, LEDGER_AUDIENCE, None).await;
    let (code, body) = append(&url, &unbound, &uid, 1, 2, "unbound").await;
    assert_eq!(code, 403, "{body}");
    // A token for the API server (not for ledgers) is no ledger credential at all.
    let api_token = baton_testkit::rbac::mint_token(&ns.client, &ns.name, &account).await;
    let (code, body) = append(&url, &api_token, &uid, 1, 2, "wrong audience").await;
    assert_eq!(code, 401, "{body}");

    // Another run's worker may not write this run's ledger, even at its own fence.
    let other = pod_token(&ns, &worker_service_account_name("s"), "s-w1").await;
    let (code, body) = append(&url, &other, &uid, 1, 1, "not mine").await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("may not append"),
        "{body}"
    );
    // A UID that is not the run's (a deleted run's, a namesake re-created since) is no
    // write at all: that run is gone, and its writer is told so.
    let (code, body) = append(&url, &current, &other_uid, 1, 2, "namesake").await;
    assert_eq!((code, &body["outcome"]), (200, &json!("deleted")), "{body}");
    let (_, rows) = read(&url, &current, &other_uid).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");

    // A user with AgentRun rights only mints a ledger token for herself: refused both ways.
    let mallory = "mallory";
    person(
        &ns,
        mallory,
        vec![rule(&["agentruns"], &["get", "list", "create"])],
    )
    .await;
    let hers = mint_token_for(&ns.client, &ns.name, mallory, LEDGER_AUDIENCE, None).await;
    let (code, body) = append(&url, &hers, &uid, 1, 2, "mallory").await;
    assert_eq!(code, 403, "{body}");
    let (code, body) = read(&url, &hers, &uid).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("ledgersegments"),
        "{body}"
    );

    // The controller seals a claim one above the run's fence; the old attempt then learns
    // it lost the run, as an answer, and nothing of it is stored.
    let (code, body) = append(&url, &seal_token, &uid, 1, 3, "claimed").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["tail"].as_i64(), Some(2), "{body}");
    let (code, body) = append(&url, &current, &uid, 1, 2, "late").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["outcome"].as_str(), Some("superseded"), "{body}");
    let (_, body) = read(&url, &current, &uid).await;
    let fences: Vec<i64> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["spec"]["fence"].as_i64().unwrap())
        .collect();
    assert_eq!(fences, vec![2, 3], "{body}");
    ns.cleanup().await;
}

#[tokio::test]
async fn a_namespace_cannot_read_another_namespaces_served_ledger() {
    let ns = TestNamespace::new("served-ledger-a").await;
    let elsewhere = TestNamespace::new("served-ledger-b").await;
    let (base, _server) = start_ledger_server(vec![]).await;
    let uid = run_at(&ns, "r", 1).await;
    let url = format!("{base}{}", ledger_path(&ns.name, "r"));
    let writer = pod_token(&ns, &worker_service_account_name("r"), "r-w1").await;
    let (code, body) = append(&url, &writer, &uid, 0, 1, "secret").await;
    assert_eq!(code, 200, "{body}");

    // Eve may read every transcript of her own namespace, none of this one's.
    person(&elsewhere, "eve", run_user_rules()).await;
    let eve = mint_token_for(
        &elsewhere.client,
        &elsewhere.name,
        "eve",
        LEDGER_AUDIENCE,
        None,
    )
    .await;
    let (code, body) = read(&url, &eve, &uid).await;
    assert_eq!(code, 403, "{body}");
    // Nor through her own namespace's path: the rows are kept apart by the database.
    let hers = format!("{base}{}", ledger_path(&elsewhere.name, "r"));
    let (code, body) = read(&hers, &eve, &uid).await;
    assert_eq!(
        (code, body.as_array().map(Vec::len)),
        (200, Some(0)),
        "{body}"
    );
    elsewhere.cleanup().await;
    ns.cleanup().await;
}

async fn delete(url: &str, token: &str, uid: &str) -> (u16, Value) {
    let response = baton_testkit::sse::http()
        .delete(format!("{url}?uid={uid}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let code = response.status().as_u16();
    (code, response.json().await.unwrap_or_default())
}

#[tokio::test]
async fn only_the_controller_deletes_a_served_ledger_and_only_of_a_run_being_deleted() {
    let ns = TestNamespace::new("served-ledger-del").await;
    let (base, _server, seal) = ledger_server_and_controller(&ns).await;
    let uid = run_at(&ns, "r", 1).await;
    let url = format!("{base}{}", ledger_path(&ns.name, "r"));
    let writer = pod_token(&ns, &worker_service_account_name("r"), "r-w1").await;
    let (code, body) = append(&url, &writer, &uid, 0, 1, "kept").await;
    assert_eq!(code, 200, "{body}");

    // The run's own worker may not delete its ledger; the controller may not while the run
    // lives.
    let (code, body) = delete(&url, &writer, &uid).await;
    assert_eq!(code, 403, "{body}");
    let (code, body) = delete(&url, &seal, &uid).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("not being deleted"),
        "{body}"
    );
    let (_, rows) = read(&url, &writer, &uid).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");

    // Once the run is gone the controller deletes its rows, and its worker, still running,
    // learns it lost the run at its next append.
    ns.api::<AgentRun>()
        .delete("r", &Default::default())
        .await
        .unwrap();
    let (code, body) = delete(&url, &seal, &uid).await;
    assert_eq!((code, &body["segments"]), (200, &json!(1)), "{body}");
    let db = std::env::var("BATON_TEST_POSTGRES_URL").unwrap();
    let db = baton::ledger::postgres::PgLedger::connect(&db, 1)
        .await
        .unwrap();
    assert!(
        db.for_run(&ns.name, "r", &uid)
            .list()
            .await
            .unwrap()
            .is_empty()
    );
    let late = baton::ledger::LedgerClient::new(&base, baton::ledger::LedgerToken::Fixed(writer))
        .for_run(&ns.name, "r", &uid)
        .append(1, Fence::new(1), vec![])
        .await;
    assert!(
        matches!(late, Err(baton::ledger::LedgerError::Deleted { .. })),
        "{late:?}"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_run_kept_in_postgresql_survives_a_kill_and_leaves_no_segment_in_the_api_server() {
    use baton::crd::v1alpha1::LedgerSegment;
    let ns = TestNamespace::new("served-ledger-run").await;
    let (base, _server, seal_token) = ledger_server_and_controller(&ns).await;
    let _controller = start_pg_controller(&ns, &base, seal_token);
    let lease = LeaseSpec {
        duration_seconds: 4,
        renew_seconds: 1,
        startup_seconds: 60,
    };
    let script = vec![final_turn("kept beside the cluster", 3000)];
    let run = scripted_run("pg", script, vec![], lease);
    let runs: Api<AgentRun> = ns.api();
    let uid = create_run(&runs, &run).await;

    // A person who may read transcripts here follows the run through the server from the
    // start; one who may read runs but not transcripts is refused.
    let reader = person(&ns, "alice", run_user_rules()).await;
    let events_url = format!("{base}/api/v1/namespaces/{}/runs/pg/events", ns.name);
    let follower = {
        let mut stream = SseReader::open(&events_url, &reader, None).await;
        tokio::spawn(async move { stream.until_end().await })
    };
    let runs_only = vec![rule(&["agentruns"], &["get", "list", "watch"])];
    let nosy = person(&ns, "mallory", runs_only).await;
    let refused = SseReader::try_open(&events_url, &nosy, None).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("403")),
        "a reader of runs only was not refused the transcript: {:?}",
        refused.err()
    );

    // The first attempt is killed while the model answers; the second resumes it from the
    // rows the first wrote, read through the server.
    let mut first = start_pg_worker(&ns, "pg", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    first.kill9().await;
    let mut second = start_pg_worker(&ns, "pg", 2).await;
    wait_phase(&runs, "pg", Phase::Succeeded, T).await;
    assert_eq!(second.wait(T).await, 0, "{}", second.log_text());
    let status = runs.get("pg").await.unwrap().status.unwrap();
    assert_eq!(status.ledger_backend, Some(LedgerBackend::PostgreSQL));
    assert_eq!(status.output.as_deref(), Some("kept beside the cluster"));

    // Every segment is a row, none an object in etcd.
    let objects = ns
        .api::<LedgerSegment>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(objects.items.is_empty(), "{:?}", objects.items);

    // The follower saw the rows as they were written (the database's announcements), not
    // only in the read at the end, and saw the whole ledger once, in order.
    let streamed = follower.await.expect("the follower");
    let ended_at = streamed
        .iter()
        .position(|e| e.event == "status" && e.data["phase"] == "Succeeded")
        .expect("the run's end was streamed");
    assert!(
        streamed[..ended_at].iter().any(|e| e.event == "segment"),
        "no segment came live, before the run ended: {streamed:?}"
    );
    let url = std::env::var("BATON_TEST_POSTGRES_URL").unwrap();
    let db = baton::ledger::postgres::PgLedger::connect(&url, 1)
        .await
        .unwrap();
    let rows = db.for_run(&ns.name, "pg", &uid).list().await.unwrap();
    let positions: Vec<i64> = segments(&streamed)
        .iter()
        .map(|e| e.data["seq"].as_i64().unwrap())
        .collect();
    let stored: Vec<i64> = rows.iter().map(|s| s.spec.seq).collect();
    assert_eq!(
        positions, stored,
        "the stream is the ledger, once, in order"
    );
    let fences: Vec<i64> = rows.iter().map(|s| s.spec.fence.get()).collect();
    assert!(fences.contains(&1) && fences.contains(&2), "{fences:?}");
    assert!(fences.windows(2).all(|w| w[0] <= w[1]), "{fences:?}");

    // `baton transcript` reads it through the server, with the reader's token; a reader of
    // runs only is refused there, and without --server the command says what it needs.
    // (An async child: the server answering it runs on this test's one thread.)
    let transcript = |token: Option<String>| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"));
        command.args(["transcript", "pg", "-n", &ns.name]);
        if let Some(token) = token {
            let file =
                std::env::temp_dir().join(format!("baton-{}-{}.token", ns.name, token.len()));
            std::fs::write(&file, token).unwrap();
            command.args(["--server", &base, "--token-file", &file.to_string_lossy()]);
        }
        async move {
            let out = command.output().await.unwrap();
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (out.status.success(), text(&out.stdout), text(&out.stderr))
        }
    };
    let (ok, stdout, stderr) = transcript(Some(reader.clone())).await;
    assert!(
        ok && stdout.contains("kept beside the cluster"),
        "{stdout}{stderr}"
    );
    let (ok, _, stderr) = transcript(Some(nosy.clone())).await;
    assert!(!ok && stderr.contains("403"), "{stderr}");
    let (ok, _, stderr) = transcript(None).await;
    assert!(!ok && stderr.contains("--server"), "{stderr}");

    // The run held the ledger's finalizer from the start; deleted, it takes its rows along.
    let ended = runs.get("pg").await.unwrap();
    assert_eq!(ended.finalizers(), [LEDGER_FINALIZER.to_string()]);
    runs.delete("pg", &Default::default()).await.unwrap();
    wait_until(T, "pg gone", || async {
        runs.get_opt("pg").await.unwrap().is_none()
    })
    .await;
    let left = db.for_run(&ns.name, "pg", &uid).list().await.unwrap();
    assert!(left.is_empty(), "{left:?}");
    ns.cleanup().await;
}

/// The server reads at most one segment of an append; a writer sends a larger one as the
/// segments it is stored as, and a body larger than a segment is refused unread.
#[tokio::test]
async fn an_append_larger_than_a_segment_goes_as_its_segments() {
    let ns = TestNamespace::new("served-ledger-big").await;
    let (base, _server) = start_ledger_server(vec![]).await;
    let uid = run_at(&ns, "r", 1).await;
    let url = format!("{base}{}", ledger_path(&ns.name, "r"));
    let writer = pod_token(&ns, &worker_service_account_name("r"), "r-w1").await;
    let text = "y".repeat(2_500_000);
    let (code, body) = append(&url, &writer, &uid, 0, 1, &text).await;
    assert_eq!(code, 413, "{body}");

    let message = baton::crd::v1alpha1::LedgerEvent::Message {
        role: baton::crd::v1alpha1::Role::Assistant,
        content: text.clone(),
    };
    let appended =
        baton::ledger::LedgerClient::new(&base, baton::ledger::LedgerToken::Fixed(writer))
            .for_run(&ns.name, "r", &uid)
            .append(0, Fence::new(1), vec![message])
            .await
            .expect("sent as its segments");
    assert!(appended.tail >= 3, "{}", appended.tail);
    let db = std::env::var("BATON_TEST_POSTGRES_URL").unwrap();
    let db = baton::ledger::postgres::PgLedger::connect(&db, 1)
        .await
        .unwrap();
    let stored = db.for_run(&ns.name, "r", &uid).list().await.unwrap();
    assert_eq!(stored.len() as i64, appended.tail);
    let replayed = baton::ledger::Replay::from_segments(&stored).expect("a ledger that replays");
    let rebuilt = replayed.messages.iter().any(
        |m| matches!(m, baton::ledger::ReplayedMessage::Assistant { text: t, .. } if *t == text),
    );
    assert!(rebuilt, "the chunks rebuild the message");
    ns.cleanup().await;
}
