//! Removing what pods leave behind. At the pod's end (SIGTERM): every container of the
//! guard's own pod, and under `collect` its networks and the images it built, committed or
//! tagged. And `podmend guard reap`, once or every `--interval`: containers whose owner pod
//! is gone (or, with `--older-than` and no cluster, stopped ones that stopped long enough
//! ago), and with `--images-high` unused images, least recently used first, until the
//! daemon's images are under `--images-low`, as the kubelet's image garbage collection.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::docker::{
    ContainerSummary, DockerClient, DockerError, ImageSummary, NetworkSummary, Removal,
    VolumeSummary, parse_rfc3339,
};
use super::metrics::{GuardMetrics, Reason};
use super::policy::{IMAGE_OWNER_LABEL, OWNER_LABEL};
use crate::cluster::watch::{self, Lookups};

/// How many times the shutdown clean-up lists and removes, in case a create was in flight
/// during the first pass.
const SHUTDOWN_PASSES: usize = 5;
/// How many times the image budget lists the daemon's usage again while above the low mark.
const BUDGET_ROUNDS: usize = 4;

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
    #[error(
        "the cluster lists no pod on node {0:?}, not even this reaper's own: check --node-name \
         (or NODE_NAME, from the downward API spec.nodeName); nothing was removed"
    )]
    NoPodsOnNode(String),
    #[error("cannot write the report: {0}")]
    Output(#[source] std::io::Error),
}

/// A size as `--images-high` takes it: a Kubernetes quantity (`50Gi`, `500M`) or bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    crate::quantity::parse_milli(text)
        .filter(|milli| *milli >= 0)
        .and_then(|milli| u64::try_from(milli.div_euclid(1000)).ok())
        .ok_or_else(|| format!("invalid size {text:?}: expected bytes or e.g. 500Mi, 50Gi, 100G"))
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
                    metrics.container_removed(Reason::PodEnd);
                    tracing::info!(
                        id = container.short_id(),
                        name = container.name(),
                        image = %container.image,
                        state = %container.state,
                        "removed a container of this pod"
                    );
                }
                Ok(Removal::AlreadyGone | Removal::InUse) => {}
                Err(error) => {
                    tracing::warn!(%error, id = container.short_id(), "cannot remove a container of this pod")
                }
            }
        }
    }
    Ok(removed)
}

/// Removes every network and named volume labelled with the pod (after its containers: one
/// a container of someone else still uses is refused and kept). Returns how many networks
/// and volumes it removed.
pub async fn remove_pod_networks_and_volumes(
    client: &DockerClient,
    owner_pod_uid: &str,
    metrics: &GuardMetrics,
) -> Result<(u64, u64), DockerError> {
    let label = format!("{OWNER_LABEL}={owner_pod_uid}");
    let mut removed = (0, 0);
    for leftover in Leftovers::list(client, &label).await?.all() {
        let (kind, name) = leftover.kind_and_name();
        match leftover.remove(client).await {
            Ok(Removal::Removed) => {
                leftover.count(metrics, &mut removed);
                tracing::info!(name, "removed a {kind} of this pod");
            }
            Ok(Removal::AlreadyGone) => {}
            Ok(Removal::InUse) => {
                tracing::info!(
                    name,
                    "kept a {kind} of this pod: containers of others use it"
                )
            }
            Err(error) => tracing::warn!(%error, name, "cannot remove a {kind} of this pod"),
        }
    }
    Ok(removed)
}

