//! Ledger benchmark (`make bench-ledger`): the same transcripts written to both backends on
//! the bed, one after the other, as workers write them: each run one awaited fenced append at
//! a time, 64 runs at a time. Prints, per backend:
//! - appends per second;
//! - awaited requests per append (the worker's: API-server creates for LedgerSegments, HTTP
//!   calls to `baton server` for PostgreSQL; target 1.0);
//! - API-server requests per append (for PostgreSQL: the server's token review and its fresh
//!   read of the run, which store nothing);
//! - etcd bytes and API-server memory per transcript byte (target with PostgreSQL: no growth),
//!   and both before and after, in MiB.
//!
//!     bash hack/with-control-plane.sh cargo run --release --example ledger_bench [-- RUNS APPENDS BYTES]
//!
//! `make bench-ledger-load` is the same at scale: 10,000 runs and 1 GiB of transcript per
//! backend, on a bed of its own whose etcd may hold that much (`--quota-backend-bytes` 8 GiB,
//! etcd's suggested maximum).
//!
//! The PostgreSQL writers are real worker identities: a ServiceAccount per run and a token
//! bound to its attempt's pod, reviewed by the API server, through an in-process
//! `baton server` holding the database (`BATON_TEST_POSTGRES_URL`). Memory is the API
//! server's own figures (`process_resident_memory_bytes`, `go_memstats_heap_inuse_bytes`),
//! read once before and once after: a garbage collector's timing moves them, so read them as
//! one run's, not as a law.

use baton_testkit::metrics;

use baton_testkit::common::namespace;
use baton_testkit::rbac;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use baton::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerBackend, LedgerEvent, Phase, Role};
use baton::fence::{Fence, worker_pod_name};
use baton::ledger::postgres::PgLedger;
use baton::ledger::served::LEDGER_AUDIENCE;
use baton::ledger::{LedgerClient, LedgerToken, RunLedger, SegmentStore};
use baton::rbac::worker_service_account_name;

/// How many runs are prepared, and written, at a time: a busy cluster's worth of workers,
/// and few enough that a 10,000-run load does not open 10,000 connections at once.
const AT_ONCE: usize = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    let appends: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(100);
    let bytes: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(16384);
    let client = Client::try_default().await?;
    baton::crd::install(client.clone(), Duration::from_secs(60)).await?;
    let url = std::env::var("BATON_TEST_POSTGRES_URL").map_err(|_| {
        anyhow::anyhow!("BATON_TEST_POSTGRES_URL: run through hack/with-control-plane.sh")
    })?;
    let server = start_server(&client, &url).await?;
    let etcd = etcd_port()?;
    println!(
        "ledger bench: {runs} runs x {appends} appends x {bytes} B of model text, per backend"
    );
    let mut figures = Vec::new();
    // PostgreSQL first: the API server's and etcd's readings before it are then not those of
    // a namespace of 1 GiB being deleted.
    for backend in [LedgerBackend::PostgreSQL, LedgerBackend::LedgerSegments] {
        let ns = namespace(&client).await?;
        let ledgers = prepare(&client, &ns, runs, backend, &server).await?;
        let before = Snapshot::take(&client, etcd, &server).await?;
        let started = Instant::now();
        write(ledgers, appends, bytes).await?;
        let secs = started.elapsed().as_secs_f64();
        // Let the API server's watch cache and etcd settle before the second reading.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = Snapshot::take(&client, etcd, &server).await?;
        let written = (runs * appends) as f64;
        figures.push(Figures {
            backend,
            appends_per_sec: written / secs,
            awaited_per_append: after.awaited(&before, backend) / written,
            api_requests_per_append: (after.api_requests - before.api_requests) / written,
            etcd_per_byte: (after.etcd_bytes - before.etcd_bytes) / (written * bytes as f64),
            rss_per_byte: (after.api_rss - before.api_rss) / (written * bytes as f64),
            heap_per_byte: (after.api_heap - before.api_heap) / (written * bytes as f64),
            transcript_mib: written * bytes as f64 / MIB,
            etcd_mib: (before.etcd_bytes / MIB, after.etcd_bytes / MIB),
            rss_mib: (before.api_rss / MIB, after.api_rss / MIB),
        });
        let _ = Api::<Namespace>::all(client.clone())
            .delete(&ns, &Default::default())
            .await;
    }
    report(&figures);
    Ok(())
}

