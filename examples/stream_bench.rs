//! Stream benchmark: `baton server` (the release binary, as its own process) against the real
//! API server in KUBECONFIG, followed by many clients while this process appends to 10 runs'
//! ledgers as their workers would (a fenced append at fence 1), through each protocol the
//! server speaks: its own Server-Sent Events, the OpenAI Responses API's stream, A2A's
//! `tasks/resubscribe`. Prints, in one run, for each protocol (fresh runs each):
//! - the latency from the start of an append (its create request: one round trip) to each
//!   client's receipt of that position (its first event), p50/p99,
//!   with 10 followers (one per run) and with 1,000 (100 per run);
//! - the server's resident memory idle and with 1,000 followers, its CPU time over the
//!   appends, and the API watches it holds (target: independent of the followers);
//! - that every follower got every segment once, in order.
//!
//!     make bench-stream    (cargo run --release --example stream_bench [-- FOLLOWERS APPENDS])

mod stream_support;

use baton_testkit::common::claim;
use baton_testkit::common::namespace;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};

use baton::crd::v1alpha1::{AgentRun, LedgerEvent, Role as MessageRole};
use baton::fence::Fence;
use baton::ledger::SegmentStore;
use stream_support::*;

const RUNS: usize = 10;

/// When the append of each (run UID, position) started.
type Appended = Arc<Mutex<HashMap<(String, i64), Instant>>>;
/// Each receipt: the run's index, the segment's position, its latency in ms.
type Receipts = Arc<Mutex<Vec<(usize, i64, f64)>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let followers: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let appends: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    raise_fd_limit();
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("stream-bench-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;
    let result = bench(&client, &ns, followers, appends).await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    result
}

async fn bench(client: &Client, ns: &str, followers: usize, appends: usize) -> anyhow::Result<()> {
    let token = reader_token(client, ns).await?;
    let (mut server, url) = start_server(&[])?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = rss_kib(server.id());
    println!(
        "stream bench: {RUNS} runs, {appends} appends each per phase, server pid {}",
        server.id()
    );
    println!("server RSS idle: {} KiB", idle_rss);
    for protocol in [Protocol::Sse, Protocol::Responses, Protocol::A2a] {
        for count in [RUNS, followers] {
            let mut runs = Vec::new();
            for i in 0..RUNS {
                let name = format!("bench-{}-{count}-{i}", protocol.name());
                runs.push(started_run(client, ns, &name).await?);
            }
            let at = Phase {
                protocol,
                count,
                appends,
            };
            phase(client, &url, &token, &runs, at, server.id()).await?;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    Ok(())
}

/// How the followers follow.
#[derive(Clone, Copy)]
enum Protocol {
    /// baton's own events: `GET …/runs/{run}/events`, `Last-Event-ID`.
    Sse,
    /// `GET …/openai/v1/responses/{run}?stream=true&starting_after=N`.
    Responses,
    /// A2A `tasks/resubscribe` with the ledger-cursor extension's header.
    A2a,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Sse => "sse",
            Protocol::Responses => "responses",
            Protocol::A2a => "a2a",
        }
    }

    /// The request that follows `run` of `ns` after position `tail`.
    fn request(
        self,
        url: &str,
        ns: &str,
        run: &str,
        uid: &str,
        tail: i64,
    ) -> reqwest::RequestBuilder {
        let http = reqwest::Client::new();
        let base = format!("{url}/api/v1/namespaces/{ns}");
        // The last number of position `tail`: events of later positions follow it.
        let after = ((tail + 1) * 1_000_000 - 1).to_string();
        match self {
            Protocol::Sse => http
                .get(format!("{base}/runs/{run}/events"))
                .header("Last-Event-ID", format!("{uid}:{tail}")),
            Protocol::Responses => http.get(format!(
                "{base}/openai/v1/responses/{run}?stream=true&starting_after={after}"
            )),
            Protocol::A2a => http
                .post(format!("{base}/a2a/threads/{BENCH_THREAD}"))
                .header("baton-starting-after", after)
                .json(&serde_json::json!({
                    "jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": run},
                })),
        }
    }

    /// The ledger position an event is of (None: an event of no position, such as a status).
    fn position(self, block: &str) -> Option<i64> {
        match self {
            Protocol::Sse => {
                let id = block.lines().find_map(|l| l.strip_prefix("id: "))?;
                id.rsplit_once(':')?.1.parse().ok()
            }
            Protocol::Responses | Protocol::A2a => {
                let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
                let data: serde_json::Value = serde_json::from_str(data).ok()?;
                let number = match self {
                    Protocol::Responses => &data["sequence_number"],
                    _ => {
                        &data["result"]["metadata"]["https://baton.dev/a2a/ledger-cursor/v1"]["sequenceNumber"]
                    }
                };
                Some(number.as_i64()? / 1_000_000).filter(|p| *p > 0)
            }
        }
    }
}

/// One phase: `count` followers through `protocol`, `appends` segments per run.
#[derive(Clone, Copy)]
struct Phase {
    protocol: Protocol,
    count: usize,
    appends: usize,
}

