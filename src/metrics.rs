//! The Prometheus registry: a few counters and one histogram, rendered as text on
//! `GET /metrics`. Label sets are small and bounded (webhook, kind, operation, result, rule):
//! every label value is a `&'static str`, so counting a request allocates nothing once its
//! label set has been seen.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds: admission answers take microseconds.
const LATENCY_BUCKETS: [f64; 13] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A series' labels as (name, value) pairs, in the order they are rendered.
type Labels = Vec<(&'static str, &'static str)>;

#[derive(Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in self.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// Every metric podmend exports.
#[derive(Default)]
pub struct Metrics {
    /// Keyed by the metric's name, then its labels.
    counters: Mutex<BTreeMap<&'static str, BTreeMap<Labels, u64>>>,
    latency: Mutex<BTreeMap<Labels, Histogram>>,
    certificate_expiry: AtomicI64,
}

const REQUESTS: &str = "podmend_admission_requests_total";
const RULE_ACTIONS: &str = "podmend_rule_actions_total";
const BAD_REQUESTS: &str = "podmend_bad_requests_total";
const CONFIG_RELOADS: &str = "podmend_config_reloads_total";
const TLS_RELOADS: &str = "podmend_tls_reloads_total";
const TLS_HANDSHAKE_FAILURES: &str = "podmend_tls_handshake_failures_total";
const CONNECTION_ERRORS: &str = "podmend_connection_errors_total";
const LATENCY: &str = "podmend_admission_duration_seconds";
const CERT_EXPIRY: &str = "podmend_tls_certificate_expiry_timestamp_seconds";

const HELP: &[(&str, &str, &str)] = &[
    (
        REQUESTS,
        "counter",
        "AdmissionReviews answered, by webhook, kind, operation and result.",
    ),
    (
        RULE_ACTIONS,
        "counter",
        "Rule findings, by rule and action (repaired, warned, denied).",
    ),
    (
        BAD_REQUESTS,
        "counter",
        "Requests refused before review (unreadable body, wrong content type, method or path), by reason.",
    ),
    (
        TLS_HANDSHAKE_FAILURES,
        "counter",
        "Connections to the webhook port that never completed a TLS handshake, by reason.",
    ),
    (
        CONNECTION_ERRORS,
        "counter",
        "Webhook connections that ended in an HTTP-level error (header timeout, malformed request), by reason.",
    ),
    (
        CONFIG_RELOADS,
        "counter",
        "Configuration file reloads, by result (success, error).",
    ),
    (
        TLS_RELOADS,
        "counter",
        "Serving certificate reloads, by result (success, error).",
    ),
];

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    fn add(&self, name: &'static str, labels: &[(&'static str, &'static str)]) {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let series = counters.entry(name).or_default();
        match series.get_mut(labels) {
            Some(count) => *count += 1,
            None => {
                series.insert(labels.to_vec(), 1);
            }
        }
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
        self.add(
            REQUESTS,
            &[
                ("webhook", webhook),
                ("kind", kind),
                ("operation", operation),
                ("result", result),
            ],
        );
        let labels = [("webhook", webhook)];
        let mut latency = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        match latency.get_mut(&labels[..]) {
            Some(histogram) => histogram.observe(elapsed),
            None => {
                let mut histogram = Histogram::default();
                histogram.observe(elapsed);
                latency.insert(labels.to_vec(), histogram);
            }
        }
    }

    pub fn rule_action(&self, rule: &'static str, action: &'static str) {
        self.add(RULE_ACTIONS, &[("rule", rule), ("action", action)]);
    }

    pub fn bad_request(&self, reason: &'static str) {
        self.add(BAD_REQUESTS, &[("reason", reason)]);
    }

    /// A connection refused before HTTP: plain HTTP, an old TLS version, no common cipher
    /// suite or ALPN protocol, a missing client certificate, a timeout.
    pub fn tls_handshake_failure(&self, reason: &'static str) {
        self.add(TLS_HANDSHAKE_FAILURES, &[("reason", reason)]);
    }

    /// A TLS connection that ended with an HTTP error rather than a clean close.
    pub fn connection_error(&self, reason: &'static str) {
        self.add(CONNECTION_ERRORS, &[("reason", reason)]);
    }

    pub fn config_reload(&self, success: bool) {
        self.add(CONFIG_RELOADS, &[("result", result(success))]);
    }

    pub fn tls_reload(&self, success: bool) {
        self.add(TLS_RELOADS, &[("result", result(success))]);
    }

    pub fn set_certificate_expiry(&self, unix_seconds: i64) {
        self.certificate_expiry
            .store(unix_seconds, Ordering::Relaxed);
    }

    /// The Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in counters.get(name).into_iter().flatten() {
                let _ = writeln!(out, "{name}{} {value}", format_labels(labels, None));
            }
        }
        drop(counters);
        let _ = writeln!(
            out,
            "# HELP {LATENCY} Time to answer an AdmissionReview, from body read to response encoded.\n# TYPE {LATENCY} histogram"
        );
        let latency = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        for (labels, histogram) in latency.iter() {
            for (count, bound) in histogram.buckets.iter().zip(LATENCY_BUCKETS) {
                let le = bound.to_string();
                let _ = writeln!(
                    out,
                    "{LATENCY}_bucket{} {count}",
                    format_labels(labels, Some(&le))
                );
            }
            let _ = writeln!(
                out,
                "{LATENCY}_bucket{} {}",
                format_labels(labels, Some("+Inf")),
                histogram.count
            );
            let _ = writeln!(
                out,
                "{LATENCY}_sum{} {}",
                format_labels(labels, None),
                histogram.sum
            );
            let _ = writeln!(
                out,
                "{LATENCY}_count{} {}",
                format_labels(labels, None),
                histogram.count
            );
        }
        drop(latency);
        let _ = writeln!(
            out,
            "# HELP {CERT_EXPIRY} notAfter of the serving certificate, as a Unix timestamp.\n# TYPE {CERT_EXPIRY} gauge\n{CERT_EXPIRY} {}",
            self.certificate_expiry.load(Ordering::Relaxed)
        );
        out
    }
}

fn result(success: bool) -> &'static str {
    if success { "success" } else { "error" }
}

fn format_labels(labels: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
                "podmend_admission_duration_seconds_bucket{webhook=\"mutate\",le=\"0.0001\"} 1"
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
        assert!(
            text.contains("# TYPE podmend_tls_handshake_failures_total counter"),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new();
        metrics.bad_request("quote\"d");
        assert!(metrics.render().contains("reason=\"quote\\\"d\""));
    }
}
