//! What a `clean-storms` run did, as Prometheus metrics. A batch job cannot be scraped (it
//! is gone before the next scrape), so the run hands them over when it ends: pushed to a
//! Pushgateway (`--pushgateway URL`: `PUT /metrics/job/podmend-clean-storms`, replacing the
//! previous run's group, as Prometheus' docs advise for service-level batch jobs) and/or
//! written as Prometheus text to a file (`--metrics-file`, written to a temporary file and
//! renamed, as node_exporter's textfile collector needs). All are gauges of the last run. A
//! run that stops on an error hands them over too, with `success` 0 and nothing counted, so
//! that an alert on `success == 0` fires.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hyper::Request;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode_registry;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::CleanupOutcome;

/// The Pushgateway `job` label of every push.
pub const PUSHGATEWAY_JOB: &str = "podmend-clean-storms";
/// How long a push may take, connection included.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the metrics could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(
        "--pushgateway {url:?} is not an http://HOST[:PORT] URL ({detail}); give the Pushgateway's Service URL, e.g. http://pushgateway.monitoring:9091, or use --metrics-file"
    )]
    BadUrl { url: String, detail: String },
    #[error(
        "cannot push metrics to the Pushgateway at {url}: {detail}; check that it runs and that --pushgateway names it (e.g. http://pushgateway.monitoring:9091)"
    )]
    Push { url: String, detail: String },
    #[error(
        "the Pushgateway at {url} refused the metrics ({status}): {body}; check --pushgateway and the Pushgateway's logs"
    )]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    #[error("cannot write --metrics-file {}: {source}; check the directory exists and is writable", .path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    action: &'static str,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// A gauge of `value`: counts stay integers in the text.
fn gauge(value: usize) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
    gauge
}

/// A family of gauges, one per label set.
fn gauges<S>(samples: impl IntoIterator<Item = (S, usize)>) -> Family<S, Gauge>
where
    S: Clone + std::hash::Hash + Eq,
{
    let family: Family<S, Gauge> = Family::default();
    for (labels, value) in samples {
        family
            .get_or_create(&labels)
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    }
    family
}

/// The run as Prometheus text, through `prometheus-client`: gauges only, without the
/// OpenMetrics `# EOF`, which makes it the plain text format (0.0.4) too, as the
/// Pushgateway and node_exporter's textfile collector read it.
pub fn render(outcome: &CleanupOutcome) -> String {
    let mut registry = Registry::default();
    register_pods(&mut registry, outcome);
    register_run(&mut registry, outcome);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode_registry(&mut out, &registry);
    out
}

/// The storms, and their pods by action and reason or by why they were skipped.
fn register_pods(registry: &mut Registry, outcome: &CleanupOutcome) {
    registry.register(
        "podmend_clean_storms_storms",
        "Owners whose Failed pods of one kubelet rejection reason numbered at least --threshold, in the last run",
        gauge(outcome.storms),
    );
    let pods = outcome.by_reason.iter().flat_map(|(reason, counts)| {
        [
            ("selected", counts.selected),
            ("deleted", counts.deleted),
            ("kept", counts.kept),
        ]
        .map(|(action, value)| {
            let reason = reason.clone();
            (PodLabels { action, reason }, value)
        })
    });
    registry.register(
        "podmend_clean_storms_pods",
        "Failed storm pods of the last run, by action (selected for deletion, deleted, kept as the newest) and reason",
        gauges(pods),
    );
    let skipped = [
        ("gone", outcome.gone),
        ("recreated", outcome.recreated),
        ("failed", outcome.failed),
    ];
    registry.register(
        "podmend_clean_storms_skipped_pods",
        "Selected pods the last run did not delete, by cause (gone: deleted meanwhile; recreated: same name, another UID; failed: the API server refused)",
        gauges(skipped.map(|(cause, value)| (CauseLabel { cause }, value))),
    );
    let events = [
        ("posted", outcome.events_posted),
        ("failed", outcome.events_failed),
    ];
    registry.register(
        "podmend_clean_storms_events",
        "Events posted on the storms' owners in the last run, by result",
        gauges(events.map(|(result, value)| (ResultLabel { result }, value))),
    );
}

/// What the run cost and how it ended.
fn register_run(registry: &mut Registry, outcome: &CleanupOutcome) {
    registry.register(
        "podmend_clean_storms_api_requests",
        "Requests the last run sent to the API server (list pages, deletes, events)",
        gauge(outcome.api_requests),
    );
    registry.register(
        "podmend_clean_storms_dry_run",
        "1 when the last run was a dry run (nothing deleted)",
        gauge(usize::from(outcome.dry_run)),
    );
    registry.register(
        "podmend_clean_storms_success",
        "1 when the last run finished, deleted every selected pod it could and posted every event; 0 otherwise (also when it stopped on an error)",
        gauge(usize::from(outcome.succeeded())),
    );
    let duration = Gauge::<f64, AtomicU64>::default();
    duration.set(outcome.duration.as_secs_f64());
    registry.register(
        "podmend_clean_storms_duration_seconds",
        "How long the last run took",
        duration,
    );
    registry.register(
        "podmend_clean_storms_last_run_timestamp_seconds",
        "When the last run ended, in Unix seconds",
        gauge(usize::try_from(outcome.finished_unix).unwrap_or(usize::MAX)),
    );
}

