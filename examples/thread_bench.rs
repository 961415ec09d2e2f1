//! Thread benchmark: the history build of a turn of a long thread, against the real API server
//! in KUBECONFIG. A thread is grown to 1, 10, 100 and 1,000 turns, written as the controller and
//! a worker leave them (each turn's ledger five positions, ~1 KiB of conversation); at each size
//! the next turn's history is read as the worker reads it, its requests counted: each earlier
//! turn read on its own (as before the thread label), and all of them with one list of the
//! thread's segments. Prints p50/max ms, requests per build, the ratio, the size of the first
//! seal's `history` event and the history's estimated tokens; then what a worker's read of its
//! own ledger costs in a namespace that large; then the same thread with its turns kept in
//! PostgreSQL, read through `baton server` (in this process, as a worker reaches it): each
//! turn alone (as before) and all at once, its requests counted by the server.
//!
//!     cargo run --release --example thread_bench [-- TURNS [REPEATS]]

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};

use baton::crd::v1alpha1::{HistoryTurn, LedgerEvent};
use baton::ledger::{Ledgers, ReplayedMessage, estimated_tokens};
use baton::worker::api_count::{ApiCounters, counted_client};
use baton_testkit::common::namespace;
use baton_testkit::common::thread_ledgers::{
    TurnLedgers, create_thread, write_turns, write_turns_in,
};

/// One way of reading a history: its times and requests per build.
struct Reads {
    times: Vec<Duration>,
    requests: u64,
}

/// The most turns read each alone.
const ALONE_AT_MOST: usize = 100;

impl Reads {
    fn skipped() -> Self {
        Reads {
            times: vec![Duration::ZERO],
            requests: 0,
        }
    }

    fn p50(&self) -> f64 {
        let mut times = self.times.clone();
        times.sort();
        times[times.len() / 2].as_secs_f64() * 1000.0
    }