/// `count` followers spread over the runs; `appends` segments per run; the figures.
async fn phase(
    client: &Client,
    url: &str,
    token: &str,
    runs: &[(AgentRun, SegmentStore)],
    at: Phase,
    pid: u32,
) -> anyhow::Result<()> {
    let Phase {
        protocol,
        count,
        appends,
    } = at;
    let appended: Appended = Arc::default();
    let latencies: Receipts = Arc::default();
    let mut tails = Vec::new();
    for (run, _) in runs {
        tails.push(
            SegmentStore::for_run(client.clone(), run)
                .list()
                .await?
                .len() as i64,
        );
    }
    let opening = Instant::now();
    let mut clients = Vec::new();
    for i in 0..count {
        let (run, _) = &runs[i % runs.len()];
        let (uid, tail) = (run.uid().unwrap(), tails[i % runs.len()]);
        let request = protocol.request(url, &run.namespace().unwrap(), &run.name_any(), &uid, tail);
        let follower = Follower {
            run: i % runs.len(),
            uid,
            tail,
            protocol,
        };
        clients.push(tokio::spawn(follow(
            follower,
            request.bearer_auth(token),
            appends,
            appended.clone(),
            latencies.clone(),
        )));
    }
    wait_followers(url, count).await;
    let opened = opening.elapsed();
    // What the server holds while they all follow.
    let metrics = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let rss_before = rss_kib(pid);
    let cpu_before = cpu_ticks(pid);
    let started = Instant::now();
    append_all(runs, &mut tails, appends, &appended).await?;
    let mut complete = 0;
    for c in clients {
        if c.await? {
            complete += 1;
        }
    }
    let elapsed = started.elapsed();
    let cpu = cpu_ticks(pid) - cpu_before;
    let by_round = worst_by_round(&latencies.lock().unwrap(), &tails, appends);
    let mut l: Vec<f64> = latencies.lock().unwrap().iter().map(|r| r.2).collect();
    l.sort_by(f64::total_cmp);
    println!(
        "{} {count} followers: latency from an append's start to its receipt: p50 {:.1} ms, p99 {:.1} ms over {} receipts; \
         {complete}/{count} got every segment once, in order; server RSS {} KiB (with them), \
         CPU {:.2} s over {:.1} s of appends; API watches held: {} (hubs {}); \
         all open and past their replay in {:.2} s",
        protocol.name(),
        pct(&l, 0.50),
        pct(&l, 0.99),
        l.len(),
        rss_before,
        cpu as f64 / ticks_per_second(),
        elapsed.as_secs_f64(),
        gauge(&metrics, "baton_server_api_watches"),
        gauge(&metrics, "baton_server_hubs"),
        opened.as_secs_f64(),
    );
    println!("  the slowest receipt of each round of appends, ms: {by_round:?}");
    Ok(())
}

/// The slowest receipt of each round of appends (a round: one append to every run).
fn worst_by_round(receipts: &[(usize, i64, f64)], tails: &[i64], appends: usize) -> Vec<u64> {
    let mut worst = vec![0u64; appends];
    for (run, seq, ms) in receipts {
        // `tails` are the ends after the appends: round r of run i is at tail - appends + r + 1.
        let round = (seq - (tails[*run] - appends as i64) - 1).clamp(0, appends as i64 - 1);
        let slot = &mut worst[round as usize];
        *slot = (*slot).max(*ms as u64);
    }
    worst
}

/// Appends `appends` segments to every run, round robin, 20 ms apart, as its worker would.
async fn append_all(
    runs: &[(AgentRun, SegmentStore)],
    tails: &mut [i64],
    appends: usize,
    appended: &Appended,
) -> anyhow::Result<()> {
    for _ in 0..appends {
        for (i, (run, store)) in runs.iter().enumerate() {
            let events = vec![LedgerEvent::Message {
                role: MessageRole::Assistant,
                content: "x".repeat(512),
            }];
            appended
                .lock()
                .unwrap()
                .insert((run.uid().unwrap(), tails[i] + 1), Instant::now());
            let done = store.append(tails[i], Fence::new(1), events).await?;
            tails[i] = done.tail;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Who a follower is: its run (index and UID), the position it follows from, its protocol.
struct Follower {
    run: usize,
    uid: String,
    tail: i64,
    protocol: Protocol,
}

/// One client: reads until it has `appends` positions after its cursor; records each
/// position's first receipt; true if they came once each, in order.
async fn follow(
    follower: Follower,
    request: reqwest::RequestBuilder,
    appends: usize,
    appended: Appended,
    latencies: Receipts,
) -> bool {
    let response = match request.send().await {
        Ok(r) if r.status() == 200 => r,
        _ => return false,
    };
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let (mut last, mut got) = (follower.tail, 0);
    while got < appends {
        let Ok(Some(Ok(chunk))) = tokio::time::timeout(Duration::from_secs(60), body.next()).await
        else {
            return false;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let Some(seq) = follower.protocol.position(&block) else {
                continue;
            };
            let now = Instant::now();
            match seq {
                // A later event of a position already received.
                s if s == last => continue,
                s if s != last + 1 => return false,
                _ => {}
            }
            last = seq;
            got += 1;
            let sent = appended
                .lock()
                .unwrap()
                .get(&(follower.uid.clone(), seq))
                .copied();
            let ms = sent.map_or(0.0, |t| {
                now.saturating_duration_since(t).as_secs_f64() * 1e3
            });
            latencies.lock().unwrap().push((follower.run, seq, ms));
        }
    }
    true
}
