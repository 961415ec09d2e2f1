//! The flags of `baton server` and `baton console`.

use std::net::SocketAddr;

/// `baton server`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Address the HTTP API listens on.
    #[arg(long, env = "BATON_SERVER_ADDR", default_value = "0.0.0.0:8080")]
    pub addr: SocketAddr,
    /// Log format: text or json.
    #[arg(long, env = "BATON_LOG_FORMAT", default_value = "text")]
    pub log_format: crate::telemetry::LogFormat,
    /// The namespace the console opens in.
    #[arg(long, env = "BATON_CONSOLE_NAMESPACE", default_value = "default")]
    pub console_namespace: String,
    /// Namespaces the approvals inbox looks in for a user who may not list runs
    /// cluster-wide (comma-separated), besides the one shown.
    #[arg(long, env = "BATON_CONSOLE_NAMESPACES", value_delimiter = ',')]
    pub console_namespaces: Vec<String>,
    /// Behind an authenticating proxy: the header naming the person it signed in (say
    /// X-Remote-User). Requests then act with the proxy's own bearer token impersonating that
    /// person; the API server checks the proxy may impersonate. Unset: no header is read.
    #[arg(long, env = "BATON_PROXY_USER_HEADER")]
    pub proxy_user_header: Option<String>,
    /// With --proxy-user-header: the header naming that person's groups (repeated or
    /// comma-separated).
    #[arg(
        long,
        env = "BATON_PROXY_GROUPS_HEADER",
        requires = "proxy_user_header"
    )]
    pub proxy_groups_header: Option<String>,
    /// The PostgreSQL ledger (a `postgres://` URL): this server then serves the ledgers of
    /// runs kept there, to the writers that may write them. Unset: it serves none.
    #[arg(long, env = "BATON_LEDGER_POSTGRES_URL", hide_env_values = true)]
    pub ledger_postgres_url: Option<String>,
    /// The CA certificates (PEM) the database's certificate must chain to, instead of the
    /// system's roots. Whether TLS is used is the URL's `sslmode` (`require` to insist).
    #[arg(
        long,
        env = "BATON_LEDGER_POSTGRES_CA_FILE",
        requires = "ledger_postgres_url"
    )]
    pub ledger_postgres_ca_file: Option<std::path::PathBuf>,
    /// User names baton's controller authenticates as: the ledger admits their seals.
    #[arg(long, env = "BATON_CONTROLLER_USERS", value_delimiter = ',')]
    pub controller_user: Vec<String>,
    /// Serve HTTPS with this certificate (PEM, with its chain), read again every minute.
    #[arg(long, env = "BATON_SERVER_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, env = "BATON_SERVER_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// The key (at least 32 bytes) the console's sessions are sealed under; every replica
    /// must hold the same one. Unset: a key of this process's own, whose sessions end with it
    /// and open on no other replica.
    #[arg(long, env = "BATON_CONSOLE_SESSION_KEY_FILE")]
    pub console_session_key_file: Option<std::path::PathBuf>,
    /// The streams one credential may hold open at once on this replica; past it a new one
    /// is refused (429) until one ends.
    #[arg(long, env = "BATON_MAX_STREAMS_PER_CREDENTIAL", default_value_t = crate::server::MAX_STREAMS_PER_CREDENTIAL)]
    pub max_streams_per_credential: usize,
    /// Bytes of events all streams together hold for their clients (what clients have not
    /// taken yet); a stream whose next event does not fit waits for others' to be written.
    #[arg(long, env = "BATON_MAX_STREAM_BYTES", default_value_t = crate::server::DEFAULT_STREAM_BYTES)]
    pub max_stream_bytes: usize,
    /// Credential-and-namespace pairs followed at once (each holds two API watches, shared by
    /// all its streams); past it a stream that needs a new one is refused (503).
    #[arg(long, env = "BATON_MAX_HUBS", default_value_t = crate::server::MAX_HUBS)]
    pub max_hubs: usize,
    /// Browsers reach the console over HTTPS (a proxy or ingress terminates TLS in front of
    /// this server): its cookies are then `Secure` and `__Host-` prefixed, as they are when
    /// this server serves TLS itself.
    #[arg(long, env = "BATON_CONSOLE_SECURE_COOKIES")]
    pub console_secure_cookies: bool,
}

/// `baton console`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ConsoleArgs {
    /// Address to listen on: loopback only (the console acts as you). Port 0: any free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// The namespace it opens in (default: your kubeconfig's).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Namespaces the approvals inbox looks in if you may not list runs cluster-wide.
    #[arg(long, value_delimiter = ',')]
    pub namespaces: Vec<String>,
}