/// What pods that are gone left on a daemon that runs inside this guard's pod: every
/// container (running or not, with its anonymous volumes), network and named volume labelled
/// with another owner. Only this pod's guard reaches such a daemon, so another owner is a
/// pod that ran on the same storage before (a persistent `/var/lib/docker`) and is gone.
/// Images stay: they are the layer cache that storage is kept for. Returns how many
/// containers, networks and volumes it removed.
pub async fn remove_left_by_earlier_pods(
    client: &DockerClient,
    owner_pod_uid: &str,
    metrics: &GuardMetrics,
) -> Result<(usize, usize, usize), DockerError> {
    let earlier = |owner: Option<&str>| owner.is_some_and(|o| !o.is_empty() && o != owner_pod_uid);
    let mut containers = 0;
    for container in client.containers_with_label(OWNER_LABEL).await? {
        if !earlier(container.label(OWNER_LABEL)) {
            continue;
        }
        match client.remove(&container.id).await {
            Ok(Removal::Removed) => {
                containers += 1;
                metrics.container_removed(Reason::OwnerGone);
                tracing::info!(
                    id = container.short_id(),
                    name = container.name(),
                    owner = container.label(OWNER_LABEL).unwrap_or_default(),
                    state = %container.state,
                    "removed a container an earlier pod left on this pod's daemon"
                );
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, id = container.short_id(), "cannot remove a container an earlier pod left")
            }
        }
    }
    let mut removed = (0, 0);
    let leftovers = Leftovers::list(client, OWNER_LABEL).await?.all();
    for leftover in leftovers.iter().filter(|l| earlier(l.owner())) {
        if let Ok(Removal::Removed) = leftover.remove(client).await {
            leftover.count(metrics, &mut removed);
            let (kind, name) = leftover.kind_and_name();
            tracing::info!(
                name,
                "removed a {kind} an earlier pod left on this pod's daemon"
            );
        }
    }
    let (networks, volumes) = removed;
    Ok((containers, networks as usize, volumes as usize))
}

/// Removes the images the pod made: the references it tagged or its BuildKit builds wrote
/// (`recorded`: names, and image ids) and the images
/// labelled `podmend.io/built-by-pod=<owner>` (built or committed), each without force, so
/// an image a container still uses stays. Pulled, loaded and imported images are not the
/// pod's and stay. Returns how many references (or untagged images) it removed.
pub async fn remove_pod_images(
    client: &DockerClient,
    owner_pod_uid: &str,
    recorded: &[String],
    metrics: &GuardMetrics,
) -> Result<u64, DockerError> {
    let mut removed = 0;
    for reference in recorded {
        if reference.starts_with("sha256:") {
            // An image a build wrote: its names first (the daemon refuses to remove an id
            // that more than one name points at), then the image.
            for name in client.image_tags(reference).await? {
                removed += u64::from(remove_pod_image(client, &name, metrics).await);
            }
        }
        removed += u64::from(remove_pod_image(client, reference, metrics).await);
    }
    let label = format!("{IMAGE_OWNER_LABEL}={owner_pod_uid}");
    for _ in 0..SHUTDOWN_PASSES {
        let mut progress = false;
        for image in client.images_with_label(&label).await? {
            let tags = image.tags();
            let names: Vec<&str> = if tags.is_empty() {
                vec![image.id.as_str()]
            } else {
                tags
            };
            for name in names {
                let gone = remove_pod_image(client, name, metrics).await;
                removed += u64::from(gone);
                progress |= gone;
            }
        }
        if !progress {
            break;
        }
    }
    Ok(removed)
}

/// Removes one image reference of the pod without force; whether it did.
async fn remove_pod_image(client: &DockerClient, name: &str, metrics: &GuardMetrics) -> bool {
    match client.remove_image(name).await {
        Ok(Removal::Removed) => {
            metrics.image_removed(Reason::PodEnd);
            tracing::info!(image = name, "removed an image of this pod");
            true
        }
        Ok(Removal::AlreadyGone) => false,
        Ok(Removal::InUse) => {
            tracing::info!(
                image = name,
                "kept an image of this pod: a container uses it"
            );
            false
        }
        Err(error) => {
            tracing::warn!(%error, image = name, "cannot remove an image of this pod");
            false
        }
    }
}

/// Which containers `guard reap` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReapMode {
    /// Those whose owner pod is not in the cluster, or has finished (kubeconfig, or the
    /// usual discovery); with `node`, only that node's pods are listed.
    OwnerGone {
        kubeconfig: Option<PathBuf>,
        node: Option<String>,
    },
    /// Stopped ones that stopped (or were created, if never started) this long ago.
    StoppedFor(Duration),
}

/// The image budget of `guard reap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageBudget {
    /// Above this many bytes of image layers, unused images are removed...
    pub high: u64,
    /// ...until the layers take this many or fewer.
    pub low: u64,
    /// Never an image created, tagged or first seen less than this long ago.
    pub min_age: Duration,
}

