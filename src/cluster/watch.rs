//! Reflector caches of Nodes and LimitRanges, kept by kube-runtime watchers, that answer
//! [`ClusterView`] for `serve`; plus how a Kubernetes client is found ([`Lookups`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{LimitRangeItem, Taint};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio::task::AbortHandle;

use super::ClusterView;
use super::cached::{CachedLimitRange, CachedNode};

/// Nodes and LimitRanges as last seen by the watchers.
///
/// Answers may be stale: they come from caches that follow the API server with some delay,
/// and that stay empty (every node unknown) until the first list has arrived
/// (see [`CacheReadiness`]).
pub struct WatchedCluster {
    nodes: Store<CachedNode>,
    limit_ranges: Store<CachedLimitRange>,
    /// Watcher tasks, stopped when the cluster view is dropped.
    tasks: Vec<AbortHandle>,
}

impl WatchedCluster {
    /// A view over stores filled by someone else (no tasks are started).
    pub fn from_stores(nodes: Store<CachedNode>, limit_ranges: Store<CachedLimitRange>) -> Self {
        Self {
            nodes,
            limit_ranges,
            tasks: Vec::new(),
        }
    }
}

impl fmt::Debug for WatchedCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedCluster")
            .field("nodes", &self.nodes.len())
            .field("limit_ranges", &self.limit_ranges.len())
            .finish_non_exhaustive()
    }
}

impl Drop for WatchedCluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ClusterView for WatchedCluster {
    fn lookups_enabled(&self) -> bool {
        true
    }

    fn node_taints(&self, name: &str) -> Option<Vec<Taint>> {
        let node = self.nodes.get(&ObjectRef::new(name))?;
        Some(node.taints().to_vec())
    }

    fn node_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        let node = self.nodes.get(&ObjectRef::new(name))?;
        Some(node.labels())
    }

    fn limit_range_items(&self, namespace: &str) -> Vec<LimitRangeItem> {
        let mut ranges = self
            .limit_ranges
            .state_filter(|lr| lr.metadata.namespace.as_deref() == Some(namespace));
        // Stable order whatever the cache's hashing does.
        ranges.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        ranges
            .iter()
            .flat_map(|lr| lr.items().iter().cloned())
            .collect()
    }
}

/// How long a Node or LimitRange watch may keep failing before `/readyz` says not ready.
///
/// Long enough that a watch cut and resumed (API server restart, load balancer idle
/// timeout) never flips readiness; short enough that a webhook answering from a cache that
/// stopped following the cluster is taken out of the Service within a minute.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);
/// While a watch fails, how often a one-item list checks whether the API server answers
/// again (a resumed watch sends nothing until something changes).
const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// One cache: whether it had its first full list, and since when its watch has been failing.
#[derive(Debug, Default)]
struct CacheHealth {
    synced: AtomicBool,
    failing_since: Mutex<Option<Instant>>,
}

impl CacheHealth {
    fn failing_since(&self) -> Option<Instant> {
        *self.failing_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a failed watch; the clock starts at the first failure after a success.
    fn failed(&self) {
        self.failing_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
    }

    /// Records that the API server answered; returns true when the watch had been failing.
    fn recovered(&self) -> bool {
        self.failing_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }
}

/// Whether the Node and LimitRange caches can be trusted: both had their first full list,
/// and neither watch has been failing for longer than `stale_after`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CacheReadiness {
    nodes: Arc<CacheHealth>,
    limit_ranges: Arc<CacheHealth>,
    stale_after: Duration,
}

impl Default for CacheReadiness {
    fn default() -> Self {
        Self::new(DEFAULT_STALE_AFTER)
    }
}

impl CacheReadiness {
    fn new(stale_after: Duration) -> Self {
        Self {
            nodes: Arc::default(),
            limit_ranges: Arc::default(),
            stale_after,
        }
    }

    /// True once both caches had their first full list, while neither watch is stale.
    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    /// Why the caches cannot be trusted, in words for `/readyz`; `None` when they can.
    pub fn not_ready_reason(&self) -> Option<String> {
        let caches = [("Node", &self.nodes), ("LimitRange", &self.limit_ranges)];
        if let Some((what, _)) = caches
            .iter()
            .find(|(_, health)| !health.synced.load(Ordering::Acquire))
        {
            return Some(format!("the {what} cache has not had its first list yet"));
        }
        caches.iter().find_map(|(what, health)| {
            let failing = health.failing_since()?.elapsed();
            (failing >= self.stale_after).then(|| {
                format!(
                    "the {what} watch has been failing for {}s, so its cache may be stale; \
                     check that the API server is reachable and that podmend's service account \
                     may list and watch {what}s",
                    failing.as_secs()
                )
            })
        })
    }
}

