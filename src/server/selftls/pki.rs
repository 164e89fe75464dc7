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
    /// Whether this certificate names `ca` as its issuer: by name, as a verifier builds the
    /// chain, and by key identifier too when both carry one.
    pub fn issued_by(&self, ca: &CertInfo) -> bool {
        self.issuer == ca.subject
            && match (&self.authority_key_id, &ca.key_id) {
                (Some(aki), Some(ski)) => aki == ski,
                _ => true,
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

/// A serving certificate signed by the CA `ca` (its PEM, and the key of `ca_key_pem`), never
/// outliving the CA. The certificate names `ca`'s own subject as its issuer: a verifier
/// builds the chain by matching the issuer name to a CA's subject, and a CA in the Secret may
/// have been made by another tool or another podmend version, under another name.
fn new_leaf(
    ca: &CertInfo,
    ca_key_pem: &str,
    dns_names: &[String],
    validity: Duration,
) -> Result<(String, String), SelfTlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(generate_err("CA key (from the Secret)"))?;
    let issuer = Issuer::from_ca_cert_pem(&ca.pem, ca_key)
        .map_err(generate_err("CA certificate (from the Secret)"))?;
    let ca_not_after = ca.not_after;
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
    let Some(ca_info) = parse_certs(&ca).into_iter().next() else {
        return Err(SelfTlsError::Generate {
            what: "CA certificate (unreadable once made)",
            source: rcgen::Error::CouldNotParseCertificate,
        });
    };
    let (cert, key) = new_leaf(&ca_info, &ca_key, &options.dns_names, options.validity)?;
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
        current_ca,
        &current.ca_key,
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use rcgen::{BasicConstraints, DnType, IsCa, KeyUsagePurpose};

    use super::*;

    fn options() -> SelfTlsOptions {
        SelfTlsOptions {
            namespace: "podmend-system".to_string(),
            secret: "podmend-tls".to_string(),
            webhook_configurations: Vec::new(),
            dns_names: vec!["localhost".to_string()],
            renew_before: Duration::from_secs(86_400),
            validity: Duration::from_secs(2 * 86_400),
            check_interval: Duration::from_secs(60),
            ca_settle: Duration::ZERO,
            cert_path: PathBuf::from("tls.crt"),
            key_path: PathBuf::from("tls.key"),
        }
    }

    /// A CA named as podmend never names its own, valid for 30 days, and a serving certificate
    /// it signed that comes due within the hour.
    fn material_of_another_ca() -> Material {
        material_signed_as(None, Duration::from_secs(3_600))
    }

    /// [`material_of_another_ca`] with its serving certificate valid for `leaf_valid_for`,
    /// signed with the CA's key under the name `issuer_name` when given (else the CA's own).
    fn material_signed_as(issuer_name: Option<&str>, leaf_valid_for: Duration) -> Material {
        let now = x509_parser::time::ASN1Time::now().to_datetime();
        let mut ca = CertificateParams::default();
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(DnType::CommonName, "a CA another tool made");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.not_before = now - BACKDATE;
        ca.not_after = now + Duration::from_secs(30 * 86_400);
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let ca_key_pem = ca_key.serialize_pem();
        if let Some(name) = issuer_name {
            ca.distinguished_name = rcgen::DistinguishedName::new();
            ca.distinguished_name.push(DnType::CommonName, name);
        }
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).expect("names");
        leaf.not_before = now - BACKDATE;
        leaf.not_after = now + leaf_valid_for;
        // As podmend's own serving certificates do.
        leaf.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("serving key");
        let cert = leaf.signed_by(&key, &issuer).expect("serving certificate");
        Material {
            ca_bundle: ca_cert.pem(),
            ca_key: ca_key_pem,
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    #[test]
    fn a_serving_certificate_renewed_under_a_ca_made_elsewhere_names_that_ca_as_its_issuer() {
        let current = material_of_another_ca();
        let next = plan(Some(&current), &options())
            .expect("a plan")
            .expect("the due serving certificate is renewed");
        assert_eq!(next.ca_bundle, current.ca_bundle, "the same CA signs");
        let ca = &parse_certs(&current.ca_bundle)[0];
        let leaf = &parse_certs(&next.cert)[0];
        // A verifier finds the issuer of a certificate by its name: with another name than
        // the CA's subject, the API server cannot build the chain and the call fails.
        assert_eq!(
            leaf.issuer, ca.subject,
            "the issuer is the CA's own subject"
        );
        assert_eq!(leaf.authority_key_id, ca.key_id, "and its key identifier");
    }

    #[test]
    fn a_serving_certificate_naming_another_issuer_than_its_ca_is_reissued_before_it_is_due() {
        // Signed with the CA's key but under podmend's own CA name: no verifier chains it to
        // the CA, however long it is valid.
        let current = material_signed_as(Some(CA_COMMON_NAME), Duration::from_secs(30 * 86_400));
        let next = plan(Some(&current), &options())
            .expect("a plan")
            .expect("the serving certificate is reissued");
        let ca = &parse_certs(&current.ca_bundle)[0];
        assert_eq!(parse_certs(&next.cert)[0].issuer, ca.subject);
        assert_eq!(next.ca_bundle, current.ca_bundle, "the same CA signs");
    }
}
