//! Caches of Nodes, LimitRanges and Namespaces, kept by kube-runtime watchers, that answer [`ClusterView`]
//! for `serve`; plus how a Kubernetes client is found ([`Lookups`]). What is kept of each
//! object is in [`super::cached`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{LimitRangeItem, Taint, Toleration};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use tokio::task::AbortHandle;

use super::ClusterView;
use super::cached::{
    CachedLimitRange, CachedNamespace, CachedNode, LimitRangeTable, NamespaceTable, NodeTable,
    Projection, Table,
};

/// Nodes, LimitRanges and Namespaces as last seen by the watchers.
///
/// Answers may be stale: they come from caches that follow the API server with some delay,
/// and that stay empty (every node unknown) until the first list has arrived
/// (see [`CacheReadiness`]).
pub struct WatchedCluster {
    nodes: Arc<Projection<NodeTable>>,
    limit_ranges: Arc<Projection<LimitRangeTable>>,
    namespaces: Arc<Projection<NamespaceTable>>,
    /// Watcher tasks, stopped when the cluster view is dropped.
    tasks: Vec<AbortHandle>,
}

impl WatchedCluster {
    /// A view over tables filled by someone else (no tasks are started).
    pub fn from_tables(
        nodes: Arc<Projection<NodeTable>>,
        limit_ranges: Arc<Projection<LimitRangeTable>>,
        namespaces: Arc<Projection<NamespaceTable>>,
    ) -> Self {
        Self {
            nodes,
            limit_ranges,
            namespaces,
            tasks: Vec::new(),
        }
    }
}

impl fmt::Debug for WatchedCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedCluster")
            .field("nodes", &self.nodes.read(Table::len))
            .field("limit_ranges", &self.limit_ranges.read(Table::len))
            .field("namespaces", &self.namespaces.read(Table::len))
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
        self.nodes
            .read(|nodes| nodes.get(name).map(|node| node.taints()))
    }

    fn node_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.nodes
            .read(|nodes| nodes.get(name).map(|node| node.labels()))
    }

    fn limit_range_items(&self, namespace: &str) -> Vec<LimitRangeItem> {
        self.limit_ranges.read(|ranges| ranges.items(namespace))
    }

    fn toleration_whitelist(&self, namespace: &str) -> Option<Vec<Toleration>> {
        self.namespaces
            .read(|namespaces| namespaces.whitelist(namespace))
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

/// Whether the Node, LimitRange and Namespace caches can be trusted: each had its first full list,
/// and no watch has been failing for longer than `stale_after`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CacheReadiness {
    nodes: Arc<CacheHealth>,
    limit_ranges: Arc<CacheHealth>,
    namespaces: Arc<CacheHealth>,
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
            namespaces: Arc::default(),
            stale_after,
        }
    }

    /// True once both caches had their first full list, while neither watch is stale.
    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    /// Why the caches cannot be trusted, in words for `/readyz`; `None` when they can.
    pub fn not_ready_reason(&self) -> Option<String> {
        let caches = [
            ("Node", &self.nodes),
            ("LimitRange", &self.limit_ranges),
            ("Namespace", &self.namespaces),
        ];
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
/// [`DEFAULT_STALE_AFTER`] and nothing to do after a list; see [`start_with`].
pub fn start(client: Client) -> (Arc<WatchedCluster>, CacheReadiness) {
    start_with(client, DEFAULT_STALE_AFTER, || {})
}

/// Starts watchers of every Node and every LimitRange on the current tokio runtime.
///
/// The returned view answers from the caches at once (empty at first); readiness turns true
/// once both had their first list. A failing or cut watch is retried with kube's default
/// backoff and logged at warn; if it keeps failing for `stale_after`, readiness turns false
/// until the API server answers again. Outside a tokio runtime nothing is started and the
/// caches never get ready. The watchers stop when the returned [`WatchedCluster`] is dropped.
///
/// `after_list` runs after every complete list (the first and each relist), once the table it
/// replaced and the pages it read are freed: the moment to give that memory back.
pub fn start_with(
    client: Client,
    stale_after: Duration,
    after_list: fn(),
) -> (Arc<WatchedCluster>, CacheReadiness) {
    let nodes = Arc::new(Projection::<NodeTable>::default());
    let limit_ranges = Arc::new(Projection::<LimitRangeTable>::default());
    let namespaces = Arc::new(Projection::<NamespaceTable>::default());
    let readiness = CacheReadiness::new(stale_after);
    let mut cluster =
        WatchedCluster::from_tables(nodes.clone(), limit_ranges.clone(), namespaces.clone());

    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::error!(
            "cluster caches not started: no tokio runtime; node taints, LimitRanges and namespaces stay unknown"
        );
        return (Arc::new(cluster), readiness);
    };

    // The cached types name the Node and LimitRange resources but declare only what rules
    // read: the rest of each object is skipped while it is parsed. Small pages keep the
    // memory a list needs at once low (a kubelet-reported Node is ~15 KB of JSON).
    let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    let node_api = Api::<CachedNode>::all(client.clone());
    let lr_api = Api::<CachedLimitRange>::all(client.clone());
    let ns_api = Api::<CachedNamespace>::all(client);
    cluster.tasks = vec![
        runtime
            .spawn(drive(
                watcher(node_api.clone(), config.clone()).default_backoff(),
                node_api,
                nodes,
                readiness.nodes.clone(),
                "nodes",
                after_list,
            ))
            .abort_handle(),
        runtime
            .spawn(drive(
                watcher(lr_api.clone(), config.clone()).default_backoff(),
                lr_api,
                limit_ranges,
                readiness.limit_ranges.clone(),
                "limitranges",
                after_list,
            ))
            .abort_handle(),
        runtime
            .spawn(drive(
                watcher(ns_api.clone(), config).default_backoff(),
                ns_api,
                namespaces,
                readiness.namespaces.clone(),
                "namespaces",
                after_list,
            ))
            .abort_handle(),
    ];
    (Arc::new(cluster), readiness)
}

