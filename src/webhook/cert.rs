//! The webhook's certificates (pure): a CA of its own and a serving certificate it signs, kept
//! as one Secret, so every replica serves the same certificate and the API server trusts one CA.
//!
//! Renewal replaces both the CA and the serving certificate and keeps the previous CA beside
//! the new one in the webhook configuration's `caBundle`: a replica still serving the previous
//! certificate stays trusted until it reloads. No certificate is ever parsed back: the hosts
//! and the expiry are carried beside the PEM (annotations on the Secret), so deciding on a
//! renewal needs no X.509 parser.

use std::collections::BTreeMap;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Secret keys, the `kubernetes.io/tls` layout plus the CA(s).
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
pub const CA_KEY: &str = "ca.crt";
pub const PREVIOUS_CA_KEY: &str = "ca-previous.crt";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("validity date out of range: {0}")]
    Date(#[from] time::error::ComponentRange),
    #[error("the Secret lacks {0}")]
    Missing(&'static str),
    #[error("the Secret's {key} is not UTF-8")]
    NotText { key: &'static str },
}

/// What the webhook serves and what the API server must trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    /// The CA this one replaced, trusted until the next renewal.
    pub previous_ca_pem: Option<String>,
    /// The serving certificate's DNS names and IP addresses.
    pub hosts: Vec<String>,
    /// The serving certificate's expiry, in Unix seconds.
    pub not_after: i64,
}

/// Why a bundle must be issued again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    Hosts,
    Expiring,
}

/// A new CA and a serving certificate for `hosts`, valid `lifetime_secs` from `now`.
pub fn issue(
    hosts: &[String],
    now: i64,
    lifetime_secs: i64,
    previous_ca_pem: Option<String>,
) -> Result<Bundle, CertError> {
    let not_before = time::OffsetDateTime::from_unix_timestamp(now - 300)?;
    let not_after = time::OffsetDateTime::from_unix_timestamp(now + lifetime_secs)?;

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("baton webhook CA {now}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca.not_before, ca.not_after) = (not_before, not_after);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    // rcgen files an address-shaped name as an IP SAN, which the API server needs for a URL
    // with an address in it.
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        hosts.first().cloned().unwrap_or_default(),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    (leaf.not_before, leaf.not_after) = (not_before, not_after);
    let cert = leaf.signed_by(&key, &issuer)?;

    Ok(Bundle {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: ca_cert.pem(),
        previous_ca_pem,
        hosts: hosts.to_vec(),
        not_after: now + lifetime_secs,
    })
}

/// Whether `bundle` must be issued again: other hosts, or less than a third of its life left.
pub fn renewal(bundle: &Bundle, hosts: &[String], now: i64, lifetime_secs: i64) -> Option<Renew> {
    if bundle.hosts != hosts {
        return Some(Renew::Hosts);
    }
    (bundle.not_after - now < lifetime_secs / 3).then_some(Renew::Expiring)
}

/// The PEM blocks the API server must trust: the current CA, then the previous one.
pub fn trusted_cas(bundle: &Bundle) -> Vec<String> {
    std::iter::once(bundle.ca_pem.clone())
        .chain(bundle.previous_ca_pem.clone())
        .map(|pem| pem.trim().to_string())
        .collect()
}

/// Whether a `caBundle` already trusts every CA of `bundle` (it may trust more: a renewal in
/// flight on another replica adds its CA first).
pub fn ca_bundle_covers(ca_bundle: &str, bundle: &Bundle) -> bool {
    let present = pem_blocks(ca_bundle);
    trusted_cas(bundle).iter().all(|ca| present.contains(ca))
}

/// Most CAs a `caBundle` keeps: the current and previous ones, and a few another replica added
/// in a race (each replica adds, none removes another's CA that may be in use).
const MAX_TRUSTED: usize = 4;

/// The `caBundle` that trusts `bundle`'s CAs, keeping what `present` already trusts (a
/// replica that issued in a race may be serving its own until it reads the Secret), capped at
/// [`MAX_TRUSTED`] with the oldest dropped.
pub fn merged_ca_bundle(present: &str, bundle: &Bundle) -> String {
    let mut cas = trusted_cas(bundle);
    for block in pem_blocks(present) {
        if !cas.contains(&block) {
            cas.push(block);
        }
    }
    cas.truncate(MAX_TRUSTED);
    cas.join("\n")
}

fn pem_blocks(text: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    text.split_inclusive(END)
        .map(str::trim)
        .filter(|block| block.ends_with(END))
        .map(str::to_string)
        .collect()
}

/// Annotations carried beside the PEM so a renewal needs no parsing.
pub const HOSTS_ANNOTATION: &str = "baton.dev/webhook-hosts";
pub const NOT_AFTER_ANNOTATION: &str = "baton.dev/webhook-not-after";

/// The Secret's data and annotations holding `bundle`.
pub fn to_secret(bundle: &Bundle) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>) {
    let mut data = BTreeMap::from([
        (CERT_KEY.to_string(), bundle.cert_pem.clone().into_bytes()),
        (KEY_KEY.to_string(), bundle.key_pem.clone().into_bytes()),
        (CA_KEY.to_string(), bundle.ca_pem.clone().into_bytes()),
    ]);
    if let Some(previous) = &bundle.previous_ca_pem {
        data.insert(PREVIOUS_CA_KEY.to_string(), previous.clone().into_bytes());
    }
    let annotations = BTreeMap::from([
        (HOSTS_ANNOTATION.to_string(), bundle.hosts.join(",")),
        (
            NOT_AFTER_ANNOTATION.to_string(),
            bundle.not_after.to_string(),
        ),
    ]);
    (data, annotations)
}

