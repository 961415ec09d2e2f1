//! The ledger's limits with a real `baton worker` against the real API server: a transcript
//! over `--max-ledger-bytes` ends the run `Interrupted` (TranscriptTooLarge) with nothing
//! trimmed or rewritten, and an event larger than one segment is split across segments and
//! replayed whole by the next worker.

use std::time::Duration;

use crate::{EXIT_TIMEOUT, create, status};
use baton::crd::v1alpha1::{
    AgentRun, LeaseSpec, LedgerEvent, LedgerSegment, ModelSpec, Phase, Provider,
};
use baton::fence::Fence;
use baton::ledger::{Replay, ReplayedMessage, event_bytes};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;
use baton_testkit::model::{Reply, Server};
use baton_testkit::worker::*;

/// A shell command that prints `n` copies of `c` (no newline).
fn print_n(c: char, n: usize) -> String {
    format!("head -c {n} /dev/zero | tr '\\0' {c}")
}

/// No segment was ever modified or deleted, and each was created once.
fn assert_append_only(seen: &[(String, String, String)], listed: &[LedgerSegment]) {
    assert!(
        seen.iter().all(|(kind, _, _)| kind == "ADDED"),
        "a segment was modified or deleted: {seen:?}"
    );
    for seg in listed {
        let name = seg.metadata.name.clone().unwrap_or_default();
        let versions: Vec<&String> = seen
            .iter()
            .filter(|(_, n, _)| *n == name)
            .map(|(_, _, rv)| rv)
            .collect();
        assert_eq!(versions.len(), 1, "{name} seen {versions:?}");
        assert_eq!(
            seg.metadata.resource_version.as_ref(),
            Some(versions[0]),
            "{name} changed since it was created"
        );
        assert_eq!(seg.metadata.generation, Some(1), "{name} was updated");
    }
}

