//! Where the guard listens and where the Docker daemon is ([`Address`], read as the docker CLI
//! reads `DOCKER_HOST`), and connections to the daemon, optionally over TLS with a client certificate
//! from a `DOCKER_CERT_PATH`-style directory (`ca.pem`, `cert.pem`, `key.pem`), which the guard
//! may load later than it starts (the daemon that writes it starts after the guard). TCP
//! listeners may serve TLS ([`super::tls`] writes their certificates).

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ClientConfig;
use rustls::crypto::ring;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub use crate::dind::Address;

/// How long connecting to the daemon may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client of a TLS listener may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A byte stream both ways: a Unix socket, a TCP connection, or TLS over TCP.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// A boxed [`Stream`].
pub type BoxStream = Pin<Box<dyn Stream>>;

/// Why an address or the TLS material is unusable.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("{0:?} is not a host name a TLS certificate can be checked against")]
    ServerName(String),
    #[error("cannot read {path}: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} holds no usable {what} (PEM expected)", path = .path.display())]
    Pem { path: PathBuf, what: &'static str },
    #[error("cannot build the TLS client configuration from {dir}: {source}", dir = .dir.display())]
    Tls {
        dir: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("--tls-verify needs a tcp:// upstream, not {0}")]
    TlsOverUnix(String),
}

/// The Docker daemon the guard forwards to.
#[derive(Clone)]
pub struct DaemonUpstream {
    address: Address,
    tls: Option<Arc<UpstreamTls>>,
}

/// TLS to the daemon: the files' directory and the configuration loaded from them, once they
/// could be read.
struct UpstreamTls {
    dir: PathBuf,
    name: ServerName<'static>,
    connector: Mutex<Option<TlsConnector>>,
    /// Whether "not readable yet" was logged (once).
    warned: AtomicBool,
}

