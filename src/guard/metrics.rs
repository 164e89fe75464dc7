//! The guard's counters and its optional plain-HTTP `GET /metrics` endpoint (Prometheus text
//! format). Separate from the webhook's registry: the guard runs as its own process per pod.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::header;
use axum::routing::get;

use super::policy::Decision;

/// Every metric the guard exports.
#[derive(Debug, Default)]
pub struct GuardMetrics {
    creates: [AtomicU64; Decision::ALL.len()],
    /// Swarm requests: refused, and passed on under `audit`.
    swarm_refused: AtomicU64,
    swarm_audited: AtomicU64,
    reaped: AtomicU64,
    upstream_errors: AtomicU64,
}

impl GuardMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// One container create, by what became of it.
    pub fn create(&self, decision: Decision) {
        let index = Decision::ALL
            .iter()
            .position(|d| *d == decision)
            .unwrap_or_default();
        self.creates[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn creates(&self, decision: Decision) -> u64 {
        Decision::ALL
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
        for (decision, count) in Decision::ALL.iter().zip(&self.creates) {
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
        out
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<GuardMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new().route(
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
        metrics.create(Decision::Rm);
        metrics.create(Decision::Rm);
        metrics.create(Decision::RestartPolicy);
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
        assert_eq!(metrics.creates(Decision::Rm), 2);
        assert_eq!(metrics.swarm_requests(true), 2);
    }
}