#[tokio::test]
async fn a_transcript_over_the_cap_ends_interrupted_with_nothing_trimmed() {
    let ns = TestNamespace::new("worker-too-large").await;
    let words = "lorem ipsum dolor sit amet ".repeat(30); // ~800 bytes a turn
    let script = (1..=8)
        .map(|i| shell_turn(&format!("turn {i}: {words}"), "sh", &print_n('y', 1500), 0))
        .chain([final_turn("never reached", 0)])
        .collect();
    let run = scripted_run(
        "big",
        script,
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    create(&ns, &run).await;
    let watch = SegmentWatch::start(ns.api()).await;
    let pod = claim(&ns.client, &ns.name, "big", 1).await;
    let max = 6000u64;
    let max_flag = format!("--max-ledger-bytes={max}");
    let mut worker = spawn_worker(&ns.name, "big", 1, &pod, &[&max_flag, "--admin-addr=none"]);
    assert_eq!(worker.wait(EXIT_TIMEOUT).await, 0, "{}", worker.log_text());

    let st = status(&ns, "big").await;
    assert_eq!(st.phase, Phase::Finishing, "{st:?}");
    assert_eq!(st.outcome, Some(Phase::Interrupted));
    assert_eq!(st.reason.as_deref(), Some("TranscriptTooLarge"));
    assert!(st.output_partial, "the output is a salvage");
    let output = st.output.clone().unwrap_or_default();
    assert!(output.starts_with("turn 1: lorem ipsum"), "{output}");
    assert!(!output.contains("never reached"));

    // Give a straggling watch event time to arrive, then compare with the listed ledger.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = segments(&ns.client, &ns.name, "big").await;
    assert_append_only(&watch.stop(), &listed);
    let stored: u64 = events(&listed)
        .iter()
        .map(|(_, e)| event_bytes(e).unwrap() as u64)
        .sum();
    assert!(
        stored <= max,
        "{stored} bytes stored, over the cap of {max}"
    );
    assert_eq!(st.ledger.as_ref().map(|l| l.bytes as u64), Some(stored));
    let evs = events(&listed);
    assert!(
        !evs.iter()
            .any(|(_, e)| matches!(e, LedgerEvent::Final { .. })),
        "no final answer"
    );
    // Whatever was stored is whole: every recorded result has all 1500 bytes.
    let results: Vec<&String> = evs
        .iter()
        .filter_map(|(_, e)| match e {
            LedgerEvent::StepResult { output, .. } => Some(output),
            _ => None,
        })
        .collect();
    assert!(!results.is_empty(), "at least one step was recorded");
    for output in results {
        assert_eq!(output.matches('y').count(), 1500, "{output}");
        assert!(!output.contains("truncated"), "{output}");
    }
    // The salvage is made of what the ledger holds (plus, at most, streamed text after it).
    let replay = Replay::from_segments(&listed).unwrap();
    assert!(replay.salvage().starts_with(&output), "{output}");
    ns.cleanup().await;
}

/// A run on the local Chat Completions server: `sh` prints 10,000 bytes, `slow` sleeps.
fn openai_run(name: &str, endpoint: &str) -> AgentRun {
    let mut run = scripted_run(
        name,
        vec![],
        vec![shell_tool("sh", false), shell_tool("slow", false)],
        LeaseSpec::default(),
    );
    run.spec.agent_mut().model = ModelSpec {
        provider: Provider::Openai,
        name: Some("local-test".into()),
        endpoint: Some(format!("{endpoint}/v1")),
        ..ModelSpec::default()
    };
    run
}

#[tokio::test]
async fn an_event_larger_than_a_segment_is_split_and_replayed_whole() {
    let ns = TestNamespace::new("worker-split").await;
    let counter = counter_file("split");
    let big = format!("echo x >> {}; {}", counter.display(), print_n('z', 10_000));
    let server = Server::start(vec![
        Reply::sse(tool_call_stream("call_big", "sh", &big)),
        Reply::sse(tool_call_stream("call_slow", "slow", "sleep 60")),
        Reply::sse(answer_stream("Done: ten thousand zeds.")),
    ])
    .await;
    create(&ns, &openai_run("split", &server.url)).await;
    let budget = 2048usize;
    let flags = [
        format!("--segment-budget-bytes={budget}"),
        "--admin-addr=127.0.0.1:0".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();

    // Worker 1 runs the big step, then blocks in `slow`: kill -9 it there.
    let pod1 = claim(&ns.client, &ns.name, "split", 1).await;
    let mut w1 = spawn_worker(&ns.name, "split", 1, &pod1, &flags);
    let (client, name) = (ns.client.clone(), ns.name.clone());
    wait_until(EXIT_TIMEOUT, "the intent of step 2", || {
        let (client, name) = (client.clone(), name.clone());
        async move {
            events(&segments(&client, &name, "split").await)
                .iter()
                .any(|(_, e)| matches!(e, LedgerEvent::StepIntent { step: 2, .. }))
        }
    })
    .await;
    check_metrics(&w1.log_text()).await;
    w1.kill9().await;

    let listed = segments(&ns.client, &ns.name, "split").await;
    let chunked: Vec<&LedgerSegment> = listed
        .iter()
        .filter(|s| {
            s.spec
                .events
                .iter()
                .any(|e| matches!(e, LedgerEvent::Chunk { .. }))
        })
        .collect();
    assert!(
        chunked.len() >= 5,
        "10 kB over 2 kB segments: {} chunk segments",
        chunked.len()
    );
    for seg in &listed {
        let size: usize = seg
            .spec
            .events
            .iter()
            .map(|e| event_bytes(e).unwrap())
            .sum();
        assert!(
            size <= budget,
            "segment {} holds {size} bytes",
            seg.spec.seq
        );
    }
    assert_eq!(count(&counter), 1);

    // Worker 2 replays the chunks into one result and sends it to the model whole.
    let pod2 = claim(&ns.client, &ns.name, "split", 2).await;
    let mut w2 = spawn_worker(&ns.name, "split", 2, &pod2, &flags);
    assert_eq!(w2.wait(EXIT_TIMEOUT).await, 0, "{}", w2.log_text());
    let st = status(&ns, "split").await;
    assert_eq!(st.phase, Phase::Finishing, "{st:?}\n{}", w2.log_text());
    assert_eq!(st.outcome, Some(Phase::Succeeded));
    assert_eq!(st.output.as_deref(), Some("Done: ten thousand zeds."));
    assert_eq!(count(&counter), 1, "the big step was not run again");
    let unknown: Vec<i64> = st.unknown_effects.iter().map(|e| e.step).collect();
    assert_eq!(unknown, vec![2], "only the killed step is unknown");

    let requests = server.received();
    assert_eq!(requests.len(), 3, "{requests:?}");
    let resumed = tool_messages(&requests[2].body);
    let (_, whole) = resumed
        .iter()
        .find(|(id, _)| id == "call_big")
        .expect("the big result in the resumed request");
    assert_eq!(whole.matches('z').count(), 10_000, "replayed whole");
    let replay = Replay::from_segments(&segments(&ns.client, &ns.name, "split").await).unwrap();
    let stored = replay.messages.iter().find_map(|m| match m {
        ReplayedMessage::ToolResult {
            step: 1, content, ..
        } => Some(content),
        _ => None,
    });
    assert_eq!(stored, Some(whole));
    ns.cleanup().await;
}

/// While worker 1 sits in its second step: its admin server is up and counted the work.
async fn check_metrics(log: &str) {
    let addr = admin_addr(log).unwrap_or_else(|| panic!("no admin address in:\n{log}"));
    assert_eq!(http_get(&addr, "/livez").await.0, 200);
    assert_eq!(http_get(&addr, "/readyz").await.0, 200);
    let (code, text) = http_get(&addr, "/metrics").await;
    assert_eq!(code, 200);
    let value = |series: &str| sample(&text, series).unwrap_or(-1.0);
    assert_eq!(
        value("baton_worker_step_append_duration_seconds_count"),
        2.0,
        "{text}"
    );
    assert!(value("baton_worker_ledger_segments_total") >= 7.0, "{text}");
    assert!(
        value("baton_worker_ledger_bytes_total") > 10_000.0,
        "{text}"
    );
    assert_eq!(
        value("baton_worker_model_calls_total{outcome=\"ok\"}"),
        2.0,
        "{text}"
    );
    assert_eq!(
        value("baton_worker_fence_rejections_total{kind=\"ledger_superseded\"}"),
        0.0
    );
}

/// A worker that died between the chunks of an event too large for one segment (here a zombie
/// finishing its `slow` step after it was killed, its big result cut short): the next owner's
/// seal follows the incomplete chunks. The next worker drops the half-written event (its
/// append was never acknowledged), reports the step unknown instead of running it again, and
/// finishes the run, instead of refusing the ledger attempt after attempt.
#[tokio::test]
async fn a_chunked_event_its_writer_never_finished_does_not_stop_the_resume() {
    use baton::ledger::{SegmentStore, encode_events};
    let ns = TestNamespace::new("worker-torn-chunk").await;
    let counter = counter_file("torn-chunk");
    let script = vec![
        shell_turn("a", "sh", &format!("echo x >> {}", counter.display()), 0),
        shell_turn("b", "slow", "sleep 60", 0),
        final_turn("done", 0),
    ];
    let tools = vec![shell_tool("sh", false), shell_tool("slow", false)];
    create(
        &ns,
        &scripted_run("torn", script, tools, LeaseSpec::default()),
    )
    .await;

    let pod1 = claim(&ns.client, &ns.name, "torn", 1).await;
    let mut w1 = spawn_worker(&ns.name, "torn", 1, &pod1, &[]);
    let (client, name) = (ns.client.clone(), ns.name.clone());
    wait_until(EXIT_TIMEOUT, "the intent of step 2", || {
        let (client, name) = (client.clone(), name.clone());
        async move {
            events(&segments(&client, &name, "torn").await)
                .iter()
                .any(|(_, e)| matches!(e, LedgerEvent::StepIntent { step: 2, .. }))
        }
    })
    .await;
    w1.kill9().await;

    // What the dead writer got into the ledger of its 10 kB result: every chunk but the last.
    let run: AgentRun = ns.api().get("torn").await.unwrap();
    let store = SegmentStore::for_run(ns.client.clone(), &run);
    let result = LedgerEvent::StepResult {
        step: 2,
        output: "y".repeat(10_000),
        is_error: false,
    };
    let groups = encode_events(vec![result], 2048).unwrap();
    assert!(groups.len() > 2);
    let mut tail = segments(&ns.client, &ns.name, "torn").await.len() as i64;
    for group in &groups[..groups.len() - 1] {
        tail = store
            .append(tail, Fence::new(1), group.clone())
            .await
            .unwrap()
            .tail;
    }

    let pod2 = claim(&ns.client, &ns.name, "torn", 2).await;
    let mut w2 = spawn_worker(&ns.name, "torn", 2, &pod2, &[]);
    assert_eq!(w2.wait(EXIT_TIMEOUT).await, 0, "{}", w2.log_text());
    let st = status(&ns, "torn").await;
    assert_eq!(st.phase, Phase::Finishing, "{st:?}\n{}", w2.log_text());
    assert_eq!(st.outcome, Some(Phase::Succeeded));
    let unknown: Vec<i64> = st.unknown_effects.iter().map(|e| e.step).collect();
    assert_eq!(
        unknown,
        vec![2],
        "the step whose result was cut short is unknown"
    );
    assert_eq!(count(&counter), 1, "step 1 was not run again");
    let replay = Replay::from_segments(&segments(&ns.client, &ns.name, "torn").await).unwrap();
    assert_eq!(replay.abandoned_chunks(), 1);
    ns.cleanup().await;
}
