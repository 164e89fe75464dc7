//! `podmend serve`: the HTTPS admission webhook and its plain-HTTP metrics port.
//!
//! Endpoints (constants in [`paths`]):
//! - `POST /mutate`, `POST /validate` on `--listen`, TLS (HTTP/1.1 and HTTP/2 by ALPN);
//! - `GET /metrics`, `/healthz`, `/readyz` on `--metrics-listen`, plain HTTP.
//!
//! The serving certificate and the config file are polled and reloaded when they change;
//! a bad new version keeps the old one serving.

pub mod handlers;
pub mod paths;
pub mod selftls;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::cluster::watch::{self, CacheReadiness, Lookups};
use crate::cluster::{ClusterView, StaticCluster};
use crate::config::{Config, ConfigError};
use crate::engine::Engine;
use crate::metrics::Metrics;
use tls::{CertStore, TlsError};

/// The API server caps objects at about 3 MiB; a review carries an object and its old
/// version, so anything beyond this is not from an API server.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// A client that has not finished its TLS handshake or request headers by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    SelfTls(#[from] selftls::SelfTlsError),
    #[error(
        "cannot listen on {addr}: {source}; choose a free address with --listen / --metrics-listen"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Everything `podmend serve` is told on its command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub config: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    /// How often the certificate and config files are checked for changes.
    pub reload_interval: Duration,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub shutdown_timeout: Duration,
    /// How long, after SIGTERM, `/readyz` says no while requests are still accepted, so
    /// that the Service's endpoints drop the pod before it stops listening.
    pub shutdown_delay: Duration,
    /// How long a Node/LimitRange watch may fail before `/readyz` says no.
    pub cache_stale_after: Duration,
    /// `--tls-self-manage`: keep the certificate in a Secret and write it to `tls_cert`/`tls_key`.
    pub self_tls: Option<selftls::SelfTlsOptions>,
    /// Also serve [`paths::NULL`], the load generator's baseline.
    pub benchmark_null_route: bool,
    /// `--client-ca`: only clients presenting a certificate signed by a CA in this PEM file
    /// (the API server) complete the TLS handshake.
    pub client_ca: Option<PathBuf>,
}

/// Why `/readyz` says no.
pub struct Readiness {
    shutting_down: AtomicBool,
    caches: Option<CacheReadiness>,
    /// Set while TLS self-management has not put a certificate in place yet.
    certificate_pending: AtomicBool,
}

impl Readiness {
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Some("shutting down".to_string());
        }
        if self.certificate_pending.load(Ordering::Relaxed) {
            return Some("no serving certificate yet (TLS self-management)".to_string());
        }
        self.caches
            .as_ref()
            .and_then(CacheReadiness::not_ready_reason)
    }
}

/// Shared by every handler.
pub struct AppState {
    engine: RwLock<Arc<Engine>>,
    pub cluster: Arc<dyn ClusterView>,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
}

impl AppState {
    pub fn new(
        config: &Config,
        cluster: Arc<dyn ClusterView>,
        caches: Option<CacheReadiness>,
    ) -> Self {
        Self {
            engine: RwLock::new(Arc::new(Engine::new(config))),
            cluster,
            metrics: Arc::new(Metrics::new()),
            readiness: Readiness {
                shutting_down: AtomicBool::new(false),
                caches,
                certificate_pending: AtomicBool::new(false),
            },
        }
    }

    /// The engine of the current configuration.
    pub fn engine(&self) -> Arc<Engine> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Swaps in a new configuration; requests already under way finish with the old one.
    pub fn set_config(&self, config: &Config) {
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Engine::new(config));
    }
}

/// The webhook routes, without a socket (tests call it with `oneshot`).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            paths::MUTATE,
            post(handlers::mutate).fallback(handlers::wrong_method),
        )
        .route(
            paths::VALIDATE,
            post(handlers::validate).fallback(handlers::wrong_method),
        )
        .fallback(handlers::unknown_path)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The null webhook ([`paths::NULL`]): the same stack as [`router`], body read and limit
/// included, answering without a review. Only `serve --benchmark-null-route` mounts it.
pub fn null_router() -> Router {
    Router::new()
        .route(paths::NULL, post(handlers::null))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// The metrics and probe routes.
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(paths::METRICS, get(handlers::metrics))
        .route(paths::HEALTHZ, get(handlers::healthz))
        .route(paths::READYZ, get(handlers::readyz))
        .with_state(state)
}