/// Starts watchers of every Node and every LimitRange on the current tokio runtime, with
/// [`DEFAULT_STALE_AFTER`]; see [`start_with`].
pub fn start(client: Client) -> (Arc<WatchedCluster>, CacheReadiness) {
    start_with(client, DEFAULT_STALE_AFTER)
}

/// Starts watchers of every Node and every LimitRange on the current tokio runtime.
///
/// The returned view answers from the caches at once (empty at first); readiness turns true
/// once both had their first list. A failing or cut watch is retried with kube's default
/// backoff and logged at warn; if it keeps failing for `stale_after`, readiness turns false
/// until the API server answers again. Outside a tokio runtime nothing is started and the
/// caches never get ready. The watchers stop when the returned [`WatchedCluster`] is dropped.
pub fn start_with(client: Client, stale_after: Duration) -> (Arc<WatchedCluster>, CacheReadiness) {
    let (nodes, node_writer) = reflector::store::<CachedNode>();
    let (limit_ranges, lr_writer) = reflector::store::<CachedLimitRange>();
    let readiness = CacheReadiness::new(stale_after);
    let mut cluster = WatchedCluster::from_stores(nodes.clone(), limit_ranges.clone());

    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::error!(
            "cluster caches not started: no tokio runtime; node taints and LimitRanges stay unknown"
        );
        return (Arc::new(cluster), readiness);
    };

    // The cached types name the Node and LimitRange resources but declare only what rules
    // read: the rest of each object is skipped while it is parsed (`cached.rs`).
    let node_api = Api::<CachedNode>::all(client.clone());
    let lr_api = Api::<CachedLimitRange>::all(client);
    let node_stream = reflector::reflector(
        node_writer,
        watcher(node_api.clone(), watcher::Config::default()),
    )
    .default_backoff();
    let lr_stream = reflector::reflector(
        lr_writer,
        watcher(lr_api.clone(), watcher::Config::default()),
    )
    .default_backoff();

    cluster.tasks = vec![
        runtime
            .spawn(drive(
                node_stream,
                node_api,
                readiness.nodes.clone(),
                "nodes",
            ))
            .abort_handle(),
        runtime
            .spawn(drive(
                lr_stream,
                lr_api,
                readiness.limit_ranges.clone(),
                "limitranges",
            ))
            .abort_handle(),
        runtime
            .spawn(mark_when_ready(nodes, readiness.nodes.clone(), "nodes"))
            .abort_handle(),
        runtime
            .spawn(mark_when_ready(
                limit_ranges,
                readiness.limit_ranges.clone(),
                "limitranges",
            ))
            .abort_handle(),
    ];
    (Arc::new(cluster), readiness)
}

/// Polls a reflector stream forever, keeping `health` up to date and logging failures (the
/// backoff makes the watcher retry). While the watch fails, a one-item list every
/// [`PROBE_INTERVAL`] tells when the API server answers again: a resumed watch is silent
/// until something changes, so the stream alone cannot say it recovered.
async fn drive<S, T, K>(stream: S, api: Api<K>, health: Arc<CacheHealth>, what: &'static str)
where
    S: Stream<Item = Result<T, watcher::Error>>,
    K: Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    let mut stream = std::pin::pin!(stream);
    loop {
        let item = if health.failing_since().is_some() {
            tokio::select! {
                item = stream.next() => item,
                () = tokio::time::sleep(PROBE_INTERVAL) => {
                    if api.list_metadata(&ListParams::default().limit(1)).await.is_ok()
                        && health.recovered()
                    {
                        tracing::info!(resource = what, "the API server answers again; watch resumed");
                    }
                    continue;
                }
            }
        } else {
            stream.next().await
        };
        match item {
            None => break,
            Some(Ok(_)) => {
                if health.recovered() {
                    tracing::info!(resource = what, "watch of the cluster resumed");
                }
            }
            Some(Err(err)) => {
                health.failed();
                tracing::warn!(resource = what, error = %err, "watch of the cluster failed; retrying with backoff");
            }
        }
    }
    tracing::warn!(
        resource = what,
        "watch stream of the cluster ended; cache no longer updated"
    );
}

