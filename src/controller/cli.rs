//! `baton controller`: flags, and the entry point the binary calls.

use std::net::SocketAddr;
use std::time::Duration;

use crate::crd::v1alpha1::LedgerBackend;
use crate::ledger::{LedgerClient, LedgerError, LedgerToken};
use crate::telemetry::LogFormat;
use crate::webhook::{CertIssuer, TlsSettings, WebhookConfig};

use super::{Config, DEFAULT_WORKER_IMAGE, Error, RolloutPolicy, default_identity};

/// Flags of `baton controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Worker image for runs that do not name one.
    #[arg(long, env = "BATON_WORKER_IMAGE", default_value = DEFAULT_WORKER_IMAGE)]
    pub worker_image: String,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "BATON_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Elect a leader among replicas (`--leader-election=false` to run without).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_namespace: String,
    /// Leader Lease duration, in seconds.
    #[arg(long, default_value_t = 15)]
    pub leader_lease_seconds: u64,
    /// Admin server (metrics, /livez, /readyz).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Runs in a rollout handoff at once.
    #[arg(long, default_value_t = 1)]
    pub max_concurrent_handoffs: usize,
    /// What live runs do when the worker image changes: `handoff` or `keep`.
    #[arg(long, default_value = "handoff", value_parser = parse_policy)]
    pub rollout_policy: RolloutPolicy,
    /// Log format: `text`, or `json` for one JSON object per line.
    #[arg(long, env = "BATON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Reconciles running at once.
    #[arg(long, default_value_t = super::DEFAULT_CONCURRENCY)]
    pub concurrency: u16,
    /// Serve the admission webhook (TLS) on this address; unset: no webhook.
    #[arg(long, requires_all = ["webhook_hosts", "controller_user"])]
    pub webhook_addr: Option<SocketAddr>,
    /// Secret (in the controller's namespace) holding the webhook's CA and certificate.
    #[arg(long, default_value = "baton-webhook-tls")]
    pub webhook_secret: String,
    /// Names and addresses the API server reaches the webhook by (the certificate's SANs).
    #[arg(long, value_delimiter = ',')]
    pub webhook_hosts: Vec<String>,
    /// ValidatingWebhookConfiguration whose caBundle the controller keeps.
    #[arg(long)]
    pub webhook_configuration: Option<String>,
    /// Who issues the webhook's certificate: `baton` (itself, keeping the caBundle too) or
    /// `external` (cert-manager writes the Secret and the caBundle; baton serves it).
    #[arg(long, value_enum, default_value_t = CertIssuer::Baton)]
    pub webhook_cert_issuer: CertIssuer,
    /// Days a webhook certificate is valid; it is renewed with a third left.
    #[arg(long, default_value_t = 365)]
    pub webhook_cert_days: u64,
    /// The CA (PEM file) of the client certificate the API server presents to webhooks (its
    /// AdmissionConfiguration's kubeconfig): set, the webhook completes a TLS handshake only
    /// with such a client, so nothing else that reaches its port is read.
    #[arg(long, requires = "webhook_addr")]
    pub webhook_client_ca_file: Option<std::path::PathBuf>,
    /// User names the controller authenticates as: the webhook admits their ledger seals.
    #[arg(long, value_delimiter = ',')]
    pub controller_user: Vec<String>,
    /// `baton server`'s address, serving the ledgers of runs kept in PostgreSQL: the
    /// controller's seals go there, and worker pods of such runs are given it.
    #[arg(long, env = crate::crd::env::LEDGER_SERVER)]
    pub ledger_server: Option<String>,
    /// The controller's token for the ledger server (a projected token for
    /// `baton.dev/ledger`, read at every request).
    #[arg(long, env = crate::crd::env::LEDGER_TOKEN_FILE, default_value = crate::crd::LEDGER_TOKEN_PATH)]
    pub ledger_token_file: std::path::PathBuf,
    /// The CA (PEM file) the ledger server's certificate chains to, when it serves TLS: the
    /// controller trusts it alone for its seals, and gives it to the worker pods.
    #[arg(long, env = "BATON_LEDGER_SERVER_CA_FILE", requires = "ledger_server")]
    pub ledger_server_ca_file: Option<std::path::PathBuf>,
    /// Where the ledgers of new runs are kept: LedgerSegments (in the API server) or
    /// PostgreSQL (through --ledger-server). A run keeps the backend it started with.
    #[arg(long, value_parser = parse_backend, default_value = "LedgerSegments",
          requires_if("PostgreSQL", "ledger_server"))]
    pub new_runs_ledger: LedgerBackend,
    /// Largest AgentRun spec the webhook admits, in bytes of JSON.
    #[arg(long, default_value_t = crate::webhook::DEFAULT_MAX_SPEC_BYTES)]
    pub max_spec_bytes: usize,
    /// The OTLP/HTTP endpoint worker pods export their traces to (`http://collector:4318`);
    /// unset, worker pods export none.
    #[arg(long, env = "BATON_WORKER_OTLP_ENDPOINT")]
    pub worker_otlp_endpoint: Option<String>,
    /// The share of runs whose traces worker pods export (0 to 1), decided by the trace id so
    /// every attempt of a run decides alike.
    #[arg(long, default_value_t = 1.0, value_parser = parse_ratio, requires = "worker_otlp_endpoint")]
    pub worker_trace_sampling: f64,
    /// Worker pods put what was said on their spans: model calls' messages, tool calls'
    /// arguments and results, scrubbed of the secrets the worker holds (off: never).
    #[arg(long, requires = "worker_otlp_endpoint")]
    pub worker_trace_content: bool,
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