/// The bundle a Secret holds. A Secret without the annotations reads as expired (not_after 0),
/// so it is issued again rather than trusted blindly.
pub fn from_secret(
    data: &BTreeMap<String, Vec<u8>>,
    annotations: &BTreeMap<String, String>,
) -> Result<Bundle, CertError> {
    let text = |key| text(data, key);
    let hosts = annotations.get(HOSTS_ANNOTATION).map(String::as_str);
    Ok(Bundle {
        cert_pem: text(CERT_KEY)?.ok_or(CertError::Missing(CERT_KEY))?,
        key_pem: text(KEY_KEY)?.ok_or(CertError::Missing(KEY_KEY))?,
        ca_pem: text(CA_KEY)?.ok_or(CertError::Missing(CA_KEY))?,
        previous_ca_pem: text(PREVIOUS_CA_KEY)?,
        hosts: hosts
            .map(|h| {
                h.split(',')
                    .filter(|h| !h.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        not_after: annotations
            .get(NOT_AFTER_ANNOTATION)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
    })
}

/// What a Secret someone else issues (cert-manager: `tls.crt`, `tls.key`) serves. Its CA and
/// expiry are the issuer's to keep, so they are not read.
pub fn served_from_secret(data: &BTreeMap<String, Vec<u8>>) -> Result<Bundle, CertError> {
    Ok(Bundle {
        cert_pem: text(data, CERT_KEY)?.ok_or(CertError::Missing(CERT_KEY))?,
        key_pem: text(data, KEY_KEY)?.ok_or(CertError::Missing(KEY_KEY))?,
        ca_pem: String::new(),
        previous_ca_pem: None,
        hosts: Vec::new(),
        not_after: 0,
    })
}

fn text(data: &BTreeMap<String, Vec<u8>>, key: &'static str) -> Result<Option<String>, CertError> {
    data.get(key)
        .map(|bytes| String::from_utf8(bytes.clone()).map_err(|_| CertError::NotText { key }))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    const YEAR: i64 = 365 * 24 * 3600;

    fn hosts() -> Vec<String> {
        vec!["baton-webhook.baton-system.svc".into(), "127.0.0.1".into()]
    }

    #[test]
    fn a_bundle_survives_its_secret() {
        let bundle = issue(&hosts(), 1_000_000, YEAR, Some("old".into())).unwrap();
        let (data, annotations) = to_secret(&bundle);
        assert_eq!(from_secret(&data, &annotations).unwrap(), bundle);
        assert!(bundle.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(bundle.key_pem.contains("PRIVATE KEY"));
    }

    #[test]
    fn renewal_cases() {
        let now = 1_000_000;
        let bundle = issue(&hosts(), now, YEAR, None).unwrap();
        let cases = [
            (hosts(), now, None),
            (hosts(), now + YEAR / 2, None),
            (hosts(), now + YEAR * 2 / 3 + 10, Some(Renew::Expiring)),
            (hosts(), now + 2 * YEAR, Some(Renew::Expiring)),
            (vec!["other.svc".to_string()], now, Some(Renew::Hosts)),
        ];
        for (hosts, at, want) in cases {
            assert_eq!(
                renewal(&bundle, &hosts, at, YEAR),
                want,
                "{hosts:?} at {at}"
            );
        }
    }

    #[test]
    fn a_secret_without_its_annotations_reads_as_expired() {
        let (data, _) = to_secret(&issue(&hosts(), 0, YEAR, None).unwrap());
        let bundle = from_secret(&data, &BTreeMap::new()).unwrap();
        assert_eq!(renewal(&bundle, &hosts(), 0, YEAR), Some(Renew::Hosts));
        assert_eq!(renewal(&bundle, &[], 0, YEAR), Some(Renew::Expiring));
    }

    #[test]
    fn a_secret_issued_elsewhere_serves_its_certificate_and_key_only() {
        let issued = issue(&hosts(), 0, YEAR, None).unwrap();
        let (mut data, _) = to_secret(&issued);
        data.remove(CA_KEY);
        let served = served_from_secret(&data).unwrap();
        assert_eq!(
            (served.cert_pem.as_str(), served.key_pem.as_str()),
            (issued.cert_pem.as_str(), issued.key_pem.as_str())
        );
        data.remove(KEY_KEY);
        let missing = served_from_secret(&data).unwrap_err();
        assert_eq!(missing.to_string(), "the Secret lacks tls.key");
        data.insert(CERT_KEY.into(), vec![0xff]);
        data.insert(KEY_KEY.into(), b"k".to_vec());
        let garbled = served_from_secret(&data).unwrap_err();
        assert_eq!(garbled.to_string(), "the Secret's tls.crt is not UTF-8");
    }

    #[test]
    fn a_ca_bundle_covers_the_current_and_previous_ca() {
        let old = issue(&hosts(), 0, YEAR, None).unwrap();
        let new = issue(&hosts(), 10, YEAR, Some(old.ca_pem.clone())).unwrap();
        let both = format!("{}\n{}", new.ca_pem, old.ca_pem);
        assert!(ca_bundle_covers(&both, &new));
        assert!(ca_bundle_covers(&format!("{both}\n{}", old.ca_pem), &old));
        assert!(
            !ca_bundle_covers(&new.ca_pem, &new),
            "the previous CA is missing"
        );
        assert!(!ca_bundle_covers("", &old));
    }

    #[test]
    fn a_merged_ca_bundle_adds_and_keeps_what_others_trust() {
        let mine = issue(&hosts(), 0, YEAR, None).unwrap();
        let racer = issue(&hosts(), 1, YEAR, None).unwrap();
        let merged = merged_ca_bundle(&racer.ca_pem, &mine);
        assert!(ca_bundle_covers(&merged, &mine) && ca_bundle_covers(&merged, &racer));
        assert_eq!(merged_ca_bundle(&merged, &mine), merged, "nothing twice");
        let many: Vec<Bundle> = (0..6)
            .map(|i| issue(&hosts(), i, YEAR, None).unwrap())
            .collect();
        let mut present = String::new();
        for b in &many {
            present = merged_ca_bundle(&present, b);
        }
        assert_eq!(pem_blocks(&present).len(), MAX_TRUSTED);
        assert!(
            ca_bundle_covers(&present, many.last().unwrap()),
            "the newest stays"
        );
    }
}