impl ImageBudget {
    /// A budget from `high` down to `low` bytes, for images older than `min_age`; `low` must
    /// not be above `high`.
    pub fn new(high: u64, low: u64, min_age: Duration) -> Result<Self, super::GuardError> {
        if low > high {
            return Err(super::GuardError::Usage(format!(
                "--images-low ({low} bytes) must not be above --images-high ({high} bytes)"
            )));
        }
        Ok(Self { high, low, min_age })
    }
}

/// What `guard reap` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Containers removed (or, in a dry run, that would be).
    pub removed: usize,
    /// Removals that failed.
    pub failed: usize,
    /// Labelled containers left alone.
    pub kept: usize,
    /// Images removed by the budget (or that would be).
    pub images_removed: usize,
    /// Labelled networks and named volumes removed (or that would be).
    pub networks_removed: usize,
    pub volumes_removed: usize,
}

/// A container `guard reap` removes, and why.
type Doomed = (ContainerSummary, String);

/// `podmend guard reap`, one pass: prints one line per container, network and named volume
/// it removes (or, with `dry_run`, would remove) to `out`. Networks and volumes go after the
/// containers, when their owner pod is gone (or, with `--older-than`, when no container of
/// their owner is left and they were created that long ago); one still in use is refused by
/// the daemon and kept.
pub async fn reap(
    client: &DockerClient,
    mode: &ReapMode,
    dry_run: bool,
    out: &mut dyn Write,
    metrics: &GuardMetrics,
) -> Result<ReapReport, ReapError> {
    // Containers (and networks and volumes) first, pods second: one listed before the pods
    // were is never mistaken for an orphan because its pod was created in between.
    let containers = client.containers_with_label(OWNER_LABEL).await?;
    let leftovers = Leftovers::list(client, OWNER_LABEL).await?;
    let (doomed, kept, reason, gone) = match mode {
        ReapMode::OwnerGone { kubeconfig, node } => {
            let pods = live_pod_uids(kubeconfig.as_deref(), node.as_deref()).await?;
            let (doomed, kept) = orphans(containers, &pods);
            let gone = leftovers.owner_gone(&pods);
            (doomed, kept, Reason::OwnerGone, gone)
        }
        ReapMode::StoppedFor(age) => {
            let mut left: HashMap<String, usize> = HashMap::new();
            for owner in containers.iter().filter_map(|c| c.label(OWNER_LABEL)) {
                *left.entry(owner.to_string()).or_default() += 1;
            }
            let (doomed, kept) = stopped_for(client, containers, *age).await?;
            for owner in doomed.iter().filter_map(|(c, _)| c.label(OWNER_LABEL)) {
                if let Some(count) = left.get_mut(owner) {
                    *count -= 1;
                }
            }
            left.retain(|_, count| *count > 0);
            let gone = leftovers.unused_for(&left, *age, unix_now());
            (doomed, kept, Reason::OlderThan, gone)
        }
    };
    let mut report = ReapReport {
        kept,
        ..ReapReport::default()
    };
    remove_containers(client, doomed, reason, dry_run, out, metrics, &mut report).await?;
    remove_leftovers(client, gone, dry_run, out, metrics, &mut report).await?;
    Ok(report)
}

/// Removes the doomed containers, one line each on `out`.
async fn remove_containers(
    client: &DockerClient,
    doomed: Vec<Doomed>,
    reason: Reason,
    dry_run: bool,
    out: &mut dyn Write,
    metrics: &GuardMetrics,
    report: &mut ReapReport,
) -> Result<(), ReapError> {
    for (container, why) in doomed {
        let owner = container.label(OWNER_LABEL).unwrap_or_default();
        let name = match container.name() {
            "" => "-",
            name => name,
        };
        let describe = format!(
            "{} {name} {OWNER_LABEL}={owner} ({why})",
            container.short_id()
        );
        if dry_run {
            writeln!(out, "would remove {describe}").map_err(ReapError::Output)?;
            report.removed += 1;
            continue;
        }
        match client.remove(&container.id).await {
            Ok(_) => {
                writeln!(out, "removed {describe}").map_err(ReapError::Output)?;
                metrics.container_removed(reason);
                report.removed += 1;
            }
            Err(error) => {
                writeln!(out, "failed to remove {describe}: {error}").map_err(ReapError::Output)?;
                report.failed += 1;
            }
        }
    }
    Ok(())
}