/// Loads config and certificate, binds both ports, then serves until `shutdown` resolves:
/// readiness drops, no new connections are accepted, in-flight requests finish.
pub async fn serve(
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let config = match &options.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    let lookups = match &options.kubeconfig {
        Some(path) => watch::lookups_from_kubeconfig(path).await,
        None => watch::lookups_from_environment().await,
    };
    let mut self_tls = None;
    let (cluster, caches): (Arc<dyn ClusterView>, Option<CacheReadiness>) = match lookups {
        Lookups::On(client) => {
            if let Some(o) = &options.self_tls {
                self_tls = Some(selftls::SelfTls::new(client.clone(), o.clone()));
            }
            let (cluster, readiness) = watch::start_with(client, options.cache_stale_after);
            tracing::info!("cluster look-ups on: watching Nodes and LimitRanges");
            (cluster, Some(readiness))
        }
        Lookups::Off { reason } => {
            if options.self_tls.is_some() {
                return Err(selftls::SelfTlsError::NoCluster { reason }.into());
            }
            tracing::info!("cluster look-ups off: {reason}");
            (Arc::new(StaticCluster::offline()), None)
        }
    };
    let state = Arc::new(AppState::new(&config, cluster, caches));
    state
        .readiness
        .certificate_pending
        .store(self_tls.is_some(), Ordering::Relaxed);

    let webhook_listener = bind(options.listen).await?;
    let metrics_listener = bind(options.metrics_listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let metrics_server = {
        let mut stop = stop_rx.clone();
        let app = metrics_router(state.clone());
        tokio::spawn(async move {
            let serving = axum::serve(metrics_listener, app).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            if let Err(error) = serving.await {
                tracing::error!("metrics server failed: {error}");
            }
        })
    };

    let mut shutdown = std::pin::pin!(shutdown);
    if let Some(self_tls) = &self_tls {
        // Not ready until a certificate is in place; retry with backoff meanwhile.
        let mut delay = Duration::from_millis(500);
        loop {
            match self_tls.reconcile().await {
                Ok(_) => break,
                Err(error) => {
                    tracing::error!(
                        "TLS self-management: no certificate yet, retrying in {delay:?}: {error}"
                    )
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut shutdown => {
                    let _ = stop_tx.send(true);
                    let _ = metrics_server.await;
                    return Ok(());
                }
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }
    let certs = Arc::new(CertStore::load(&options.tls_cert, &options.tls_key)?);
    let tls_config = tls::webhook_server_config(certs.clone(), options.client_ca.as_deref())?;
    state.metrics.set_certificate_expiry(certs.not_after_unix());
    state
        .readiness
        .certificate_pending
        .store(false, Ordering::Relaxed);
    let renewals = self_tls.map(|self_tls| {
        let certs = certs.clone();
        let state = state.clone();
        tokio::spawn(self_tls.run(move || match certs.reload_if_changed() {
            Ok(true) => {
                state.metrics.tls_reload(true);
                state.metrics.set_certificate_expiry(certs.not_after_unix());
            }
            Ok(false) => {}
            Err(error) => tracing::error!("renewed certificate not loaded yet: {error}"),
        }))
    });

    tracing::info!(
        webhook = %options.listen,
        metrics = %options.metrics_listen,
        config = %options.config.as_ref().map_or("built-in defaults".to_string(), |p| p.display().to_string()),
        "podmend serving"
    );

    let reloads = tokio::spawn(reload_loop(state.clone(), certs, options.clone()));

    let mut app = router(state.clone());
    if options.benchmark_null_route {
        tracing::warn!("serving the benchmark's null webhook on {}", paths::NULL);
        app = app.merge(null_router());
    }
    let webhook = accept_loop(
        webhook_listener,
        TlsAcceptor::from(tls_config),
        app,
        state.metrics.clone(),
        stop_rx,
        options.shutdown_timeout,
    );
    let webhook = tokio::spawn(webhook);

    shutdown.await;
    if let Some(renewals) = renewals {
        renewals.abort();
    }
    // Readiness drops first and requests keep being served for a while: the API server may
    // still pick this pod from the Service's endpoints until they catch up.
    state.readiness.shutting_down.store(true, Ordering::Relaxed);
    tracing::info!(
        delay_s = options.shutdown_delay.as_secs_f64(),
        "shutting down: readiness off, still serving while the Service's endpoints catch up"
    );
    tokio::time::sleep(options.shutdown_delay).await;
    tracing::info!("no longer accepting connections; finishing in-flight requests");
    let _ = stop_tx.send(true);
    let _ = webhook.await;
    let _ = metrics_server.await;
    reloads.abort();
    tracing::info!("stopped");
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Accepts TLS connections and serves HTTP/1.1 or HTTP/2 on each until told to stop, then
/// waits (bounded) for the open connections to finish their requests. Connections that fail
/// before or at the HTTP level are counted by reason in `metrics`.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    drain_timeout: Duration,
) {
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
    let (http1, http2) = (Arc::new(http1), Arc::new(http2));
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
        let acceptor = acceptor.clone();
        let app = app.clone();
        let (http1, http2) = (http1.clone(), http2.clone());
        let metrics = metrics.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &acceptor)).await
            {
                Ok(Handshake::Done(tls)) => tls,
                Ok(Handshake::PlainHttp(tcp)) => {
                    metrics.tls_handshake_failure("plain-http");
                    tracing::debug!(%peer, "plain HTTP on the TLS port; answered 400");
                    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, answer_plain_http(tcp)).await;
                    return;
                }
                Ok(Handshake::Failed(reason)) => {
                    metrics.tls_handshake_failure(reason);
                    tracing::debug!(%peer, reason, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    metrics.tls_handshake_failure("timeout");
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            // Whether a request has come in: a header timeout after one is an idle
            // keep-alive connection being closed, not a client failing to send its head.
            let served = Arc::new(AtomicBool::new(false));
            let service = {
                let served = served.clone();
                hyper::service::service_fn(move |request| {
                    served.store(true, Ordering::Relaxed);
                    tower_service::Service::call(&mut app.clone(), request)
                })
            };
            // ALPN decides the protocol, so nothing waits for a client's first bytes without a
            // timeout: HTTP/1.1's header read timeout runs from the handshake on.
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let io = TokioIo::new(tls);
            let ended = if h2 {
                // hyper has no header timeout for HTTP/2: a client that sends no complete
                // request within it is dropped here. Later idle periods are the API
                // server's connection reuse and stay open.
                let connection = watcher.watch(http2.serve_connection(io, service));
                tokio::pin!(connection);
                tokio::select! {
                    ended = &mut connection => ended,
                    _ = tokio::time::sleep(HEADER_READ_TIMEOUT) => {
                        if !served.load(Ordering::Relaxed) {
                            metrics.connection_error("header-timeout");
                            tracing::debug!(%peer, "no HTTP/2 request in time; closed");
                            return;
                        }
                        connection.await
                    }
                }
            } else {
                watcher.watch(http1.serve_connection(io, service)).await
            };
            match ended {
                Ok(()) => {}
                Err(error) if error.is_timeout() && served.load(Ordering::Relaxed) => {
                    tracing::debug!(%peer, "idle keep-alive connection closed");
                }
                Err(error) => {
                    let reason = connection_error_reason(&error);
                    metrics.connection_error(reason);
                    tracing::debug!(%peer, reason, "connection ended: {error}");
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {drain_timeout:?}; closing them");
    }
}

/// How a connection's start went.
enum Handshake {
    Done(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
    /// The client speaks plain HTTP: it gets a plain-HTTP 400 that says so, as Go's net/http
    /// does, rather than a TLS alert it cannot read.
    PlainHttp(tokio::net::TcpStream),
    /// A `podmend_tls_handshake_failures_total` reason.
    Failed(&'static str),
}

async fn handshake(tcp: tokio::net::TcpStream, acceptor: &TlsAcceptor) -> Handshake {
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
async fn answer_plain_http(mut tcp: tokio::net::TcpStream) {
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

/// Polls the certificate and the config file; swaps in valid new versions only.
async fn reload_loop(state: Arc<AppState>, certs: Arc<CertStore>, options: ServeOptions) {
    let mut config_text = options
        .config
        .as_ref()
        .and_then(|path| std::fs::read_to_string(path).ok());
    let mut ticks = tokio::time::interval(options.reload_interval);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        match certs.reload_if_changed() {
            Ok(false) => {}
            Ok(true) => {
                state.metrics.tls_reload(true);
                state.metrics.set_certificate_expiry(certs.not_after_unix());
                tracing::info!(cert = %options.tls_cert.display(), "serving certificate reloaded");
            }
            Err(error) => {
                state.metrics.tls_reload(false);
                tracing::error!("serving certificate not reloaded, keeping the old one: {error}");
            }
        }
        let Some(path) = &options.config else {
            continue;
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => {
                if config_text.take().is_some() {
                    state.metrics.config_reload(false);
                    tracing::error!(
                        "config {} unreadable, keeping the old one: {error}",
                        path.display()
                    );
                }
                continue;
            }
        };
        if config_text.as_deref() == Some(text.as_str()) {
            continue;
        }
        match Config::from_yaml(&text, &path.display().to_string()) {
            Ok(config) => {
                state.set_config(&config);
                state.metrics.config_reload(true);
                tracing::info!(config = %path.display(), "configuration reloaded");
            }
            Err(error) => {
                state.metrics.config_reload(false);
                tracing::error!("configuration not reloaded, keeping the old one: {error}");
            }
        }
        config_text = Some(text);
    }
}
