//! The chart's `baton server` pods on the real node under the load DESIGN's bounds are for: 10
//! runs with 20 MB ledgers each, 1,000 clients with one token that open a stream and read
//! nothing, and after them 20 others that read every ledger whole. Each server pod stays under
//! its memory limit (256 MiB: its process's peak resident memory, read from the host, no
//! restart, no OOM kill), holds at most its event budget for its clients, cuts the clients that
//! read nothing, and the readers get every segment once, in order, without waiting on the idle
//! ones (a reader cut on the way reconnects with its cursor, as a browser does; how often, and
//! why, is printed); `GET …/segments` answers in pages; and the machine's TCP memory stays
//! below where the kernel squeezes every connection (before the server bounded its sockets'
//! send buffers, the idle clients' unread events took it past its limit: packets dropped on
//! every connection, the API server cut the server's reads of the ledger mid-body, and in CI a
//! reader got nothing). Then 30 clients follow a live run whose ledger holds all the chunks of
//! a 20 MB answer but the last, and the pods' peaks still stay under their limit: a stream
//! keeps nothing of a chunked event while its chunks go by. The ledgers are written straight to LedgerSegments by the admin, in a
//! namespace the webhook does not watch (only a run's worker may write them elsewhere): the
//! server's bounds, not the webhook, are under test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Phase, Role, ScriptTurn, ToolKind};
use baton::ledger::{SEGMENT_BUDGET_BYTES, SegmentStore, encode_events, event_bytes};
use baton_testkit::common::{large_ledger, proc};
use baton_testkit::e2e::{run_with, shell_tool, tool_call};
use baton_testkit::node::*;
use baton_testkit::sse;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use proc::{peak_rss_kib, raise_fd_limit, tcp_memory_kib, tcp_memory_pressure_kib};

const RUNS: usize = 10;
const MEGABYTES: usize = 20;
const IDLE: usize = 1000;
const READERS_PER_RUN: usize = 2;
/// The chart's memory limit of a server replica.
const LIMIT_KIB: u64 = 256 * 1024;
/// The server's default event budget (`--max-stream-bytes`).
const BUDGET: f64 = 32.0 * 1024.0 * 1024.0;
/// Followers of an answer whose chunks are written but its last, and its size: together
/// more than twice a server pod's memory limit.
const FOLLOWERS: usize = 30;
const CHUNKED_MEGABYTES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_thousand_idle_streams_on_large_ledgers_stay_within_the_servers_bounds() {
    raise_fd_limit();
    let env = NodeEnv::start_without_webhook("server-bounds").await;
    let servers = servers_ready(&env.client).await;
    let token = person(
        &env.client,
        &env.ns,
        "reader",
        vec![
            rule(&["agentruns"], &["get", "list", "watch"]),
            rule(&["ledgersegments"], &["get", "list", "watch"]),
        ],
    )
    .await;
    let mut tails = Vec::new();
    for i in 0..RUNS {
        tails.push(filled_run(&env, &format!("big-{i}")).await);
    }
    let service = Relay::start(&format!("{}:80", server_cluster_ip(&env.client).await));
    let mut pods = Vec::new();
    for server in &servers {
        pods.push(Watched::new(&env.client, server).await);
    }
    let events = |i: usize| {
        format!(
            "{}/api/v1/namespaces/{}/runs/big-{i}/events",
            service.url(),
            env.ns
        )
    };

    // A page of segments is at most 100, however many are asked for.
    let page = format!(
        "{}/api/v1/namespaces/{}/runs/big-0/segments?limit=1000",
        service.url(),
        env.ns
    );
    let listed: serde_json::Value = sse::http()
        .get(&page)
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = listed.as_array().map_or(0, Vec::len);
    assert!(
        (1..=100).contains(&listed),
        "a page of {listed} segments (tail {})",
        tails[0]
    );

    let peaks = Arc::new(Peaks::default());
    let sampler = peaks.sample(pods.iter().map(Watched::metrics_url).collect());

    // The idle clients come first: the readers after them must not wait on them.
    let mut idle = Vec::new();
    for i in 0..IDLE {
        let opened = sse::http()
            .get(events(i % RUNS))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(opened.status(), 200);
        idle.push(opened);
    }
    let started = Instant::now();
    let readers: Vec<_> = (0..RUNS * READERS_PER_RUN)
        .map(|i| {
            let run = i % RUNS;
            tokio::spawn(sse::reads_in_order(events(run), token.clone(), tails[run]))
        })
        .collect();
    let mut complete = 0;
    let mut reconnects = Vec::new();
    for reader in readers {
        match reader.await.unwrap() {
            Ok(read) => reconnects.extend(read.why),
            Err(e) => panic!(
                "a reader: {e}\n{}",
                what_the_servers_saw(&env.client, &pods).await
            ),
        }
        complete += 1;
    }
    let read_in = started.elapsed();

    // The idle clients are all cut (within seconds of holding room others wait for, or a
    // minute after their events began to wait on them).
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let mut open = 0.0;
        for pod in &pods {
            let metrics = pod.metrics().await;
            open += sse::gauge(&metrics, "baton_server_followers");
        }
        if open == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} idle streams still open 300 s after the readers finished"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let cut_in = started.elapsed();
    drop(idle);
    let unfinished = follow_an_unfinished_chunked_event(&env, &service, &token).await;
    sampler.abort();
    let most_held = peaks.held_bytes.load(Ordering::Relaxed) as f64;
    let tcp_peak = peaks.tcp_kib.load(Ordering::Relaxed);
    let tcp_pressure = tcp_memory_pressure_kib();
    assert!(most_held <= BUDGET, "{most_held} event bytes held");
    let peaks: Vec<u64> = pods.iter().map(|p| p.peak_kib()).collect();
    println!(
        "{RUNS} runs of {MEGABYTES} MB: {complete} readers got every segment in order in {:.0} s \
         ({} reconnections with their cursor: {reconnects:?}); {IDLE} idle streams all cut within {:.0} s; most event bytes held by a pod {:.1} MiB; \
         server peak RSS {peaks:?} KiB (limit {LIMIT_KIB} KiB); the machine's TCP memory at \
         most {} MiB (the kernel squeezes it past {} MiB); {FOLLOWERS} followers of {} MB \
         of an event's chunks (its last never written)",
        read_in.as_secs_f64(),
        reconnects.len(),
        cut_in.as_secs_f64(),
        most_held / 1024.0 / 1024.0,
        tcp_peak / 1024,
        tcp_pressure / 1024,
        unfinished / 1_000_000,
    );
    assert!(
        tcp_peak < tcp_pressure,
        "TCP memory {tcp_peak} KiB, past the kernel's pressure mark {tcp_pressure} KiB"
    );
    for (pod, peak) in pods.iter().zip(&peaks) {
        assert!(
            *peak > 0 && *peak < LIMIT_KIB,
            "{}: peak {peak} KiB",
            pod.name
        );
        pod.never_restarted(&env.client).await;
    }
    drop((pods, service));
    env.finish().await;
}