/// The networks and named volumes guards labelled with their owner pod, as listed at the
/// start of a pass.
struct Leftovers {
    networks: Vec<NetworkSummary>,
    volumes: Vec<VolumeSummary>,
}

/// A network or named volume to remove, and why.
enum Leftover {
    Network(NetworkSummary, String),
    Volume(VolumeSummary, String),
}

impl Leftover {
    fn kind_and_name(&self) -> (&'static str, &str) {
        match self {
            Leftover::Network(n, _) => ("network", &n.name),
            Leftover::Volume(v, _) => ("volume", &v.name),
        }
    }

    fn owner(&self) -> Option<&str> {
        match self {
            Leftover::Network(n, _) => n.label(OWNER_LABEL),
            Leftover::Volume(v, _) => v.label(OWNER_LABEL),
        }
    }

    /// Removes it without force: one in use is refused by the daemon and kept.
    async fn remove(&self, client: &DockerClient) -> Result<Removal, DockerError> {
        match self {
            Leftover::Network(n, _) => client.remove_network(&n.id).await,
            Leftover::Volume(v, _) => client.remove_volume(&v.name).await,
        }
    }

    /// Counts its removal in the metrics and in `removed` (networks, volumes).
    fn count(&self, metrics: &GuardMetrics, removed: &mut (u64, u64)) {
        match self {
            Leftover::Network(..) => {
                metrics.network_removed();
                removed.0 += 1;
            }
            Leftover::Volume(..) => {
                metrics.volume_removed();
                removed.1 += 1;
            }
        }
    }
}

impl Leftovers {
    /// Those carrying `label` (`KEY` or `KEY=VALUE`).
    async fn list(client: &DockerClient, label: &str) -> Result<Self, DockerError> {
        Ok(Self {
            networks: client.networks_with_label(label).await?,
            volumes: client.volumes_with_label(label).await?,
        })
    }

    /// All of them, networks first (a network holds no volume; both wait for containers).
    fn all(self) -> Vec<Leftover> {
        let networks = self
            .networks
            .into_iter()
            .map(|n| Leftover::Network(n, String::new()));
        let volumes = self
            .volumes
            .into_iter()
            .map(|v| Leftover::Volume(v, String::new()));
        networks.chain(volumes).collect()
    }

    /// Those whose owner is not among the live `pods`. A blank owner is never a guard's.
    fn owner_gone(self, pods: &HashSet<String>) -> Vec<Leftover> {
        let why = || "its owner pod no longer exists".to_string();
        let gone = |owner: Option<&str>| owner.is_some_and(|o| !o.is_empty() && !pods.contains(o));
        let networks = self
            .networks
            .into_iter()
            .filter(|n| gone(n.label(OWNER_LABEL)));
        let volumes = self
            .volumes
            .into_iter()
            .filter(|v| gone(v.label(OWNER_LABEL)));
        networks
            .map(|n| Leftover::Network(n, why()))
            .chain(volumes.map(|v| Leftover::Volume(v, why())))
            .collect()
    }

    /// Those whose owner has no container left (`left` counts the owners that do) and that
    /// were created at least `age` before `now` (unix seconds).
    fn unused_for(self, left: &HashMap<String, usize>, age: Duration, now: i64) -> Vec<Leftover> {
        let old = |owner: Option<&str>, created: &str| {
            let owner = owner.unwrap_or_default();
            let created = parse_rfc3339(created).unwrap_or(now);
            !owner.is_empty()
                && !left.contains_key(owner)
                && now.saturating_sub(created) >= age.as_secs() as i64
        };
        let why = || {
            format!(
                "no container of its owner pod is left, created {} ago or more",
                format_duration(age)
            )
        };
        let networks = self
            .networks
            .into_iter()
            .filter(|n| old(n.label(OWNER_LABEL), &n.created));
        let volumes = self
            .volumes
            .into_iter()
            .filter(|v| old(v.label(OWNER_LABEL), &v.created_at));
        networks
            .map(|n| Leftover::Network(n, why()))
            .chain(volumes.map(|v| Leftover::Volume(v, why())))
            .collect()
    }
}