/// Writes `text` to `path` atomically (a temporary file beside it, then a rename).
pub fn write_file(path: &Path, text: &str) -> Result<(), MetricsError> {
    let error = |source| MetricsError::File {
        path: path.to_path_buf(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "metrics.prom".to_string());
    let temporary = path.with_file_name(format!(".{file_name}.tmp"));
    std::fs::write(&temporary, text).map_err(error)?;
    std::fs::rename(&temporary, path).map_err(error)
}

/// The push URL for `base`: `http://host:port[/prefix]/metrics/job/<job>[/namespace/<ns>]`.
pub fn push_path(base: &str, namespace: Option<&str>) -> Result<(String, String), MetricsError> {
    let bad = |detail: &str| MetricsError::BadUrl {
        url: base.to_string(),
        detail: detail.to_string(),
    };
    let rest = base.strip_prefix("http://").ok_or_else(|| {
        bad("only http:// is supported: in-cluster Pushgateways serve plain HTTP")
    })?;
    let (authority, prefix) = match rest.split_once('/') {
        Some((authority, prefix)) => (authority, prefix.trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains(['?', '#', '@']) {
        return Err(bad("no host"));
    }
    let mut path = String::new();
    if !prefix.is_empty() {
        path.push('/');
        path.push_str(prefix);
    }
    path.push_str("/metrics/job/");
    path.push_str(PUSHGATEWAY_JOB);
    if let Some(ns) = namespace {
        path.push_str("/namespace/");
        path.push_str(ns);
    }
    Ok((authority.to_string(), path))
}

/// PUTs `text` to the Pushgateway at `base` (replacing the group's previous metrics).
pub async fn push(base: &str, namespace: Option<&str>, text: &str) -> Result<(), MetricsError> {
    let (authority, path) = push_path(base, namespace)?;
    let url = format!("http://{authority}{path}");
    let failed = |detail: String| MetricsError::Push {
        url: url.clone(),
        detail,
    };
    let address = if authority.contains(':') {
        authority.clone()
    } else {
        format!("{authority}:80")
    };
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.to_string()))?;
        let driver = tokio::spawn(connection);
        let request = Request::put(path.as_str())
            .header("Host", authority.as_str())
            .header("Content-Type", "text/plain; version=0.0.4")
            .body(axum::body::Body::from(text.to_string()))
            .map_err(|e| failed(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 64 * 1024)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        driver.abort();
        if status.is_success() {
            Ok(())
        } else {
            Err(MetricsError::Refused {
                url: url.clone(),
                status: status.as_u16(),
                body,
            })
        }
    };
    match tokio::time::timeout(PUSH_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(failed(format!("no answer within {PUSH_TIMEOUT:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_paths_name_the_job_and_the_namespace() {
        assert_eq!(
            push_path("http://pushgateway.monitoring:9091", None).unwrap(),
            (
                "pushgateway.monitoring:9091".to_string(),
                "/metrics/job/podmend-clean-storms".to_string()
            )
        );
        assert_eq!(
            push_path("http://pg:9091/prefix/", Some("ci")).unwrap().1,
            "/prefix/metrics/job/podmend-clean-storms/namespace/ci"
        );
        for bad in ["https://pg:9091", "pg:9091", "http://", "http://user@pg"] {
            let error = push_path(bad, None).expect_err(bad).to_string();
            assert!(error.contains("--pushgateway"), "{error}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let mut outcome = CleanupOutcome::default();
        outcome
            .by_reason
            .insert("a\"b\\c\nd".to_string(), Default::default());
        let text = render(&outcome);
        assert!(
            text.contains(
                "podmend_clean_storms_pods{action=\"kept\",reason=\"a\\\"b\\\\c\\nd\"} 0"
            ),
            "{text}"
        );
    }

    #[test]
    fn every_gauge_keeps_its_name_type_and_help_text() {
        let mut by_reason = std::collections::BTreeMap::new();
        by_reason.insert("OutOfcpu".to_string(), Default::default());
        let text = render(&CleanupOutcome {
            storms: 2,
            by_reason,
            duration: std::time::Duration::from_millis(1500),
            finished_unix: 1_800_000_000,
            ..CleanupOutcome::default()
        });
        for (name, help) in [
            (
                "podmend_clean_storms_storms",
                "Owners whose Failed pods of one kubelet rejection reason numbered at least --threshold, in the last run.",
            ),
            (
                "podmend_clean_storms_pods",
                "Failed storm pods of the last run, by action (selected for deletion, deleted, kept as the newest) and reason.",
            ),
            (
                "podmend_clean_storms_skipped_pods",
                "Selected pods the last run did not delete, by cause (gone: deleted meanwhile; recreated: same name, another UID; failed: the API server refused).",
            ),
            (
                "podmend_clean_storms_events",
                "Events posted on the storms' owners in the last run, by result.",
            ),
            (
                "podmend_clean_storms_api_requests",
                "Requests the last run sent to the API server (list pages, deletes, events).",
            ),
            (
                "podmend_clean_storms_dry_run",
                "1 when the last run was a dry run (nothing deleted).",
            ),
            (
                "podmend_clean_storms_success",
                "1 when the last run finished, deleted every selected pod it could and posted every event; 0 otherwise (also when it stopped on an error).",
            ),
            (
                "podmend_clean_storms_duration_seconds",
                "How long the last run took.",
            ),
            (
                "podmend_clean_storms_last_run_timestamp_seconds",
                "When the last run ended, in Unix seconds.",
            ),
        ] {
            assert!(
                text.contains(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n")),
                "{name}: {text}"
            );
        }
        for line in [
            "podmend_clean_storms_storms 2\n",
            "podmend_clean_storms_skipped_pods{cause=\"recreated\"} 0\n",
            "podmend_clean_storms_duration_seconds 1.5\n",
            "podmend_clean_storms_last_run_timestamp_seconds 1800000000\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert!(
            !text.contains("# EOF"),
            "the plain text format has no EOF: {text}"
        );
    }
}
