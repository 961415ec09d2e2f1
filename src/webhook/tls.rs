//! Keeps the webhook's certificate: one Secret shared by every replica (created by the first,
//! renewed by whichever sees it expiring, each write a compare-and-swap), the CA in the
//! webhook configuration's `caBundle`, and the serving configuration reloaded when the Secret
//! changes. Written by hand because no library here both issues and rotates a webhook's own
//! certificate without cert-manager. With [`CertIssuer::External`] (cert-manager) the Secret
//! and the `caBundle` are the issuer's: baton only reads the Secret and serves what it holds.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use super::WebhookError;
use super::cert::{self, Bundle};

/// Who issues the webhook's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertIssuer {
    /// baton: it issues its own CA and certificate, renews them and keeps the `caBundle`.
    Baton,
    /// Someone else (cert-manager) writes the Secret and keeps the `caBundle`; baton serves
    /// what the Secret holds and reloads it when it changes.
    External,
}

/// Where the certificate lives and what it must name.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub issuer: CertIssuer,
    /// Namespace and name of the Secret.
    pub namespace: String,
    pub secret: String,
    /// DNS names and addresses the API server reaches the webhook by.
    pub hosts: Vec<String>,
    /// The ValidatingWebhookConfiguration whose `caBundle` must trust the CA, if any.
    pub configuration: Option<String>,
    /// Validity of a certificate; it is renewed with a third of it left.
    pub lifetime: Duration,
    /// How often the Secret is read again (a renewal, or another issuer's rotation).
    pub check_every: Duration,
    /// The CA (PEM) the API server's client certificate for webhooks chains to: set, a
    /// connection without such a certificate ends in the handshake, before any byte of a
    /// review is read (docs/security.md, "The webhook's port").
    pub client_ca_pem: Option<String>,
}

/// The first wait after a failed pass; doubled each failure in a row, up to the period.
const RETRY_FIRST: Duration = Duration::from_millis(500);

