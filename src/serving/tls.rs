//! Where a listener's certificate comes from ([`super::Tls`]), kept current while it serves.
//!
//! From files (`baton server --tls-cert-file/--tls-key-file`): read again every
//! [`RELOAD_EVERY`], since cert-manager rotates the Secret they are mounted from; a pair that
//! does not load is logged and the one served stays. Rotated (the webhook): the configuration
//! the webhook's certificate keeper publishes, each new one served from the next handshake on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use tokio::sync::watch;

/// How often the certificate files are read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(60);

/// The certificate (chain) and key a listener serves HTTPS with, as PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A serving configuration published by its keeper: None until the first one is loaded.
pub type Published = watch::Receiver<Option<Arc<ServerConfig>>>;

/// The configuration from `files`, read again every [`RELOAD_EVERY`] for as long as the
/// process runs.
pub(super) async fn from_files(files: TlsFiles) -> std::io::Result<RustlsConfig> {
    let config = RustlsConfig::from_pem_file(&files.cert, &files.key)
        .await
        .map_err(|e| std::io::Error::other(format!("{files:?}: {e}")))?;
    tokio::spawn(reload_files(config.clone(), files));
    Ok(config)
}

async fn reload_files(config: RustlsConfig, files: TlsFiles) {
    loop {
        tokio::time::sleep(RELOAD_EVERY).await;
        if let Err(err) = config.reload_from_pem_file(&files.cert, &files.key).await {
            tracing::warn!(%err, ?files, "the TLS certificate did not reload; serving the last");
        }
    }
}

/// The first configuration `published` holds (waiting for it: until then nothing is
/// accepted, and a caller's connection waits in the listen queue or times out), followed.
pub(super) async fn following(mut published: Published) -> std::io::Result<RustlsConfig> {
    let first = published
        .wait_for(Option::is_some)
        .await
        .map_err(|_| std::io::Error::other("the certificate's keeper ended before loading one"))?
        .clone();
    let config = RustlsConfig::from_config(first.expect("waited for Some"));
    tokio::spawn(follow(config.clone(), published));
    Ok(config)
}

async fn follow(config: RustlsConfig, mut published: Published) {
    while published.changed().await.is_ok() {
        let next = published.borrow_and_update().clone();
        if let Some(next) = next {
            config.reload_from_config(next);
        }
    }
}