/// Removes the doomed networks and volumes without force, one line each on `out`; one in
/// use is kept and said so.
async fn remove_leftovers(
    client: &DockerClient,
    gone: Vec<Leftover>,
    dry_run: bool,
    out: &mut dyn Write,
    metrics: &GuardMetrics,
    report: &mut ReapReport,
) -> Result<(), ReapError> {
    for leftover in gone {
        let (kind, name) = leftover.kind_and_name();
        let why = match &leftover {
            Leftover::Network(_, why) | Leftover::Volume(_, why) => why,
        };
        let owner = leftover.owner().unwrap_or_default();
        let describe = format!("{kind} {name} {OWNER_LABEL}={owner} ({why})");
        if dry_run {
            writeln!(out, "would remove {describe}").map_err(ReapError::Output)?;
            count_leftover(&leftover, report);
            continue;
        }
        match leftover.remove(client).await {
            Ok(Removal::Removed) => {
                writeln!(out, "removed {describe}").map_err(ReapError::Output)?;
                count_leftover(&leftover, report);
                leftover.count(metrics, &mut (0, 0));
            }
            Ok(Removal::AlreadyGone) => {}
            Ok(Removal::InUse) => {
                writeln!(out, "kept {describe}: a container still uses it")
                    .map_err(ReapError::Output)?;
            }
            Err(error) => {
                writeln!(out, "failed to remove {describe}: {error}").map_err(ReapError::Output)?;
                report.failed += 1;
            }
        }
    }
    Ok(())
}

fn count_leftover(leftover: &Leftover, report: &mut ReapReport) {
    match leftover {
        Leftover::Network(..) => report.networks_removed += 1,
        Leftover::Volume(..) => report.volumes_removed += 1,
    }
}

/// The containers whose owner is not among the live `pods`, and how many others are kept.
fn orphans(containers: Vec<ContainerSummary>, pods: &HashSet<String>) -> (Vec<Doomed>, usize) {
    let mut doomed = Vec::new();
    let mut kept = 0;
    for container in containers {
        let owner = container.label(OWNER_LABEL).unwrap_or_default();
        // A blank owner is inherited from a committed image, not set by a guard.
        if owner.is_empty() || pods.contains(owner) {
            kept += 1;
        } else {
            doomed.push((container, "its owner pod no longer exists".to_string()));
        }
    }
    (doomed, kept)
}

