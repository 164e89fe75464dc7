//! Removing what pods leave behind: at shutdown, every container of the guard's own pod; and
//! `podmend guard reap`, containers whose owner pod no longer exists (or, with `--older-than`
//! and no cluster, stopped ones that stopped long enough ago).

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::docker::{ContainerSummary, DockerClient, DockerError, Removal};
use super::metrics::GuardMetrics;
use super::policy::OWNER_LABEL;
use crate::cluster::watch::{self, Lookups};

/// How many times the shutdown clean-up lists and removes, in case a create was in flight
/// during the first pass.
const SHUTDOWN_PASSES: usize = 5;

/// Why `guard reap` could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(
        "podmend guard reap needs the cluster to know which pods exist (or pass --older-than): {0}"
    )]
    NoCluster(String),
    #[error("cannot list the pods of the cluster: {0}")]
    ListPods(#[source] kube::Error),
    #[error("cannot write the report: {0}")]
    Output(#[source] std::io::Error),
}

/// Removes every container labelled `podmend.io/owner-pod=<owner_pod_uid>`, running or
/// stopped, with its anonymous volumes, until none is left. Returns how many it removed.
pub async fn remove_pod_containers(
    client: &DockerClient,
    owner_pod_uid: &str,
    metrics: &GuardMetrics,
) -> Result<u64, DockerError> {
    let label = format!("{OWNER_LABEL}={owner_pod_uid}");
    let mut removed = 0;
    for _ in 0..SHUTDOWN_PASSES {
        let containers = client.containers_with_label(&label).await?;
        if containers.is_empty() {
            break;
        }
        for container in containers {
            match client.remove(&container.id).await {
                Ok(Removal::Removed) => {
                    removed += 1;
                    metrics.reaped(1);
                    tracing::info!(
                        id = container.short_id(),
                        name = container.name(),
                        image = %container.image,
                        state = %container.state,
                        "removed a container of this pod"
                    );
                }
                Ok(Removal::AlreadyGone) => {}
                Err(error) => {
                    tracing::warn!(%error, id = container.short_id(), "cannot remove a container of this pod")
                }
            }
        }
    }
    Ok(removed)
}

/// Which containers `guard reap` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReapMode {
    /// Those whose owner pod is not in the cluster (kubeconfig, or the usual discovery).
    OwnerGone { kubeconfig: Option<PathBuf> },
    /// Stopped ones that stopped (or were created, if never started) this long ago.
    StoppedFor(Duration),
}

/// What `guard reap` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Removed (or, in a dry run, that would be).
    pub removed: usize,
    /// Removals that failed.
    pub failed: usize,
    /// Labelled containers left alone.
    pub kept: usize,
}

/// `podmend guard reap`: prints one line per container it removes (or, with `dry_run`, would
/// remove) to `out`.
pub async fn reap(
    client: &DockerClient,
    mode: &ReapMode,
    dry_run: bool,
    out: &mut dyn Write,
) -> Result<ReapReport, ReapError> {
    // Containers first, pods second: a container listed before the pods were is never
    // mistaken for an orphan because its pod was created in between.
    let containers = client.containers_with_label(OWNER_LABEL).await?;
    let mut doomed: Vec<(ContainerSummary, String)> = Vec::new();
    let mut kept = 0;
    match mode {
        ReapMode::OwnerGone { kubeconfig } => {
            let pods = pod_uids(kubeconfig.as_deref()).await?;
            for container in containers {
                let owner = container.label(OWNER_LABEL).unwrap_or_default().to_string();
                if pods.contains(&owner) {
                    kept += 1;
                } else {
                    doomed.push((container, "its owner pod no longer exists".to_string()));
                }
            }
        }
        ReapMode::StoppedFor(age) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            for container in containers {
                if !container.is_stopped() {
                    kept += 1;
                    continue;
                }
                let stopped = match client.finished_at(&container.id).await {
                    Ok(finished) => finished.unwrap_or(container.created),
                    Err(DockerError::Status { status: 404, .. }) => continue,
                    Err(error) => return Err(error.into()),
                };
                let idle = Duration::from_secs(now.saturating_sub(stopped).max(0) as u64);
                if idle >= *age {
                    let reason = format!("{} for {}", container.state, format_duration(idle));
                    doomed.push((container, reason));
                } else {
                    kept += 1;
                }
            }
        }
    }

    let mut report = ReapReport {
        kept,
        ..ReapReport::default()
    };
    for (container, reason) in doomed {
        let owner = container.label(OWNER_LABEL).unwrap_or_default();
        let describe = format!(
            "{} {} {OWNER_LABEL}={owner} ({reason})",
            container.short_id(),
            if container.name().is_empty() {
                "-"
            } else {
                container.name()
            },
        );
        if dry_run {
            writeln!(out, "would remove {describe}").map_err(ReapError::Output)?;
            report.removed += 1;
            continue;
        }
        match client.remove(&container.id).await {
            Ok(_) => {
                writeln!(out, "removed {describe}").map_err(ReapError::Output)?;
                report.removed += 1;
            }
            Err(error) => {
                writeln!(out, "failed to remove {describe}: {error}").map_err(ReapError::Output)?;
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

/// The UIDs of every pod in the cluster, listed 500 at a time.
async fn pod_uids(kubeconfig: Option<&std::path::Path>) -> Result<HashSet<String>, ReapError> {
    let lookups = match kubeconfig {
        Some(path) => watch::lookups_from_kubeconfig(path).await,
        None => watch::lookups_from_environment().await,
    };
    let client = match lookups {
        Lookups::On(client) => client,
        Lookups::Off { reason } => return Err(ReapError::NoCluster(reason)),
    };
    let pods: Api<Pod> = Api::all(client);
    let mut params = ListParams::default().limit(500);
    let mut uids = HashSet::new();
    loop {
        let page = pods.list(&params).await.map_err(ReapError::ListPods)?;
        uids.extend(page.items.into_iter().filter_map(|pod| pod.metadata.uid));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Ok(uids)
}

/// `2h5m`, `40s`: short, for report lines.
fn format_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (value, unit) in [(d, "d"), (h, "h"), (m, "m")] {
        if value > 0 {
            out.push_str(&format!("{value}{unit}"));
        }
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_short() {
        assert_eq!(format_duration(Duration::from_secs(7500)), "2h5m");
        assert_eq!(format_duration(Duration::from_secs(0)), "0s");
        assert_eq!(format_duration(Duration::from_secs(90_061)), "1d1h1m1s");
    }
}