fn parse_backend(s: &str) -> Result<LedgerBackend, String> {
    match s {
        "LedgerSegments" => Ok(LedgerBackend::LedgerSegments),
        "PostgreSQL" => Ok(LedgerBackend::PostgreSQL),
        other => Err(format!(
            "unknown ledger backend {other:?} (LedgerSegments | PostgreSQL)"
        )),
    }
}

fn parse_policy(s: &str) -> Result<RolloutPolicy, String> {
    match s {
        "handoff" => Ok(RolloutPolicy::Handoff),
        "keep" => Ok(RolloutPolicy::Keep),
        other => Err(format!("unknown rollout policy {other:?} (handoff | keep)")),
    }
}

impl ControllerArgs {
    /// The controller's settings; an error when the ledger server's CA file cannot be read
    /// or holds no certificate.
    pub fn config(&self) -> Result<Config, Error> {
        Ok(Config {
            worker_image: self.worker_image.clone(),
            namespace: self.namespace.clone(),
            leader_election: self.leader_election,
            leader_namespace: self.leader_namespace.clone(),
            identity: default_identity(),
            leader_lease: Duration::from_secs(self.leader_lease_seconds.max(3)),
            admin_addr: Some(self.admin_addr),
            max_concurrent_handoffs: self.max_concurrent_handoffs,
            rollout_policy: self.rollout_policy,
            events: true,
            concurrency: self.concurrency,
            webhook: self.webhook()?,
            ledger_server: self.ledger_server()?,
            new_runs_ledger: self.new_runs_ledger,
            worker_traces: self
                .worker_otlp_endpoint
                .clone()
                .filter(|e| !e.trim().is_empty())
                .map(|endpoint| crate::traces::WorkerTraces {
                    endpoint,
                    sampling: self.worker_trace_sampling,
                    content: self.worker_trace_content,
                }),
        })
    }

    /// The ledger server the seals go to, trusting only `--ledger-server-ca-file` if given.
    fn ledger_server(&self) -> Result<Option<LedgerClient>, Error> {
        let Some(url) = self.ledger_server.as_deref() else {
            return Ok(None);
        };
        let server = LedgerClient::new(url, LedgerToken::File(self.ledger_token_file.clone()));
        let Some(path) = &self.ledger_server_ca_file else {
            return Ok(Some(server));
        };
        let pem = std::fs::read_to_string(path).map_err(|e| LedgerError::Client {
            message: format!("--ledger-server-ca-file {}: {e}", path.display()),
        })?;
        Ok(Some(server.trusting(&pem)?))
    }

    /// The webhook's settings; an error when `--webhook-client-ca-file` cannot be read.
    fn webhook(&self) -> Result<Option<WebhookConfig>, Error> {
        let Some(addr) = self.webhook_addr else {
            return Ok(None);
        };
        let client_ca_pem = match &self.webhook_client_ca_file {
            Some(path) => Some(crate::webhook::read_client_ca(path)?),
            None => None,
        };
        Ok(Some(WebhookConfig {
            addr,
            tls: TlsSettings {
                issuer: self.webhook_cert_issuer,
                check_every: crate::webhook::CHECK_EVERY,
                namespace: self.leader_namespace.clone(),
                secret: self.webhook_secret.clone(),
                hosts: self.webhook_hosts.clone(),
                configuration: self.webhook_configuration.clone(),
                lifetime: Duration::from_secs(self.webhook_cert_days.max(1) * 24 * 3600),
                client_ca_pem,
            },
            controller_users: self.controller_user.clone(),
            max_spec_bytes: self.max_spec_bytes,
        }))
    }
}

/// Runs `baton controller` with a client from the environment until it fails.
pub async fn main(args: ControllerArgs) -> Result<(), Error> {
    // Its own spans (claims; the root of a run it ends) go where the standard OTLP variables
    // say: the chart sets them to `tracing.endpoint`, as it tells the worker pods.
    let traces = crate::telemetry::init_logging_and_traces(args.log_format, "baton-controller");
    let client = crate::kube_util::client_for("controller").await?;
    let ran = super::run_until(client, args.config()?, terminated()).await;
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    ran
}

/// SIGTERM (a pod being deleted, drained or rolled) or SIGINT. The controller runs as PID 1 in
/// its image, where a signal without a handler is ignored: without this, every controller pod
/// lived out its whole grace period and the cluster had no leader meanwhile.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for SIGTERM; the controller stops only when killed");
        return futures::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}
