//! The webhook's TLS port: accepting connections, the TLS handshake (and the plain-HTTP
//! client that gets a readable 400 instead), HTTP/1.1 or HTTP/2 by ALPN with their timeouts,
//! and the graceful drain on stop. Every connection that fails before or at the HTTP level
//! is counted by reason in [`Metrics`]; what a request gets is [`WebhookRoutes`]' business.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::WebhookRoutes;
use super::answers_together::AnswersTogether;
use super::tls;
use super::workers::Workers;
use crate::metrics::Metrics;

/// A client that has not finished its TLS handshake or request headers by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/1.1 and HTTP/2 connection settings, shared by every connection.
#[derive(Clone)]
struct Protocols {
    http1: Arc<hyper::server::conn::http1::Builder>,
    http2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
}

impl Protocols {
    fn new() -> Self {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            // hyper runs this timeout whenever it waits for a request head, idle keep-alive
            // connections included: they are closed after it too.
            .header_read_timeout(HEADER_READ_TIMEOUT)
            // A client that sends a short body and shuts its sending side still reads the 400.
            .half_close(true);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new());
        Self {
            http1: Arc::new(http1),
            http2: Arc::new(http2),
        }
    }
}

/// Accepts connections and hands each to a worker, which serves TLS and HTTP/1.1 or HTTP/2
/// on it, until told to stop; then waits (bounded) for the open connections to finish their
/// requests, and stops the workers. Connections that fail before or at the HTTP level are
/// counted by reason in `metrics`.
pub(super) async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: WebhookRoutes,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    drain_timeout: Duration,
    mut workers: Workers,
) {
    let protocols = Protocols::new();
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!("accept failed: {error}");
                    continue;
                }
            },
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let _ = tcp.set_nodelay(true);
        // Registered again with the reactor of the worker that serves it.
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(error) => {
                tracing::warn!(%peer, "cannot hand the connection to a worker: {error}");
                continue;
            }
        };
        let connection = Connection {
            peer,
            app: app.clone(),
            protocols: protocols.clone(),
            metrics: metrics.clone(),
            watcher: graceful.watcher(),
        };
        workers.spawn(connection.serve(tcp, acceptor.clone()));
    }
    drop(listener);
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {drain_timeout:?}; closing them");
    }
    workers.stop().await;
}

/// One accepted connection and what serving it needs.
struct Connection {
    peer: std::net::SocketAddr,
    app: WebhookRoutes,
    protocols: Protocols,
    metrics: Arc<Metrics>,
    watcher: Watcher,
}

impl Connection {
    /// Serves the connection to its end, on the runtime that first polls this: a worker's.
    async fn serve(self, tcp: std::net::TcpStream, acceptor: TlsAcceptor) {
        let tcp = match TcpStream::from_std(tcp) {
            Ok(tcp) => tcp,
            Err(error) => {
                tracing::warn!(peer = %self.peer, "cannot serve the connection: {error}");
                return;
            }
        };
        if let Some(tls) = self.start_tls(tcp, &acceptor).await {
            self.serve_http(tls).await;
        }
    }

