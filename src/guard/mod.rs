//! `podmend guard`: the Docker Engine API proxy injected into Docker-in-Docker pods. It relays
//! the whole API to the pod's daemon, labels what the pod creates, collects its exited
//! containers (policy `collect`, the default), or enforces `--rm` on creates (or denies,
//! labels for reaping, or audits them), and removes what the pod made when the pod ends.
//! `podmend guard reap` removes containers whose owner pod is gone and keeps images in a
//! budget.
//!
//! - [`policy`]: the pure decision: which requests matter, what each becomes.
//! - [`proxy`]: one client connection, relayed (streamed bodies, upgrades, hijacks).
//! - [`http`]: HTTP/1.1 framing for the relay.
//! - [`upstream`]: listen and daemon addresses, TLS to the daemon.
//! - [`tls`]: the docker:dind certificate tree and TLS on the guard's TCP listeners.
//! - [`docker`]: a minimal daemon client for the clean-up.
//! - [`collect`]: policy `collect`'s garbage collection of exited containers.
//! - [`collected`]: what it removed, for the message a client asking for one gets.
//! - [`reap`]: the pod-end clean-up and `guard reap`.
//! - [`metrics`]: the guard's counters, `GET /metrics`, `/healthz` and `/readyz`.

pub mod buildkit;
pub mod collect;
pub mod collected;
pub mod docker;
pub mod http;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod reap;
pub mod tls;
pub mod upstream;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::dind::{Address, GuardCommand};
use collected::Collected;
use docker::DockerClient;
use metrics::{GuardMetrics, Probes};
pub use policy::{CreateDecision, OWNER_LABEL, Policy, REAP_LABEL};
use proxy::Shared;
pub use reap::{ImageBudget, ReapMode, ReapReport};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use upstream::{AddressError, DaemonUpstream, Listener, SocketAccess};

/// Why the guard could not start (once running, it only logs).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Address(#[from] AddressError),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Reap(#[from] reap::ReapError),
    #[error("cannot set up TLS for the guard's listeners: {0}")]
    Tls(#[from] tls::TlsTreeError),
}

/// Everything `podmend guard` runs with.
#[derive(Debug, Clone)]
pub struct GuardOptions {
    /// What the rule wrote on the guard's command line.
    pub command: GuardCommand,
    /// The UID of the pod the guard runs in: every container it creates is labelled with it.
    pub owner_pod_uid: String,
    /// How long the shutdown clean-up may take.
    pub shutdown_timeout: Duration,
}

impl GuardOptions {
    /// The options of a guard in the pod `owner_pod_uid`, which must not be empty.
    pub fn new(
        command: GuardCommand,
        owner_pod_uid: &str,
        shutdown_timeout: Duration,
    ) -> Result<Self, GuardError> {
        let owner_pod_uid = owner_pod_uid.trim();
        if owner_pod_uid.is_empty() {
            return Err(GuardError::Usage(
                "podmend guard needs --owner-pod-uid (or PODMEND_OWNER_POD_UID, from the \
                 downward API metadata.uid)"
                    .to_string(),
            ));
        }
        Ok(Self {
            command,
            owner_pod_uid: owner_pod_uid.to_string(),
            shutdown_timeout,
        })
    }
}