impl fmt::Debug for DaemonUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DaemonUpstream")
            .field("address", &self.address.to_string())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl DaemonUpstream {
    /// A daemon at `address`; with `tls_dir`, spoken to over TLS verified against
    /// `tls_dir/ca.pem`, presenting `cert.pem` and `key.pem`, which must be readable now.
    pub fn new(address: Address, tls_dir: Option<&Path>) -> Result<Self, AddressError> {
        let upstream = Self::waiting_for_tls(address, tls_dir)?;
        if let Some(tls) = &upstream.tls {
            let config = client_config(&tls.dir)?;
            *lock(&tls.connector) = Some(TlsConnector::from(Arc::new(config)));
        }
        Ok(upstream)
    }

    /// Like [`DaemonUpstream::new`], but the TLS files may appear later: they are read on the
    /// first connection that needs them, and again on every later one until they can be
    /// (the failure is logged once), and again after a handshake fails (a daemon restarted
    /// with a new CA).
    pub fn waiting_for_tls(address: Address, tls_dir: Option<&Path>) -> Result<Self, AddressError> {
        let tls = match tls_dir {
            None => None,
            Some(dir) => {
                let Address::Tcp { host, .. } = &address else {
                    return Err(AddressError::TlsOverUnix(address.to_string()));
                };
                let name = match host.parse::<IpAddr>() {
                    Ok(ip) => ServerName::IpAddress(ip.into()),
                    Err(_) => ServerName::try_from(host.clone())
                        .map_err(|_| AddressError::ServerName(host.clone()))?,
                };
                Some(Arc::new(UpstreamTls {
                    dir: dir.to_path_buf(),
                    name,
                    connector: Mutex::new(None),
                    warned: AtomicBool::new(false),
                }))
            }
        };
        Ok(Self { address, tls })
    }

    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Opens a new connection to the daemon. Unreadable TLS files are a `NotFound` error (the
    /// daemon is not there yet); a failed TLS handshake an `InvalidData` one.
    pub async fn connect(&self) -> io::Result<BoxStream> {
        let connect = async {
            match &self.address {
                Address::Unix(path) => Ok(Box::pin(UnixStream::connect(path).await?) as BoxStream),
                Address::Tcp { host, port } => {
                    let tls = match &self.tls {
                        None => None,
                        Some(tls) => Some((tls, tls.connector()?)),
                    };
                    let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                    let _ = tcp.set_nodelay(true);
                    match tls {
                        None => Ok(Box::pin(tcp) as BoxStream),
                        Some((tls, connector)) => {
                            match connector.connect(tls.name.clone(), tcp).await {
                                Ok(stream) => Ok(Box::pin(stream) as BoxStream),
                                Err(error) => {
                                    // Read the files again next time: they may have changed.
                                    *lock(&tls.connector) = None;
                                    Err(error)
                                }
                            }
                        }
                    }
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connection timed out"))?
    }
}

impl UpstreamTls {
    /// The loaded configuration, or loads it now.
    fn connector(&self) -> io::Result<TlsConnector> {
        let mut cached = lock(&self.connector);
        if let Some(connector) = cached.as_ref() {
            return Ok(connector.clone());
        }
        match client_config(&self.dir) {
            Ok(config) => {
                let connector = TlsConnector::from(Arc::new(config));
                *cached = Some(connector.clone());
                if self.warned.swap(false, Ordering::AcqRel) {
                    tracing::info!(dir = %self.dir.display(), "the TLS files for the Docker daemon are readable now");
                }
                Ok(connector)
            }
            Err(error) => {
                if !self.warned.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        %error,
                        "the TLS files for the Docker daemon are not readable yet (the daemon \
                         that writes them may still be starting); trying again on every request"
                    );
                }
                Err(io::Error::new(io::ErrorKind::NotFound, error.to_string()))
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl fmt::Display for DaemonUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.address, f)?;
        if self.tls.is_some() {
            f.write_str(" (TLS)")?;
        }
        Ok(())
    }
}

fn read_file(path: PathBuf) -> Result<(PathBuf, Vec<u8>), AddressError> {
    match std::fs::read(&path) {
        Ok(bytes) => Ok((path, bytes)),
        Err(source) => Err(AddressError::Read { path, source }),
    }
}

/// A rustls client configuration (ring) from `ca.pem`, `cert.pem` and `key.pem` in `dir`.
fn client_config(dir: &Path) -> Result<ClientConfig, AddressError> {
    let (ca_path, ca) = read_file(dir.join("ca.pem"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|_| AddressError::Pem {
            path: ca_path.clone(),
            what: "CA certificate",
        })?;
        roots.add(cert).map_err(|_| AddressError::Pem {
            path: ca_path.clone(),
            what: "CA certificate",
        })?;
    }
    if roots.is_empty() {
        return Err(AddressError::Pem {
            path: ca_path,
            what: "CA certificate",
        });
    }
    let (cert_path, cert) = read_file(dir.join("cert.pem"))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<_, _>>()
        .map_err(|_| AddressError::Pem {
            path: cert_path.clone(),
            what: "client certificate",
        })?;
    if chain.is_empty() {
        return Err(AddressError::Pem {
            path: cert_path,
            what: "client certificate",
        });
    }
    let (key_path, key) = read_file(dir.join("key.pem"))?;
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(|_| AddressError::Pem {
        path: key_path,
        what: "private key",
    })?;
    let tls = |source| AddressError::Tls {
        dir: dir.to_path_buf(),
        source,
    };
    ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(tls)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(tls)
}

/// One of the guard's listeners. It can stop listening and listen again on the same
/// address ([`Listener::close`], [`Listener::reopen`]): while the daemon is down the guard
/// refuses connections as the daemon's own closed socket does.
pub struct Listener {
    /// `None` while closed.
    socket: tokio::sync::Mutex<Option<Socket>>,
    /// The address listened on (a TCP port as bound, so reopening takes the same one).
    address: Address,
    /// TLS with client certificates on TCP, as `dockerd --tlsverify` serves.
    tls: Option<TlsAcceptor>,
    access: Mutex<SocketAccess>,
    /// What [`Listener::local_address`] says.
    local: String,
}

enum Socket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// A client connection, accepted; a TLS one still has to complete its handshake, which
/// [`Incoming::establish`] does on the connection's own task.
pub enum Incoming {
    Ready(BoxStream),
    Handshake(TlsAcceptor, TcpStream),
}

impl Incoming {
    /// The connection, ready for HTTP.
    pub async fn establish(self) -> io::Result<BoxStream> {
        match self {
            Incoming::Ready(stream) => Ok(stream),
            Incoming::Handshake(acceptor, tcp) => {
                let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })??;
                Ok(Box::pin(tls))
            }
        }
    }
}

/// Who may connect to the guard's Unix sockets: an owner, a group and a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// `None`: the guard's own user and group (the socket's owner as created).
    pub owner: Option<(u32, u32)>,
    pub mode: u32,
}