/// The stopped containers that stopped (or were created, if never started) at least `age`
/// ago, and how many others are kept.
async fn stopped_for(
    client: &DockerClient,
    containers: Vec<ContainerSummary>,
    age: Duration,
) -> Result<(Vec<Doomed>, usize), ReapError> {
    let now = unix_now();
    let mut doomed = Vec::new();
    let mut kept = 0;
    for container in containers {
        if !container.is_stopped() || container.label(OWNER_LABEL) == Some("") {
            kept += 1;
            continue;
        }
        let stopped = match client.finished_at(&container.id).await {
            Ok(finished) => finished.unwrap_or(container.created),
            Err(DockerError::Status { status: 404, .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        let idle = Duration::from_secs(now.saturating_sub(stopped).max(0) as u64);
        if idle >= age {
            let reason = format!("{} for {}", container.state, format_duration(idle));
            doomed.push((container, reason));
        } else {
            kept += 1;
        }
    }
    Ok((doomed, kept))
}

/// The UIDs of every pod that has not finished (phase neither Succeeded nor Failed: its
/// guard has run its clean-up), listed 500 at a time; with `node`, only that node's.
async fn live_pod_uids(
    kubeconfig: Option<&std::path::Path>,
    node: Option<&str>,
) -> Result<HashSet<String>, ReapError> {
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
    if let Some(node) = node.filter(|n| !n.is_empty()) {
        params = params.fields(&format!("spec.nodeName={node}"));
    }
    let mut uids = HashSet::new();
    let mut listed = 0;
    loop {
        let page = pods.list(&params).await.map_err(ReapError::ListPods)?;
        listed += page.items.len();
        uids.extend(page.items.into_iter().filter_map(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            let finished = matches!(phase, Some("Succeeded" | "Failed"));
            (!finished).then_some(pod.metadata.uid).flatten()
        }));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    // A misspelt node name lists nothing, and every container would look orphaned.
    if let Some(node) = node.filter(|n| !n.is_empty())
        && listed == 0
    {
        return Err(ReapError::NoPodsOnNode(node.to_string()));
    }
    Ok(uids)
}

/// What the reaper knows of one image between passes (the Engine API keeps no last-used
/// time, so the reaper keeps its own, as the kubelet does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageRecord {
    /// When the reaper first saw it (unix seconds); `None` if it was there at the first pass.
    pub first_seen: Option<i64>,
    /// The last pass that saw a container (running or stopped) use it.
    pub used_at: Option<i64>,
    pub created: i64,
    pub last_tagged: Option<i64>,
}

impl ImageRecord {
    /// Its last use: seen in use by a container, else created or tagged, whichever is later.
    pub fn last_used(&self) -> i64 {
        self.used_at
            .unwrap_or(0)
            .max(self.created)
            .max(self.last_tagged.unwrap_or(0))
    }

    /// What its age is counted from for `--image-min-age`: created, tagged or first seen.
    pub fn born(&self) -> i64 {
        self.created
            .max(self.last_tagged.unwrap_or(0))
            .max(self.first_seen.unwrap_or(0))
    }
}

/// One image as the budget judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetImage {
    pub id: String,
    /// Bytes removing it frees (its size less what it shares).
    pub frees: u64,
    /// A container (running or stopped) uses it.
    pub in_use: bool,
    /// Another image is built on it: it goes when its children do.
    pub parent: bool,
    pub record: ImageRecord,
}

/// The images the budget may remove, least recently used first (ties: born first, then by
/// id): not in use, not a parent, and older than `min_age` at `now`.
pub fn budget_order(images: &[BudgetImage], now: i64, min_age: Duration) -> Vec<&BudgetImage> {
    let min_age = i64::try_from(min_age.as_secs()).unwrap_or(i64::MAX);
    let mut candidates: Vec<&BudgetImage> = images
        .iter()
        .filter(|i| !i.in_use && !i.parent && now.saturating_sub(i.record.born()) >= min_age)
        .collect();
    candidates.sort_by(|a, b| {
        (a.record.last_used(), a.record.born(), &a.id).cmp(&(
            b.record.last_used(),
            b.record.born(),
            &b.id,
        ))
    });
    candidates
}

/// The reaper's memory of images, kept between passes of `--interval`.
#[derive(Debug, Default)]
pub struct ImageMemory {
    records: HashMap<String, ImageRecord>,
    seen_once: bool,
}

/// One image budget pass: lists the daemon's images and containers, updates `memory`, and
/// when the layers take more than `budget.high`, removes (or lists, with `dry_run`) unused
/// images least recently used first until they take `budget.low` or less.
pub async fn image_budget(
    client: &DockerClient,
    budget: ImageBudget,
    memory: &mut ImageMemory,
    dry_run: bool,
    out: &mut dyn Write,
    metrics: &GuardMetrics,
) -> Result<usize, ReapError> {
    let mut pass = BudgetPass {
        client,
        budget,
        dry_run,
        metrics,
        tried: HashSet::new(),
        removed: 0,
    };
    for round in 0..BUDGET_ROUNDS {
        let now = unix_now();
        let listing = list_images(client, memory, now).await?;
        if round == 0 && listing.layers <= budget.high {
            tracing::debug!(
                layers = listing.layers,
                high = budget.high,
                "images within the budget"
            );
            return Ok(0);
        }
        if listing.layers <= budget.low {
            break;
        }
        let (estimate, tried_any) = pass.round(&listing, now, out).await?;
        if dry_run || !tried_any {
            if estimate > budget.low {
                let line = format!(
                    "images take {} after this pass, above the low mark {}: the rest is in use, \
                     a parent of another image, or younger than --image-min-age",
                    bytes(estimate),
                    bytes(budget.low)
                );
                tracing::warn!("{line}");
                writeln!(out, "{line}").map_err(ReapError::Output)?;
            }
            break;
        }
    }
    Ok(pass.removed)
}

/// The daemon's images as one budget round sees them.
struct ImageListing {
    /// Bytes the image layers take (`GET /system/df` LayersSize).
    layers: u64,
    images: Vec<ImageSummary>,
    /// Every image as the budget judges it.
    judged: Vec<BudgetImage>,
}

/// Lists the daemon's usage, images and containers, and updates `memory` from them.
async fn list_images(
    client: &DockerClient,
    memory: &mut ImageMemory,
    now: i64,
) -> Result<ImageListing, ReapError> {
    let usage = client.disk_usage().await?;
    let layers = u64::try_from(usage.layers_size).unwrap_or(0);
    let images = usage.images.unwrap_or_default();
    let used: HashSet<String> = client
        .all_containers()
        .await?
        .into_iter()
        .map(|c| c.image_id)
        .collect();
    let parents: HashSet<String> = client
        .all_images()
        .await?
        .into_iter()
        .map(|i| i.parent_id)
        .filter(|p| !p.is_empty())
        .collect();
    let judged = remember(client, memory, &images, &used, &parents, now).await;
    Ok(ImageListing {
        layers,
        images,
        judged,
    })
}

/// The removals of one budget pass, over its rounds.
struct BudgetPass<'a> {
    client: &'a DockerClient,
    budget: ImageBudget,
    dry_run: bool,
    metrics: &'a GuardMetrics,
    /// Images already tried (removed or not), never tried twice.
    tried: HashSet<String>,
    removed: usize,
}