    /// The TLS handshake, within [`HANDSHAKE_TIMEOUT`]; `None` (counted) when the connection
    /// ends there.
    async fn start_tls(
        &self,
        tcp: TcpStream,
        acceptor: &TlsAcceptor,
    ) -> Option<Box<TlsStream<TcpStream>>> {
        let peer = self.peer;
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, acceptor)).await {
            Ok(Handshake::Done(tls)) => Some(tls),
            Ok(Handshake::PlainHttp(tcp)) => {
                self.metrics.tls_handshake_failure("plain-http");
                tracing::debug!(%peer, "plain HTTP on the TLS port; answered 400");
                let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, answer_plain_http(tcp)).await;
                None
            }
            Ok(Handshake::Failed(reason)) => {
                self.metrics.tls_handshake_failure(reason);
                tracing::debug!(%peer, reason, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.metrics.tls_handshake_failure("timeout");
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }

    /// Serves HTTP/2 or HTTP/1.1, as ALPN decided, until the connection ends; counts how it
    /// failed, if it did.
    async fn serve_http(self, tls: Box<TlsStream<TcpStream>>) {
        let peer = self.peer;
        // Whether a request has come in: a header timeout after one is an idle
        // keep-alive connection being closed, not a client failing to send its head.
        let served = Arc::new(AtomicBool::new(false));
        let service = {
            let (served, app) = (served.clone(), self.app);
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                served.store(true, Ordering::Relaxed);
                let app = app.clone();
                async move { Ok::<_, Infallible>(app.answer(request.map(Body::new)).await) }
            })
        };
        // ALPN decides the protocol, so nothing waits for a client's first bytes without a
        // timeout: HTTP/1.1's header read timeout runs from the handshake on.
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        let io = TokioIo::new(AnswersTogether::new(tls));
        let ended = if h2 {
            // hyper has no header timeout for HTTP/2: a client that sends no complete
            // request within it is dropped here. Later idle periods are the API
            // server's connection reuse and stay open.
            let connection = self
                .watcher
                .watch(self.protocols.http2.serve_connection(io, service));
            tokio::pin!(connection);
            tokio::select! {
                ended = &mut connection => ended,
                _ = tokio::time::sleep(HEADER_READ_TIMEOUT) => {
                    if !served.load(Ordering::Relaxed) {
                        self.metrics.connection_error("header-timeout");
                        tracing::debug!(%peer, "no HTTP/2 request in time; closed");
                        return;
                    }
                    connection.await
                }
            }
        } else {
            self.watcher
                .watch(self.protocols.http1.serve_connection(io, service))
                .await
        };
        match ended {
            Ok(()) => {}
            Err(error) if error.is_timeout() && served.load(Ordering::Relaxed) => {
                tracing::debug!(%peer, "idle keep-alive connection closed");
            }
            Err(error) => {
                let reason = connection_error_reason(&error);
                self.metrics.connection_error(reason);
                tracing::debug!(%peer, reason, "connection ended: {error}");
            }
        }
    }
}

/// How a connection's start went.
enum Handshake {
    Done(Box<TlsStream<TcpStream>>),
    /// The client speaks plain HTTP: it gets a plain-HTTP 400 that says so, as Go's net/http
    /// does, rather than a TLS alert it cannot read.
    PlainHttp(TcpStream),
    /// A `podmend_tls_handshake_failures_total` reason.
    Failed(&'static str),
}

async fn handshake(tcp: TcpStream, acceptor: &TlsAcceptor) -> Handshake {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(0) | Err(_) => return Handshake::Failed("closed"),
        Ok(_) => {}
    }
    // A TLS connection starts with a handshake record (0x16); an HTTP request with its
    // method in capitals.
    if first[0].is_ascii_uppercase() {
        return Handshake::PlainHttp(tcp);
    }
    match acceptor.accept(tcp).await {
        Ok(tls) => Handshake::Done(Box::new(tls)),
        Err(error) => Handshake::Failed(tls::handshake_failure_reason(&error)),
    }
}

/// Writes the 400, then reads and drops what the client sent (bounded) before closing, so
/// that the client reads the answer instead of a connection reset.
async fn answer_plain_http(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: &str = "this port speaks HTTPS (TLS), not plain HTTP: use an https:// URL; \
                        /healthz, /readyz and /metrics are plain HTTP on the metrics port\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    if tcp.write_all(answer.as_bytes()).await.is_err() || tcp.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let mut left: usize = 64 * 1024;
    while left > 0 {
        match tcp.read(&mut sink).await {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Why an HTTP connection ended in an error, as a `podmend_connection_errors_total` reason.
fn connection_error_reason(error: &hyper::Error) -> &'static str {
    if error.is_timeout() {
        "header-timeout"
    } else if error.is_parse() || error.is_parse_too_large() {
        "malformed-http"
    } else if error.is_incomplete_message() {
        "incomplete"
    } else {
        "other"
    }
}
