//! Garbage-burst benchmark: `baton server` (the release binary, as its own process) against
//! the real API server in KUBECONFIG, answering a real caller's reads while clients with no
//! valid credential send it large bodies, whole or withheld part-way. Prints, in one run:
//! - the latency of a real request (a run's GET with a valid token), p50/p99, with no burst
//!   and during the burst;
//! - the server's peak resident memory and CPU time over the burst;
//! - how the garbage was answered (by status; 0: no answer before the client gave up).
//!
//!     make bench-burst    (cargo run --release --example burst_bench [-- SENDERS SECONDS])

mod stream_support;

use baton_testkit::common::claim;
use baton_testkit::common::namespace;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use stream_support::*;

/// Routes a stranger may send a body to: the ledger's append (authenticated from its
/// headers) and a caller's write (checked with the API server before its body).
const ROUTES: [&str; 2] = [
    "/ledger/v1/namespaces/NS/runs/RUN/segments",
    "/api/v1/namespaces/NS/runs/RUN/inputs",
];
/// What each garbage request announces: just under the caller routes' bound.
const ANNOUNCED: usize = 500 * 1024;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let senders: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    raise_fd_limit();
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("burst-bench-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;
    let result = bench(&client, &ns, senders, Duration::from_secs(seconds)).await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    result
}

async fn bench(client: &Client, ns: &str, senders: usize, burst: Duration) -> anyhow::Result<()> {
    let token = reader_token(client, ns).await?;
    let (run, _) = started_run(client, ns, "target").await?;
    let (mut server, url) = start_server(&[])?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = server.id();
    let get = format!("{url}/api/v1/namespaces/{ns}/runs/{}", run.name_any());
    let quiet = latencies(&get, &token, Duration::from_secs(5)).await;
    let cpu_before = cpu_ticks(pid);
    let answers = Arc::new(Mutex::new(BTreeMap::<u16, usize>::new()));
    let deadline = Instant::now() + burst;
    let garbage: Vec<_> = (0..senders)
        .map(|i| {
            let route = ROUTES[i % ROUTES.len()]
                .replace("NS", ns)
                .replace("RUN", &run.name_any());
            let addr = url.trim_start_matches("http://").to_string();
            tokio::spawn(send_garbage(
                addr,
                route,
                i % 2 == 1,
                deadline,
                answers.clone(),
            ))
        })
        .collect();
    let during = latencies(&get, &token, burst).await;
    for g in garbage {
        let _ = g.await;
    }
    let cpu = (cpu_ticks(pid) - cpu_before) as f64 / ticks_per_second();
    println!(
        "burst bench: {senders} senders with no valid credential for {} s, bodies announced at {} KiB",
        burst.as_secs(),
        ANNOUNCED / 1024
    );
    println!(
        "a real request (GET of a run): p50 {:.1} ms, p99 {:.1} ms quiet ({} requests); p50 {:.1} ms, p99 {:.1} ms during the burst ({} requests)",
        pct(&quiet, 0.5),
        pct(&quiet, 0.99),
        quiet.len(),
        pct(&during, 0.5),
        pct(&during, 0.99),
        during.len(),
    );
    println!(
        "server: peak RSS {} KiB, CPU {cpu:.1} s over the burst; garbage answered: {:?}",
        peak_rss_kib(pid),
        answers.lock().unwrap()
    );
    let _ = server.kill();
    let _ = server.wait();
    Ok(())
}

/// A real caller's GETs, one after another for `length`: their latencies in ms, sorted.
async fn latencies(url: &str, token: &str, length: Duration) -> Vec<f64> {
    let http = reqwest::Client::new();
    let end = Instant::now() + length;
    let mut ms = Vec::new();
    while Instant::now() < end {
        let started = Instant::now();
        let ok = http.get(url).bearer_auth(token).send().await;
        if ok.is_ok_and(|r| r.status() == 200) {
            ms.push(started.elapsed().as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ms.sort_by(f64::total_cmp);
    ms
}

/// Sends garbage on fresh connections until `deadline`: a body of [`ANNOUNCED`] bytes with a
/// token the API server refuses, sent whole, or (`withheld`) 1 KiB of it and then nothing.
/// Counts the answers by status (0: none).
async fn send_garbage(
    addr: String,
    route: String,
    withheld: bool,
    deadline: Instant,
    answers: Arc<Mutex<BTreeMap<u16, usize>>>,
) {
    let body = vec![b' '; ANNOUNCED];
    while Instant::now() < deadline {
        let head = format!(
            "POST {route} HTTP/1.1\r\nHost: baton\r\nAuthorization: Bearer not-a-token\r\n\
             Content-Type: application/json\r\nContent-Length: {ANNOUNCED}\r\n\r\n"
        );
        let status = match tokio::net::TcpStream::connect(&addr).await {
            Ok(mut tcp) => {
                let sent = if withheld { &body[..1024] } else { &body[..] };
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp.write_all(sent).await;
                let mut buf = [0u8; 64];
                match tokio::time::timeout(Duration::from_secs(15), tcp.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 12 => {
                        String::from_utf8_lossy(&buf[9..12]).parse().unwrap_or(0)
                    }
                    _ => 0,
                }
            }
            Err(_) => 0,
        };
        *answers.lock().unwrap().entry(status).or_default() += 1;
    }
}
