//! The webhook's TLS surface over real sockets: the certificate served after kubelet swaps a
//! Secret volume's `..data` symlink, broken replacements, ALPN and protocol versions.
//! Clients trust only the CA that `podmend certs` made; ring is the provider everywhere.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::tls;
use podmend::certs::{self, DevPki};
use podmend::server::tls::{CertStore, TlsError, server_config};
use rustls::{ProtocolVersion, SupportedProtocolVersion};
use rustls_pki_types::CertificateDer;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

const H2: &[u8] = b"h2";
const HTTP1: &[u8] = b"http/1.1";
const TLS12_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];
const TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn dev_pki() -> DevPki {
    certs::generate(&["localhost".to_string(), "127.0.0.1".to_string()], 30).expect("dev PKI")
}

fn leaf_der(cert_pem: &str) -> CertificateDer<'static> {
    tls::leaf_der(cert_pem.as_bytes())
}

/// A Secret volume as kubelet lays it out: a timestamped directory holding the files,
/// `..data` pointing at it, and each key a symlink through `..data`.
struct SecretVolume {
    dir: TempDir,
    generation: u32,
}

impl SecretVolume {
    fn new(cert_pem: &str, key_pem: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut volume = Self { dir, generation: 0 };
        let first = volume.write_generation(cert_pem, key_pem);
        symlink(&first, &volume.path("..data"));
        symlink(Path::new("..data/tls.crt"), &volume.path("tls.crt"));
        symlink(Path::new("..data/tls.key"), &volume.path("tls.key"));
        volume
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cert(&self) -> PathBuf {
        self.path("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.path("tls.key")
    }

    /// Writes `..2026_11_22_00_00_00.00000000N/{tls.crt,tls.key}`; returns the relative name.
    fn write_generation(&mut self, cert_pem: &str, key_pem: &str) -> PathBuf {
        self.generation += 1;
        let name = PathBuf::from(format!("..2026_11_22_00_00_00.{:09}", self.generation));
        let dir = self.dir.path().join(&name);
        std::fs::create_dir(&dir).expect("generation dir");
        std::fs::write(dir.join("tls.crt"), cert_pem).expect("write tls.crt");
        std::fs::write(dir.join("tls.key"), key_pem).expect("write tls.key");
        name
    }

    /// kubelet's atomic update: new directory, `..data_tmp` symlink, rename over `..data`,
    /// then the old directory is removed.
    fn swap(&mut self, cert_pem: &str, key_pem: &str) {
        let old = std::fs::read_link(self.path("..data")).expect("read ..data");
        let new = self.write_generation(cert_pem, key_pem);
        symlink(&new, &self.path("..data_tmp"));
        std::fs::rename(self.path("..data_tmp"), self.path("..data")).expect("rename ..data");
        std::fs::remove_dir_all(self.dir.path().join(old)).expect("remove old generation");
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

/// A TLS server on an ephemeral loopback port that completes handshakes and hangs up.
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(store: Arc<CertStore>) -> Self {
        let acceptor = TlsAcceptor::from(server_config(store).expect("server config"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // Handshake failures are what some tests expect; nothing to report.
                    let _ = acceptor.accept(tcp).await;
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the client saw of one handshake.
#[derive(Debug)]
struct Handshake {
    leaf: CertificateDer<'static>,
    alpn: Option<Vec<u8>>,
    version: Option<ProtocolVersion>,
}

struct Client<'a> {
    trusted_cas: Vec<&'a str>,
    alpn: Vec<&'static [u8]>,
    versions: &'static [&'static SupportedProtocolVersion],
}

impl<'a> Client<'a> {
    fn trusting(ca_pem: &'a str) -> Self {
        Self {
            trusted_cas: vec![ca_pem],
            alpn: vec![H2, HTTP1],
            versions: rustls::ALL_VERSIONS,
        }
    }

    async fn connect(&self, addr: SocketAddr) -> Result<Handshake, std::io::Error> {
        let roots = tls::roots(self.trusted_cas.iter().map(|ca| ca.as_bytes()));
        let config = tls::client_config_with(roots, Some(self.versions), None, &self.alpn);
        let tls = tls::connect(addr, config).await?;
        let (_, conn) = tls.get_ref();
        let leaf = conn
            .peer_certificates()
            .and_then(|chain| chain.first())
            .expect("server sent a certificate")
            .clone()
            .into_owned();
        Ok(Handshake {
            leaf,
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            version: conn.protocol_version(),
        })
    }
}

/// A store loaded through the volume's top-level symlinks, and a server using it.
async fn serve_volume(volume: &SecretVolume) -> (Arc<CertStore>, Server) {
    let store = Arc::new(CertStore::load(&volume.cert(), &volume.key()).expect("load store"));
    let server = Server::start(Arc::clone(&store)).await;
    (store, server)
}

#[tokio::test]
async fn the_served_certificate_changes_after_the_data_symlink_is_swapped_and_reloaded() {
    let first = dev_pki();
    let mut volume = SecretVolume::new(&first.cert_pem, &first.key_pem);
    let (store, server) = serve_volume(&volume).await;

    let before = Client::trusting(&first.ca_pem)
        .connect(server.addr)
        .await
        .expect("handshake before");
    assert_eq!(before.leaf, leaf_der(&first.cert_pem));

    let second = certs::generate(&["localhost".to_string()], 60).expect("second PKI");
    volume.swap(&second.cert_pem, &second.key_pem);

    // Until reload runs, the old certificate is served even though its files are gone.
    let stale = Client::trusting(&first.ca_pem)
        .connect(server.addr)
        .await
        .expect("handshake before reload");
    assert_eq!(stale.leaf, leaf_der(&first.cert_pem));

    let not_after_before = store.not_after_unix();
    assert!(store.reload_if_changed().expect("reload"));
    assert!(store.not_after_unix() > not_after_before);

    let mut client = Client::trusting(&second.ca_pem);
    client.trusted_cas.push(&first.ca_pem);
    let after = client.connect(server.addr).await.expect("handshake after");
    assert_eq!(after.leaf, leaf_der(&second.cert_pem));
    assert_ne!(after.leaf, before.leaf);

    // A client that trusts only the old CA now refuses the new certificate.
    assert!(
        Client::trusting(&first.ca_pem)
            .connect(server.addr)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_broken_replacement_keeps_the_old_certificate_and_reload_fails() {
    let good = dev_pki();
    let mut volume = SecretVolume::new(&good.cert_pem, &good.key_pem);
    let (store, server) = serve_volume(&volume).await;
    let other = dev_pki();

    let garbage = "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n";
    let cases: [(&str, &str, &str); 3] = [
        ("garbage PEM", garbage, &good.key_pem),
        ("a key that does not match", &other.cert_pem, &good.key_pem),
        ("no certificate at all", "", &good.key_pem),
    ];
    for (what, cert_pem, key_pem) in cases {
        volume.swap(cert_pem, key_pem);
        let err = store
            .reload_if_changed()
            .expect_err(&format!("{what}: reload must fail"));
        match what {
            "a key that does not match" => {
                assert!(matches!(err, TlsError::KeyMismatch { .. }), "{what}: {err}")
            }
            "no certificate at all" => {
                assert!(
                    matches!(err, TlsError::NoCertificate { .. }),
                    "{what}: {err}"
                )
            }
            _ => assert!(
                matches!(err, TlsError::BadCertificate { .. }),
                "{what}: {err}"
            ),
        }
        assert!(
            err.to_string().contains("tls.crt") || err.to_string().contains("tls.key"),
            "{what}: the error names the file: {err}"
        );

        let seen = Client::trusting(&good.ca_pem)
            .connect(server.addr)
            .await
            .unwrap_or_else(|e| panic!("{what}: old certificate still served: {e}"));
        assert_eq!(seen.leaf, leaf_der(&good.cert_pem), "{what}");
    }

    // Fixing the volume is picked up by the next reload.
    volume.swap(&other.cert_pem, &other.key_pem);
    assert!(store.reload_if_changed().expect("reload after the fix"));
    let seen = Client::trusting(&other.ca_pem)
        .connect(server.addr)
        .await
        .expect("handshake after the fix");
    assert_eq!(seen.leaf, leaf_der(&other.cert_pem));
}

#[tokio::test]
async fn reload_with_unchanged_files_returns_false() {
    let pki = dev_pki();
    let mut volume = SecretVolume::new(&pki.cert_pem, &pki.key_pem);
    let (store, server) = serve_volume(&volume).await;
    assert!(!store.reload_if_changed().expect("reload"));

    // kubelet rewrites the volume with the same contents on resync: still no change.
    volume.swap(&pki.cert_pem, &pki.key_pem);
    assert!(
        !store
            .reload_if_changed()
            .expect("reload after same-content swap")
    );

    let seen = Client::trusting(&pki.ca_pem)
        .connect(server.addr)
        .await
        .expect("handshake");
    assert_eq!(seen.leaf, leaf_der(&pki.cert_pem));
}

#[tokio::test]
async fn alpn_negotiates_h2_when_offered_and_http1_otherwise() {
    let pki = dev_pki();
    let volume = SecretVolume::new(&pki.cert_pem, &pki.key_pem);
    let (_store, server) = serve_volume(&volume).await;

    let mut client = Client::trusting(&pki.ca_pem);
    client.alpn = vec![HTTP1, H2];
    let both = client.connect(server.addr).await.expect("h2 handshake");
    assert_eq!(both.alpn.as_deref(), Some(H2));

    client.alpn = vec![HTTP1];
    let http1 = client
        .connect(server.addr)
        .await
        .expect("http/1.1 handshake");
    assert_eq!(http1.alpn.as_deref(), Some(HTTP1));

    client.alpn = vec![];
    let none = client
        .connect(server.addr)
        .await
        .expect("no-ALPN handshake");
    assert_eq!(none.alpn, None);
}

#[tokio::test]
async fn a_client_limited_to_tls12_still_connects() {
    let pki = dev_pki();
    let volume = SecretVolume::new(&pki.cert_pem, &pki.key_pem);
    let (_store, server) = serve_volume(&volume).await;

    let mut client = Client::trusting(&pki.ca_pem);
    client.versions = TLS12_ONLY;
    let seen = client
        .connect(server.addr)
        .await
        .expect("TLS 1.2 handshake");
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_2));
    assert_eq!(seen.alpn.as_deref(), Some(H2));
    assert_eq!(seen.leaf, leaf_der(&pki.cert_pem));

    client.versions = TLS13_ONLY;
    let seen = client
        .connect(server.addr)
        .await
        .expect("TLS 1.3 handshake");
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_3));
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_is_refused() {
    let pki = dev_pki();
    let stranger = dev_pki();
    let volume = SecretVolume::new(&pki.cert_pem, &pki.key_pem);
    let (_store, server) = serve_volume(&volume).await;
    let err = Client::trusting(&stranger.ca_pem)
        .connect(server.addr)
        .await
        .expect_err("unknown issuer");
    // Every dev CA has the same subject, so webpki reports a bad signature, not an unknown issuer.
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
}
