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
//! - [`reap`]: the pod-end clean-up and `guard reap`.
//! - [`metrics`]: the guard's counters, `GET /metrics`, `/healthz` and `/readyz`.

pub mod collect;
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{GuardReapArgs, UpstreamArgs};
use crate::dind::GuardCommand;
use docker::DockerClient;
use metrics::{GuardMetrics, Probes};
pub use policy::{Decision, OWNER_LABEL, Policy, REAP_LABEL};
use proxy::Shared;
pub use reap::{ReapMode, ReapReport};
use upstream::{AddressError, Listener, Upstream};

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

fn upstream_from_args(args: &UpstreamArgs) -> Result<Upstream, GuardError> {
    let address = args
        .upstream
        .clone()
        .ok_or_else(|| GuardError::Usage("--upstream is required".to_string()))?;
    let tls_dir = args.cert_dir().map_err(GuardError::Usage)?;
    Ok(Upstream::new(address, tls_dir.as_deref())?)
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
    let upstream = Upstream::waiting_for_tls(
        command.upstream.clone(),
        command.upstream_cert_path.as_deref(),
    )?;
    let server_tls = match &command.tls_certdir {
        None => None,
        Some(dir) => Some(tls::ensure_tree(dir, &tls::server_names(&command.tls_san))?),
    };
    let mut listeners = Vec::new();
    for address in &command.listen {
        let listener = Listener::bind(address, server_tls.as_ref())
            .await
            .map_err(|source| GuardError::Bind {
                address: address.to_string(),
                source,
            })?;
        listeners.push(listener);
    }
    let guard_metrics = Arc::new(GuardMetrics::new());
    let started = Arc::new(AtomicBool::new(false));
    let (stop_metrics, metrics_server) = match command.health_listen {
        None => (None, None),
        Some(address) => {
            let probes = Probes {
                started: Arc::clone(&started),
                upstream: upstream.clone(),
            };
            let (stop, server) = serve_metrics(address, Arc::clone(&guard_metrics), probes).await?;
            (Some(stop), Some(server))
        }
    };
    let shared = Arc::new(Shared::new(
        upstream.clone(),
        command.policy,
        &options.owner_pod_uid,
        Arc::clone(&guard_metrics),
        command.upstream_wait,
    ));
    let listening: Vec<String> = listeners.iter().map(Listener::local_address).collect();
    let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
    let accepting: Vec<_> = listeners
        .iter()
        .map(|listener| tokio::spawn(accept_loop(Arc::clone(listener), Arc::clone(&shared))))
        .collect();
    let collector = (command.policy == Policy::Collect).then(|| {
        tokio::spawn(collect::run(
            DockerClient::new(upstream.clone()),
            options.owner_pod_uid.clone(),
            collect::Limits {
                min_age: command.min_age,
                max_exited: command.max_exited,
            },
            Arc::clone(&guard_metrics),
        ))
    });
    started.store(true, Ordering::Release);
    tracing::info!(
        listen = %listening.join(", "),
        upstream = %upstream,
        policy = %command.policy,
        owner_pod_uid = %options.owner_pod_uid,
        min_age = %crate::dind::format_duration(command.min_age),
        max_exited = command.max_exited,
        "podmend guard ready"
    );

    shutdown.await;
    for task in &accepting {
        task.abort();
    }
    if let Some(collector) = &collector {
        collector.abort();
    }
    for listener in &listeners {
        listener.remove_socket();
    }
    drop(listeners);
    shared.shutting_down.store(true, Ordering::Release);
    tracing::info!(
        timeout_seconds = options.shutdown_timeout.as_secs(),
        "shutting down: removing this pod's containers"
    );
    let client = DockerClient::new(upstream);
    let cleanup = async {
        let removed =
            reap::remove_pod_containers(&client, &options.owner_pod_uid, &guard_metrics).await?;
        tracing::info!(removed, "removed this pod's containers");
        if command.policy == Policy::Collect {
            let networks =
                reap::remove_pod_networks(&client, &options.owner_pod_uid, &guard_metrics).await?;
            let images = reap::remove_pod_images(
                &client,
                &options.owner_pod_uid,
                &shared.recorded_images(),
                &guard_metrics,
            )
            .await?;
            tracing::info!(networks, images, "removed this pod's networks and images");
        }
        Ok::<_, docker::DockerError>(())
    };
    match tokio::time::timeout(options.shutdown_timeout, cleanup).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "cannot remove what this pod created"),
        Err(_) => tracing::warn!(
            removed = guard_metrics.reaped_count(),
            "the clean-up did not finish in time; `podmend guard reap` removes the rest"
        ),
    }
    if let Some(stop) = stop_metrics {
        let _ = stop.send(());
    }
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    Ok(())
}

