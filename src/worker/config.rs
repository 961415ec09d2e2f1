//! The worker's configuration: `baton worker`'s arguments (everything from the pod's
//! environment; flags are for tests) and the settings an attempt runs with.

use std::path::PathBuf;
use std::time::Duration;

use super::admin::AdminAddr;
use super::appender::FlushPolicy;
use crate::fence::Fence;
use crate::ledger::SEGMENT_BUDGET_BYTES;
use crate::serving::admin::WORKER_ADMIN_ADDR;
use crate::telemetry::LogFormat;

/// Default cap on the ledger's size: past it the run ends `Interrupted` (TranscriptTooLarge).
pub const DEFAULT_MAX_LEDGER_BYTES: u64 = 64 * 1024 * 1024;

/// `baton worker`: everything comes from the pod's environment; flags are for tests.
#[derive(clap::Args, Clone)]
pub struct WorkerArgs {
    /// The run's name.
    #[arg(long, env = crate::crd::env::RUN)]
    pub run: String,
    /// The run's namespace.
    #[arg(long, env = crate::crd::env::NAMESPACE)]
    pub namespace: String,
    /// The fence this pod was created for.
    #[arg(long, env = crate::crd::env::FENCE)]
    pub fence: Fence,
    /// This pod's name: its holder identity on the run Lease.
    #[arg(long, env = crate::crd::env::POD)]
    pub pod: String,
    /// The model API key (never logged or stored).
    #[arg(long, env = crate::crd::env::MODEL_API_KEY, hide_env_values = true)]
    pub model_api_key: Option<String>,
    /// Ledger size cap in bytes; past it the run ends Interrupted (TranscriptTooLarge).
    #[arg(long, default_value_t = DEFAULT_MAX_LEDGER_BYTES)]
    pub max_ledger_bytes: u64,
    /// Flush buffered ledger events at least this often (milliseconds).
    #[arg(long, default_value_t = 500)]
    pub flush_millis: u64,
    /// Flush once this many events are buffered.
    #[arg(long, default_value_t = 32)]
    pub flush_events: usize,
    /// On SIGTERM, how long a running tool may take before it is killed (seconds).
    #[arg(long, default_value_t = 20)]
    pub handoff_grace_seconds: u64,
    /// Minimum spacing of progress writes to status (milliseconds).
    #[arg(long, default_value_t = 1000)]
    pub progress_millis: u64,
    /// Write the API request counts (JSON) to this file at exit (used by the benchmark).
    #[arg(long)]
    pub stats_file: Option<PathBuf>,
    /// Admin server (/metrics, /livez, /readyz); `none` disables it. A busy port is logged
    /// and skipped.
    #[arg(long, env = "BATON_ADMIN_ADDR", default_value = WORKER_ADMIN_ADDR)]
    pub admin_addr: AdminAddr,
    /// Log format.
    #[arg(long, env = "BATON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serialized events per LedgerSegment, at most (tests use a small one to split events).
    #[arg(long, hide = true, default_value_t = SEGMENT_BUDGET_BYTES)]
    pub segment_budget_bytes: usize,
    /// The tools container's executor socket (the pod sets it). Without one, shell tools and
    /// probes cannot run.
    #[arg(long, env = crate::crd::env::EXECUTOR_SOCKET)]
    pub executor_socket: Option<PathBuf>,
    /// The directory shared with the run's agent container (the pod sets it when the run
    /// brings its own agent): its executor's socket and the run's input.
    #[arg(long, env = crate::crd::env::AGENT_DIR)]
    pub agent_dir: Option<PathBuf>,
    /// How long to wait for the executor to listen (the tools container starts first).
    #[arg(long, default_value_t = 120)]
    pub executor_wait_seconds: u64,
    /// Where the headers of each MCP server are mounted (`<dir>/<tool name>/<header>`): the
    /// pod mounts each `headersFromSecret` there, in this container only.
    #[arg(long, env = crate::crd::env::MCP_HEADERS_DIR, default_value = crate::crd::MCP_HEADERS_DIR)]
    pub mcp_headers_dir: PathBuf,
    /// `baton server`'s address, for a run whose ledger is kept in PostgreSQL (the pod sets it
    /// when the cluster keeps ledgers there).
    #[arg(long, env = crate::crd::env::LEDGER_SERVER)]
    pub ledger_server: Option<String>,
    /// The token the ledger server is asked with (a projected token for `baton.dev/ledger`,
    /// read at every request: the kubelet rotates it).
    #[arg(long, env = crate::crd::env::LEDGER_TOKEN_FILE, default_value = crate::crd::LEDGER_TOKEN_PATH)]
    pub ledger_token_file: PathBuf,
    /// The CA (PEM text) the ledger server's certificate chains to, when it serves TLS (the
    /// pod sets it then).
    #[arg(long, env = crate::crd::env::LEDGER_SERVER_CA, hide_env_values = true)]
    pub ledger_server_ca: Option<String>,
    /// Set on a pod started ahead for a thread's next turn: the thread's UID. The worker then
    /// waits for that turn to be claimed for this pod, and serves nothing else.
    #[arg(long, env = crate::crd::env::WARM_THREAD_UID)]
    pub warm_thread_uid: Option<String>,
    /// With `--warm-thread-uid`: the thread's generation the pod was made from.
    #[arg(long, env = crate::crd::env::WARM_THREAD_GENERATION)]
    pub warm_thread_generation: Option<i64>,
    /// With `--warm-thread-uid`: how long to wait for the turn before exiting.
    #[arg(long, env = crate::crd::env::WARM_IDLE_SECONDS, default_value_t = 300)]
    pub warm_idle_seconds: u64,
    /// With `--warm-thread-uid`: this pod's UID (the worker starts only once the run has
    /// adopted the pod of this UID).
    #[arg(long, env = crate::crd::env::WARM_POD_UID)]
    pub warm_pod_uid: Option<String>,
}

