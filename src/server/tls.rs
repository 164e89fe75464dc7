//! The webhook's serving certificate: PEM loading (full chains, leaf first), validation, and
//! validate-then-swap reloads from files that may be symlinks swapped by a Secret volume.
//! It does not decide when to reload: the server calls [`CertStore::reload_if_changed`].

use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rustls::crypto::{CryptoProvider, ring};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CipherSuite, Error as RustlsError, InconsistentKeys, PeerIncompatible, RootCertStore,
    ServerConfig, SupportedCipherSuite,
};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The ALPN protocols the webhook offers, in order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The cipher suites the webhook accepts: TLS 1.3's three, and for TLS 1.2 only ECDHE key
/// exchange (forward secrecy) with an AEAD cipher (no CBC, no static RSA, no DHE). This is
/// ring's default list today; it is spelled out so that a dependency update cannot widen it
/// unnoticed.
pub const CIPHER_SUITES: [SupportedCipherSuite; 9] = [
    ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
    ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
    ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ring::cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ring::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ring::cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// ring with exactly [`CIPHER_SUITES`].
fn provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: CIPHER_SUITES.to_vec(),
        ..ring::default_provider()
    })
}

/// Which of the two PEM files an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemFile {
    /// The certificate chain (`--tls-cert`).
    Certificate,
    /// The private key (`--tls-key`).
    PrivateKey,
}

impl PemFile {
    /// The command-line flag that names this file.
    pub fn flag(self) -> &'static str {
        match self {
            PemFile::Certificate => "--tls-cert",
            PemFile::PrivateKey => "--tls-key",
        }
    }
}

impl fmt::Display for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PemFile::Certificate => "certificate",
            PemFile::PrivateKey => "private key",
        })
    }
}

/// Why a certificate or key could not be loaded. Each message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "cannot read TLS {file} {}: {source}; pass {} with a PEM file (podmend certs writes one)",
        .path.display(),
        .file.flag()
    )]
    Read {
        file: PemFile,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "no certificate in {}: expected one or more \"BEGIN CERTIFICATE\" PEM blocks, the \
         server's own certificate first; pass --tls-cert with a PEM certificate chain",
        .path.display()
    )]
    NoCertificate { path: PathBuf },

    #[error(
        "certificate #{index} in {} cannot be parsed: {reason}; pass --tls-cert with PEM \
         X.509 certificates, the server's own certificate first",
        .path.display()
    )]
    BadCertificate {
        path: PathBuf,
        /// 1-based position of the certificate in the file.
        index: usize,
        reason: String,
    },

    #[error(
        "no private key in {}: expected a \"PRIVATE KEY\", \"EC PRIVATE KEY\" or \"RSA PRIVATE \
         KEY\" PEM block; pass --tls-key with the key of the certificate",
        .path.display()
    )]
    NoPrivateKey { path: PathBuf },

    #[error(
        "the private key in {} cannot be used: {reason}; pass --tls-key with an unencrypted \
         PKCS#8, SEC1 (EC) or PKCS#1 (RSA) PEM key",
        .path.display()
    )]
    BadPrivateKey { path: PathBuf, reason: String },

    #[error(
        "the private key in {} does not match the certificate in {}; pass the key that was \
         issued with this certificate, or regenerate both",
        .key.display(),
        .cert.display()
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },

    #[error(
        "cannot use the client CA file {}: {reason}; pass --client-ca with the PEM \
         certificate(s) of the CA that signs the API server's client certificate",
        .path.display()
    )]
    ClientCa { path: PathBuf, reason: String },

    #[error("cannot build the TLS server configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// What is being served right now; swapped as a whole.
struct Served {
    key: Arc<CertifiedKey>,
    /// Hash of the certificate and key file contents this was built from.
    content_hash: u64,
    /// The leaf's notAfter, in unix seconds.
    not_after: i64,
}

/// The serving certificate, read from two PEM files and swapped in place when they change.
///
/// It is the server's certificate resolver: every handshake gets the key loaded last. A reload
/// that fails (unreadable file, bad PEM, key not matching) leaves the previous key in service.
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    served: RwLock<Served>,
}

