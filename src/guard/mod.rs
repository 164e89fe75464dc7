//! `podmend guard`: the Docker Engine API proxy injected into Docker-in-Docker pods. It relays
//! the whole API to the pod's daemon, enforces `--rm` on container creates (or denies, labels
//! for reaping, or audits them), and removes the pod's containers when the pod ends.
//! `podmend guard reap` removes containers whose owner pod is gone.
//!
//! - [`policy`]: the pure decision: which requests are creates, what a create becomes.
//! - [`proxy`]: one client connection, relayed (streamed bodies, upgrades, hijacks).
//! - [`http`]: HTTP/1.1 framing for the relay.
//! - [`upstream`]: listen and daemon addresses, TLS to the daemon.
//! - [`docker`]: a minimal daemon client for the clean-up.
//! - [`reap`]: the shutdown clean-up and `guard reap`.
//! - [`metrics`]: the guard's counters and `GET /metrics`.

pub mod docker;
pub mod http;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod reap;
pub mod upstream;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{GuardReapArgs, UpstreamArgs};
use crate::dind::GuardCommand;
use docker::DockerClient;
use metrics::GuardMetrics;
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
/// the pod (bounded by the shutdown timeout) and returns.
pub async fn run(
    options: GuardOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GuardError> {
    let command = &options.command;
    let upstream = Upstream::new(
        command.upstream.clone(),
        command.upstream_cert_path.as_deref(),
    )?;
    let mut listeners = Vec::new();
    for address in &command.listen {
        let listener = Listener::bind(address)
            .await
            .map_err(|source| GuardError::Bind {
                address: address.to_string(),
                source,
            })?;
        listeners.push(listener);
    }
    let guard_metrics = Arc::new(GuardMetrics::new());
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_server = match command.health_listen {
        None => None,
        Some(address) => {
            let metrics_listener =
                metrics::bind(address)
                    .await
                    .map_err(|source| GuardError::Bind {
                        address: address.to_string(),
                        source,
                    })?;
            let served = Arc::clone(&guard_metrics);
            Some(tokio::spawn(async move {
                let stopped = async {
                    let _ = metrics_stopped.await;
                };
                if let Err(error) = metrics::serve(metrics_listener, served, stopped).await {
                    tracing::warn!(%error, "the metrics server stopped");
                }
            }))
        }
    };
    let shared = Arc::new(Shared {
        upstream: upstream.clone(),
        policy: command.policy,
        owner_pod_uid: options.owner_pod_uid.clone(),
        metrics: Arc::clone(&guard_metrics),
        shutting_down: AtomicBool::new(false),
    });
    let listening: Vec<String> = listeners.iter().map(Listener::local_address).collect();
    tracing::info!(
        listen = %listening.join(", "),
        upstream = %upstream,
        policy = %command.policy,
        owner_pod_uid = %options.owner_pod_uid,
        "podmend guard ready"
    );

    let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
    let accepting: Vec<_> = listeners
        .iter()
        .map(|listener| tokio::spawn(accept_loop(Arc::clone(listener), Arc::clone(&shared))))
        .collect();
    shutdown.await;
    for task in &accepting {
        task.abort();
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
    let cleanup = reap::remove_pod_containers(&client, &options.owner_pod_uid, &guard_metrics);
    match tokio::time::timeout(options.shutdown_timeout, cleanup).await {
        Ok(Ok(removed)) => tracing::info!(removed, "removed this pod's containers"),
        Ok(Err(error)) => tracing::warn!(%error, "cannot remove this pod's containers"),
        Err(_) => tracing::warn!(
            removed = guard_metrics.reaped_count(),
            "the clean-up did not finish in time; `podmend guard reap` removes the rest"
        ),
    }
    let _ = stop_metrics.send(());
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    Ok(())
}

/// Accepts clients on one listener until aborted; each connection is relayed on its own task.
async fn accept_loop(listener: Arc<Listener>, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                tokio::spawn(proxy::serve_connection(stream, Arc::clone(&shared)));
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
/// one line per container on `out`.
pub async fn reap_command(
    args: &GuardReapArgs,
    out: &mut dyn io::Write,
) -> Result<ReapReport, GuardError> {
    let client = DockerClient::new(upstream_from_args(&args.upstream)?);
    let mode = match args.older_than {
        Some(age) => ReapMode::StoppedFor(age),
        None => ReapMode::OwnerGone {
            kubeconfig: args.kubeconfig.clone(),
        },
    };
    Ok(reap::reap(&client, &mode, args.dry_run, out).await?)
}