/// Runs the guard until `shutdown` resolves; then stops accepting, removes every container of
/// the pod (and under `collect` its networks and images), bounded by the shutdown timeout,
/// and returns.
pub async fn run(
    options: GuardOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GuardError> {
    let command = &options.command;
    // TLS files the daemon writes may not exist yet: they are read when needed.
    let upstream = DaemonUpstream::waiting_for_tls(
        command.upstream.clone(),
        command.upstream_cert_path.as_deref(),
    )?;
    let guard_metrics = Arc::new(GuardMetrics::new());
    let started = Arc::new(AtomicBool::new(false));
    let probes = Probes {
        started: Arc::clone(&started),
        upstream: upstream.clone(),
        token: command.health_token.clone(),
    };
    // The probes' port first: once a client can reach the guard's sockets, a probe can reach
    // the port (it says "starting" until the sockets are served).
    let metrics_server =
        MetricsServer::start(command.health_listen, Arc::clone(&guard_metrics), probes).await?;
    let listeners = bind_listeners(command).await?;
    let shared = Arc::new(
        Shared::new(
            upstream.clone(),
            command.policy,
            &options.owner_pod_uid,
            Arc::clone(&guard_metrics),
            command.upstream_wait,
            Arc::new(Collected::new(command.min_age, command.max_exited)),
        )
        .with_socket_binds(policy::SocketBinds {
            daemon: command.daemon_socket_paths.clone(),
            guard: command.guard_socket_for_daemon.clone(),
        }),
    );
    let serving = Serving::start(listeners, &shared, &options);
    started.store(true, Ordering::Release);
    tracing::info!(
        listen = %serving.listening.join(", "),
        upstream = %upstream,
        policy = %command.policy,
        owner_pod_uid = %options.owner_pod_uid,
        min_age = %crate::dind::format_duration(command.min_age),
        max_exited = command.max_exited,
        "podmend guard ready"
    );

    shutdown.await;
    serving.stop();
    shared.shutting_down.store(true, Ordering::Release);
    tracing::info!(
        timeout_seconds = options.shutdown_timeout.as_secs(),
        "shutting down: removing this pod's containers"
    );
    clean_up_within_timeout(&options, upstream, &shared, &guard_metrics).await;
    metrics_server.stop().await;
    Ok(())
}

/// Removes what the pod made, giving up (with a warning naming `podmend guard reap`) after
/// the shutdown timeout: the kubelet kills the guard soon after.
async fn clean_up_within_timeout(
    options: &GuardOptions,
    upstream: DaemonUpstream,
    shared: &Shared,
    guard_metrics: &GuardMetrics,
) {
    let client = DockerClient::new(upstream);
    let recorded = shared.recorded_images();
    let cleanup = remove_what_the_pod_made(&client, options, &recorded, guard_metrics);
    match tokio::time::timeout(options.shutdown_timeout, cleanup).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "cannot remove what this pod created"),
        Err(_) => tracing::warn!(
            removed = guard_metrics.reaped_count(),
            "the clean-up did not finish in time; `podmend guard reap` removes the rest"
        ),
    }
}