impl CertStore {
    /// Loads the certificate chain (leaf first) and its private key.
    ///
    /// The paths may be symlinks; they are followed on every read, so a Secret volume's
    /// `..data` swap is seen by [`CertStore::reload_if_changed`].
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = read_both(cert, key)?;
        let served = build(cert, &cert_pem, key, &key_pem)?;
        Ok(Self {
            cert_path: cert.to_path_buf(),
            key_path: key.to_path_buf(),
            served: RwLock::new(served),
        })
    }

    /// Reads both files again and, if their contents changed, validates the new key pair and
    /// serves it from the next handshake on.
    ///
    /// Returns `Ok(false)` when nothing changed and `Ok(true)` after a swap. On any error the
    /// old certificate stays in service and the next call tries again (the files may have been
    /// caught half-updated).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = read_both(&self.cert_path, &self.key_path)?;
        if content_hash(&cert_pem, &key_pem) == self.read().content_hash {
            return Ok(false);
        }
        let served = build(&self.cert_path, &cert_pem, &self.key_path, &key_pem)?;
        *self.served.write().unwrap_or_else(|e| e.into_inner()) = served;
        Ok(true)
    }

    /// The served leaf certificate's notAfter, in unix seconds (for the expiry gauge).
    pub fn not_after_unix(&self) -> i64 {
        self.read().not_after
    }

    /// The certificate file this store reads.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The private key file this store reads.
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The key pair served right now.
    fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.read().key)
    }

    /// A poisoned lock still holds a complete `Served`: swaps are a single assignment.
    fn read(&self) -> RwLockReadGuard<'_, Served> {
        self.served.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let served = self.read();
        f.debug_struct("CertStore")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("chain_len", &served.key.cert.len())
            .field("not_after_unix", &served.not_after)
            .field(
                "content_hash",
                &format_args!("{:016x}", served.content_hash),
            )
            .finish()
    }
}

/// The webhook's rustls server configuration: ring, TLS 1.3 and 1.2 with [`CIPHER_SUITES`],
/// no client authentication, ALPN `h2` then `http/1.1`, certificates from `store`.
pub fn server_config(store: Arc<CertStore>) -> Result<Arc<ServerConfig>, TlsError> {
    webhook_server_config(store, None)
}

/// [`server_config`], and with `client_ca` (`--client-ca`) a client must present a
/// certificate that chains to one of the CA certificates in that PEM file, or the handshake
/// fails. The file is read once, here.
pub fn webhook_server_config(
    store: Arc<CertStore>,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Requires a client certificate that chains to a CA in `path`.
fn client_verifier(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let error = |reason: String| TlsError::ClientCa {
        path: path.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| error(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for (i, item) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let der = item.map_err(|e| error(format!("certificate #{}: invalid PEM: {e}", i + 1)))?;
        roots
            .add(der)
            .map_err(|e| error(format!("certificate #{}: {e}", i + 1)))?;
    }
    if roots.is_empty() {
        return Err(error(
            "no \"BEGIN CERTIFICATE\" PEM block in it".to_string(),
        ));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| error(e.to_string()))
}

/// Why a TLS handshake failed, as a `podmend_tls_handshake_failures_total` reason: a small
/// fixed set, so a client cannot grow the metric.
pub fn handshake_failure_reason(error: &io::Error) -> &'static str {
    let Some(tls) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<RustlsError>())
    else {
        return match error.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => "closed",
            _ => "other",
        };
    };
    match tls {
        // TLS 1.0 and 1.1 clients send no signature_algorithms (it came with TLS 1.2), and
        // rustls refuses them for that (handshake_failure) before it looks at the version.
        RustlsError::PeerIncompatible(
            PeerIncompatible::Tls12NotOffered
            | PeerIncompatible::Tls12NotOfferedOrEnabled
            | PeerIncompatible::SupportedVersionsExtensionRequired
            | PeerIncompatible::SignatureAlgorithmsExtensionRequired,
        ) => "protocol-version",
        RustlsError::PeerIncompatible(
            PeerIncompatible::NoCipherSuitesInCommon
            | PeerIncompatible::NoKxGroupsInCommon
            | PeerIncompatible::NoSignatureSchemesInCommon,
        ) => "cipher-suite",
        RustlsError::NoApplicationProtocol => "alpn",
        RustlsError::NoCertificatesPresented | RustlsError::InvalidCertificate(_) => {
            "client-certificate"
        }
        // Usually the client does not trust the serving certificate (bad caBundle).
        RustlsError::AlertReceived(_) => "peer-alert",
        _ => "malformed",
    }
}

