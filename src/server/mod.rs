//! `podmend serve`: the HTTPS admission webhook and its plain-HTTP metrics port.
//!
//! Endpoints (constants in [`paths`]):
//! - `POST /mutate`, `POST /validate` on `--listen`, TLS (HTTP/1.1 and HTTP/2 by ALPN);
//! - `GET /metrics`, `/healthz`, `/readyz` on `--metrics-listen`, plain HTTP.
//!
//! The serving certificate and the config file are polled and reloaded when they change;
//! a bad new version keeps the old one serving.

mod answers_together;
pub mod handlers;
mod helpers;
mod listener;
pub mod paths;
mod reload;
pub mod selftls;
pub mod tls;
mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::Response;
use axum::routing::get;
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
    #[error(
        "cannot start the webhook's threads (a worker with its event loop per CPU the process \
         may use but one, and a review helper): {0}; raise the process's thread and open-file \
         limits (ulimit -u, ulimit -n, or the container's pids limit), or give it fewer CPUs"
    )]
    Workers(#[source] std::io::Error),
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
    /// `--tls-wait-for-files`: while `tls_cert` or `tls_key` does not exist, wait for it
    /// (not ready) instead of exiting: cert-manager creates the Secret after the pod starts.
    pub tls_wait_for_files: bool,
    /// Also serve [`paths::NULL`], the load generator's baseline.
    pub benchmark_null_route: bool,
    /// `--client-ca`: only clients presenting a certificate signed by a CA in this PEM file
    /// (the API server) complete the TLS handshake.
    pub client_ca: Option<PathBuf>,
    /// Runs after every complete list of the Nodes or LimitRanges, once what the list took is
    /// freed: the binary, which owns the allocator, gives that memory back there.
    pub after_cache_list: fn(),
}

/// Why `/readyz` says no.
pub struct Readiness {
    shutting_down: AtomicBool,
    caches: Option<CacheReadiness>,
    /// Why there is no serving certificate yet: TLS self-management has not put one in
    /// place, or the certificate files are not there yet. `None` once one is loaded.
    certificate_pending: std::sync::Mutex<Option<String>>,
}

