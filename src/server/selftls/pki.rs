//! The PKI TLS self-management keeps in its Secret: reading what is there ([`Material`],
//! [`parse_certs`]) and deciding what should be there next ([`plan`]): a first CA and
//! serving certificate, a renewed serving certificate, or a CA rollover that keeps the older
//! CAs trusted until they expire. Pure but for the clock and key generation; the Secret
//! itself is [`super::SelfTls`]'s.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rcgen::{CertificateParams, Issuer, KeyPair};
use x509_parser::extensions::ParsedExtension;

use super::{SelfTlsError, SelfTlsOptions};
use crate::certs;

/// Secret keys.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

const CA_COMMON_NAME: &str = "podmend webhook CA";
/// Validity starts this far back, for clock skew between nodes.
const BACKDATE: Duration = Duration::from_secs(3_600);
/// The CA lives this many times as long as a serving certificate.
const CA_VALIDITY_FACTOR: u32 = 2;

/// The PKI as kept in the Secret, all PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// Current CA first, then older unexpired CAs.
    pub ca_bundle: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("ca_bundle", &self.ca_bundle)
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// Reads the four keys of a Secret; `None` if any is missing or not UTF-8.
    pub fn from_secret(secret: &Secret) -> Option<Material> {
        let data = secret.data.as_ref()?;
        let get = |k: &str| {
            data.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        Some(Material {
            ca_bundle: get(CA_CERT)?,
            ca_key: get(CA_KEY)?,
            cert: get(TLS_CERT)?,
            key: get(TLS_KEY)?,
        })
    }

    pub(super) fn to_data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERT, &self.ca_bundle),
            (CA_KEY, &self.ca_key),
            (TLS_CERT, &self.cert),
            (TLS_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }
}

/// One certificate of a PEM text: its PEM block, notAfter (unix seconds) and DNS SANs.
pub struct CertInfo {
    pub pem: String,
    pub not_after: i64,
    pub dns_names: Vec<String>,
    /// DER of the subject and issuer names.
    pub subject: Vec<u8>,
    pub issuer: Vec<u8>,
    /// Subject and authority key identifiers, when present.
    pub key_id: Option<Vec<u8>>,
    pub authority_key_id: Option<Vec<u8>>,
}

impl CertInfo {
    /// Whether this certificate names `ca` as its issuer (by key identifier when both carry
    /// one, else by name).
    pub fn issued_by(&self, ca: &CertInfo) -> bool {
        match (&self.authority_key_id, &ca.key_id) {
            (Some(aki), Some(ski)) => aki == ski,
            _ => self.issuer == ca.subject,
        }
    }
}

/// Every certificate in a PEM text, in order; unparsable blocks are skipped.
pub fn parse_certs(pem: &str) -> Vec<CertInfo> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()).flatten() {
        let Ok(cert) = block.parse_x509() else {
            continue;
        };
        out.push(CertInfo {
            pem: pem_block(&block.contents),
            not_after: cert.validity().not_after.timestamp(),
            dns_names: dns_sans(&cert),
            subject: cert.subject().as_raw().to_vec(),
            key_id: cert
                .iter_extensions()
                .find_map(|e| match e.parsed_extension() {
                    ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
                    _ => None,
                }),
            authority_key_id: cert
                .iter_extensions()
                .find_map(|e| match e.parsed_extension() {
                    ParsedExtension::AuthorityKeyIdentifier(aki) => {
                        aki.key_identifier.as_ref().map(|id| id.0.to_vec())
                    }
                    _ => None,
                }),
            issuer: cert.issuer().as_raw().to_vec(),
        });
    }
    out
}