/// Binds every `--listen` address (TLS on the TCP ones with `--tls-certdir`).
async fn bind_listeners(command: &GuardCommand) -> Result<Vec<Listener>, GuardError> {
    let server_tls = match &command.tls_certdir {
        None => None,
        Some(dir) => Some(tls::ensure_tree(dir, &tls::server_names(&command.tls_san))?),
    };
    let access =
        SocketAccess::of_upstream(&command.upstream).map_err(|source| GuardError::Bind {
            address: command.upstream.to_string(),
            source,
        })?;
    let mut listeners = Vec::new();
    for address in &command.listen {
        let listener = Listener::bind(address, server_tls.as_ref(), &access)
            .await
            .map_err(|source| GuardError::Bind {
                address: address.to_string(),
                source,
            })?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// The running guard: its listeners accepting, under `collect` its collector, and on a
/// daemon in the pod the removal of what earlier pods left.
struct Serving {
    listening: Vec<String>,
    listeners: Vec<Arc<Listener>>,
    accepting: Vec<JoinHandle<()>>,
    collector: Option<JoinHandle<()>>,
    earlier_pods: Option<JoinHandle<()>>,
}

impl Serving {
    fn start(listeners: Vec<Listener>, shared: &Arc<Shared>, options: &GuardOptions) -> Self {
        let command = &options.command;
        let listening = listeners.iter().map(Listener::local_address).collect();
        let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
        let mut accepting: Vec<JoinHandle<()>> = listeners
            .iter()
            .map(|listener| tokio::spawn(accept_loop(Arc::clone(listener), Arc::clone(shared))))
            .collect();
        accepting.push(tokio::spawn(Arc::clone(shared).watch_daemon()));
        for listener in &listeners {
            let listener = Arc::clone(listener);
            let upstream = command.upstream.clone();
            accepting.push(tokio::spawn(async move {
                listener.adopt_access_of(&upstream).await;
            }));
        }
        let collector = (command.policy == Policy::Collect).then(|| {
            tokio::spawn(collect::run(
                DockerClient::new(shared.upstream.clone()),
                options.owner_pod_uid.clone(),
                collect::Limits {
                    min_age: command.min_age,
                    max_exited: command.max_exited,
                },
                Arc::clone(&shared.metrics),
                Arc::clone(&shared.collected),
            ))
        });
        let earlier_pods = command.daemon_in_pod.then(|| {
            tokio::spawn(remove_left_by_earlier_pods(
                DockerClient::new(shared.upstream.clone()),
                options.owner_pod_uid.clone(),
                Arc::clone(&shared.metrics),
            ))
        });
        Self {
            listening,
            listeners,
            accepting,
            collector,
            earlier_pods,
        }
    }

    /// Stops accepting and collecting, and removes the Unix sockets.
    fn stop(self) {
        for task in &self.accepting {
            task.abort();
        }
        for task in self.collector.iter().chain(&self.earlier_pods) {
            task.abort();
        }
        for listener in &self.listeners {
            listener.remove_socket();
        }
    }
}

/// Removes what earlier pods left on a daemon in this pod, once the daemon answers (it may
/// start after the guard): retried until it succeeds once.
async fn remove_left_by_earlier_pods(
    client: DockerClient,
    owner: String,
    metrics: Arc<GuardMetrics>,
) {
    let mut pause = Duration::from_millis(100);
    loop {
        match reap::remove_left_by_earlier_pods(&client, &owner, &metrics).await {
            Ok((containers, networks, volumes)) => {
                if containers + networks + volumes > 0 {
                    tracing::info!(
                        containers,
                        networks,
                        volumes,
                        "removed what earlier pods left on this pod's daemon"
                    );
                }
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "cannot look for what earlier pods left yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The pod's end: removes every container of the pod (with its anonymous volumes), then its
/// networks and named volumes once no container uses them, and under `collect` the images
/// it made (`recorded`: the references it tagged).
async fn remove_what_the_pod_made(
    client: &DockerClient,
    options: &GuardOptions,
    recorded: &[String],
    metrics: &GuardMetrics,
) -> Result<(), docker::DockerError> {
    let owner = &options.owner_pod_uid;
    let removed = reap::remove_pod_containers(client, owner, metrics).await?;
    tracing::info!(removed, "removed this pod's containers");
    let (networks, volumes) = reap::remove_pod_networks_and_volumes(client, owner, metrics).await?;
    tracing::info!(networks, volumes, "removed this pod's networks and volumes");
    if options.command.policy == Policy::Collect {
        let images = reap::remove_pod_images(client, owner, recorded, metrics).await?;
        tracing::info!(images, "removed this pod's images");
    }
    Ok(())
}

/// The plain-HTTP port of `/metrics`, `/healthz` and `/readyz`, when one was asked for.
struct MetricsServer(Option<(oneshot::Sender<()>, JoinHandle<()>)>);

impl MetricsServer {
    /// Binds `address` (if any) and serves it until [`MetricsServer::stop`].
    async fn start(
        address: Option<SocketAddr>,
        metrics: Arc<GuardMetrics>,
        probes: Probes,
    ) -> Result<Self, GuardError> {
        let Some(address) = address else {
            return Ok(Self(None));
        };
        let listener = metrics::bind(address)
            .await
            .map_err(|source| GuardError::Bind {
                address: address.to_string(),
                source,
            })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            if let Err(error) = metrics::serve(listener, metrics, probes, stopped).await {
                tracing::warn!(%error, "the metrics server stopped");
            }
        });
        Ok(Self(Some((stop, server))))
    }

    async fn stop(self) {
        if let Some((stop, server)) = self.0 {
            let _ = stop.send(());
            let _ = server.await;
        }
    }
}

/// Accepts clients on one listener until aborted; each connection (its TLS handshake too)
/// is served on its own task. While the daemon is down the listener is closed, so clients
/// are refused as by a daemon that is not running (the docker CLI then says "Cannot connect
/// to the Docker daemon", and fails).
async fn accept_loop(listener: Arc<Listener>, shared: Arc<Shared>) {
    let mut down = shared.daemon_down();
    loop {
        let went_down = async { down.wait_for(|down| *down).await.map(drop) };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            went_down = went_down => {
                if went_down.is_err() {
                    return;
                }
                refuse_while_down(&listener, &mut down).await;
                continue;
            }
        };
        match accepted {
            Ok(incoming) => {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    match incoming.establish().await {
                        Ok(stream) => proxy::serve_connection(stream, shared).await,
                        Err(error) => tracing::info!(%error, "a client's TLS handshake failed"),
                    }
                });
            }
            Err(error) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Keeps `listener` closed until the daemon answers again, then listens again (retried
/// while the address cannot be bound).
async fn refuse_while_down(listener: &Listener, down: &mut tokio::sync::watch::Receiver<bool>) {
    listener.close().await;
    if down.wait_for(|down| !*down).await.is_err() {
        return;
    }
    while let Err(error) = listener.reopen().await {
        tracing::warn!(%error, listen = %listener.local_address(), "cannot listen again; retrying");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Everything `podmend guard reap` runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReapOptions {
    /// The Docker daemon whose containers are reaped.
    pub upstream: Address,
    /// With TLS to the daemon: the directory of `ca.pem`, `cert.pem` and `key.pem`.
    pub upstream_cert_dir: Option<PathBuf>,
    /// Which containers go.
    pub mode: ReapMode,
    /// With a budget, unused images go too, least recently used first.
    pub image_budget: Option<ImageBudget>,
    /// A pass every interval until shutdown; without it, one pass.
    pub interval: Option<Duration>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (with `interval`).
    pub metrics_listen: Option<SocketAddr>,
    /// List what would go, remove nothing.
    pub dry_run: bool,
}

/// `podmend guard reap`: removes (or lists, with `--dry-run`) orphaned podmend containers,
/// and with `--images-high` unused images over the budget, one line each on `out`. Once, or
/// with `--interval` every interval until `shutdown` resolves (then the report is empty).
pub async fn reap_command(
    options: &ReapOptions,
    out: &mut dyn io::Write,
    shutdown: impl Future<Output = ()>,
) -> Result<ReapReport, GuardError> {
    let upstream = DaemonUpstream::new(
        options.upstream.clone(),
        options.upstream_cert_dir.as_deref(),
    )?;
    let reaper = Reaper {
        client: DockerClient::new(upstream.clone()),
        options,
        metrics: Arc::new(GuardMetrics::new()),
        memory: reap::ImageMemory::default(),
    };
    match options.interval {
        None => reaper.once(out).await,
        Some(interval) => reaper
            .every(interval, upstream, out, shutdown)
            .await
            .map(|()| ReapReport::default()),
    }
}

/// `guard reap`'s state between passes.
struct Reaper<'a> {
    client: DockerClient,
    options: &'a ReapOptions,
    metrics: Arc<GuardMetrics>,
    memory: reap::ImageMemory,
}

impl Reaper<'_> {
    /// One pass: containers, then the image budget.
    async fn pass(&mut self, out: &mut dyn io::Write) -> Result<ReapReport, reap::ReapError> {
        let options = self.options;
        let mut report = reap::reap(
            &self.client,
            &options.mode,
            options.dry_run,
            out,
            &self.metrics,
        )
        .await?;
        if let Some(budget) = options.image_budget {
            report.images_removed = reap::image_budget(
                &self.client,
                budget,
                &mut self.memory,
                options.dry_run,
                out,
                &self.metrics,
            )
            .await?;
        }
        Ok(report)
    }

    /// One pass, and its report.
    async fn once(mut self, out: &mut dyn io::Write) -> Result<ReapReport, GuardError> {
        Ok(self.pass(out).await?)
    }

    /// A pass every `interval` until `shutdown` resolves; a failed pass is logged and the
    /// next one tried. Serves the metrics port meanwhile, if asked.
    async fn every(
        mut self,
        interval: Duration,
        upstream: DaemonUpstream,
        out: &mut dyn io::Write,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), GuardError> {
        let options = self.options;
        let probes = Probes {
            started: Arc::new(AtomicBool::new(true)),
            upstream,
            token: None,
        };
        let metrics_server =
            MetricsServer::start(options.metrics_listen, Arc::clone(&self.metrics), probes).await?;
        let (images_high, images_low) = match options.image_budget {
            Some(budget) => (Some(budget.high), Some(budget.low)),
            None => (None, None),
        };
        let node = match &options.mode {
            ReapMode::OwnerGone { node, .. } => node.as_deref(),
            ReapMode::StoppedFor(_) => None,
        };
        tracing::info!(
            interval = %crate::dind::format_duration(interval),
            node = node.unwrap_or(""),
            images_high,
            images_low,
            dry_run = options.dry_run,
            "podmend guard reap: a pass every interval"
        );
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let pass = self.pass(out).await;
            let _ = out.flush();
            match pass {
                Ok(report) => tracing::debug!(?report, "reap pass done"),
                Err(error) => {
                    tracing::warn!(%error, "the reap pass failed; trying again next interval")
                }
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(interval) => {}
            }
        }
        metrics_server.stop().await;
        Ok(())
    }
}
