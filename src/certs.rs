//! `podmend certs`: a development PKI, one throwaway CA and one serving certificate it signed.
//! For local runs and kind clusters only; production TLS comes from the Helm chart's own CA,
//! cert-manager or an existing Secret. The CA's private key is never written anywhere.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::ServerName;

/// File name of the CA certificate (what clients such as the API server trust).
pub const CA_FILE: &str = "ca.crt";
/// File name of the serving certificate (`--tls-cert`).
pub const CERT_FILE: &str = "tls.crt";
/// File name of the serving key (`--tls-key`), written with mode 0600.
pub const KEY_FILE: &str = "tls.key";
/// The longest validity `generate` accepts: 100 years.
pub const MAX_DAYS: u32 = 36_500;

/// The CA's subject common name.
const CA_COMMON_NAME: &str = "podmend development CA";
/// How far back validity starts, to tolerate clock skew between machines.
const BACKDATE: Duration = Duration::from_secs(3_600);

/// Why the development PKI could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error(
        "no names given: pass at least one --dns NAME (a DNS name such as localhost or \
         podmend.podmend.svc, or an IP address such as 127.0.0.1)"
    )]
    NoNames,

    #[error("--days must be at least 1")]
    ZeroDays,

    #[error("--days {days} is too long: at most {max} days", max = MAX_DAYS)]
    TooManyDays { days: u32 },

    #[error(
        "{name:?} is neither a DNS name nor an IP address; pass --dns with names such as \
         localhost, podmend.podmend.svc, *.example.test or 127.0.0.1"
    )]
    BadName { name: String },

    #[error("cannot generate the development {what}: {source}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },

    #[error("cannot create the output directory {}: {source}", .path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A development CA certificate and a serving certificate and key it issued, all PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct DevPki {
    /// The CA certificate: give it to clients (the webhook's `caBundle`, curl's `--cacert`).
    pub ca_pem: String,
    /// The serving certificate (leaf only), for `--tls-cert`.
    pub cert_pem: String,
    /// The serving certificate's private key (PKCS#8, ECDSA P-256), for `--tls-key`.
    pub key_pem: String,
}