impl BudgetPass<'_> {
    /// Removes (or lists) unused images from the least recently used until the estimate is
    /// down to the low mark. Returns the estimate after, and whether any image was tried.
    async fn round(
        &mut self,
        listing: &ImageListing,
        now: i64,
        out: &mut dyn Write,
    ) -> Result<(u64, bool), ReapError> {
        let mut estimate = listing.layers;
        let mut tried_any = false;
        for image in budget_order(&listing.judged, now, self.budget.min_age) {
            if estimate <= self.budget.low {
                break;
            }
            if !self.tried.insert(image.id.clone()) {
                continue;
            }
            tried_any = true;
            let Some(summary) = listing.images.iter().find(|i| i.id == image.id) else {
                continue;
            };
            let describe = describe_image(summary, &image.record, now);
            if self.dry_run {
                writeln!(out, "would remove image {describe}").map_err(ReapError::Output)?;
            } else if remove_whole_image(self.client, summary).await {
                writeln!(out, "removed image {describe}").map_err(ReapError::Output)?;
                self.metrics.image_removed(Reason::Budget);
            } else {
                continue;
            }
            estimate = estimate.saturating_sub(image.frees);
            self.removed += 1;
        }
        Ok((estimate, tried_any))
    }
}

/// Updates the reaper's records from one listing; returns every image as the budget judges it.
async fn remember(
    client: &DockerClient,
    memory: &mut ImageMemory,
    images: &[ImageSummary],
    used: &HashSet<String>,
    parents: &HashSet<String>,
    now: i64,
) -> Vec<BudgetImage> {
    let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
    memory.records.retain(|id, _| present.contains(id.as_str()));
    let mut judged = Vec::with_capacity(images.len());
    for image in images {
        let record = match memory.records.get(&image.id) {
            Some(record) => *record,
            None => {
                let (created, last_tagged) = match client.image_times(&image.id).await {
                    Ok(times) => times,
                    Err(_) => (image.created, None),
                };
                ImageRecord {
                    first_seen: memory.seen_once.then_some(now),
                    used_at: None,
                    created,
                    last_tagged,
                }
            }
        };
        let in_use = used.contains(&image.id) || image.containers > 0;
        let record = ImageRecord {
            used_at: if in_use { Some(now) } else { record.used_at },
            ..record
        };
        memory.records.insert(image.id.clone(), record);
        let shared = u64::try_from(image.shared_size).unwrap_or(0);
        judged.push(BudgetImage {
            id: image.id.clone(),
            frees: u64::try_from(image.size)
                .unwrap_or(0)
                .saturating_sub(shared),
            in_use,
            parent: parents.contains(&image.id),
            record,
        });
    }
    memory.seen_once = true;
    judged
}

