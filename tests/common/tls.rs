//! The tests' TLS clients: ring, trust anchors from PEM, client configurations (protocol
//! versions, ALPN, a client certificate), and the certificate a server presented.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::crypto::{CryptoProvider, ring};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// ring with its default cipher suites, as every test client uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Trust anchors: every certificate of each PEM text.
pub fn roots<'a>(pems: impl IntoIterator<Item = &'a [u8]>) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem) {
            roots.add(cert.expect("CA PEM")).expect("add CA");
        }
    }
    roots
}

/// A client certificate and its key.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    pub key: PrivateKeyDer<'static>,
}

/// A client configuration trusting `roots`, with rustls' default protocol versions (TLS 1.3
/// and 1.2), no client certificate, offering `alpn`.
pub fn client_config(roots: RootCertStore, alpn: &[&[u8]]) -> ClientConfig {
    client_config_with(roots, None, None, alpn)
}

/// [`client_config`] limited to `versions` and presenting `identity`, when given.
pub fn client_config_with(
    roots: RootCertStore,
    versions: Option<&[&'static SupportedProtocolVersion]>,
    identity: Option<&Identity>,
    alpn: &[&[u8]],
) -> ClientConfig {
    let builder = ClientConfig::builder_with_provider(provider());
    let builder = match versions {
        Some(versions) => builder.with_protocol_versions(versions),
        None => builder.with_safe_default_protocol_versions(),
    }
    .expect("protocol versions")
    .with_root_certificates(roots);
    let mut config = match identity {
        Some(identity) => builder
            .with_client_auth_cert(vec![identity.cert.clone()], identity.key.clone_key())
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A TLS connection to `addr` for the name `localhost`.
pub async fn connect(
    addr: SocketAddr,
    config: ClientConfig,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

/// The certificate the server presented first (its own), DER.
pub fn presented_leaf(tls: &TlsStream<TcpStream>) -> Vec<u8> {
    tls.get_ref().1.peer_certificates().expect("certificate")[0].to_vec()
}

/// The first certificate of a PEM text.
pub fn leaf_der(pem: &[u8]) -> CertificateDer<'static> {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .expect("a certificate")
        .expect("PEM")
}

/// The first certificate of a PEM file, DER.
pub fn leaf_der_of_file(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    leaf_der(&pem).to_vec()
}

/// A CA and a serving certificate it signed for `dns_names`, both valid from an hour ago
/// until `valid_for` from now: (CA PEM, CA key PEM, certificate PEM, key PEM). For a PKI
/// that comes due while a test runs.
pub fn pki_valid_for(
    valid_for: std::time::Duration,
    dns_names: &[&str],
) -> (String, String, String, String) {
    pki_with_leaf_valid_for(valid_for, valid_for, dns_names)
}

/// [`pki_valid_for`] with the CA valid for `ca_valid_for` and the serving certificate for
/// `leaf_valid_for`: for a serving certificate that comes due before its CA.
pub fn pki_with_leaf_valid_for(
    ca_valid_for: std::time::Duration,
    leaf_valid_for: std::time::Duration,
    dns_names: &[&str],
) -> (String, String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "a podmend CA coming due");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = now - std::time::Duration::from_secs(3600);
    ca.not_after = now + ca_valid_for;
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);
    let names: Vec<String> = dns_names.iter().map(|n| n.to_string()).collect();
    let mut leaf = CertificateParams::new(names).expect("names");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = now - std::time::Duration::from_secs(3600);
    leaf.not_after = now + leaf_valid_for;
    let leaf_key = KeyPair::generate().expect("serving key");
    let leaf_cert = leaf
        .signed_by(&leaf_key, &issuer)
        .expect("serving certificate");
    (
        ca_cert.pem(),
        ca_key_pem,
        leaf_cert.pem(),
        leaf_key.serialize_pem(),
    )
}

/// Every certificate of a PEM text, DER, in order.
pub fn all_der(pem: &[u8]) -> Vec<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .map(|der: CertificateDer<'static>| der.to_vec())
        .collect()
}