/// Loads the certificate (issuing it if none and baton is its issuer), then checks it every
/// `settings.check_every`, forever.
pub async fn keep(
    client: Client,
    settings: TlsSettings,
    served: watch::Sender<Option<Arc<ServerConfig>>>,
) -> Result<(), WebhookError> {
    let every = settings.check_every;
    let mut loaded_version = None;
    let mut retry = RETRY_FIRST;
    loop {
        let synced = match settings.issuer {
            CertIssuer::Baton => sync(&client, &settings).await,
            CertIssuer::External => read_issued(&client, &settings).await,
        };
        let wait = match synced {
            Ok((version, bundle)) => {
                if loaded_version.as_ref() != Some(&version) {
                    served.send_replace(Some(server_config(
                        &bundle,
                        settings.client_ca_pem.as_deref(),
                    )?));
                    tracing::info!(secret = %settings.secret, %version, "webhook certificate loaded");
                    loaded_version = Some(version);
                }
                retry = RETRY_FIRST;
                every
            }
            // A lost race (another replica wrote first) or an API error: soon, not in `every`.
            Err(err) => {
                tracing::warn!(%err, "webhook certificate not synced; trying again");
                retry = (retry * 2).min(every);
                retry
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// One pass: the Secret's bundle (issued or renewed if needed) and its resourceVersion.
async fn sync(client: &Client, s: &TlsSettings) -> Result<(String, Bundle), WebhookError> {
    let api = Api::<Secret>::namespaced(client.clone(), &s.namespace);
    let now = now();
    let lifetime = s.lifetime.as_secs() as i64;
    let current = api.get_opt(&s.secret).await?;
    let stored = current.as_ref().map(stored_bundle);
    let (secret, bundle) = match (current, stored) {
        (Some(secret), Some(Ok(bundle)))
            if cert::renewal(&bundle, &s.hosts, now, lifetime).is_none() =>
        {
            (secret, bundle)
        }
        (current, stored) => {
            let previous = stored.and_then(Result::ok).map(|b| b.ca_pem);
            let bundle = cert::issue(&s.hosts, now, lifetime, previous)?;
            // Trusted before it is served: a replica may load it as soon as the Secret changes.
            trust(client, s, &bundle).await?;
            let secret = write(&api, s, current, &bundle).await?;
            tracing::info!(secret = %s.secret, hosts = ?s.hosts, "webhook certificate issued");
            (secret, bundle)
        }
    };
    trust(client, s, &bundle).await?;
    Ok((secret.resource_version().unwrap_or_default(), bundle))
}

/// The bundle another issuer keeps in the Secret, and the Secret's resourceVersion. A Secret
/// not there yet (cert-manager has not issued) is an error: the replica stays unready.
async fn read_issued(client: &Client, s: &TlsSettings) -> Result<(String, Bundle), WebhookError> {
    let api = Api::<Secret>::namespaced(client.clone(), &s.namespace);
    let secret = api
        .get_opt(&s.secret)
        .await?
        .ok_or_else(|| WebhookError::NoSecret(s.secret.clone()))?;
    let bundle = cert::served_from_secret(&secret_data(&secret))?;
    Ok((secret.resource_version().unwrap_or_default(), bundle))
}

fn secret_data(secret: &Secret) -> std::collections::BTreeMap<String, Vec<u8>> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

fn stored_bundle(secret: &Secret) -> Result<Bundle, cert::CertError> {
    cert::from_secret(&secret_data(secret), secret.annotations())
}

/// Creates the Secret, or replaces the one read (resourceVersion precondition). A replica that
/// loses either race gets an error and reads the winner's next pass.
async fn write(
    api: &Api<Secret>,
    s: &TlsSettings,
    current: Option<Secret>,
    bundle: &Bundle,
) -> Result<Secret, WebhookError> {
    let (data, annotations) = cert::to_secret(bundle);
    let mut secret = current.unwrap_or_else(|| Secret {
        metadata: ObjectMeta {
            name: Some(s.secret.clone()),
            namespace: Some(s.namespace.clone()),
            labels: Some(crate::owned::managed_labels()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        ..Secret::default()
    });
    secret.data = Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect());
    secret.annotations_mut().extend(annotations);
    let params = PostParams::default();
    Ok(match secret.resource_version() {
        Some(_) => api.replace(&s.secret, &params, &secret).await?,
        None => api.create(&params, &secret).await?,
    })
}

/// Makes every webhook of the configuration trust `bundle`'s CAs (resourceVersion
/// precondition): the validating configuration, and the mutating one of the same name where
/// it exists.
async fn trust(client: &Client, s: &TlsSettings, bundle: &Bundle) -> Result<(), WebhookError> {
    let Some(name) = &s.configuration else {
        return Ok(());
    };
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    trust_in(&validating, validating.get(name).await?, bundle).await?;
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone());
    match mutating.get_opt(name).await? {
        Some(configuration) => trust_in(&mutating, configuration, bundle).await,
        None => Ok(()),
    }
}

/// A webhook configuration, validating or mutating: what `trust` needs of either.
trait Configuration:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
{
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig>;
}

impl Configuration for ValidatingWebhookConfiguration {
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig> {
        let hooks = self.webhooks.iter_mut().flatten();
        hooks.map(|h| &mut h.client_config).collect()
    }
}

impl Configuration for MutatingWebhookConfiguration {
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig> {
        let hooks = self.webhooks.iter_mut().flatten();
        hooks.map(|h| &mut h.client_config).collect()
    }
}

/// Writes `configuration` back trusting `bundle`, if any of its webhooks did not yet.
async fn trust_in<C: Configuration>(
    api: &Api<C>,
    mut configuration: C,
    bundle: &Bundle,
) -> Result<(), WebhookError> {
    if trust_each(configuration.client_configs().into_iter(), bundle) {
        let name = configuration.name_any();
        api.replace(&name, &PostParams::default(), &configuration)
            .await?;
        tracing::info!(configuration = %name, kind = %C::kind(&()), "webhook caBundle updated");
    }
    Ok(())
}

/// Sets `bundle`'s CAs on every client config that does not trust them yet; true if any changed.
fn trust_each<'a>(
    configs: impl Iterator<Item = &'a mut WebhookClientConfig>,
    bundle: &Bundle,
) -> bool {
    let wanted = ByteString(cert::trusted_cas(bundle).join("\n").into_bytes());
    let mut changed = false;
    for config in configs {
        let present = config
            .ca_bundle
            .as_ref()
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        if !present.is_some_and(|p| cert::ca_bundle_covers(&p, bundle)) {
            config.ca_bundle = Some(wanted.clone());
            changed = true;
        }
    }
    changed
}

/// The TLS configuration serving `bundle`; with `client_ca_pem`, only clients whose
/// certificate chains to it complete the handshake.
pub fn server_config(
    bundle: &Bundle,
    client_ca_pem: Option<&str>,
) -> Result<Arc<ServerConfig>, WebhookError> {
    let certs = CertificateDer::pem_slice_iter(bundle.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| WebhookError::Tls(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(bundle.key_pem.as_bytes())
        .map_err(|e| WebhookError::Tls(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Tls(e.to_string()))?;
    let builder = match client_ca_pem {
        Some(pem) => builder.with_client_cert_verifier(client_verifier(pem, provider)?),
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| WebhookError::Tls(e.to_string()))?;
    Ok(Arc::new(config))
}

/// Requires a client certificate chaining to one of `pem`'s CAs (webpki's path validation:
/// a verifier of our own would be the one place a mistake lets anyone in).
fn client_verifier(
    pem: &str,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, WebhookError> {
    rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(client_roots(pem)?),
        provider,
    )
    .build()
    .map_err(|e| WebhookError::Tls(format!("client CA: {e}")))
}

/// The CA certificates in `pem`; an error if one does not parse or there is none.
pub fn client_roots(pem: &str) -> Result<rustls::RootCertStore, WebhookError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| WebhookError::Tls(format!("client CA: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| WebhookError::Tls(format!("client CA: {e}")))?;
    }
    if roots.is_empty() {
        return Err(WebhookError::Tls("client CA: no certificate in it".into()));
    }
    Ok(roots)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