/// The DNS names among a certificate's subject alternative names.
fn dns_sans(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pem_block(der: &[u8]) -> String {
    let b64 = BASE64.encode(der);
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

fn now_unix() -> i64 {
    x509_parser::time::ASN1Time::now().timestamp()
}

fn ca_params() -> CertificateParams {
    certs::ca_params(CA_COMMON_NAME)
}

fn generate_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> SelfTlsError {
    move |source| SelfTlsError::Generate { what, source }
}

/// A new CA valid for `validity`: (certificate PEM, key PEM).
fn new_ca(validity: Duration) -> Result<(String, String), SelfTlsError> {
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let mut params = ca_params();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    let key = KeyPair::generate().map_err(generate_err("CA key"))?;
    let cert = params
        .self_signed(&key)
        .map_err(generate_err("CA certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving certificate signed by the CA of `ca_key_pem`, never outliving the CA.
fn new_leaf(
    ca_key_pem: &str,
    ca_not_after: i64,
    dns_names: &[String],
    validity: Duration,
) -> Result<(String, String), SelfTlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(generate_err("CA key (from the Secret)"))?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let sans = CertificateParams::new(dns_names.to_vec())
        .map_err(generate_err("serving certificate names"))?
        .subject_alt_names;
    let mut params = certs::serving_params(sans, dns_names.first().map(String::as_str));
    params.not_before = now - BACKDATE;
    let ca_left = u64::try_from(ca_not_after - now_unix()).unwrap_or(0);
    params.not_after = now + validity.min(Duration::from_secs(ca_left));
    let key = KeyPair::generate().map_err(generate_err("serving key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(generate_err("serving certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new CA and a serving certificate it signed; the bundle is the new CA, then `older_cas`
/// (PEM, still trusted until they expire).
fn new_pki(options: &SelfTlsOptions, older_cas: &str) -> Result<Material, SelfTlsError> {
    let (ca, ca_key) = new_ca(options.validity * CA_VALIDITY_FACTOR)?;
    let ca_end = parse_certs(&ca).first().map_or(0, |c| c.not_after);
    let (cert, key) = new_leaf(&ca_key, ca_end, &options.dns_names, options.validity)?;
    Ok(Material {
        ca_bundle: ca + older_cas,
        ca_key,
        cert,
        key,
    })
}

/// Whether a certificate ending at `not_after` is due for renewal at `now`.
fn due(not_after: i64, now: i64, options: &SelfTlsOptions) -> bool {
    not_after - options.renew_before.as_secs() as i64 <= now
}

/// Whether the serving certificate in `cert_pem` can stay: not due, for exactly the names
/// asked for, and signed by `ca`.
fn leaf_can_stay(cert_pem: &str, ca: &CertInfo, now: i64, options: &SelfTlsOptions) -> bool {
    parse_certs(cert_pem).first().is_some_and(|leaf| {
        let mut have = leaf.dns_names.clone();
        let mut want = options.dns_names.clone();
        have.sort();
        want.sort();
        !due(leaf.not_after, now, options) && have == want && leaf.issued_by(ca)
    })
}

/// What the Secret should hold next, or `None` if `current` is fine as it is.
pub fn plan(
    current: Option<&Material>,
    options: &SelfTlsOptions,
) -> Result<Option<Material>, SelfTlsError> {
    let now = now_unix();
    let Some(current) = current else {
        return new_pki(options, "").map(Some);
    };
    let cas = parse_certs(&current.ca_bundle);
    let unexpired: String = cas
        .iter()
        .filter(|c| c.not_after > now)
        .map(|c| c.pem.as_str())
        .collect();
    let Some(current_ca) = cas.first().filter(|c| !due(c.not_after, now, options)) else {
        // CA rollover: a new CA signs from now on; the old ones stay trusted until they expire.
        return new_pki(options, &unexpired).map(Some);
    };
    // Expired CAs are dropped from the bundle.
    if leaf_can_stay(&current.cert, current_ca, now, options) {
        if unexpired.len() == cas.iter().map(|c| c.pem.len()).sum::<usize>() {
            return Ok(None);
        }
        return Ok(Some(Material {
            ca_bundle: unexpired,
            ..current.clone()
        }));
    }
    let (cert, key) = new_leaf(
        &current.ca_key,
        current_ca.not_after,
        &options.dns_names,
        options.validity,
    )?;
    Ok(Some(Material {
        ca_bundle: unexpired,
        ca_key: current.ca_key.clone(),
        cert,
        key,
    }))
}
