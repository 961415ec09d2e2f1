//! The user-facing CLI verbs (`baton get|transcript|stop|input|approve|deny|describe`, also `kubectl baton
//! ...`): argument types, errors, and the entry point. `render` is pure; `ops` does the I/O.

mod describe;
mod ops;
mod render;
#[cfg(test)]
mod render_tests;

use kube::Client;

use crate::display::Neutral;
pub use crate::display::{age, neutralize};

pub use ops::Session;

/// A CLI verb.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Verb {
    /// List AgentRuns: phase, attempt, steps, unknown effects, worker, age.
    Get(GetArgs),
    /// Print a run's transcript from its ledger, in order; `-f` follows it live.
    Transcript(TranscriptArgs),
    /// Ask a run to stop (sets `spec.stop`); it ends `Stopped`.
    Stop(RunArgs),
    /// Answer a run that is waiting for input (appends to `spec.inputs`).
    Input(InputArgs),
    /// Approve the tool call a run waits on (appends to `spec.approvals`): it runs.
    Approve(ApproveArgs),
    /// Deny the tool call a run waits on (appends to `spec.approvals`): it is not run, and
    /// the model is told why.
    Deny(DenyArgs),
    /// Show a run's phase, attempts and fences, unknown effects, conditions and Events.
    Describe(RunArgs),
    /// Say something in a thread: creates a turn, prints its transcript as its ledger grows,
    /// and exits with its outcome (0 once it succeeded).
    Chat(ChatArgs),
    /// Print a thread's conversation, turn by turn, from the turns' ledgers.
    Thread(ThreadArgs),
}

/// Flags of `chat`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub target: ThreadArgs,
    /// The message: the new turn's input.
    pub message: String,
}

/// A verb on one thread.
#[derive(Debug, Clone, clap::Args)]
pub struct ThreadArgs {
    /// The AgentThread's name.
    pub thread: String,
    /// Namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// `kubectl-baton`: the same verbs as a kubectl plugin (`kubectl baton get ...`).
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-baton",
    version,
    about = "baton AgentRuns, as a kubectl plugin"
)]
pub struct PluginCli {
    #[command(subcommand)]
    pub verb: Verb,
}

/// Flags of `get`.
#[derive(Debug, Clone, clap::Args)]
pub struct GetArgs {
    /// Only this run.
    pub run: Option<String>,
    /// Namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// List runs in every namespace.
    #[arg(short = 'A', long, conflicts_with_all = ["namespace", "run"])]
    pub all_namespaces: bool,
}

/// A verb on one run.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The AgentRun's name.
    pub run: String,
    /// Namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// Flags of `transcript`.
#[derive(Debug, Clone, clap::Args)]
pub struct TranscriptArgs {
    #[command(flatten)]
    pub target: RunArgs,
    /// Keep printing new ledger segments until the run ends.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// `baton server`'s address (`http://host:port`). A run whose ledger is kept in
    /// PostgreSQL is read through it: this command holds no credential of the database.
    #[arg(long, env = "BATON_SERVER")]
    pub server: Option<String>,
    /// A file holding the bearer token the server acts with on your behalf (with --server;
    /// default: the kubeconfig user's token, token file, exec plugin or auth provider): the
    /// API server decides what it may read, as for any reader.
    #[arg(long, env = "BATON_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// The CA (PEM file) an `https://` --server's certificate chains to (default: the
    /// system's roots).
    #[arg(long, env = "BATON_SERVER_CA_FILE")]
    pub server_ca_file: Option<std::path::PathBuf>,
}

/// Flags of `input`.
#[derive(Debug, Clone, clap::Args)]
pub struct InputArgs {
    #[command(flatten)]
    pub target: RunArgs,
    /// The answer to send.
    pub text: String,
}

/// Flags of `approve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub target: RunArgs,
    /// The step you mean (default: the one `status.pendingApproval` shows). A step that is
    /// not the waiting one is refused.
    #[arg(long)]
    pub step: Option<i64>,
    /// Why (recorded in the ledger).
    #[arg(long)]
    pub reason: Option<String>,
}

/// Flags of `deny`.
#[derive(Debug, Clone, clap::Args)]
pub struct DenyArgs {
    #[command(flatten)]
    pub target: RunArgs,
    /// The step you mean (default: the one `status.pendingApproval` shows). A step that is
    /// not the waiting one is refused.
    #[arg(long)]
    pub step: Option<i64>,
    /// Why: the model is told, so it can choose another way.
    #[arg(long)]
    pub reason: String,
}

/// Errors of the CLI verbs, worded for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("run {name} not found in namespace {namespace}")]
    RunNotFound { name: String, namespace: String },
    #[error("run {name} is not waiting for input (phase {phase})")]
    NotWaitingForInput { name: String, phase: String },
    #[error(transparent)]
    Decision(#[from] crate::approval::DecisionError),
    #[error("cannot reach the cluster at {server}: {detail}")]
    Unreachable { server: String, detail: String },
    #[error("no cluster configured ({0}); set KUBECONFIG or run inside a cluster")]
    NoConfig(String),
    #[error("the API server at {server} refused the request: {detail}")]
    Api { server: String, detail: String },
    #[error("reading the ledger of run {name}: {detail}")]
    Ledger { name: String, detail: String },
    #[error("run {name} kept changing while we tried to update it; try again")]
    Contended { name: String },
    #[error(
        "the call of step {step} is not in the ledger of run {name}: not approving a call that cannot be shown whole (see `baton transcript {name}`)"
    )]
    CallNotShown { name: String, step: i64 },
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    #[error("thread {name} not found in namespace {namespace}")]
    ThreadNotFound { name: String, namespace: String },
    #[error("turn {name} ended {phase}: {reason}: {message}")]
    TurnDidNotSucceed {
        name: String,
        phase: String,
        reason: String,
        message: String,
    },
    #[error("turn {name} waits ({phase}): {message}")]
    TurnWaits {
        name: String,
        phase: String,
        message: String,
    },
}

impl CliError {
    /// Low-cardinality label (for logs and tests).
    pub fn label(&self) -> &'static str {
        match self {
            CliError::RunNotFound { .. } => "run_not_found",
            CliError::NotWaitingForInput { .. } => "not_waiting_for_input",
            CliError::Decision(_) => "decision_refused",
            CliError::Unreachable { .. } => "unreachable",
            CliError::NoConfig(_) => "no_config",
            CliError::Api { .. } => "api",
            CliError::Ledger { .. } => "ledger",
            CliError::Contended { .. } => "contended",
            CliError::CallNotShown { .. } => "call_not_shown",
            CliError::Io(_) => "io",
            CliError::ThreadNotFound { .. } => "thread_not_found",
            CliError::TurnDidNotSucceed { .. } => "turn_did_not_succeed",
            CliError::TurnWaits { .. } => "turn_waits",
        }
    }
}

/// Runs one verb against the cluster named by the environment (KUBECONFIG, in-cluster).
pub async fn main(verb: Verb) -> Result<(), CliError> {
    let config = crate::kube_util::config_for("cli")
        .await
        .map_err(|e| CliError::NoConfig(e.to_string()))?;
    let server = config.cluster_url.to_string();
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config.clone()).map_err(|e| CliError::NoConfig(e.to_string()))?;
    let session = Session::new(client, server, default_namespace).with_kubeconfig(config);
    let mut out = Neutral(std::io::stdout());
    session.run(verb, &mut out).await
}