impl SocketAccess {
    /// The access of the daemon's socket for a Unix `upstream` (`root:docker 0660` for a
    /// node's `docker.sock`): the guard's socket is no wider a door to the daemon than the
    /// daemon's own. A daemon socket not there yet (a daemon that starts after the guard)
    /// gives the guard's own user alone (`0600`). A TCP upstream is reachable by every
    /// process of the pod's network namespace already, so the socket is open to every user
    /// of the pod (`0666`).
    pub fn of_upstream(upstream: &Address) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        match upstream {
            Address::Unix(path) => match std::fs::metadata(path) {
                Ok(meta) => Ok(SocketAccess {
                    owner: Some((meta.uid(), meta.gid())),
                    mode: meta.mode() & 0o777,
                }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(SocketAccess {
                    owner: None,
                    mode: 0o600,
                }),
                Err(e) => Err(io::Error::new(
                    e.kind(),
                    format!("cannot read the access of {}: {e}", path.display()),
                )),
            },
            Address::Tcp { .. } => Ok(SocketAccess {
                owner: None,
                mode: 0o666,
            }),
        }
    }

    /// Gives the socket at `path` this owner and mode. Without `CAP_CHOWN` (the injected
    /// guard keeps it; a guard started elsewhere may lack it) the owner cannot be changed to
    /// a group the guard is not in: the socket then keeps the guard's own user and group with the daemon's
    /// mode, which lets fewer users in, never more, and says so.
    fn apply(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        if let Some((uid, gid)) = self.owner
            && let Err(error) = std::os::unix::fs::chown(path, Some(uid), Some(gid))
        {
            if error.kind() != io::ErrorKind::PermissionDenied {
                return Err(io::Error::new(
                    error.kind(),
                    format!(
                        "cannot give {} the owner {uid}:{gid}: {error}",
                        path.display()
                    ),
                ));
            }
            tracing::warn!(
                socket = %path.display(),
                uid,
                gid,
                %error,
                "cannot give the guard's socket the owner and group of the daemon's socket (CAP_CHOWN is needed); it keeps the guard's own, so members of that group who are not root cannot connect"
            );
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(self.mode))
    }
}

impl Listener {
    /// Binds `address`, serving TLS with `tls` on TCP (a Unix socket is always plain, as
    /// dockerd's are). A stale Unix socket file (left by a previous run) is replaced, its
    /// directory created, and the socket given the access of the daemon it stands in for
    /// ([`SocketAccess::of_upstream`]): whoever cannot reach the daemon cannot reach it
    /// through the guard either.
    pub async fn bind(
        address: &Address,
        tls: Option<&Arc<rustls::ServerConfig>>,
        access: &SocketAccess,
    ) -> io::Result<Self> {
        let socket = open_socket(address, access).await?;
        let tls = tls.map(|config| TlsAcceptor::from(Arc::clone(config)));
        let (address, local) = match (&socket, address) {
            (Socket::Tcp(listener), _) => {
                let bound = listener.local_addr()?;
                let tls = if tls.is_some() { " (TLS)" } else { "" };
                let address = Address::Tcp {
                    host: bound.ip().to_string(),
                    port: bound.port(),
                };
                (address, format!("tcp://{bound}{tls}"))
            }
            (Socket::Unix(_), address) => (address.clone(), address.to_string()),
        };
        Ok(Listener {
            socket: tokio::sync::Mutex::new(Some(socket)),
            address,
            tls,
            access: Mutex::new(*access),
            local,
        })
    }

    /// The next client connection; while closed, waits forever.
    pub async fn accept(&self) -> io::Result<Incoming> {
        let socket = self.socket.lock().await;
        match socket.as_ref() {
            None => std::future::pending().await,
            Some(Socket::Unix(listener)) => {
                let (stream, _) = listener.accept().await?;
                Ok(Incoming::Ready(Box::pin(stream)))
            }
            Some(Socket::Tcp(listener)) => {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(match &self.tls {
                    None => Incoming::Ready(Box::pin(stream)),
                    Some(acceptor) => Incoming::Handshake(acceptor.clone(), stream),
                })
            }
        }
    }

    /// Stops listening: a connection is refused from now on (`ECONNREFUSED`), as with a
    /// daemon that is not running; a Unix socket's file stays, so clients see the refusal
    /// rather than a missing file. Connections not accepted yet are dropped.
    pub async fn close(&self) {
        self.socket.lock().await.take();
    }

    /// Listens again on the same address, with the same access, if closed.
    pub async fn reopen(&self) -> io::Result<()> {
        let mut socket = self.socket.lock().await;
        if socket.is_none() {
            let access = *lock(&self.access);
            *socket = Some(open_socket(&self.address, &access).await?);
        }
        Ok(())
    }

    /// Where it listens, as an address.
    pub fn local_address(&self) -> String {
        self.local.clone()
    }

