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