/// One backend's figures.
struct Figures {
    backend: LedgerBackend,
    appends_per_sec: f64,
    awaited_per_append: f64,
    api_requests_per_append: f64,
    etcd_per_byte: f64,
    rss_per_byte: f64,
    heap_per_byte: f64,
    /// The transcript written, and what etcd and the API server held before and after it
    /// (MiB).
    transcript_mib: f64,
    etcd_mib: (f64, f64),
    rss_mib: (f64, f64),
}

const MIB: f64 = 1024.0 * 1024.0;

fn report(figures: &[Figures]) {
    println!(
        "\n| figure | {} |\n|---|{}",
        figures
            .iter()
            .map(|f| format!("{:?}", f.backend))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(figures.len())
    );
    let row = |name: &str, value: &dyn Fn(&Figures) -> String| {
        let cells: Vec<String> = figures.iter().map(value).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    row("appends per second", &|f| {
        format!("{:.0}", f.appends_per_sec)
    });
    row("awaited requests per append (target 1.0)", &|f| {
        format!("{:.2}", f.awaited_per_append)
    });
    row("API-server requests per append", &|f| {
        format!("{:.2}", f.api_requests_per_append)
    });
    row("etcd bytes per transcript byte", &|f| {
        format!("{:.2}", f.etcd_per_byte)
    });
    row("API-server RSS per transcript byte", &|f| {
        format!("{:.2}", f.rss_per_byte)
    });
    row("API-server heap in use per transcript byte", &|f| {
        format!("{:.2}", f.heap_per_byte)
    });
    row("transcript written (MiB)", &|f| {
        format!("{:.0}", f.transcript_mib)
    });
    row("etcd in use before → after (MiB)", &|f| {
        format!("{:.0} → {:.0}", f.etcd_mib.0, f.etcd_mib.1)
    });
    row("API-server RSS before → after (MiB)", &|f| {
        format!("{:.0} → {:.0}", f.rss_mib.0, f.rss_mib.1)
    });
}

/// What is read before and after a backend's writes.
struct Snapshot {
    etcd_bytes: f64,
    api_rss: f64,
    api_heap: f64,
    api_requests: f64,
    segment_creates: f64,
    served_appends: f64,
}

impl Snapshot {
    async fn take(client: &Client, etcd_port: u16, server: &Served) -> anyhow::Result<Self> {
        let etcd = metrics::scrape(etcd_port).await?;
        let api = metrics::scrape_apiserver(client).await?;
        let served = metrics::scrape(server.port).await?;
        let segment_creates = ["resource=\"ledgersegments\"", "verb=\"POST\""];
        Ok(Self {
            etcd_bytes: sum(&etcd, "etcd_mvcc_db_total_size_in_use_in_bytes"),
            api_rss: sum(&api, "process_resident_memory_bytes"),
            api_heap: sum(&api, "go_memstats_heap_inuse_bytes"),
            api_requests: sum(&api, "apiserver_request_total"),
            segment_creates: sum_where(&api, "apiserver_request_total", &segment_creates),
            served_appends: sum(&served, "baton_server_responses_total"),
        })
    }

    /// The requests the writers awaited since `before`.
    fn awaited(&self, before: &Snapshot, backend: LedgerBackend) -> f64 {
        match backend {
            LedgerBackend::LedgerSegments => self.segment_creates - before.segment_creates,
            // The two /metrics reads of the snapshots are answered too.
            LedgerBackend::PostgreSQL => self.served_appends - before.served_appends - 1.0,
        }
    }
}

fn sum(samples: &metrics::Samples, name: &str) -> f64 {
    sum_where(samples, name, &[])
}

/// The sum of the series named `name` whose labels hold every one of `labels`.
fn sum_where(samples: &metrics::Samples, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let metric = series.split('{').next().unwrap_or_default();
            metric == name && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

/// The bed's etcd client port (it serves /metrics), from hack/control-plane.sh's state file.
fn etcd_port() -> anyhow::Result<u16> {
    let dir = std::env::var("BATON_CP_DIR").unwrap_or_else(|_| {
        format!(
            "{}/baton-control-plane",
            std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into())
        )
    });
    let state = std::fs::read_to_string(format!("{dir}/state"))?;
    let port = state
        .lines()
        .find_map(|l| l.strip_prefix("ETCD_PORT="))
        .ok_or_else(|| anyhow::anyhow!("no ETCD_PORT in {dir}/state"))?;
    Ok(port.parse()?)
}

/// `baton server` in this process, serving the PostgreSQL ledger.
struct Served {
    base: String,
    port: u16,
    _task: tokio::task::JoinHandle<()>,
}

async fn start_server(client: &Client, url: &str) -> anyhow::Result<Served> {
    let db = PgLedger::connect(url, 16).await?;
    let config = kube::Config::infer().await?;
    let service = baton::server::LedgerService::new(db, client.clone(), vec![]);
    let state = baton::server::ServerState::new(config, Default::default()).with_ledger(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let base = format!("http://127.0.0.1:{port}");
    let app = baton::server::router(Arc::new(state));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Served {
        base,
        port,
        _task: task,
    })
}

async fn namespace(client: &Client) -> anyhow::Result<String> {
    let ns = format!("ledger-bench-{}", rand::random::<u32>() % 1_000_000);
    namespace::create_namespace(client, &ns).await?;
    Ok(ns)
}

/// `runs` runs held at fence 1 in `backend`, each with the ledger its worker writes through.
async fn prepare(
    client: &Client,
    ns: &str,
    runs: usize,
    backend: LedgerBackend,
    server: &Served,
) -> anyhow::Result<Vec<RunLedger>> {
    let prepared = (0..runs).map(|i| async move {
        let name = format!("bench-{i}");
        let run = held_run(client, ns, &name, backend).await?;
        anyhow::Ok(match backend {
            LedgerBackend::LedgerSegments => {
                RunLedger::Segments(SegmentStore::for_run(client.clone(), &run))
            }
            LedgerBackend::PostgreSQL => {
                let token = worker_token(client, ns, &name).await?;
                let writer = LedgerClient::new(&server.base, LedgerToken::Fixed(token));
                RunLedger::Served(writer.for_run(ns, &name, &run.uid().unwrap_or_default()))
            }
        })
    });
    futures::stream::iter(prepared)
        .buffer_unordered(AT_ONCE)
        .try_collect()
        .await
}

/// A run held by its first attempt, its ledger kept in `backend`.
async fn held_run(
    client: &Client,
    ns: &str,
    name: &str,
    backend: LedgerBackend,
) -> anyhow::Result<AgentRun> {
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let run: AgentRun = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"input": "benchmark", "agent": {"model": {"script": [{"text": "done"}]}}}
    }))?;
    let mut run = runs.create(&PostParams::default(), &run).await?;
    run.status = Some(AgentRunStatus {
        phase: Phase::Running,
        fence: Fence::new(1),
        attempt: 1,
        worker: Some(worker_pod_name(name, Fence::new(1))),
        ledger_backend: Some(backend),
        ..AgentRunStatus::default()
    });
    Ok(runs
        .replace_status(name, &PostParams::default(), &run)
        .await?)
}