/// Marks `health` synced once `store` had its first full list.
async fn mark_when_ready<K>(store: Store<K>, health: Arc<CacheHealth>, what: &'static str)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match store.wait_until_ready().await {
        Ok(()) => {
            health.synced.store(true, Ordering::Release);
            tracing::info!(
                resource = what,
                objects = store.len(),
                "cluster cache ready"
            );
        }
        Err(err) => tracing::warn!(resource = what, error = %err, "cluster cache never got ready"),
    }
}

/// Whether rules can look things up in a cluster, and with which client.
pub enum Lookups {
    /// A client for the cluster found.
    On(Client),
    /// No cluster: why, in words for a person.
    Off { reason: String },
}

impl fmt::Debug for Lookups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::On(_) => f.write_str("On(Client)"),
            Self::Off { reason } => f.debug_struct("Off").field("reason", reason).finish(),
        }
    }
}

const NOT_LOOKED_UP: &str = "node taints and LimitRanges will not be looked up";

/// Finds a cluster as kubectl would: `KUBECONFIG` or `~/.kube/config`, else the in-cluster
/// service account.
pub async fn lookups_from_environment() -> Lookups {
    match kube::Config::infer().await {
        Ok(config) => lookups_from_config(config),
        Err(err) => Lookups::Off {
            reason: format!("no kubeconfig and not in a cluster: {NOT_LOOKED_UP} ({err})"),
        },
    }
}

/// Uses the current context of the kubeconfig file at `path`.
pub async fn lookups_from_kubeconfig(path: &Path) -> Lookups {
    let kubeconfig = match Kubeconfig::read_from(path) {
        Ok(kubeconfig) => kubeconfig,
        Err(err) => {
            return Lookups::Off {
                reason: format!(
                    "cannot use kubeconfig {}: {err}: {NOT_LOOKED_UP}",
                    path.display()
                ),
            };
        }
    };
    match kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await {
        Ok(config) => lookups_from_config(config),
        Err(err) => Lookups::Off {
            reason: format!(
                "cannot use kubeconfig {}: {err}: {NOT_LOOKED_UP}",
                path.display()
            ),
        },
    }
}