/// Objects per list request of the watchers.
const LIST_PAGE_SIZE: u32 = 100;

/// Polls a watcher stream forever, applying its events to `table`, marking `health` synced at
/// the first complete list (and calling `after_list` after each), keeping it up to date and
/// logging failures (the backoff makes the watcher retry). While the watch fails, a one-item
/// list every [`PROBE_INTERVAL`] tells when the API server answers again: a resumed watch is
/// silent until something changes, so the stream alone cannot say it recovered.
async fn drive<S, K, T>(
    stream: S,
    api: Api<K>,
    table: Arc<Projection<T>>,
    health: Arc<CacheHealth>,
    what: &'static str,
    after_list: fn(),
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
    K: Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
    T: Table<K>,
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
            Some(Ok(event)) => {
                if health.recovered() {
                    tracing::info!(resource = what, "watch of the cluster resumed");
                }
                if table.apply(event) {
                    if !health.synced.swap(true, Ordering::AcqRel) {
                        let objects = table.read(Table::len);
                        tracing::info!(resource = what, objects, "cluster cache ready");
                    }
                    after_list();
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

const NOT_LOOKED_UP: &str = "node taints, LimitRanges and namespaces will not be looked up";

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

    /// A table after one complete list of `objects`.
    fn listed<K, T: Table<K>>(objects: Vec<K>) -> Arc<Projection<T>> {
        let table = Arc::new(Projection::default());
        table.apply(Event::Init);
        for object in objects {
            table.apply(Event::InitApply(object));
        }
        table.apply(Event::InitDone);
        table
    }

    fn cluster(nodes: Vec<CachedNode>, ranges: Vec<CachedLimitRange>) -> WatchedCluster {
        WatchedCluster::from_tables(listed(nodes), listed(ranges), Arc::default())
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

    /// A client for `drive`'s probe, which these tests never reach.
    fn never_called_client() -> Client {
        Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .expect("a client that is never called")
    }

    #[tokio::test]
    async fn readiness_waits_for_every_cache_to_complete_a_list() {
        let readiness = CacheReadiness::default();
        assert_eq!(
            readiness.not_ready_reason().as_deref(),
            Some("the Node cache has not had its first list yet")
        );
        let events = |objects: Vec<CachedNode>| {
            let mut events = vec![Ok(Event::Init)];
            events.extend(objects.into_iter().map(|o| Ok(Event::InitApply(o))));
            events.push(Ok(Event::InitDone));
            futures::stream::iter(events)
        };
        let client = never_called_client();
        let nodes = Arc::new(Projection::<NodeTable>::default());
        drive(
            events(vec![node("n1", None)]),
            Api::<CachedNode>::all(client.clone()),
            nodes.clone(),
            readiness.nodes.clone(),
            "nodes",
            || {},
        )
        .await;
        assert!(
            !readiness.is_ready(),
            "the LimitRange cache is not there yet"
        );
        assert_eq!(nodes.read(Table::len), 1);
        drive(
            futures::stream::iter(vec![Ok(Event::Init), Ok(Event::InitDone)]),
            Api::<CachedLimitRange>::all(client.clone()),
            Arc::new(Projection::<LimitRangeTable>::default()),
            readiness.limit_ranges.clone(),
            "limitranges",
            || {},
        )
        .await;
        assert_eq!(
            readiness.not_ready_reason().as_deref(),
            Some("the Namespace cache has not had its first list yet")
        );
        drive(
            futures::stream::iter(vec![Ok(Event::Init), Ok(Event::InitDone)]),
            Api::<CachedNamespace>::all(client),
            Arc::new(Projection::<NamespaceTable>::default()),
            readiness.namespaces.clone(),
            "namespaces",
            || {},
        )
        .await;
        assert!(readiness.is_ready());
    }

    #[test]
    fn a_namespace_answers_its_toleration_whitelist_and_one_without_none() {
        let namespace = |name: &str, whitelist: Option<&str>| -> CachedNamespace {
            let mut annotations = serde_json::json!({"other": "x"});
            if let Some(text) = whitelist {
                annotations[crate::cluster::TOLERATIONS_WHITELIST] = text.into();
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "annotations": annotations}
            }))
            .expect("a namespace")
        };
        let namespaces = listed::<CachedNamespace, NamespaceTable>(vec![
            namespace(
                "ci",
                Some(r#"[{"key": "dedicated", "operator": "Exists"}]"#),
            ),
            namespace("plain", None),
            namespace("broken", Some("not json")),
        ]);
        let cluster = WatchedCluster::from_tables(Arc::default(), Arc::default(), namespaces);
        let allowed = cluster.toleration_whitelist("ci").expect("a whitelist");
        assert_eq!(allowed[0].key.as_deref(), Some("dedicated"));
        assert_eq!(cluster.toleration_whitelist("plain"), None);
        assert_eq!(cluster.toleration_whitelist("broken"), None);
        assert_eq!(cluster.toleration_whitelist("unknown"), None);
    }

    #[tokio::test]
    async fn the_after_list_hook_runs_after_every_complete_list_and_not_on_other_events() {
        static LISTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let client = never_called_client();
        // A first list, a change, a deletion, then a relist (as after a `410 Gone`).
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(node("n1", None))),
            Ok(Event::InitDone),
            Ok(Event::Apply(node("n2", None))),
            Ok(Event::Delete(node("n1", None))),
            Ok(Event::Init),
            Ok(Event::InitApply(node("n3", None))),
            Ok(Event::InitDone),
        ];
        let nodes = Arc::new(Projection::<NodeTable>::default());
        drive(
            futures::stream::iter(events),
            Api::<CachedNode>::all(client),
            nodes.clone(),
            CacheReadiness::default().nodes.clone(),
            "nodes",
            || {
                LISTS.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await;
        assert_eq!(LISTS.load(Ordering::SeqCst), 2);
        assert_eq!(nodes.read(Table::len), 1, "the relist replaced the table");
    }

    #[test]
    fn a_watch_failing_longer_than_the_grace_makes_the_caches_not_ready_until_it_recovers() {
        let readiness = CacheReadiness::new(Duration::ZERO);
        readiness.nodes.synced.store(true, Ordering::Release);
        readiness.limit_ranges.synced.store(true, Ordering::Release);
        readiness.namespaces.synced.store(true, Ordering::Release);
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
        readiness.namespaces.synced.store(true, Ordering::Release);
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