/// Whether `suite` is one a client may negotiate with the webhook (see [`CIPHER_SUITES`]).
pub fn is_accepted_suite(suite: CipherSuite) -> bool {
    CIPHER_SUITES.iter().any(|s| s.suite() == suite)
}

fn read_both(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    Ok((
        read_file(PemFile::Certificate, cert)?,
        read_file(PemFile::PrivateKey, key)?,
    ))
}

/// Reads through symlinks (`std::fs::read` follows them at open time).
fn read_file(file: PemFile, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        file,
        path: path.to_path_buf(),
        source,
    })
}

/// Change detection only: whoever can write these files can already replace the key.
fn content_hash(cert_pem: &[u8], key_pem: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write_usize(cert_pem.len());
    hasher.write(cert_pem);
    hasher.write_usize(key_pem.len());
    hasher.write(key_pem);
    hasher.finish()
}

/// Parses and validates a key pair; nothing here panics on file contents.
fn build(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
) -> Result<Served, TlsError> {
    let (chain, not_after) = parse_chain(cert_path, cert_pem)?;
    let signing_key = parse_key(key_path, key_pem)?;
    let key = CertifiedKey::new(chain, signing_key);
    check_keys_match(&key, cert_path, key_path)?;
    Ok(Served {
        key: Arc::new(key),
        content_hash: content_hash(cert_pem, key_pem),
        not_after,
    })
}

/// The certificates of a PEM chain, each an X.509 certificate, and the first one's notAfter
/// (unix seconds).
fn parse_chain(
    cert_path: &Path,
    cert_pem: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, i64), TlsError> {
    let bad = |index: usize, reason: String| TlsError::BadCertificate {
        path: cert_path.to_path_buf(),
        index,
        reason,
    };
    let mut chain = Vec::new();
    for (i, item) in CertificateDer::pem_slice_iter(cert_pem).enumerate() {
        chain.push(item.map_err(|e| bad(i + 1, format!("invalid PEM: {e}")))?);
    }
    let mut not_after = None;
    for (i, der) in chain.iter().enumerate() {
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref())
            .map_err(|e| bad(i + 1, format!("not an X.509 certificate: {e}")))?;
        if i == 0 {
            not_after = Some(parsed.validity().not_after.timestamp());
        }
    }
    match not_after {
        Some(not_after) => Ok((chain, not_after)),
        None => Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        }),
    }
}