    /// For a Unix socket bound before the daemon's socket existed (owner-only until then):
    /// once the daemon's socket appears, gives this socket its access. Returns at once
    /// otherwise; polls every 200 ms until then.
    pub async fn adopt_access_of(&self, upstream: &Address) {
        let (Address::Unix(path), Address::Unix(_)) = (&self.address, upstream) else {
            return;
        };
        if lock(&self.access).owner.is_some() {
            return;
        }
        loop {
            match SocketAccess::of_upstream(upstream) {
                Ok(access) if access.owner.is_some() => {
                    *lock(&self.access) = access;
                    if let Err(error) = access.apply(path) {
                        tracing::warn!(%error, "cannot give the guard's socket the daemon socket's access");
                    }
                    return;
                }
                Ok(_) => {}
                Err(error) => tracing::debug!(%error, "cannot read the daemon socket's access yet"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Removes the socket file, if any.
    pub fn remove_socket(&self) {
        if let Address::Unix(path) = &self.address {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A listening socket on `address`: a Unix one replaces a stale socket file, creates its
/// directory and gets `access`.
async fn open_socket(address: &Address, access: &SocketAccess) -> io::Result<Socket> {
    match address {
        Address::Unix(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            match std::fs::symlink_metadata(path) {
                Ok(meta) => {
                    use std::os::unix::fs::FileTypeExt as _;
                    if meta.file_type().is_socket() {
                        std::fs::remove_file(path)?;
                    } else {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("{} exists and is not a socket", path.display()),
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let listener = UnixListener::bind(path)?;
            access.apply(path)?;
            Ok(Socket::Unix(listener))
        }
        Address::Tcp { host, port } => {
            let addrs: Vec<SocketAddr> = (host.as_str(), *port).to_socket_addrs()?.collect();
            let first = addrs.first().copied().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{host} does not resolve"))
            })?;
            Ok(Socket::Tcp(TcpListener::bind(first).await?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_needs_tcp_and_readable_pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            DaemonUpstream::new("unix:///x.sock".parse().unwrap(), Some(dir.path())).unwrap_err();
        assert!(matches!(err, AddressError::TlsOverUnix(_)), "{err}");
        let err = DaemonUpstream::new("tcp://docker:2376".parse().unwrap(), Some(dir.path()))
            .unwrap_err();
        assert!(err.to_string().contains("ca.pem"), "{err}");
        std::fs::write(dir.path().join("ca.pem"), "not pem").unwrap();
        let err = DaemonUpstream::new("tcp://docker:2376".parse().unwrap(), Some(dir.path()))
            .unwrap_err();
        assert!(matches!(err, AddressError::Pem { .. }), "{err}");
    }

    #[test]
    fn a_tls_upstream_loads_a_docker_cert_path_directory() {
        let ca = rcgen::generate_simple_self_signed(vec!["docker".to_string()]).unwrap();
        let client = rcgen::generate_simple_self_signed(vec!["client".to_string()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), client.cert.pem()).unwrap();
        std::fs::write(
            dir.path().join("key.pem"),
            client.signing_key.serialize_pem(),
        )
        .unwrap();
        let upstream =
            DaemonUpstream::new("tcp://docker:2376".parse().unwrap(), Some(dir.path())).unwrap();
        assert_eq!(upstream.to_string(), "tcp://docker:2376 (TLS)");
    }

    #[tokio::test]
    async fn missing_tls_files_are_a_not_found_connection_error_until_they_appear() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("client");
        let upstream =
            DaemonUpstream::waiting_for_tls("tcp://127.0.0.1:9".parse().unwrap(), Some(&certs))
                .unwrap();
        for _ in 0..2 {
            let error = upstream.connect().await.err().expect("no TLS files yet");
            assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
            assert!(error.to_string().contains("ca.pem"), "{error}");
        }
        let ca = rcgen::generate_simple_self_signed(vec!["docker".to_string()]).unwrap();
        std::fs::create_dir(&certs).unwrap();
        std::fs::write(certs.join("ca.pem"), ca.cert.pem()).unwrap();
        std::fs::write(certs.join("cert.pem"), ca.cert.pem()).unwrap();
        std::fs::write(certs.join("key.pem"), ca.signing_key.serialize_pem()).unwrap();
        // Now the files load, and the connection fails for another reason (nothing listens).
        let error = upstream
            .connect()
            .await
            .err()
            .expect("nothing listens on port 9");
        assert_ne!(error.kind(), io::ErrorKind::NotFound, "{error}");
    }
}