fn lookups_from_config(config: kube::Config) -> Lookups {
    match Client::try_from(config) {
        Ok(client) => Lookups::On(client),
        Err(err) => Lookups::Off {
            reason: format!("cannot build a Kubernetes client: {err}: {NOT_LOOKED_UP}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cached::{LimitRangeLimits, NodeTaints};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.to_string(),
            effect: effect.to_string(),
            ..Taint::default()
        }
    }

    fn node(name: &str, taints: Option<Vec<Taint>>) -> CachedNode {
        CachedNode {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeTaints { taints }),
        }
    }

    fn limit_range(namespace: &str, name: &str, item_type: &str) -> CachedLimitRange {
        CachedLimitRange {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LimitRangeLimits {
                limits: vec![LimitRangeItem {
                    type_: item_type.to_string(),
                    ..LimitRangeItem::default()
                }],
            }),
        }
    }

    fn fill<K>(writer: &mut Writer<K>, objects: Vec<K>)
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        writer.apply_watcher_event(&Event::Init);
        for obj in objects {
            writer.apply_watcher_event(&Event::InitApply(obj));
        }
        writer.apply_watcher_event(&Event::InitDone);
    }

    fn cluster(nodes: Vec<CachedNode>, ranges: Vec<CachedLimitRange>) -> WatchedCluster {
        let (node_store, mut node_writer) = reflector::store();
        let (lr_store, mut lr_writer) = reflector::store();
        fill(&mut node_writer, nodes);
        fill(&mut lr_writer, ranges);
        WatchedCluster::from_stores(node_store, lr_store)
    }

    #[test]
    fn a_cached_node_answers_its_taints() {
        let taints = vec![taint("node.kubernetes.io/unschedulable", "NoSchedule")];
        let view = cluster(vec![node("n1", Some(taints.clone()))], vec![]);
        assert!(view.lookups_enabled());
        assert_eq!(view.node_taints("n1"), Some(taints));
    }

    #[test]
    fn a_cached_node_without_taints_answers_an_empty_list() {
        let view = cluster(vec![node("n1", None), node("n2", Some(vec![]))], vec![]);
        assert_eq!(view.node_taints("n1"), Some(vec![]));
        assert_eq!(view.node_taints("n2"), Some(vec![]));
    }

    #[test]
    fn a_node_without_spec_answers_an_empty_list() {
        let mut bare = node("n1", None);
        bare.spec = None;
        let view = cluster(vec![bare], vec![]);
        assert_eq!(view.node_taints("n1"), Some(vec![]));
    }

    #[test]
    fn a_cached_node_answers_its_labels_and_an_unknown_node_none() {
        let mut labelled = node("vk", None);
        labelled.metadata.labels = Some(BTreeMap::from([(
            "type".to_string(),
            "virtual-kubelet".to_string(),
        )]));
        let view = cluster(vec![labelled, node("n1", None)], vec![]);
        assert_eq!(
            view.node_labels("vk").and_then(|l| l.get("type").cloned()),
            Some("virtual-kubelet".to_string())
        );
        assert_eq!(view.node_labels("n1"), Some(BTreeMap::new()));
        assert_eq!(view.node_labels("n2"), None);
    }

    #[test]
    fn an_unknown_node_answers_none() {
        let view = cluster(vec![node("n1", None)], vec![]);
        assert_eq!(view.node_taints("n2"), None);
    }

    #[test]
    fn limit_range_items_come_from_every_limit_range_of_the_namespace_only() {
        let view = cluster(
            vec![],
            vec![
                limit_range("team-a", "b", "Pod"),
                limit_range("team-a", "a", "Container"),
                limit_range("team-b", "c", "PersistentVolumeClaim"),
            ],
        );
        let types: Vec<String> = view
            .limit_range_items("team-a")
            .into_iter()
            .map(|item| item.type_)
            .collect();
        assert_eq!(types, vec!["Container", "Pod"]);
        assert!(view.limit_range_items("team-c").is_empty());
    }

    #[tokio::test]
    async fn readiness_waits_for_both_caches() {
        let (node_store, mut node_writer) = reflector::store::<CachedNode>();
        let (lr_store, mut lr_writer) = reflector::store::<CachedLimitRange>();
        let readiness = CacheReadiness::default();
        assert_eq!(
            readiness.not_ready_reason().as_deref(),
            Some("the Node cache has not had its first list yet")
        );
        let nodes_task = tokio::spawn(mark_when_ready(
            node_store,
            readiness.nodes.clone(),
            "nodes",
        ));
        let lr_task = tokio::spawn(mark_when_ready(
            lr_store,
            readiness.limit_ranges.clone(),
            "limitranges",
        ));
        assert!(!readiness.is_ready());

        fill(&mut node_writer, vec![node("n1", None)]);
        nodes_task.await.unwrap();
        assert!(!readiness.clone().is_ready());

        fill(&mut lr_writer, vec![]);
        lr_task.await.unwrap();
        assert!(readiness.is_ready());
    }

    #[test]
    fn a_watch_failing_longer_than_the_grace_makes_the_caches_not_ready_until_it_recovers() {
        let readiness = CacheReadiness::new(Duration::ZERO);
        readiness.nodes.synced.store(true, Ordering::Release);
        readiness.limit_ranges.synced.store(true, Ordering::Release);
        assert!(readiness.is_ready());

        readiness.limit_ranges.failed();
        let reason = readiness.not_ready_reason().unwrap_or_default();
        assert!(
            reason.contains("LimitRange watch has been failing")
                && reason.contains("list and watch"),
            "{reason}"
        );
        assert!(readiness.limit_ranges.recovered());
        assert!(
            !readiness.limit_ranges.recovered(),
            "only the first success reports recovery"
        );
        assert!(readiness.is_ready());
    }

    #[test]
    fn a_watch_failing_within_the_grace_keeps_the_caches_ready() {
        let readiness = CacheReadiness::new(Duration::from_secs(30));
        readiness.nodes.synced.store(true, Ordering::Release);
        readiness.limit_ranges.synced.store(true, Ordering::Release);
        readiness.nodes.failed();
        let first = readiness.nodes.failing_since();
        readiness.nodes.failed();
        assert_eq!(
            readiness.nodes.failing_since(),
            first,
            "the clock starts at the first failure"
        );
        assert!(readiness.is_ready());
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_turns_lookups_off_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nowhere.yaml");
        match lookups_from_kubeconfig(&path).await {
            Lookups::Off { reason } => {
                assert!(reason.contains("nowhere.yaml"), "{reason}");
            }
            other => panic!("expected Off, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_without_a_context_turns_lookups_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, "apiVersion: v1\nkind: Config\nclusters: []\n").unwrap();
        assert!(matches!(
            lookups_from_kubeconfig(&path).await,
            Lookups::Off { .. }
        ));
    }
}