/// `FOLLOWERS` clients follow a run waiting for input (a live run: its streams stay open)
/// whose ledger then gets all the chunks but the last of a `CHUNKED_MEGABYTES` answer (as a
/// writer mid-event leaves it), each to the last chunk written, and stay. A stream used to
/// keep the chunks it had gone by until their event was whole: these followers held
/// `FOLLOWERS` × the answer in the server pods, more than their memory limit (the peak is
/// checked with the others'). The bytes of chunks written.
async fn follow_an_unfinished_chunked_event(env: &NodeEnv, service: &Relay, token: &str) -> usize {
    let turns = vec![ScriptTurn {
        text: Some("Which environment?".into()),
        tool_calls: vec![tool_call("ask", "question", "staging or production?")],
        ..ScriptTurn::default()
    }];
    let mut ask = shell_tool("ask");
    ask.kind = ToolKind::AskUser;
    env.create(&run_with("unfinished", turns, vec![ask])).await;
    let waiting = env
        .wait_run(
            "unfinished",
            Duration::from_secs(120),
            "WaitingInput",
            |s| s.phase == Phase::WaitingInput,
        )
        .await;
    let run = env.runs().get("unfinished").await.unwrap();
    let store = SegmentStore::for_run(env.client.clone(), &run);
    let mut tail = store.list().await.unwrap().len() as i64;
    let answer = LedgerEvent::Message {
        role: Role::Assistant,
        content: "y".repeat(CHUNKED_MEGABYTES * 1_000_000),
    };
    let mut chunks = encode_events(vec![answer], SEGMENT_BUDGET_BYTES).unwrap();
    chunks.pop();
    let mut written = 0;
    for chunk in chunks {
        written += chunk.iter().map(|e| event_bytes(e).unwrap()).sum::<usize>();
        tail = store.append(tail, waiting.fence, chunk).await.unwrap().tail;
    }
    let events = format!(
        "{}/api/v1/namespaces/{}/runs/unfinished/events",
        service.url(),
        env.ns
    );
    let mut followers = Vec::new();
    for _ in 0..FOLLOWERS {
        let mut follower = sse::SseReader::open(&events, token, None).await;
        let at_tail = async {
            while let Some(event) = follower.next().await {
                assert_ne!(event.event, "error", "{:?}", event.data);
                if event.data["seq"] == tail {
                    return;
                }
            }
            panic!("the stream ended before position {tail}");
        };
        tokio::time::timeout(Duration::from_secs(120), at_tail)
            .await
            .expect("a follower reaches the last chunk written");
        followers.push(follower);
    }
    // They stay a while, as followers of a run still writing do.
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(followers);
    written
}