/// The worker's settings.
#[derive(Clone)]
pub struct WorkerConfig {
    pub run: String,
    pub namespace: String,
    pub fence: Fence,
    pub pod: String,
    pub api_key: Option<String>,
    pub max_ledger_bytes: u64,
    pub flush: FlushPolicy,
    pub handoff_grace: Duration,
    pub progress_interval: Duration,
    pub stats_file: Option<PathBuf>,
    /// Serialized events per segment, at most.
    pub segment_budget: usize,
    pub executor_socket: Option<PathBuf>,
    pub agent_dir: Option<PathBuf>,
    pub executor_wait: Duration,
    pub mcp_headers_dir: PathBuf,
    /// Where runs kept in PostgreSQL are reached (None: nowhere).
    pub ledger_server: Option<crate::ledger::LedgerClient>,
    /// On a pod started ahead for a thread's next turn: what it waits for.
    pub warm: Option<super::warm::Warm>,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("run", &self.run)
            .field("namespace", &self.namespace)
            .field("fence", &self.fence)
            .field("pod", &self.pod)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl TryFrom<WorkerArgs> for WorkerConfig {
    /// A ledger server CA that does not read as PEM certificates.
    type Error = crate::ledger::LedgerError;

    fn try_from(a: WorkerArgs) -> Result<Self, Self::Error> {
        let ledger_server = match a.ledger_server {
            Some(url) => {
                let token = crate::ledger::LedgerToken::File(a.ledger_token_file);
                let server = crate::ledger::LedgerClient::new(&url, token);
                Some(match a.ledger_server_ca.as_deref() {
                    Some(ca) => server.trusting(ca)?,
                    None => server,
                })
            }
            None => None,
        };
        let warm = a.warm_thread_uid.map(|thread_uid| super::warm::Warm {
            thread_uid,
            thread_generation: a.warm_thread_generation,
            pod_uid: a.warm_pod_uid.unwrap_or_default(),
            idle: Duration::from_secs(a.warm_idle_seconds),
        });
        Ok(Self {
            warm,
            run: a.run,
            namespace: a.namespace,
            fence: a.fence,
            pod: a.pod,
            api_key: a.model_api_key.filter(|k| !k.is_empty()),
            max_ledger_bytes: a.max_ledger_bytes,
            flush: FlushPolicy {
                interval: Duration::from_millis(a.flush_millis.max(1)),
                max_events: a.flush_events.max(1),
            },
            handoff_grace: Duration::from_secs(a.handoff_grace_seconds),
            progress_interval: Duration::from_millis(a.progress_millis),
            stats_file: a.stats_file,
            segment_budget: a.segment_budget_bytes.max(1024),
            executor_socket: a.executor_socket,
            agent_dir: a.agent_dir,
            executor_wait: Duration::from_secs(a.executor_wait_seconds),
            mcp_headers_dir: a.mcp_headers_dir,
            ledger_server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    fn parse(args: &[&str]) -> WorkerArgs {
        use clap::Parser;
        let base = ["baton", "--run=r", "--namespace=n", "--fence=1", "--pod=p"];
        Cli::parse_from(base.iter().chain(args)).worker
    }

    #[test]
    fn the_api_key_never_shows_in_debug_output() {
        let cfg: WorkerConfig = parse(&["--model-api-key=sk-very-secret-123"])
            .try_into()
            .unwrap();
        assert_eq!(cfg.api_key.as_deref(), Some("sk-very-secret-123"));
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn flags_default_to_text_logs_and_the_admin_port() {
        let args = parse(&[]);
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.admin_addr, WORKER_ADMIN_ADDR.parse().unwrap());
        let cfg: WorkerConfig = args.try_into().unwrap();
        assert_eq!(cfg.segment_budget, SEGMENT_BUDGET_BYTES);
        let args = parse(&["--log-format=json", "--admin-addr=none"]);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.admin_addr, AdminAddr(None));
        let cfg: WorkerConfig = parse(&["--segment-budget-bytes=4096"]).try_into().unwrap();
        assert_eq!(cfg.segment_budget, 4096);
    }
}