impl Readiness {
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Some("shutting down".to_string());
        }
        if let Some(reason) = self
            .certificate_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Some(reason);
        }
        self.caches
            .as_ref()
            .and_then(CacheReadiness::not_ready_reason)
    }

    /// Sets (or, with `None`, clears) why there is no serving certificate yet.
    fn set_certificate_pending(&self, reason: Option<String>) {
        *self
            .certificate_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = reason;
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
                certificate_pending: std::sync::Mutex::new(None),
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

/// The webhook port's routes: `POST` on [`paths::MUTATE`] and [`paths::VALIDATE`] (and on
/// [`paths::NULL`] with `--benchmark-null-route`), a 405 for another method there, a 404 for any
/// other path. A `match` on the method and path rather than axum's `Router`: at tens of
/// thousands of reviews a second, the router's path lookup and its boxed handler and response
/// futures were about 5 % of a typical review's instructions, for three routes.
#[derive(Clone)]
pub struct WebhookRoutes {
    state: Arc<AppState>,
    helpers: Arc<helpers::Helpers>,
    null_route: bool,
}

impl WebhookRoutes {
    fn new(state: Arc<AppState>, helpers: helpers::Helpers, benchmark_null_route: bool) -> Self {
        if benchmark_null_route {
            tracing::warn!("serving the benchmark's null webhook on {}", paths::NULL);
        }
        Self {
            state,
            helpers: Arc::new(helpers),
            null_route: benchmark_null_route,
        }
    }

    /// The answer to one request.
    pub async fn answer(self, request: Request) -> Response {
        let post = request.method() == Method::POST;
        let state = State(self.state);
        match request.uri().path() {
            paths::MUTATE if post => handlers::mutate(state, &self.helpers, request).await,
            paths::VALIDATE if post => handlers::validate(state, &self.helpers, request).await,
            paths::NULL if self.null_route && post => handlers::null(request).await,
            paths::MUTATE | paths::VALIDATE => handlers::wrong_method(state).await,
            paths::NULL if self.null_route => handlers::wrong_method(state).await,
            _ => handlers::unknown_path(state).await,
        }
    }
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
    let (lookups, self_tls) = connect_cluster(&options).await?;
    let state = Arc::new(AppState::new(&config, lookups.cluster, lookups.caches));
    if self_tls.is_some() {
        state.readiness.set_certificate_pending(Some(
            "no serving certificate yet (TLS self-management)".to_string(),
        ));
    }

    let webhook_listener = bind(options.listen).await?;
    let metrics_listener = bind(options.metrics_listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_server = spawn_metrics_server(metrics_listener, state.clone(), stop_rx.clone());

    let mut shutdown = std::pin::pin!(shutdown);
    let certificate_in_place = match &self_tls {
        Some(self_tls) => reload::first_certificate(self_tls, &mut shutdown).await,
        None if options.tls_wait_for_files => {
            reload::certificate_files(&options, &state, &mut shutdown).await
        }
        None => true,
    };
    if !certificate_in_place {
        let _ = stop_tx.send(true);
        let _ = metrics_server.await;
        return Ok(());
    }
    let (certs, tls_config) = load_certificate(&options, &state)?;
    let renewals =
        self_tls.map(|self_tls| reload::spawn_renewals(self_tls, certs.clone(), state.clone()));

    let (workers, helpers) = start_threads()?;
    log_serving(&options, workers.count(), helpers.count());
    let reloads = tokio::spawn(reload::reload_loop(state.clone(), certs, options.clone()));
    let webhook = tokio::spawn(listener::accept_loop(
        webhook_listener,
        TlsAcceptor::from(tls_config),
        WebhookRoutes::new(state.clone(), helpers, options.benchmark_null_route),
        state.metrics.clone(),
        stop_rx,
        options.shutdown_timeout,
        workers,
    ));

    shutdown.await;
    if let Some(renewals) = renewals {
        renewals.abort();
    }
    drain(&state, options.shutdown_delay, stop_tx).await;
    let _ = webhook.await;
    let _ = metrics_server.await;
    reloads.abort();
    tracing::info!("stopped");
    Ok(())
}

/// The webhook's threads, for the cores the process may use (its CPU limit, in a container): a
/// worker per core but one, at least one, and one review helper when there are two cores or
/// more (see [`helpers`] for why not a worker per core). One core: one worker, no helper.
fn start_threads() -> Result<(workers::Workers, helpers::Helpers), ServeError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = workers::Workers::start(cores.saturating_sub(1).max(1));
    let helpers = helpers::Helpers::start(usize::from(cores > 1));
    Ok((
        workers.map_err(ServeError::Workers)?,
        helpers.map_err(ServeError::Workers)?,
    ))
}

/// The line that says `serve` is up, and where.
fn log_serving(options: &ServeOptions, workers: usize, helpers: usize) {
    tracing::info!(
        webhook = %options.listen,
        workers,
        review_helpers = helpers,
        metrics = %options.metrics_listen,
        config = %options.config.as_ref().map_or("built-in defaults".to_string(), |p| p.display().to_string()),
        "podmend serving"
    );
}

/// Loads the serving certificate and the TLS configuration that serves it; from then on
/// readiness no longer waits for a certificate.
fn load_certificate(
    options: &ServeOptions,
    state: &AppState,
) -> Result<(Arc<CertStore>, Arc<rustls::ServerConfig>), ServeError> {
    let certs = Arc::new(CertStore::load(&options.tls_cert, &options.tls_key)?);
    let tls_config = tls::webhook_server_config(certs.clone(), options.client_ca.as_deref())?;
    state.metrics.set_certificate_expiry(certs.not_after_unix());
    state.readiness.set_certificate_pending(None);
    Ok((certs, tls_config))
}

/// The cluster behind the rules' look-ups, when there is one.
struct ClusterLookups {
    cluster: Arc<dyn ClusterView>,
    /// The watches' readiness; `None` without a cluster.
    caches: Option<CacheReadiness>,
}

/// Connects to the cluster for the look-ups (and TLS self-management, which cannot do
/// without one); without a cluster, look-ups are off.
async fn connect_cluster(
    options: &ServeOptions,
) -> Result<(ClusterLookups, Option<selftls::SelfTls>), ServeError> {
    let lookups = match &options.kubeconfig {
        Some(path) => watch::lookups_from_kubeconfig(path).await,
        None => watch::lookups_from_environment().await,
    };
    match lookups {
        Lookups::On(client) => {
            let self_tls = options
                .self_tls
                .clone()
                .map(|o| selftls::SelfTls::new(client.clone(), o));
            let (cluster, readiness) =
                watch::start_with(client, options.cache_stale_after, options.after_cache_list);
            tracing::info!("cluster look-ups on: watching Nodes, LimitRanges and Namespaces");
            let lookups = ClusterLookups {
                cluster,
                caches: Some(readiness),
            };
            Ok((lookups, self_tls))
        }
        Lookups::Off { reason } => {
            if options.self_tls.is_some() {
                return Err(selftls::SelfTlsError::NoCluster { reason }.into());
            }
            tracing::info!("cluster look-ups off: {reason}");
            let lookups = ClusterLookups {
                cluster: Arc::new(StaticCluster::offline()),
                caches: None,
            };
            Ok((lookups, None))
        }
    }
}

/// Serves [`metrics_router`] on `listener` until `stop`.
fn spawn_metrics_server(
    listener: TcpListener,
    state: Arc<AppState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let app = metrics_router(state);
    tokio::spawn(async move {
        let serving = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        });
        if let Err(error) = serving.await {
            tracing::error!("metrics server failed: {error}");
        }
    })
}

/// The start of a graceful stop: readiness drops first and requests keep being served for
/// `delay`, since the API server may still pick this pod from the Service's endpoints until
/// they catch up; then the listeners are told to stop.
async fn drain(state: &AppState, delay: Duration, stop: tokio::sync::watch::Sender<bool>) {
    state.readiness.shutting_down.store(true, Ordering::Relaxed);
    tracing::info!(
        delay_s = delay.as_secs_f64(),
        "shutting down: readiness off, still serving while the Service's endpoints catch up"
    );
    tokio::time::sleep(delay).await;
    tracing::info!("no longer accepting connections; finishing in-flight requests");
    let _ = stop.send(true);
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    crate::listen::bind(addr).map_err(|source| ServeError::Bind { addr, source })
}