    fn max(&self) -> f64 {
        self.times
            .iter()
            .max()
            .map_or(0.0, |t| t.as_secs_f64() * 1000.0)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let repeats: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let ns = format!("bench-thread-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(&client, &ns).await?;

    let thread = create_thread(&client, &ns, "long").await;
    println!(
        "thread benchmark: a thread grown to {total} turns (5 positions, ~1 KiB of conversation \
         each; the namespace holds its segments only); the history of its next turn, {repeats} \
         builds per figure"
    );
    println!(
        "  {:>6}  {:>28}  {:>28}  {:>7}  {:>11}  {:>9}",
        "turns",
        "each turn alone p50/max ms (req)",
        "one list p50/max ms (req)",
        "ratio",
        "seal bytes",
        "tokens"
    );
    let uid = thread.uid().expect("a created thread has a UID");
    let sizes = [1, 10, 100, 1000].into_iter().filter(|n| *n <= total);
    let mut turns = Vec::new();
    for n in sizes {
        let place = turns.len() as i64 + 1;
        turns.extend(write_turns(&client, &thread, place, n - turns.len()).await);
        let history = &turns[..];
        // Each turn alone at 1,000 is left out: 1,000 lists at once, each reading every
        // segment of the namespace from etcd, filled this machine's 24 GiB (API server and
        // etcd 12 GB each) before it answered.
        let alone = match n <= ALONE_AT_MOST {
            true => reads(&ns, None, history, repeats).await?.0,
            false => Reads::skipped(),
        };
        let (listed, tokens) = reads(&ns, Some(&uid), history, repeats).await?;
        let seal = seal_bytes(history)?;
        println!(
            "  {n:>6}  {:>12.1} / {:>7.1} ({:>4})  {:>12.1} / {:>7.1} ({:>4})  {:>6.1}x  {seal:>11}  {tokens:>9}",
            alone.p50(),
            alone.max(),
            alone.requests,
            listed.p50(),
            listed.max(),
            listed.requests,
            alone.p50() / listed.p50().max(0.001),
        );
    }
    own_ledger_reads(&client, &ns, &turns[0], repeats).await?;
    postgres_reads(&client, &ns, total, repeats).await?;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    Ok(())
}

/// Reads `history` `repeats` times (after one read that warms the caches), as a turn of the
/// thread of UID `thread_uid` does (None: each turn alone); and the history's estimated tokens.
async fn reads(
    ns: &str,
    thread_uid: Option<&str>,
    history: &[HistoryTurn],
    repeats: usize,
) -> anyhow::Result<(Reads, i64)> {
    let counters = Arc::new(ApiCounters::default());
    let ledgers = Ledgers::api_server(counted_client(counters.clone()).await?);
    let tokens = estimated_tokens(&build(&ledgers, ns, thread_uid, history).await?);
    let before = counters.snapshot().total();
    let mut times = Vec::new();
    for _ in 0..repeats {
        let started = Instant::now();
        build(&ledgers, ns, thread_uid, history).await?;
        times.push(started.elapsed());
    }
    let requests = (counters.snapshot().total() - before) / repeats as u64;
    Ok((Reads { times, requests }, tokens))
}

/// One history build: read and folded.
async fn build(
    ledgers: &Ledgers,
    ns: &str,
    thread_uid: Option<&str>,
    history: &[HistoryTurn],
) -> anyhow::Result<Vec<ReplayedMessage>> {
    let earlier = ledgers.read_history(ns, thread_uid, history).await??;
    Ok(earlier.into_iter().flat_map(|(_, m)| m).collect())
}

/// The bytes of the `history` event a turn after `history` has in its first seal.
fn seal_bytes(history: &[HistoryTurn]) -> anyhow::Result<usize> {
    let event = LedgerEvent::History {
        thread: "long".into(),
        turns: history.to_vec(),
        context: None,
    };
    Ok(serde_json::to_vec(&event)?.len())
}

/// What a worker's read of its own ledger costs in this namespace as it starts: the list by its
/// UID label from etcd (before: every segment of the namespace read to filter), and now (the
/// watch cache's list, confirmed by a read of the next position).
async fn own_ledger_reads(
    client: &Client,
    ns: &str,
    turn: &HistoryTurn,
    repeats: usize,
) -> anyhow::Result<()> {
    let runs: Api<baton::crd::v1alpha1::AgentRun> = Api::namespaced(client.clone(), ns);
    let store = baton::ledger::SegmentStore::for_run(client.clone(), &runs.get(&turn.run).await?);
    let segments: Api<baton::crd::v1alpha1::LedgerSegment> = Api::namespaced(client.clone(), ns);
    let from_etcd = kube::api::ListParams::default().labels(&format!(
        "{}={}",
        baton::crd::RUN_UID_LABEL,
        turn.uid
    ));
    let (mut before, mut now) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let started = Instant::now();
        let listed = segments.list(&from_etcd).await?.items;
        before.push(started.elapsed());
        let started = Instant::now();
        let read = store.list().await?;
        now.push(started.elapsed());
        anyhow::ensure!(listed.len() == read.len(), "both read the whole ledger");
    }
    let before = Reads {
        times: before,
        requests: 1,
    };
    let now = Reads {
        times: now,
        requests: 2,
    };
    println!(
        "  a worker's read of its own {}-position ledger as it starts, {} segments in the \
         namespace: {:.1} ms p50 before (a list from etcd), {:.1} ms now (the watch cache's list \
         and one read; {:.0}x)",
        turn.up_to,
        namespace_segments(client, ns).await?,
        before.p50(),
        now.p50(),
        before.p50() / now.p50().max(0.001)
    );
    Ok(())
}

/// Segments in the namespace (from the watch cache).
async fn namespace_segments(client: &Client, ns: &str) -> anyhow::Result<i64> {
    let segments: Api<baton::crd::v1alpha1::LedgerSegment> = Api::namespaced(client.clone(), ns);
    let params = kube::api::ListParams::default().match_any();
    Ok(segments.list_metadata(&params).await?.items.len() as i64)
}

/// The history builds of a thread whose turns are kept in PostgreSQL, grown to the same sizes,
/// read through `baton server` with a reader's ledger token: each turn alone (one request each,
/// as before) and all at once; requests as the server counted them.
async fn postgres_reads(
    client: &Client,
    ns: &str,
    total: usize,
    repeats: usize,
) -> anyhow::Result<()> {
    use baton::crd::v1alpha1::LedgerBackend;
    use baton::ledger::served::{LEDGER_AUDIENCE, LedgerClient, LedgerToken};
    let url = std::env::var("BATON_TEST_POSTGRES_URL")?;
    let db = baton::ledger::postgres::PgLedger::connect(&url, 4).await?;
    let direct = Ledgers::with_postgres(client.clone(), db);
    let kept = TurnLedgers {
        ledgers: &direct,
        backend: LedgerBackend::PostgreSQL,
    };
    let (base, _server) = baton_testkit::server::start_ledger_server(vec![]).await;
    let reader = baton_testkit::rbac::rule(&["ledgersegments"], &["get", "list"]);
    baton_testkit::rbac::person(client, ns, "reader", vec![reader]).await;
    let token =
        baton_testkit::rbac::mint_token_for(client, ns, "reader", LEDGER_AUDIENCE, None).await;
    let server = LedgerClient::new(&base, LedgerToken::Fixed(token));
    let ledgers = Ledgers::with_server(client.clone(), server, LedgerBackend::PostgreSQL);
    let thread = create_thread(client, ns, "long-pg").await;
    println!("  the same, the turns kept in PostgreSQL, read through baton server:");
    println!(
        "  {:>6}  {:>28}  {:>28}  {:>7}",
        "turns", "each turn alone p50/max ms (req)", "at once p50/max ms (req)", "ratio"
    );
    let mut turns = Vec::new();
    for n in [1, 10, 100, 1000].into_iter().filter(|n| *n <= total) {
        let place = turns.len() as i64 + 1;
        turns.extend(write_turns_in(client, &kept, &thread, place, n - turns.len()).await);
        let alone = timed(&base, repeats, || async {
            let reads = turns
                .iter()
                .map(|t| ledgers.read_run(LedgerBackend::PostgreSQL, ns, &t.run, &t.uid));
            for read in futures::future::join_all(reads).await {
                read?;
            }
            Ok(())
        })
        .await?;
        let at_once = timed(&base, repeats, || async {
            build(&ledgers, ns, thread.uid().as_deref(), &turns)
                .await
                .map(|_| ())
        })
        .await?;
        println!(
            "  {n:>6}  {:>12.1} / {:>7.1} ({:>4})  {:>12.1} / {:>7.1} ({:>4})  {:>6.1}x",
            alone.p50(),
            alone.max(),
            alone.requests,
            at_once.p50(),
            at_once.max(),
            at_once.requests,
            alone.p50() / at_once.p50().max(0.001),
        );
    }
    Ok(())
}

/// `read` `repeats` times (after one that warms the caches), timed; its requests per read as
/// the server at `base` counted them.
async fn timed<F, R>(base: &str, repeats: usize, read: F) -> anyhow::Result<Reads>
where
    F: Fn() -> R,
    R: std::future::Future<Output = anyhow::Result<()>>,
{
    read().await?;
    let before = baton_testkit::server::answered(base).await;
    let mut times = Vec::new();
    for _ in 0..repeats {
        let started = Instant::now();
        read().await?;
        times.push(started.elapsed());
    }
    // The first scrape counts itself once it is answered.
    let requests = (baton_testkit::server::answered(base).await - before - 1) / repeats as u64;
    Ok(Reads { times, requests })
}