/// A run that ended (asked to stop before it began: no worker ever writes its ledger) whose
/// ledger then gets `MEGABYTES` of messages after the `closed` record the controller writes
/// once the run has ended (appended before it, they would take its place); its last position.
async fn filled_run(env: &NodeEnv, name: &str) -> i64 {
    let mut run = AgentRun::builder(name).input("bench").reply("ok").build();
    run.spec.stop = true;
    env.create(&run).await;
    env.wait_run(name, Duration::from_secs(60), "stopped", |s| {
        s.phase.is_terminal()
    })
    .await;
    let run = env.runs().get(name).await.unwrap();
    let store = SegmentStore::for_run(env.client.clone(), &run);
    let deadline = Instant::now() + Duration::from_secs(60);
    let tail = loop {
        let ledger = store.list().await.unwrap();
        let events = ledger.iter().flat_map(|s| &s.spec.events);
        if events
            .into_iter()
            .any(|e| matches!(e, LedgerEvent::Closed { .. }))
        {
            break ledger.len() as i64;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: no `closed` record in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    large_ledger::fill(&store, tail, MEGABYTES).await.unwrap()
}

/// The highest figures seen while the streams are open, sampled every half second: the event
/// bytes a server pod held, and what every connection's buffers held on this machine, all
/// together (the clients here, the relay, the node's pods). A thousand clients that read
/// nothing must not take the kernel to where it squeezes or drops every connection's packets
/// (the server's own reads from the API server among them).
#[derive(Default)]
struct Peaks {
    held_bytes: AtomicU64,
    tcp_kib: AtomicU64,
}

impl Peaks {
    /// Samples until the task is aborted; `metrics`: each server pod's `/metrics`.
    fn sample(self: &Arc<Self>, metrics: Vec<String>) -> tokio::task::JoinHandle<()> {
        let peaks = self.clone();
        tokio::spawn(async move {
            loop {
                peaks.tcp_kib.fetch_max(tcp_memory_kib(), Ordering::Relaxed);
                for url in &metrics {
                    let text = match sse::http().get(url).send().await {
                        Ok(r) => r.text().await.unwrap_or_default(),
                        Err(_) => String::new(),
                    };
                    let held = sse::gauge(&text, "baton_server_stream_bytes_held") as u64;
                    peaks.held_bytes.fetch_max(held, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    }
}

/// For a failed read: what the server pods logged above `info`, and what the API server logged
/// of requests it timed out or aborted (a response cut mid-body is one of those).
async fn what_the_servers_saw(client: &kube::Client, pods: &[Watched]) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let mut out = String::new();
    for pod in pods {
        let params = kube::api::LogParams {
            container: Some("server".into()),
            ..Default::default()
        };
        let log = api.logs(&pod.name, &params).await.unwrap_or_default();
        out.push_str(&format!("server pod {}:\n", pod.name));
        out.push_str(&last_lines(&log, &["WARN", "ERROR"], 20));
    }
    let apiserver = node_dir().join("kube-apiserver.log");
    let log = std::fs::read_to_string(&apiserver).unwrap_or_default();
    out.push_str("the API server:\n");
    out.push_str(&last_lines(
        &log,
        &["imeout", "abort", "Abort", "panic"],
        20,
    ));
    out
}

/// The last `n` lines of `log` that contain one of `marks`.
fn last_lines(log: &str, marks: &[&str], n: usize) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| marks.iter().any(|m| l.contains(m)))
        .collect();
    let mut out = lines[lines.len().saturating_sub(n)..].join("\n");
    out.push('\n');
    out
}

/// A server pod, watched from the host: its `/metrics` through a relay to its own address,
/// its process's figures from `/proc`.
struct Watched {
    name: String,
    pid: u32,
    restarts: i32,
    relay: Relay,
}

impl Watched {
    async fn new(client: &kube::Client, pod: &Pod) -> Self {
        let status = pod.status.clone().unwrap_or_default();
        let ip = status.pod_ip.clone().expect("a server pod's IP");
        let restarts = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        let name = pod.name_any();
        let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
        let pid = container_pid(&pods, &name, "server")
            .await
            .expect("the server container's PID");
        Self {
            name,
            pid,
            restarts,
            relay: Relay::start(&format!("{ip}:8080")),
        }
    }

    fn metrics_url(&self) -> String {
        format!("{}/metrics", self.relay.url())
    }

    async fn metrics(&self) -> String {
        match sse::http().get(self.metrics_url()).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    fn peak_kib(&self) -> u64 {
        peak_rss_kib(self.pid)
    }

    /// Panics if the pod restarted or was OOM-killed since [`Watched::new`].
    async fn never_restarted(&self, client: &kube::Client) {
        let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
        let pod = pods.get(&self.name).await.unwrap();
        let statuses = pod
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let restarts: i32 = statuses.iter().map(|c| c.restart_count).sum();
        let killed = statuses.iter().any(|c| {
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            last.is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
        });
        assert!(
            restarts == self.restarts && !killed,
            "server pod {} restarted ({} → {restarts}) or was OOM-killed",
            self.name,
            self.restarts
        );
    }
}