/// The ledger token of run `name`'s first attempt: its worker account, bound to its pod (an
/// object only: no kubelet runs on the bed).
async fn worker_token(client: &Client, ns: &str, name: &str) -> anyhow::Result<String> {
    let account = worker_service_account_name(name);
    rbac::person(client, ns, &account, vec![]).await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": worker_pod_name(name, Fence::new(1))},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": false,
            "containers": [{"name": "worker", "image": "baton:never-run"}]
        }
    }))?;
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    let bound = (pod.name_any(), pod.uid().unwrap_or_default());
    Ok(rbac::mint_token_for(
        client,
        ns,
        &account,
        LEDGER_AUDIENCE,
        Some((&bound.0, &bound.1)),
    )
    .await)
}

/// Every run's `appends` appends of `bytes` of model text, one awaited at a time per run,
/// [`AT_ONCE`] runs at a time.
async fn write(ledgers: Vec<RunLedger>, appends: usize, bytes: usize) -> anyhow::Result<()> {
    let text = "lorem ipsum ".repeat(bytes / 12 + 1)[..bytes].to_string();
    let writers = ledgers.into_iter().map(|ledger| {
        let text = text.clone();
        async move {
            let mut tail = 0;
            for _ in 0..appends {
                let events = vec![LedgerEvent::Message {
                    role: Role::Assistant,
                    content: text.clone(),
                }];
                tail = ledger.append(tail, Fence::new(1), events).await?.tail;
            }
            anyhow::Ok(())
        }
    });
    futures::stream::iter(writers)
        .buffer_unordered(AT_ONCE)
        .try_collect::<()>()
        .await
}