/// Binds the metrics port and serves it until the returned sender fires.
async fn serve_metrics(
    address: SocketAddr,
    metrics: Arc<GuardMetrics>,
    probes: Probes,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    GuardError,
> {
    let listener = metrics::bind(address)
        .await
        .map_err(|source| GuardError::Bind {
            address: address.to_string(),
            source,
        })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        if let Err(error) = metrics::serve(listener, metrics, probes, stopped).await {
            tracing::warn!(%error, "the metrics server stopped");
        }
    });
    Ok((stop, server))
}

/// Accepts clients on one listener until aborted; each connection (its TLS handshake too)
/// is served on its own task.
async fn accept_loop(listener: Arc<Listener>, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
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

/// `podmend guard reap`: removes (or lists, with `--dry-run`) orphaned podmend containers,
/// and with `--images-high` unused images over the budget, one line each on `out`. Once, or
/// with `--interval` every interval until `shutdown` resolves (then the report is empty).
pub async fn reap_command(
    args: &GuardReapArgs,
    out: &mut dyn io::Write,
    shutdown: impl Future<Output = ()>,
) -> Result<ReapReport, GuardError> {
    let upstream = upstream_from_args(&args.upstream)?;
    let client = DockerClient::new(upstream.clone());
    let mode = match args.older_than {
        Some(age) => ReapMode::StoppedFor(age),
        None => ReapMode::OwnerGone {
            kubeconfig: args.kubeconfig.clone(),
            node: args.node_name.clone(),
        },
    };
    let budget = match (args.images_high, args.images_low) {
        (Some(high), Some(low)) if low > high => {
            return Err(GuardError::Usage(format!(
                "--images-low ({low} bytes) must not be above --images-high ({high} bytes)"
            )));
        }
        (Some(high), Some(low)) => Some(reap::ImageBudget {
            high,
            low,
            min_age: args.image_min_age,
        }),
        _ => None,
    };
    let metrics = Arc::new(GuardMetrics::new());
    let mut memory = reap::ImageMemory::default();
    let Some(interval) = args.interval else {
        let mut report = reap::reap(&client, &mode, args.dry_run, out, &metrics).await?;
        if let Some(budget) = budget {
            report.images_removed =
                reap::image_budget(&client, budget, &mut memory, args.dry_run, out, &metrics)
                    .await?;
        }
        return Ok(report);
    };

    let started = Arc::new(AtomicBool::new(true));
    let (stop_metrics, metrics_server) = match args.metrics_listen {
        None => (None, None),
        Some(address) => {
            let probes = Probes { started, upstream };
            let (stop, server) = serve_metrics(address, Arc::clone(&metrics), probes).await?;
            (Some(stop), Some(server))
        }
    };
    tracing::info!(
        interval = %crate::dind::format_duration(interval),
        node = args.node_name.as_deref().unwrap_or(""),
        images_high = args.images_high,
        images_low = args.images_low,
        dry_run = args.dry_run,
        "podmend guard reap: a pass every interval"
    );
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let pass = async {
            let report = reap::reap(&client, &mode, args.dry_run, out, &metrics).await?;
            if let Some(budget) = budget {
                reap::image_budget(&client, budget, &mut memory, args.dry_run, out, &metrics)
                    .await?;
            }
            let _ = out.flush();
            Ok::<_, reap::ReapError>(report)
        };
        match pass.await {
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
    if let Some(stop) = stop_metrics {
        let _ = stop.send(());
    }
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    Ok(ReapReport::default())
}
