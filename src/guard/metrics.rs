//! The guard's counters and its optional plain-HTTP port: `GET /metrics` (the OpenMetrics
//! text format, through `prometheus-client` as the webhook's), `/healthz` (the startupProbe:
//! listeners bound, TLS tree written) and `/readyz` (the readinessProbe: the daemon answers
//! `/_ping`), also at `/healthz/<token>` and `/readyz/<token>`, which answer 404 to a token
//! not the guard's own (on a shared network namespace a probe proves it reached this
//! guard). Separate from the webhook's registry:
//! the guard runs as its own process per pod (and `guard reap --interval` per node).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

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

    fn label(self) -> ReasonLabel {
        ReasonLabel {
            reason: self.as_str(),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabel {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The `decision` label of a swarm request: refused, or passed on under `audit`.
fn swarm_decision(refused: bool) -> DecisionLabel {
    let decision = if refused { "deny" } else { "audit" };
    DecisionLabel { decision }
}

/// Every metric the guard exports, through `prometheus-client`. Every series is there from
/// the start, at 0.
#[derive(Debug)]
pub struct GuardMetrics {
    registry: Registry,
    creates: Family<DecisionLabel, Counter>,
    swarm_requests: Family<DecisionLabel, Counter>,
    reaped: Counter,
    upstream_errors: Counter,
    containers_removed: Family<ReasonLabel, Counter>,
    images_removed: Family<ReasonLabel, Counter>,
    networks_removed: Counter,
    volumes_removed: Counter,
}

impl Default for GuardMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GuardMetrics {
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::default(),
            creates: Family::default(),
            swarm_requests: Family::default(),
            reaped: Counter::default(),
            upstream_errors: Counter::default(),
            containers_removed: Family::default(),
            images_removed: Family::default(),
            networks_removed: Counter::default(),
            volumes_removed: Counter::default(),
        };
        metrics.register();
        for decision in CreateDecision::ALL {
            let _ = metrics.creates.get_or_create(&DecisionLabel {
                decision: decision.as_str(),
            });
        }
        for refused in [true, false] {
            let _ = metrics
                .swarm_requests
                .get_or_create(&swarm_decision(refused));
        }
        // Only `guard reap --images-high` removes by budget, and only images.
        for reason in Reason::ALL.into_iter().filter(|r| *r != Reason::Budget) {
            let _ = metrics.containers_removed.get_or_create(&reason.label());
        }
        for reason in [Reason::PodEnd, Reason::Budget] {
            let _ = metrics.images_removed.get_or_create(&reason.label());
        }
        metrics
    }

    /// Registers every metric, in the order `/metrics` lists them. The client library adds
    /// the closing `.` of each help text and the `_total` of each counter's samples.
    fn register(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "podmend_guard_creates",
            "Container creates seen by the guard, by decision",
            self.creates.clone(),
        );
        registry.register(
            "podmend_guard_swarm_requests",
            "Swarm init/join and service create/update requests, by decision (deny: refused, audit: passed on)",
            self.swarm_requests.clone(),
        );
        registry.register(
            "podmend_guard_containers_reaped",
            "Containers the guard removed at shutdown",
            self.reaped.clone(),
        );
        registry.register(
            "podmend_guard_upstream_errors",
            "Connections to the Docker daemon that failed",
            self.upstream_errors.clone(),
        );
        registry.register(
            "podmend_guard_containers_removed",
            "Containers removed, by reason (min-age, max-exited: collected after they exited; pod-end: at SIGTERM; owner-gone, older-than: by guard reap)",
            self.containers_removed.clone(),
        );
        registry.register(
            "podmend_guard_images_removed",
            "Image references removed (the image goes with its last one), by reason (pod-end: built, committed or tagged by the pod; budget: by guard reap's image budget)",
            self.images_removed.clone(),
        );
        registry.register(
            "podmend_guard_networks_removed",
            "Networks removed: the pod's own when it ended, and by guard reap those whose owner pod is gone",
            self.networks_removed.clone(),
        );
        registry.register(
            "podmend_guard_volumes_removed",
            "Named volumes removed: the pod's own when it ended, and by guard reap those whose owner pod is gone",
            self.volumes_removed.clone(),
        );
    }

    /// One container create, by what became of it.
    pub fn create(&self, decision: CreateDecision) {
        let decision = decision.as_str();
        self.creates
            .get_or_create(&DecisionLabel { decision })
            .inc();
    }

    pub fn creates(&self, decision: CreateDecision) -> u64 {
        let decision = decision.as_str();
        count(&self.creates, &DecisionLabel { decision })
    }

    /// One swarm request (`swarm init/join`, `service create/update`), refused or passed on.
    pub fn swarm_request(&self, refused: bool) {
        self.swarm_requests
            .get_or_create(&swarm_decision(refused))
            .inc();
    }

    pub fn swarm_requests(&self, refused: bool) -> u64 {
        count(&self.swarm_requests, &swarm_decision(refused))
    }

    /// Containers removed at shutdown.
    pub fn reaped(&self, count: u64) {
        self.reaped.inc_by(count);
    }

    pub fn reaped_count(&self) -> u64 {
        self.reaped.get()
    }

    /// One container removed, and why.
    pub fn container_removed(&self, reason: Reason) {
        self.containers_removed.get_or_create(&reason.label()).inc();
    }

    pub fn containers_removed(&self, reason: Reason) -> u64 {
        count(&self.containers_removed, &reason.label())
    }

    /// One image removed (or one of its tags, when it has others), and why.
    pub fn image_removed(&self, reason: Reason) {
        self.images_removed.get_or_create(&reason.label()).inc();
    }

    pub fn images_removed(&self, reason: Reason) -> u64 {
        count(&self.images_removed, &reason.label())
    }

    /// One network removed.
    pub fn network_removed(&self) {
        self.networks_removed.inc();
    }

    /// One named volume removed.
    pub fn volume_removed(&self) {
        self.volumes_removed.inc();
    }

    /// A connection to the daemon that could not be made or broke.
    pub fn upstream_error(&self) {
        self.upstream_errors.inc();
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`](crate::metrics::CONTENT_TYPE)).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The count of one series of `family`, 0 when it was never counted.
fn count<S>(family: &Family<S, Counter>, labels: &S) -> u64
where
    S: Clone + std::hash::Hash + Eq,
{
    family.get(labels).map_or(0, |counter| counter.get())
}

/// What the probes answer from.
#[derive(Debug, Clone)]
pub struct Probes {
    /// Set once every listener is bound and the TLS tree written: `/healthz` says 200.
    pub started: Arc<AtomicBool>,
    /// The daemon `/readyz` pings.
    pub upstream: DaemonUpstream,
    /// The token of `/healthz/<token>` and `/readyz/<token>`; any other answers 404.
    pub token: Option<String>,
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
            "/healthz/{token}",
            get({
                let (started, token) = (Arc::clone(&started), probes.token.clone());
                move |Path(asked): Path<String>| {
                    let ours = token.as_deref() == Some(asked.as_str());
                    let started = started.load(Ordering::Acquire);
                    async move { with_token(ours, healthz(started)) }
                }
            }),
        )
        .route(
            "/readyz/{token}",
            get({
                let (upstream, token) = (probes.upstream.clone(), probes.token.clone());
                move |Path(asked): Path<String>| {
                    let ours = token.as_deref() == Some(asked.as_str());
                    let upstream = upstream.clone();
                    async move {
                        if ours {
                            readyz(upstream).await
                        } else {
                            not_ours()
                        }
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let text = metrics.render();
                async move { ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let started = started.load(Ordering::Acquire);
                async move { healthz(started) }
            }),
        )
        .route("/readyz", get(move || readyz(probes.upstream.clone())));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A probe with another pod's token (or with one where none was set) reached the wrong
/// guard: 404, so that the probe fails.
fn not_ours() -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        "not this guard's token: the probe reached another pod's guard\n".to_string(),
    )
}

/// `answer` when the probe's token is ours, else [`not_ours`].
fn with_token(ours: bool, answer: (StatusCode, &'static str)) -> (StatusCode, String) {
    if ours {
        (answer.0, answer.1.to_string())
    } else {
        not_ours()
    }
}

/// `/healthz`: 200 once started.
fn healthz(started: bool) -> (StatusCode, &'static str) {
    if started {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

/// `/readyz`: 200 when the daemon answers `/_ping` within [`PING_TIMEOUT`].
async fn readyz(upstream: DaemonUpstream) -> (StatusCode, String) {
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

/// Binds the metrics port (an IPv6 address dual-stack: [`crate::listen`]).
pub async fn bind(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    crate::listen::bind(address)
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
    fn every_metric_keeps_its_name_type_and_help_text() {
        // (sample name, help) as `/metrics` has always exported them: all counters.
        let expected = [
            (
                "podmend_guard_creates_total",
                "Container creates seen by the guard, by decision.",
            ),
            (
                "podmend_guard_swarm_requests_total",
                "Swarm init/join and service create/update requests, by decision (deny: refused, audit: passed on).",
            ),
            (
                "podmend_guard_containers_reaped_total",
                "Containers the guard removed at shutdown.",
            ),
            (
                "podmend_guard_upstream_errors_total",
                "Connections to the Docker daemon that failed.",
            ),
            (
                "podmend_guard_containers_removed_total",
                "Containers removed, by reason (min-age, max-exited: collected after they exited; pod-end: at SIGTERM; owner-gone, older-than: by guard reap).",
            ),
            (
                "podmend_guard_images_removed_total",
                "Image references removed (the image goes with its last one), by reason (pod-end: built, committed or tagged by the pod; budget: by guard reap's image budget).",
            ),
            (
                "podmend_guard_networks_removed_total",
                "Networks removed: the pod's own when it ended, and by guard reap those whose owner pod is gone.",
            ),
            (
                "podmend_guard_volumes_removed_total",
                "Named volumes removed: the pod's own when it ended, and by guard reap those whose owner pod is gone.",
            ),
        ];
        let text = GuardMetrics::new().render();
        for (sample, help) in expected {
            // OpenMetrics declares a counter's family without `_total`; its samples keep it.
            let family = sample.strip_suffix("_total").expect("a counter");
            assert!(
                text.contains(&format!(
                    "# HELP {family} {help}\n# TYPE {family} counter\n"
                )),
                "{family}: {text}"
            );
            assert!(
                text.lines().any(|line| line.starts_with(sample)),
                "{sample}: {text}"
            );
        }
        // Every series is there from the start.
        assert_eq!(
            text.lines().filter(|l| l.ends_with(" 0")).count(),
            7 + 2 + 1 + 1 + 5 + 2 + 1 + 1,
            "{text}"
        );
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