impl fmt::Debug for DevPki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevPki")
            .field("ca_pem", &self.ca_pem)
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Makes a fresh CA and a serving certificate for `dns_names`, valid from an hour ago for
/// `days` days. A name that parses as an IP address becomes an IP SAN, others DNS SANs; the
/// first name is also the subject common name.
pub fn generate(dns_names: &[String], days: u32) -> Result<DevPki, CertsError> {
    if dns_names.is_empty() {
        return Err(CertsError::NoNames);
    }
    if days == 0 {
        return Err(CertsError::ZeroDays);
    }
    if days > MAX_DAYS {
        return Err(CertsError::TooManyDays { days });
    }
    let sans = dns_names
        .iter()
        .map(|name| subject_alt_name(name))
        .collect::<Result<Vec<_>, _>>()?;

    // Bounded by MAX_DAYS, so these cannot overflow (the end is before the year 2200).
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let not_before = now - BACKDATE;
    let not_after = now + Duration::from_secs(u64::from(days) * 86_400);

    let mut ca_params = ca_params(CA_COMMON_NAME);
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_key = KeyPair::generate().map_err(|source| CertsError::Generate {
        what: "CA key",
        source,
    })?;
    let ca =
        CertifiedIssuer::self_signed(ca_params, ca_key).map_err(|source| CertsError::Generate {
            what: "CA certificate",
            source,
        })?;

    let mut leaf_params = serving_params(sans, Some(dns_names[0].trim()));
    leaf_params.not_before = not_before;
    leaf_params.not_after = not_after;
    let leaf_key = KeyPair::generate().map_err(|source| CertsError::Generate {
        what: "serving key",
        source,
    })?;
    let leaf = leaf_params
        .signed_by(&leaf_key, &ca)
        .map_err(|source| CertsError::Generate {
            what: "serving certificate",
            source,
        })?;

    Ok(DevPki {
        ca_pem: ca.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// A CA's parameters, as every CA podmend makes has them: `common_name` as its subject, no
/// intermediate below it (path length 0), and the key usages of a CA that signs certificates
/// and CRLs. The validity is the caller's. `podmend certs` and TLS self-management
/// (`server::selftls`) both use it.
pub(crate) fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// A serving certificate's parameters, as every one podmend makes has them: `sans`, the
/// subject common name when given, not a CA, a digital-signature key for TLS servers only,
/// and the authority key identifier that names its CA. The validity is the caller's.
pub(crate) fn serving_params(sans: Vec<SanType>, common_name: Option<&str>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(name) = common_name {
        params.distinguished_name.push(DnType::CommonName, name);
    }
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params
}

/// An IP address becomes an IP SAN; anything else must be a valid DNS name, optionally with
/// one leading `*.` wildcard label.
fn subject_alt_name(name: &str) -> Result<SanType, CertsError> {
    let bad = || CertsError::BadName {
        name: name.to_string(),
    };
    let trimmed = name.trim();
    if let Ok(ip) = trimmed.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let base = trimmed.strip_prefix("*.").unwrap_or(trimmed);
    match ServerName::try_from(base) {
        Ok(ServerName::DnsName(_)) => {}
        _ => return Err(bad()),
    }
    let dns = Ia5String::try_from(trimmed).map_err(|_| bad())?;
    Ok(SanType::DnsName(dns))
}

impl DevPki {
    /// Creates `dir` (and its parents) and writes `ca.crt`, `tls.crt` and `tls.key`,
    /// replacing files of those names. The key is mode 0600 on unix, even if it existed.
    pub fn write_to(&self, dir: &Path) -> Result<(), CertsError> {
        fs::create_dir_all(dir).map_err(|source| CertsError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        write_file(&dir.join(CA_FILE), &self.ca_pem, false)?;
        write_file(&dir.join(CERT_FILE), &self.cert_pem, false)?;
        write_file(&dir.join(KEY_FILE), &self.key_pem, true)?;
        Ok(())
    }
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), CertsError> {
    let wrap = |source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(wrap)?;
    // `mode` only applies to new files: tighten an existing one before writing the key.
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(wrap)?;
    }
    #[cfg(not(unix))]
    let _ = private;
    file.write_all(contents.as_bytes()).map_err(wrap)?;
    file.sync_all().map_err(wrap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::crypto::ring;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, UnixTime};
    use std::sync::Arc;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{X509Certificate, parse_x509_certificate};

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
    }

    fn verify(pki: &DevPki, name: &str) -> Result<(), rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots.add(der(&pki.ca_pem)).expect("add CA");
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(ring::default_provider()),
        )
        .build()
        .expect("verifier");
        let server_name = ServerName::try_from(name.to_string()).expect("server name");
        verifier
            .verify_server_cert(&der(&pki.cert_pem), &[], &server_name, &[], UnixTime::now())
            .map(|_| ())
    }

    fn with_parsed<T>(pem: &str, f: impl FnOnce(&X509Certificate<'_>) -> T) -> T {
        let der = der(pem);
        let (_, cert) = parse_x509_certificate(der.as_ref()).expect("x509");
        f(&cert)
    }

    #[test]
    fn the_leaf_verifies_against_the_ca_for_every_name() {
        let pki = generate(
            &names(&["localhost", "podmend.podmend.svc", "127.0.0.1"]),
            30,
        )
        .expect("generate");
        for name in ["localhost", "podmend.podmend.svc", "127.0.0.1"] {
            verify(&pki, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn the_leaf_does_not_verify_for_other_names_or_another_ca() {
        let pki = generate(&names(&["localhost"]), 1).expect("generate");
        assert!(verify(&pki, "example.com").is_err());
        assert!(verify(&pki, "127.0.0.1").is_err());

        let other = generate(&names(&["localhost"]), 1).expect("generate");
        let mixed = DevPki {
            ca_pem: other.ca_pem,
            ..pki
        };
        assert!(verify(&mixed, "localhost").is_err());
    }

    #[test]
    fn ip_addresses_become_ip_sans_and_other_names_dns_sans() {
        let pki = generate(&names(&["localhost", "127.0.0.1", "::1"]), 1).expect("generate");
        let sans = with_parsed(&pki.cert_pem, |cert| {
            let ext = cert
                .subject_alternative_name()
                .expect("san ext")
                .expect("san present");
            ext.value
                .general_names
                .iter()
                .map(|n| match n {
                    GeneralName::DNSName(d) => format!("dns:{d}"),
                    GeneralName::IPAddress(b) => format!("ip:{b:?}"),
                    other => format!("other:{other:?}"),
                })
                .collect::<Vec<_>>()
        });
        assert_eq!(
            sans,
            vec![
                "dns:localhost".to_string(),
                format!("ip:{:?}", [127u8, 0, 0, 1]),
                format!("ip:{:?}", std::net::Ipv6Addr::LOCALHOST.octets()),
            ]
        );
        verify(&pki, "::1").expect("::1 verifies");
    }

    #[test]
    fn a_wildcard_name_is_accepted() {
        let pki = generate(&names(&["*.podmend.test"]), 1).expect("generate");
        verify(&pki, "webhook.podmend.test").expect("wildcard verifies");
    }

    #[test]
    fn the_ca_and_the_leaf_have_the_expected_roles() {
        let pki = generate(&names(&["localhost"]), 1).expect("generate");
        with_parsed(&pki.ca_pem, |ca| {
            assert!(ca.is_ca());
            let cn = ca.subject().iter_common_name().next().expect("cn");
            assert_eq!(cn.as_str().expect("utf8"), "podmend development CA");
            let ku = ca.key_usage().expect("ku").expect("ku present").value;
            assert!(ku.key_cert_sign() && ku.crl_sign());
        });
        with_parsed(&pki.cert_pem, |leaf| {
            assert!(!leaf.is_ca());
            let eku = leaf
                .extended_key_usage()
                .expect("eku")
                .expect("eku present");
            assert!(eku.value.server_auth);
            assert!(!eku.value.client_auth);
            let cn = leaf.subject().iter_common_name().next().expect("cn");
            assert_eq!(cn.as_str().expect("utf8"), "localhost");
        });
    }

    #[test]
    fn validity_starts_an_hour_ago_and_lasts_the_given_days() {
        let before = x509_parser::time::ASN1Time::now().timestamp();
        let pki = generate(&names(&["localhost"]), 7).expect("generate");
        let after = x509_parser::time::ASN1Time::now().timestamp();
        with_parsed(&pki.cert_pem, |leaf| {
            let nb = leaf.validity().not_before.timestamp();
            let na = leaf.validity().not_after.timestamp();
            assert!(nb >= before - 3_600 - 1 && nb <= after - 3_600, "{nb}");
            assert!(
                na >= before + 7 * 86_400 - 1 && na <= after + 7 * 86_400,
                "{na}"
            );
        });
    }

    #[test]
    fn empty_names_zero_days_and_bad_names_are_errors() {
        assert!(matches!(generate(&[], 1), Err(CertsError::NoNames)));
        assert!(matches!(
            generate(&names(&["localhost"]), 0),
            Err(CertsError::ZeroDays)
        ));
        assert!(matches!(
            generate(&names(&["localhost"]), MAX_DAYS + 1),
            Err(CertsError::TooManyDays { .. })
        ));
        for bad in ["", " ", "not a name", "bad_under/slash", "ünïcode.test"] {
            assert!(
                matches!(
                    generate(&names(&["localhost", bad]), 1),
                    Err(CertsError::BadName { .. })
                ),
                "{bad:?}"
            );
        }
        let msg = generate(&[], 1).expect_err("no names").to_string();
        assert!(msg.contains("--dns"), "{msg}");
    }

    #[test]
    fn the_longest_validity_is_accepted() {
        let pki = generate(&names(&["localhost"]), MAX_DAYS).expect("generate");
        verify(&pki, "localhost").expect("verifies");
    }

    #[test]
    fn written_files_load_as_the_serving_certificate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("nested").join("dev");
        let pki = generate(&names(&["localhost"]), 1).expect("generate");
        pki.write_to(&out).expect("write");
        assert_eq!(
            fs::read_to_string(out.join(CA_FILE)).expect("ca"),
            pki.ca_pem
        );
        assert_eq!(
            fs::read_to_string(out.join(CERT_FILE)).expect("crt"),
            pki.cert_pem
        );
        assert_eq!(
            fs::read_to_string(out.join(KEY_FILE)).expect("key"),
            pki.key_pem
        );
        crate::server::tls::CertStore::load(&out.join(CERT_FILE), &out.join(KEY_FILE))
            .expect("podmend serve can load what podmend certs writes");
    }

    #[cfg(unix)]
    #[test]
    fn the_key_file_is_private_even_when_it_existed_before() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join(KEY_FILE);
        fs::write(&key, "old").expect("write");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod");

        let pki = generate(&names(&["localhost"]), 1).expect("generate");
        pki.write_to(dir.path()).expect("write");
        let mode = fs::metadata(&key).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(fs::read_to_string(&key).expect("read"), pki.key_pem);

        let fresh = tempfile::tempdir().expect("tempdir");
        pki.write_to(fresh.path()).expect("write");
        let mode = fs::metadata(fresh.path().join(KEY_FILE))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn an_output_path_that_is_a_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("taken");
        fs::write(&file, "").expect("write");
        let pki = generate(&names(&["localhost"]), 1).expect("generate");
        let err = pki.write_to(&file).expect_err("not a dir");
        assert!(matches!(err, CertsError::CreateDir { .. }), "{err}");
        assert!(err.to_string().contains("taken"), "{err}");
    }

    #[test]
    fn the_debug_form_hides_the_key() {
        let pki = generate(&names(&["localhost"]), 1).expect("generate");
        let debug = format!("{pki:?}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }
}
