//! The webhook's Prometheus registry, through `prometheus-client` (the Prometheus project's
//! Rust client): a few counters, one histogram and one gauge, rendered on `GET /metrics` in
//! the OpenMetrics text format ([`CONTENT_TYPE`]). Label sets are small and bounded
//! (webhook, kind, operation, result, rule, reason) and typed: every label value is a
//! `&'static str`, so counting a request allocates nothing once its label set has been seen.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// What `GET /metrics` answers with: the OpenMetrics text format, which Prometheus asks for
/// first (counters are declared without their `_total` suffix there, their samples keep it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency buckets, in seconds: admission answers take microseconds.
const LATENCY_BUCKETS: [f64; 13] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    webhook: &'static str,
    kind: &'static str,
    operation: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: &'static str,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabel {
    webhook: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Every metric podmend exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    rule_actions: Family<RuleLabels, Counter>,
    bad_requests: Family<ReasonLabel, Counter>,
    tls_handshake_failures: Family<ReasonLabel, Counter>,
    connection_errors: Family<ReasonLabel, Counter>,
    config_reloads: Family<ResultLabel, Counter>,
    tls_reloads: Family<ResultLabel, Counter>,
    latency: Family<WebhookLabel, Histogram, fn() -> Histogram>,
    certificate_expiry: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self {
            registry: Registry::default(),
            requests: Family::default(),
            rule_actions: Family::default(),
            bad_requests: Family::default(),
            tls_handshake_failures: Family::default(),
            connection_errors: Family::default(),
            config_reloads: Family::default(),
            tls_reloads: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            certificate_expiry: Gauge::default(),
        };
        metrics.register()
    }

    /// Registers every metric, in the order `/metrics` lists them. The client library adds
    /// the closing `.` of each help text and the `_total` of each counter's samples.
    fn register(mut self) -> Self {
        let registry = &mut self.registry;
        registry.register(
            "podmend_admission_requests",
            "AdmissionReviews answered, by webhook, kind, operation and result",
            self.requests.clone(),
        );
        registry.register(
            "podmend_rule_actions",
            "Rule findings, by rule and action (repaired, warned, denied)",
            self.rule_actions.clone(),
        );
        registry.register(
            "podmend_bad_requests",
            "Requests refused before review (unreadable body, wrong content type, method or path), by reason",
            self.bad_requests.clone(),
        );
        registry.register(
            "podmend_tls_handshake_failures",
            "Connections to the webhook port that never completed a TLS handshake, by reason",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "podmend_connection_errors",
            "Webhook connections that ended in an HTTP-level error (header timeout, malformed request), by reason",
            self.connection_errors.clone(),
        );
        registry.register(
            "podmend_config_reloads",
            "Configuration file reloads, by result (success, error)",
            self.config_reloads.clone(),
        );
        registry.register(
            "podmend_tls_reloads",
            "Serving certificate reloads, by result (success, error)",
            self.tls_reloads.clone(),
        );
        registry.register(
            "podmend_admission_duration_seconds",
            "Time to answer an AdmissionReview, from body read to response encoded",
            self.latency.clone(),
        );
        registry.register(
            "podmend_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate, as a Unix timestamp",
            self.certificate_expiry.clone(),
        );
        self
    }

    /// One answered AdmissionReview and how long it took.
    pub fn admission(
        &self,
        webhook: &'static str,
        kind: &'static str,
        operation: &'static str,
        result: &'static str,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                webhook,
                kind,
                operation,
                result,
            })
            .inc();
        self.latency
            .get_or_create(&WebhookLabel { webhook })
            .observe(elapsed.as_secs_f64());
    }

    pub fn rule_action(&self, rule: &'static str, action: &'static str) {
        self.rule_actions
            .get_or_create(&RuleLabels { rule, action })
            .inc();
    }

    pub fn bad_request(&self, reason: &'static str) {
        self.bad_requests
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A connection refused before HTTP: plain HTTP, an old TLS version, no common cipher
    /// suite or ALPN protocol, a missing client certificate, a timeout.
    pub fn tls_handshake_failure(&self, reason: &'static str) {
        self.tls_handshake_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A TLS connection that ended with an HTTP error rather than a clean close.
    pub fn connection_error(&self, reason: &'static str) {
        self.connection_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn config_reload(&self, success: bool) {
        let result = result(success);
        self.config_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn tls_reload(&self, success: bool) {
        let result = result(success);
        self.tls_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn set_certificate_expiry(&self, unix_seconds: i64) {
        self.certificate_expiry.set(unix_seconds);
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn result(success: bool) -> &'static str {
    if success { "success" } else { "error" }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_the_histogram_render_in_prometheus_text_format() {
        let metrics = Metrics::new();
        metrics.admission(
            "mutate",
            "Pod",
            "CREATE",
            "patched",
            Duration::from_micros(80),
        );
        metrics.admission(
            "mutate",
            "Pod",
            "CREATE",
            "patched",
            Duration::from_millis(3),
        );
        metrics.rule_action("node-affinity", "repaired");
        metrics.set_certificate_expiry(1_800_000_000);
        let text = metrics.render();
        assert!(text.contains("podmend_admission_requests_total{webhook=\"mutate\",kind=\"Pod\",operation=\"CREATE\",result=\"patched\"} 2"), "{text}");
        assert!(
            text.contains(
                // prometheus-client writes `le` first.
                "podmend_admission_duration_seconds_bucket{le=\"0.0001\",webhook=\"mutate\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("podmend_admission_duration_seconds_count{webhook=\"mutate\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "podmend_rule_actions_total{rule=\"node-affinity\",action=\"repaired\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("podmend_tls_certificate_expiry_timestamp_seconds 1800000000"),
            "{text}"
        );
    }

    #[test]
    fn handshake_failures_and_connection_errors_are_counted_by_reason() {
        let metrics = Metrics::new();
        metrics.tls_handshake_failure("protocol-version");
        metrics.tls_handshake_failure("protocol-version");
        metrics.connection_error("header-timeout");
        let text = metrics.render();
        assert!(
            text.contains("podmend_tls_handshake_failures_total{reason=\"protocol-version\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("podmend_connection_errors_total{reason=\"header-timeout\"} 1"),
            "{text}"
        );
        // OpenMetrics declares a counter's family without `_total`; its samples keep it.
        assert!(
            text.contains("# TYPE podmend_tls_handshake_failures counter"),
            "{text}"
        );
    }

    #[test]
    fn every_metric_keeps_its_name_type_and_help_text() {
        // (sample name, type, help) as `/metrics` has always exported them.
        let expected = [
            (
                "podmend_admission_requests_total",
                "counter",
                "AdmissionReviews answered, by webhook, kind, operation and result.",
            ),
            (
                "podmend_rule_actions_total",
                "counter",
                "Rule findings, by rule and action (repaired, warned, denied).",
            ),
            (
                "podmend_bad_requests_total",
                "counter",
                "Requests refused before review (unreadable body, wrong content type, method or path), by reason.",
            ),
            (
                "podmend_tls_handshake_failures_total",
                "counter",
                "Connections to the webhook port that never completed a TLS handshake, by reason.",
            ),
            (
                "podmend_connection_errors_total",
                "counter",
                "Webhook connections that ended in an HTTP-level error (header timeout, malformed request), by reason.",
            ),
            (
                "podmend_config_reloads_total",
                "counter",
                "Configuration file reloads, by result (success, error).",
            ),
            (
                "podmend_tls_reloads_total",
                "counter",
                "Serving certificate reloads, by result (success, error).",
            ),
            (
                "podmend_admission_duration_seconds",
                "histogram",
                "Time to answer an AdmissionReview, from body read to response encoded.",
            ),
            (
                "podmend_tls_certificate_expiry_timestamp_seconds",
                "gauge",
                "notAfter of the serving certificate, as a Unix timestamp.",
            ),
        ];
        let metrics = Metrics::new();
        metrics.admission("validate", "Pod", "CREATE", "allowed", Duration::ZERO);
        metrics.rule_action("dind-rm", "warned");
        metrics.bad_request("not-json");
        metrics.tls_handshake_failure("timeout");
        metrics.connection_error("malformed-http");
        metrics.config_reload(true);
        metrics.tls_reload(false);
        let text = metrics.render();
        for (sample, kind, help) in expected {
            let family = match kind {
                "counter" => sample
                    .strip_suffix("_total")
                    .expect("a counter ends in _total"),
                _ => sample,
            };
            assert!(
                text.contains(&format!("# HELP {family} {help}\n# TYPE {family} {kind}\n")),
                "{family}: {text}"
            );
            assert!(
                text.lines().any(|line| line.starts_with(sample)),
                "{sample}: {text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new();
        metrics.bad_request("quote\"d");
        assert!(metrics.render().contains("reason=\"quote\\\"d\""));
    }
}
