//! The client side: hyper 1 low-level connections over tokio-rustls, trusting only the dev
//! CA, HTTP/1.1 or HTTP/2 by ALPN, as the API server's webhook client would connect.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::{http1, http2};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::args::Proto;

/// The name the client asks for (SNI) and verifies; `podmend certs --dns localhost`.
pub const SERVER_NAME: &str = "localhost";
/// What an OK answer contains.
const ALLOWED: &[u8] = br#""allowed":true"#;

/// Where and how to connect.
pub struct Target {
    pub addr: SocketAddr,
    pub proto: Proto,
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl Target {
    pub fn new(addr: SocketAddr, ca_pem: &[u8], proto: Proto) -> anyhow::Result<Target> {
        Ok(Target {
            addr,
            proto,
            connector: TlsConnector::from(client_tls(ca_pem, proto.alpn())?),
            server_name: ServerName::try_from(SERVER_NAME)
                .context("server name")?
                .to_owned(),
        })
    }

    /// A new TLS connection, handshaken, with the negotiated protocol checked.
    pub async fn connect(&self) -> Result<Sender, String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect to {}: {e}", self.addr))?;
        tcp.set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        let tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS handshake with {}: {}", self.addr, chain(&e)))?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        if alpn.as_deref() != Some(self.proto.alpn()) {
            return Err(format!(
                "ALPN: asked for {:?}, the server chose {:?}",
                String::from_utf8_lossy(self.proto.alpn()),
                alpn.as_deref().map(String::from_utf8_lossy)
            ));
        }
        let io = TokioIo::new(tls);
        match self.proto {
            Proto::H1 => {
                let (sender, connection) = http1::handshake(io)
                    .await
                    .map_err(|e| format!("HTTP/1.1 handshake: {}", chain(&e)))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(Sender::H1(sender))
            }
            Proto::H2 => {
                let (sender, connection) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(|e| format!("HTTP/2 handshake: {}", chain(&e)))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(Sender::H2(sender))
            }
        }
    }
}

/// A rustls client configuration (ring) that trusts only the CA in `ca_pem`.
pub fn client_tls(ca_pem: &[u8], alpn: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.context("the CA file is not valid PEM")?;
        roots
            .add(cert)
            .context("the CA certificate is not usable as a trust anchor")?;
    }
    if roots.is_empty() {
        bail!("the CA file holds no certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("rustls protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// One connection's request handle. An HTTP/2 handle is a clone of its connection's.
pub enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    /// Another handle on the same connection: HTTP/2 only, HTTP/1.1 has one request at a time.
    pub fn share(&self) -> Option<Sender> {
        match self {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Sender::H2(s.clone())),
        }
    }
}

/// The request every phase sends over and over: only the body's reference count changes.
pub struct RequestTemplate {
    uri: Uri,
    host: HeaderValue,
    pub body: Bytes,
}

impl RequestTemplate {
    pub fn new(
        proto: Proto,
        addr: SocketAddr,
        path: &'static str,
        body: Bytes,
    ) -> anyhow::Result<Self> {
        let authority = format!("{SERVER_NAME}:{}", addr.port());
        // HTTP/1.1 sends origin-form plus Host; HTTP/2 needs scheme and authority in the URI.
        let uri = match proto {
            Proto::H1 => path.to_string(),
            Proto::H2 => format!("https://{authority}{path}"),
        };
        Ok(RequestTemplate {
            uri: uri.parse().with_context(|| format!("URI {uri}"))?,
            host: HeaderValue::from_str(&authority).context("Host header")?,
            body,
        })
    }

    fn request(&self, proto: Proto) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        if proto == Proto::H1 {
            headers.insert(HOST, self.host.clone());
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        request
    }
}

/// Sends the request and reads the whole answer. `Err` is a transport failure: the
/// connection is not to be used again.
pub async fn exchange(
    sender: &mut Sender,
    template: &RequestTemplate,
) -> Result<(StatusCode, Bytes), String> {
    let response = match sender {
        Sender::H1(s) => {
            s.ready().await.map_err(|e| chain(&e))?;
            s.send_request(template.request(Proto::H1))
                .await
                .map_err(|e| chain(&e))?
        }
        Sender::H2(s) => {
            s.ready().await.map_err(|e| chain(&e))?;
            s.send_request(template.request(Proto::H2))
                .await
                .map_err(|e| chain(&e))?
        }
    };
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body: {}", chain(&e)))?
        .to_bytes();
    Ok((status, body))
}

/// Whether an answer counts as OK: 200 and `"allowed":true` in the body.
pub fn check_answer(status: StatusCode, body: &[u8]) -> Result<(), String> {
    if status != StatusCode::OK {
        return Err(format!("HTTP {status}: {}", snippet(body)));
    }
    if !body.windows(ALLOWED.len()).any(|w| w == ALLOWED) {
        return Err(format!("200 without \"allowed\":true: {}", snippet(body)));
    }
    Ok(())
}

/// The start of a body, printable.
pub fn snippet(body: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let text = text.trim();
    if body.len() > MAX {
        format!("{text}…")
    } else {
        text.to_string()
    }
}

/// An error and its sources, on one line (hyper's own message alone is terse).
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}