/// Removes an image with all its tags, without force; whether it is gone.
async fn remove_whole_image(client: &DockerClient, image: &ImageSummary) -> bool {
    let tags = image.tags();
    let names: Vec<&str> = if tags.is_empty() {
        vec![image.id.as_str()]
    } else {
        tags
    };
    for name in names {
        match client.remove_image(name).await {
            Ok(Removal::Removed | Removal::AlreadyGone) => {}
            Ok(Removal::InUse) => {
                tracing::info!(image = name, "kept an image: a container uses it now");
                return false;
            }
            Err(error) => {
                tracing::warn!(%error, image = name, "cannot remove an image");
                return false;
            }
        }
    }
    true
}

fn describe_image(image: &ImageSummary, record: &ImageRecord, now: i64) -> String {
    let tags = image.tags();
    format!(
        "{} {} (last used {} ago, {})",
        image.short_id(),
        if tags.is_empty() {
            "<none>".to_string()
        } else {
            tags.join(",")
        },
        format_duration(Duration::from_secs(
            now.saturating_sub(record.last_used()).max(0) as u64
        )),
        bytes(u64::try_from(image.size).unwrap_or(0)),
    )
}

/// `1.5 GiB`, `12 MiB`, `900 B`.
fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.1} {unit}", n as f64 / size as f64);
        }
    }
    format!("{n} B")
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
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

    #[test]
    fn sizes_are_quantities_or_bytes() {
        assert_eq!(parse_size("50Gi"), Ok(50 << 30));
        assert_eq!(parse_size("500Mi"), Ok(500 << 20));
        assert_eq!(parse_size("100G"), Ok(100_000_000_000));
        assert_eq!(parse_size("12345"), Ok(12345));
        assert!(parse_size("-1Gi").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(900), "900 B");
    }

    fn image(id: &str, created: i64, used_at: Option<i64>) -> BudgetImage {
        BudgetImage {
            id: id.to_string(),
            frees: 10,
            in_use: false,
            parent: false,
            record: ImageRecord {
                first_seen: None,
                used_at,
                created,
                last_tagged: None,
            },
        }
    }

    #[test]
    fn the_budget_takes_the_least_recently_used_unused_images_first() {
        let now = 10_000;
        let min_age = Duration::from_secs(120);
        let order = |images: &[BudgetImage]| -> Vec<String> {
            budget_order(images, now, min_age)
                .into_iter()
                .map(|i| i.id.clone())
                .collect()
        };
        // Created long ago but used a minute ago: after one created later and never used.
        let images = [
            image("used-lately", 100, Some(9_940)),
            image("old", 200, None),
            image("older", 150, None),
        ];
        assert_eq!(order(&images), ["older", "old", "used-lately"]);
        // In use, a parent, or too young: never.
        let mut in_use = image("in-use", 1, None);
        in_use.in_use = true;
        let mut parent = image("parent", 1, None);
        parent.parent = true;
        let young = image("young", now - 60, None);
        let mut seen_lately = image("seen-lately", 1, None);
        seen_lately.record.first_seen = Some(now - 60);
        let mut tagged_lately = image("tagged-lately", 1, None);
        tagged_lately.record.last_tagged = Some(now - 60);
        let images = [
            in_use,
            parent,
            young,
            seen_lately,
            tagged_lately,
            image("a", 5, None),
        ];
        assert_eq!(order(&images), ["a"]);
        // Ties: the one born first, then by id.
        let images = [image("b", 7, None), image("a", 7, None)];
        assert_eq!(order(&images), ["a", "b"]);
    }

    #[test]
    fn an_image_seen_in_use_was_last_used_then() {
        let record = ImageRecord {
            first_seen: None,
            used_at: Some(500),
            created: 100,
            last_tagged: Some(300),
        };
        assert_eq!(record.last_used(), 500);
        assert_eq!(
            ImageRecord {
                used_at: None,
                ..record
            }
            .last_used(),
            300
        );
        assert_eq!(record.born(), 300);
    }
}
