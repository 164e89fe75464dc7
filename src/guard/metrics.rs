//! The guard's counters and its optional plain-HTTP port: `GET /metrics` (Prometheus text
//! format), `/healthz` (the startupProbe: listeners bound, TLS tree written) and `/readyz`
//! (the readinessProbe: the daemon answers `/_ping`). Separate from the webhook's registry:
//! the guard runs as its own process per pod (and `guard reap --interval` per node).

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;

use super::docker::DockerClient;
use super::policy::CreateDecision;
use super::upstream::DaemonUpstream;

/// Why a container was removed; the `reason` label of `podmend_guard_containers_removed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Exited longer than `--min-age` (policy `collect`).
    MinAge,
    /// Beyond the `--max-exited` exited containers a pod keeps, oldest first.
    MaxExited,
    /// The pod ended (SIGTERM).
    PodEnd,
    /// `guard reap`: its owner pod is gone.
    OwnerGone,
    /// `guard reap --older-than`: stopped that long.
    OlderThan,
    /// `guard reap --images-high`: an unused image, least recently used (images only).
    Budget,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::MinAge,
        Reason::MaxExited,
        Reason::PodEnd,
        Reason::OwnerGone,
        Reason::OlderThan,
        Reason::Budget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MinAge => "min-age",
            Reason::MaxExited => "max-exited",
            Reason::PodEnd => "pod-end",
            Reason::OwnerGone => "owner-gone",
            Reason::OlderThan => "older-than",
            Reason::Budget => "budget",
        }
    }

    fn index(self) -> usize {
        Reason::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or_default()
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every metric the guard exports.
#[derive(Debug, Default)]
pub struct GuardMetrics {
    creates: [AtomicU64; CreateDecision::ALL.len()],
    /// Swarm requests: refused, and passed on under `audit`.
    swarm_refused: AtomicU64,
    swarm_audited: AtomicU64,
    reaped: AtomicU64,
    upstream_errors: AtomicU64,
    containers_removed: [AtomicU64; Reason::ALL.len()],
    images_removed: [AtomicU64; Reason::ALL.len()],
    networks_removed: AtomicU64,
}

impl GuardMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// One container create, by what became of it.
    pub fn create(&self, decision: CreateDecision) {
        let index = CreateDecision::ALL
            .iter()
            .position(|d| *d == decision)
            .unwrap_or_default();
        self.creates[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn creates(&self, decision: CreateDecision) -> u64 {
        CreateDecision::ALL
            .iter()
            .position(|d| *d == decision)
            .map_or(0, |i| self.creates[i].load(Ordering::Relaxed))
    }

    /// One swarm request (`swarm init/join`, `service create/update`), refused or passed on.
    pub fn swarm_request(&self, refused: bool) {
        let counter = if refused {
            &self.swarm_refused
        } else {
            &self.swarm_audited
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn swarm_requests(&self, refused: bool) -> u64 {
        if refused {
            self.swarm_refused.load(Ordering::Relaxed)
        } else {
            self.swarm_audited.load(Ordering::Relaxed)
        }
    }

    /// Containers removed at shutdown.
    pub fn reaped(&self, count: u64) {
        self.reaped.fetch_add(count, Ordering::Relaxed);
    }

    pub fn reaped_count(&self) -> u64 {
        self.reaped.load(Ordering::Relaxed)
    }

    /// One container removed, and why.
    pub fn container_removed(&self, reason: Reason) {
        self.containers_removed[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn containers_removed(&self, reason: Reason) -> u64 {
        self.containers_removed[reason.index()].load(Ordering::Relaxed)
    }

    /// One image removed (or one of its tags, when it has others), and why.
    pub fn image_removed(&self, reason: Reason) {
        self.images_removed[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn images_removed(&self, reason: Reason) -> u64 {
        self.images_removed[reason.index()].load(Ordering::Relaxed)
    }

    /// One network removed at the pod's end.
    pub fn network_removed(&self) {
        self.networks_removed.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection to the daemon that could not be made or broke.
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP podmend_guard_creates_total Container creates seen by the guard, by decision.\n\
             # TYPE podmend_guard_creates_total counter\n",
        );
        for (decision, count) in CreateDecision::ALL.iter().zip(&self.creates) {
            let _ = writeln!(
                out,
                "podmend_guard_creates_total{{decision=\"{decision}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let _ = write!(
            out,
            "# HELP podmend_guard_swarm_requests_total Swarm init/join and service create/update requests, by decision (deny: refused, audit: passed on).\n\
             # TYPE podmend_guard_swarm_requests_total counter\n\
             podmend_guard_swarm_requests_total{{decision=\"deny\"}} {}\n\
             podmend_guard_swarm_requests_total{{decision=\"audit\"}} {}\n\
             # HELP podmend_guard_containers_reaped_total Containers the guard removed at shutdown.\n\
             # TYPE podmend_guard_containers_reaped_total counter\n\
             podmend_guard_containers_reaped_total {}\n\
             # HELP podmend_guard_upstream_errors_total Connections to the Docker daemon that failed.\n\
             # TYPE podmend_guard_upstream_errors_total counter\n\
             podmend_guard_upstream_errors_total {}\n",
            self.swarm_refused.load(Ordering::Relaxed),
            self.swarm_audited.load(Ordering::Relaxed),
            self.reaped.load(Ordering::Relaxed),
            self.upstream_errors.load(Ordering::Relaxed),
        );
        out.push_str(
            "# HELP podmend_guard_containers_removed_total Containers removed, by reason (min-age, max-exited: collected after they exited; pod-end: at SIGTERM; owner-gone, older-than: by guard reap).\n\
             # TYPE podmend_guard_containers_removed_total counter\n",
        );
        for reason in Reason::ALL.into_iter().filter(|r| *r != Reason::Budget) {
            let _ = writeln!(
                out,
                "podmend_guard_containers_removed_total{{reason=\"{reason}\"}} {}",
                self.containers_removed(reason)
            );
        }
        let _ = write!(
            out,
            "# HELP podmend_guard_images_removed_total Image references removed (the image goes with its last one), by reason (pod-end: built, committed or tagged by the pod; budget: by guard reap's image budget).\n\
             # TYPE podmend_guard_images_removed_total counter\n\
             podmend_guard_images_removed_total{{reason=\"pod-end\"}} {}\n\
             podmend_guard_images_removed_total{{reason=\"budget\"}} {}\n\
             # HELP podmend_guard_networks_removed_total Networks the pod created, removed when it ended.\n\
             # TYPE podmend_guard_networks_removed_total counter\n\
             podmend_guard_networks_removed_total {}\n",
            self.images_removed(Reason::PodEnd),
            self.images_removed(Reason::Budget),
            self.networks_removed.load(Ordering::Relaxed),
        );
        out
    }
}

/// What the probes answer from.
#[derive(Debug, Clone)]
pub struct Probes {
    /// Set once every listener is bound and the TLS tree written: `/healthz` says 200.
    pub started: Arc<AtomicBool>,
    /// The daemon `/readyz` pings.
    pub upstream: DaemonUpstream,
}

/// How long `/readyz` waits for the daemon's `/_ping`.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<GuardMetrics>,
    probes: Probes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let started = Arc::clone(&probes.started);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        metrics.render(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let started = started.load(Ordering::Acquire);
                async move {
                    if started {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let upstream = probes.upstream.clone();
                async move {
                    let address = upstream.address().to_string();
                    let client = DockerClient::new(upstream);
                    match tokio::time::timeout(PING_TIMEOUT, client.ping()).await {
                        Ok(Ok(())) => (StatusCode::OK, "ok\n".to_string()),
                        Ok(Err(error)) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("the Docker daemon does not answer: {error}\n"),
                        ),
                        Err(_) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "the Docker daemon at {address} did not answer /_ping within {}s\n",
                                PING_TIMEOUT.as_secs()
                            ),
                        ),
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds the metrics port.
pub async fn bind(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_is_rendered_with_its_count() {
        let metrics = GuardMetrics::new();
        metrics.create(CreateDecision::Rm);
        metrics.create(CreateDecision::Rm);
        metrics.create(CreateDecision::RestartPolicy);
        metrics.reaped(3);
        metrics.upstream_error();
        metrics.swarm_request(true);
        metrics.swarm_request(true);
        metrics.swarm_request(false);
        let text = metrics.render();
        assert!(
            text.contains("podmend_guard_creates_total{decision=\"rm\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("podmend_guard_creates_total{decision=\"restart-policy\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("podmend_guard_creates_total{decision=\"deny\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("podmend_guard_containers_reaped_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("podmend_guard_upstream_errors_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("podmend_guard_swarm_requests_total{decision=\"deny\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("podmend_guard_swarm_requests_total{decision=\"audit\"} 1\n"),
            "{text}"
        );
        assert_eq!(metrics.creates(CreateDecision::Rm), 2);
        assert_eq!(metrics.swarm_requests(true), 2);
    }

    #[test]
    fn removals_are_rendered_by_reason() {
        let metrics = GuardMetrics::new();
        metrics.container_removed(Reason::MinAge);
        metrics.container_removed(Reason::MaxExited);
        metrics.container_removed(Reason::MaxExited);
        metrics.container_removed(Reason::OwnerGone);
        metrics.image_removed(Reason::PodEnd);
        metrics.network_removed();
        metrics.create(CreateDecision::Collect);
        let text = metrics.render();
        for line in [
            "podmend_guard_containers_removed_total{reason=\"min-age\"} 1\n",
            "podmend_guard_containers_removed_total{reason=\"max-exited\"} 2\n",
            "podmend_guard_containers_removed_total{reason=\"pod-end\"} 0\n",
            "podmend_guard_containers_removed_total{reason=\"owner-gone\"} 1\n",
            "podmend_guard_images_removed_total{reason=\"pod-end\"} 1\n",
            "podmend_guard_images_removed_total{reason=\"budget\"} 0\n",
            "podmend_guard_networks_removed_total 1\n",
            "podmend_guard_creates_total{decision=\"collect\"} 1\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert!(
            !text.contains("podmend_guard_containers_removed_total{reason=\"budget\"}"),
            "{text}"
        );
    }
}
