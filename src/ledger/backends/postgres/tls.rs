//! TLS to the database: rustls, through tokio-postgres-rustls (the connector tokio-postgres
//! documents), with the ring provider every other TLS client of baton uses. Whether TLS is
//! used is the URL's `sslmode`; whom the server's certificate must chain to is this module's:
//! the system's roots, or a CA file (a managed database's own CA is rarely among them).
//! rustls always checks the certificate's name against the host, so `sslmode=require` here is
//! as strict as libpq's `verify-full`.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::PgError;

/// The connector every connection of a [`super::PgLedger`] is made with.
pub type Tls = MakeRustlsConnect;

/// Server certificates checked against the system's roots.
pub fn system_roots() -> Result<Tls, PgError> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    // A system without a readable root store can still reach a database without TLS.
    let (added, _) = roots.add_parsable_certificates(found.certs);
    tracing::debug!(added, "PostgreSQL TLS: system roots");
    connector(roots)
}

/// Server certificates checked against the CA certificates (PEM) in `ca_file`.
pub fn trusting(ca_file: &Path) -> Result<Tls, PgError> {
    let unreadable =
        |e: &dyn std::fmt::Display| PgError::Tls(format!("the CA file {}: {e}", ca_file.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| unreadable(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| unreadable(&e))?;
    if certs.is_empty() {
        return Err(unreadable(&"no certificate in it"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| unreadable(&e))?;
    }
    connector(roots)
}

fn connector(roots: RootCertStore) -> Result<Tls, PgError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}