/// The private key of a PEM file, loaded by ring.
fn parse_key(
    key_path: &Path,
    key_pem: &[u8],
) -> Result<Arc<dyn rustls::sign::SigningKey>, TlsError> {
    let key_der = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: key_path.to_path_buf(),
        },
        e => TlsError::BadPrivateKey {
            path: key_path.to_path_buf(),
            reason: format!("invalid PEM: {e}"),
        },
    })?;
    ring::default_provider()
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::BadPrivateKey {
            path: key_path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// The key must be the certificate's.
fn check_keys_match(key: &CertifiedKey, cert_path: &Path, key_path: &Path) -> Result<(), TlsError> {
    match key.keys_match() {
        // ring keys always expose their public key, so `Unknown` does not happen; like
        // `CertifiedKey::from_der`, it would not be treated as a mismatch.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(()),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert: cert_path.to_path_buf(),
                key: key_path.to_path_buf(),
            })
        }
        Err(e) => Err(TlsError::BadCertificate {
            path: cert_path.to_path_buf(),
            index: 1,
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use std::fs;
    use tempfile::TempDir;

    struct Pair {
        cert_pem: String,
        key_pem: String,
        der: CertificateDer<'static>,
    }

    fn self_signed(name: &str) -> Pair {
        let made = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("rcgen");
        Pair {
            cert_pem: made.cert.pem(),
            key_pem: made.signing_key.serialize_pem(),
            der: made.cert.der().clone(),
        }
    }

    /// Writes `tls.crt` and `tls.key` into a fresh tempdir.
    fn write(cert_pem: &str, key_pem: &str) -> (TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        fs::write(&cert, cert_pem).expect("write cert");
        fs::write(&key, key_pem).expect("write key");
        (dir, cert, key)
    }

    fn served_leaf(store: &CertStore) -> CertificateDer<'static> {
        store.current().cert[0].clone()
    }

    #[test]
    fn a_certificate_and_its_key_load_and_are_served() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = CertStore::load(&cert, &key).expect("load");
        assert_eq!(served_leaf(&store), pair.der);
        assert_eq!(store.cert_path(), cert);
        assert_eq!(store.key_path(), key);
    }

    #[test]
    fn a_full_chain_is_served_leaf_first() {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca =
            CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
        let leaf_key = KeyPair::generate().expect("key");
        let leaf = CertificateParams::new(vec!["localhost".to_string()])
            .expect("params")
            .signed_by(&leaf_key, &ca)
            .expect("leaf");

        let chain_pem = format!("{}{}", leaf.pem(), ca.pem());
        let (_dir, cert, key) = write(&chain_pem, &leaf_key.serialize_pem());
        let store = CertStore::load(&cert, &key).expect("load");
        let served = store.current();
        assert_eq!(served.cert.len(), 2);
        assert_eq!(&served.cert[0], leaf.der());
        assert_eq!(&served.cert[1], ca.der());
    }

    #[test]
    fn a_key_that_does_not_match_the_certificate_is_rejected() {
        let pair = self_signed("localhost");
        let other = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &other.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("mismatch");
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&*key.to_string_lossy()), "{msg}");
        assert!(msg.contains(&*cert.to_string_lossy()), "{msg}");
    }

    #[test]
    fn a_chain_whose_leaf_is_not_first_is_rejected_as_a_mismatch() {
        let pair = self_signed("localhost");
        let other = self_signed("other");
        let chain = format!("{}{}", other.cert_pem, pair.cert_pem);
        let (_dir, cert, key) = write(&chain, &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("leaf not first");
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    }

    #[test]
    fn a_missing_file_is_an_error_that_names_it_and_the_flag() {
        let pair = self_signed("localhost");
        let (dir, _cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let missing = dir.path().join("nope.crt");
        let err = CertStore::load(&missing, &key).expect_err("missing");
        assert!(
            matches!(
                err,
                TlsError::Read {
                    file: PemFile::Certificate,
                    ..
                }
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&*missing.to_string_lossy()), "{msg}");
        assert!(msg.contains("--tls-cert"), "{msg}");
        assert!(msg.contains("podmend certs"), "{msg}");

        let err = CertStore::load(&dir.path().join("tls.crt"), &dir.path().join("nope.key"))
            .expect_err("missing key");
        assert!(err.to_string().contains("--tls-key"), "{err}");
    }

    #[test]
    fn a_certificate_file_without_certificates_is_rejected() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write("not a pem file\n", &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("no cert");
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");

        // A key alone in the certificate file is still "no certificate".
        let (_dir, cert, key) = write(&pair.key_pem, &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("no cert");
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
    }

    #[test]
    fn a_certificate_block_that_is_not_x509_is_rejected() {
        let pair = self_signed("localhost");
        let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        let (_dir, cert, key) = write(junk, &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("junk");
        assert!(
            matches!(err, TlsError::BadCertificate { index: 1, .. }),
            "{err}"
        );

        let bad_base64 = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        let (_dir, cert, key) = write(bad_base64, &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("bad base64");
        assert!(matches!(err, TlsError::BadCertificate { .. }), "{err}");

        let truncated = &pair.cert_pem[..pair.cert_pem.len() / 2];
        let (_dir, cert, key) = write(truncated, &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("truncated");
        assert!(matches!(err, TlsError::BadCertificate { .. }), "{err}");
    }

    #[test]
    fn an_unparsable_intermediate_is_rejected_with_its_position() {
        let pair = self_signed("localhost");
        let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        let (_dir, cert, key) = write(&format!("{}{junk}", pair.cert_pem), &pair.key_pem);
        let err = CertStore::load(&cert, &key).expect_err("junk intermediate");
        assert!(
            matches!(err, TlsError::BadCertificate { index: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_key_file_without_a_key_is_rejected() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.cert_pem);
        let err = CertStore::load(&cert, &key).expect_err("no key");
        assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err}");
        assert!(err.to_string().contains("--tls-key"), "{err}");
    }

    #[test]
    fn a_key_that_ring_cannot_load_is_rejected() {
        let pair = self_signed("localhost");
        let junk = "-----BEGIN PRIVATE KEY-----\naGVsbG8gd29ybGQ=\n-----END PRIVATE KEY-----\n";
        let (_dir, cert, key) = write(&pair.cert_pem, junk);
        let err = CertStore::load(&cert, &key).expect_err("junk key");
        assert!(matches!(err, TlsError::BadPrivateKey { .. }), "{err}");
    }

    #[test]
    fn reloading_unchanged_files_reports_no_change() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = CertStore::load(&cert, &key).expect("load");
        assert!(!store.reload_if_changed().expect("reload"));
        assert_eq!(served_leaf(&store), pair.der);
    }

    #[test]
    fn reloading_changed_files_serves_the_new_certificate() {
        let first = self_signed("localhost");
        let (_dir, cert, key) = write(&first.cert_pem, &first.key_pem);
        let store = CertStore::load(&cert, &key).expect("load");

        let second = self_signed("localhost");
        fs::write(&cert, &second.cert_pem).expect("write");
        fs::write(&key, &second.key_pem).expect("write");
        assert!(store.reload_if_changed().expect("reload"));
        assert_eq!(served_leaf(&store), second.der);
        assert!(!store.reload_if_changed().expect("second reload"));
    }

    #[test]
    fn a_failed_reload_keeps_the_old_certificate_and_a_fixed_one_is_picked_up() {
        let first = self_signed("localhost");
        let (_dir, cert, key) = write(&first.cert_pem, &first.key_pem);
        let store = CertStore::load(&cert, &key).expect("load");

        // Half-updated: new certificate, old key.
        let second = self_signed("localhost");
        fs::write(&cert, &second.cert_pem).expect("write");
        let err = store.reload_if_changed().expect_err("mismatch");
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert_eq!(served_leaf(&store), first.der);

        // The key arrives: the next reload succeeds.
        fs::write(&key, &second.key_pem).expect("write");
        assert!(store.reload_if_changed().expect("reload"));
        assert_eq!(served_leaf(&store), second.der);

        // The files disappear: an error, and the last good key is still served.
        fs::remove_file(&cert).expect("remove");
        let err = store.reload_if_changed().expect_err("gone");
        assert!(matches!(err, TlsError::Read { .. }), "{err}");
        assert_eq!(served_leaf(&store), second.der);
    }

    #[test]
    fn not_after_is_the_leaf_validity_end() {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_after = rcgen::date_time_ymd(2031, 5, 17);
        let cert = params.self_signed(&key).expect("cert");
        let (_dir, cert_path, key_path) = write(&cert.pem(), &key.serialize_pem());
        let store = CertStore::load(&cert_path, &key_path).expect("load");
        // 2031-05-17T00:00:00Z
        assert_eq!(store.not_after_unix(), 1_936_742_400);
    }

    #[test]
    fn a_poisoned_lock_does_not_panic_readers_or_reloads() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = Arc::new(CertStore::load(&cert, &key).expect("load"));
        let poisoner = Arc::clone(&store);
        let joined = std::thread::spawn(move || {
            let _guard = poisoner.served.write();
            panic!("poison the lock on purpose");
        })
        .join();
        assert!(joined.is_err());
        assert!(store.served.is_poisoned());

        assert_eq!(served_leaf(&store), pair.der);
        assert!(store.not_after_unix() > 0);
        assert!(!store.reload_if_changed().expect("reload"));
        assert!(format!("{store:?}").contains("CertStore"));
    }

    #[test]
    fn the_server_config_offers_h2_then_http1_and_resolves_from_the_store() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = Arc::new(CertStore::load(&cert, &key).expect("load"));
        let config = server_config(store).expect("config");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn tls12_suites_are_all_ecdhe_with_an_aead_cipher() {
        let tls12: Vec<String> = CIPHER_SUITES
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(tls12.len(), 6, "{tls12:?}");
        for name in &tls12 {
            assert!(name.starts_with("TLS_ECDHE_"), "{name}");
            assert!(
                name.ends_with("_GCM_SHA256")
                    || name.ends_with("_GCM_SHA384")
                    || name.ends_with("_CHACHA20_POLY1305_SHA256"),
                "{name}"
            );
        }
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = Arc::new(CertStore::load(&cert, &key).expect("load"));
        let config = server_config(store).expect("config");
        let offered: Vec<CipherSuite> = config
            .crypto_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        let ours: Vec<CipherSuite> = CIPHER_SUITES.iter().map(|s| s.suite()).collect();
        assert_eq!(offered, ours);
    }

    #[test]
    fn a_client_ca_file_without_certificates_is_rejected_naming_the_flag() {
        let pair = self_signed("localhost");
        let (dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = Arc::new(CertStore::load(&cert, &key).expect("load"));
        let bad = dir.path().join("client-ca.crt");
        fs::write(&bad, "not a certificate\n").expect("write");
        let err = webhook_server_config(store.clone(), Some(&bad)).expect_err("no CA");
        assert!(matches!(err, TlsError::ClientCa { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("--client-ca"), "{msg}");
        assert!(msg.contains(&*bad.to_string_lossy()), "{msg}");

        let missing = dir.path().join("missing.crt");
        let err = webhook_server_config(store.clone(), Some(&missing)).expect_err("missing");
        assert!(err.to_string().contains("--client-ca"), "{err}");

        let ca = dir.path().join("ca.crt");
        fs::write(&ca, &pair.cert_pem).expect("write");
        webhook_server_config(store, Some(&ca)).expect("a PEM CA certificate is accepted");
    }

    #[test]
    fn handshake_errors_map_to_a_small_set_of_reasons() {
        let tls = |e: RustlsError| io::Error::new(io::ErrorKind::InvalidData, e);
        let cases = [
            (
                tls(PeerIncompatible::Tls12NotOffered.into()),
                "protocol-version",
            ),
            (
                tls(PeerIncompatible::SignatureAlgorithmsExtensionRequired.into()),
                "protocol-version",
            ),
            (
                tls(PeerIncompatible::NoCipherSuitesInCommon.into()),
                "cipher-suite",
            ),
            (tls(RustlsError::NoApplicationProtocol), "alpn"),
            (
                tls(RustlsError::NoCertificatesPresented),
                "client-certificate",
            ),
            (
                tls(RustlsError::AlertReceived(
                    rustls::AlertDescription::UnknownCA,
                )),
                "peer-alert",
            ),
            (tls(RustlsError::DecryptError), "malformed"),
            (io::Error::from(io::ErrorKind::UnexpectedEof), "closed"),
            (io::Error::from(io::ErrorKind::PermissionDenied), "other"),
        ];
        for (error, reason) in cases {
            assert_eq!(handshake_failure_reason(&error), reason, "{error}");
        }
    }

    #[test]
    fn the_debug_form_shows_paths_but_not_key_material() {
        let pair = self_signed("localhost");
        let (_dir, cert, key) = write(&pair.cert_pem, &pair.key_pem);
        let store = CertStore::load(&cert, &key).expect("load");
        let debug = format!("{store:?}");
        assert!(debug.contains("tls.crt"), "{debug}");
        assert!(!debug.contains("PRIVATE"), "{debug}");
    }
}
