//! What the caches keep of a Node, a LimitRange and a Namespace: only the fields rules read.
//!
//! A kubelet-reported Node is mostly status (~50 cached image names, conditions, addresses,
//! nodeInfo) and a LimitRange often carries a `last-applied-configuration` annotation. The
//! watchers list and watch [`CachedNode`] and [`CachedLimitRange`], which name the same
//! resources but declare only what rules read, so serde skips the rest while parsing; each
//! object is then folded into a compact entry of a [`Table`] (labels in one string, quantities
//! in small slices), and a [`Projection`] keeps the tables current with kube's reflector
//! semantics: a (re)list is buffered and replaces the table once complete.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, RwLock};

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::runtime::watcher::Event;
use serde::{Deserialize, Deserializer};

use super::TOLERATIONS_WHITELIST;

/// A Node's name, labels and taints.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct CachedNode {
    #[serde(deserialize_with = "identity")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<NodeTaints>,
}

/// The one part of a Node's spec that rules read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct NodeTaints {
    #[serde(default)]
    pub taints: Option<Vec<Taint>>,
}

/// A LimitRange's namespace, name and limits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct CachedLimitRange {
    #[serde(deserialize_with = "identity")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<LimitRangeLimits>,
}

/// A LimitRange's spec.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LimitRangeLimits {
    #[serde(default)]
    pub limits: Vec<LimitRangeItem>,
}

/// A Namespace's name and the one annotation rules read: the tolerations its pods may have
/// (`scheduler.alpha.kubernetes.io/tolerationsWhitelist`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct CachedNamespace {
    #[serde(deserialize_with = "namespace_identity")]
    pub metadata: ObjectMeta,
}

/// A Namespace's metadata as the cache needs it: its name, uid and resource version, and of
/// its annotations only the toleration whitelist.
fn namespace_identity<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NamespaceIdentity {
        name: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        annotations: Option<BTreeMap<String, String>>,
    }
    let identity = NamespaceIdentity::deserialize(deserializer)?;
    let whitelist = identity
        .annotations
        .and_then(|mut annotations| annotations.remove(TOLERATIONS_WHITELIST))
        .map(|value| BTreeMap::from([(TOLERATIONS_WHITELIST.to_string(), value)]));
    Ok(ObjectMeta {
        name: identity.name,
        uid: identity.uid,
        resource_version: identity.resource_version,
        annotations: whitelist,
        ..ObjectMeta::default()
    })
}

/// The metadata a cache needs: what identifies the object and what rules read. Annotations,
/// managedFields, ownerReferences and the rest are skipped while parsing.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Identity {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

fn identity<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let identity = Identity::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: identity.name,
        namespace: identity.namespace,
        uid: identity.uid,
        resource_version: identity.resource_version,
        labels: identity.labels,
        ..ObjectMeta::default()
    })
}

impl k8s_openapi::Resource for CachedNode {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = ClusterResourceScope;
}

impl k8s_openapi::Metadata for CachedNode {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl k8s_openapi::Resource for CachedNamespace {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Namespace";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "namespaces";
    type Scope = ClusterResourceScope;
}

impl k8s_openapi::Metadata for CachedNamespace {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl k8s_openapi::Resource for CachedLimitRange {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "LimitRange";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "limitranges";
    type Scope = NamespaceResourceScope;
}

impl k8s_openapi::Metadata for CachedLimitRange {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Kept of one Node: its taints and labels.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    taints: Box<[Taint]>,
    /// `key NUL value NUL key NUL value …`: one allocation instead of a map (label keys and
    /// values cannot hold NUL).
    labels: Box<str>,
}

impl NodeEntry {
    fn of(node: CachedNode) -> Self {
        let mut labels = String::new();
        for (key, value) in node.metadata.labels.iter().flatten() {
            labels.push_str(key);
            labels.push('\0');
            labels.push_str(value);
            labels.push('\0');
        }
        Self {
            taints: node
                .spec
                .and_then(|spec| spec.taints)
                .unwrap_or_default()
                .into_boxed_slice(),
            labels: labels.into_boxed_str(),
        }
    }

    pub fn taints(&self) -> Vec<Taint> {
        self.taints.to_vec()
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut parts = self.labels.split('\0');
        let mut labels = BTreeMap::new();
        while let (Some(key), Some(value)) = (parts.next(), parts.next()) {
            labels.insert(key.to_string(), value.to_string());
        }
        labels
    }
}

/// Quantities by resource name, as LimitRange fields hold them.
type Quantities = Box<[(Box<str>, Box<str>)]>;

/// Kept of one LimitRange item: what rules read (`type` Container or Pod; `min`, `max`,
/// `maxLimitRequestRatio`). Defaults are applied by LimitRanger itself and never read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LimitEntry {
    type_: Box<str>,
    min: Option<Quantities>,
    max: Option<Quantities>,
    max_limit_request_ratio: Option<Quantities>,
}

impl LimitEntry {
    fn of(item: LimitRangeItem) -> Option<Self> {
        if item.type_ != "Container" && item.type_ != "Pod" {
            return None;
        }
        let compact = |map: Option<BTreeMap<String, Quantity>>| {
            map.map(|map| {
                map.into_iter()
                    .map(|(name, quantity)| (name.into_boxed_str(), quantity.0.into_boxed_str()))
                    .collect()
            })
        };
        Some(Self {
            type_: item.type_.into_boxed_str(),
            min: compact(item.min),
            max: compact(item.max),
            max_limit_request_ratio: compact(item.max_limit_request_ratio),
        })
    }

    fn item(&self) -> LimitRangeItem {
        let expand = |quantities: &Option<Quantities>| {
            quantities.as_ref().map(|quantities| {
                quantities
                    .iter()
                    .map(|(name, quantity)| (name.to_string(), Quantity(quantity.to_string())))
                    .collect()
            })
        };
        LimitRangeItem {
            type_: self.type_.to_string(),
            min: expand(&self.min),
            max: expand(&self.max),
            max_limit_request_ratio: expand(&self.max_limit_request_ratio),
            ..LimitRangeItem::default()
        }
    }
}

/// A cache's contents, filled from watched objects of type `O`.
pub trait Table<O>: Default + Send + Sync {
    fn insert(&mut self, object: O);
    fn remove(&mut self, object: &O);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every Node, by name.
#[derive(Debug, Default)]
pub struct NodeTable(HashMap<Box<str>, NodeEntry>);

impl NodeTable {
    pub fn get(&self, name: &str) -> Option<&NodeEntry> {
        self.0.get(name)
    }
}

impl Table<CachedNode> for NodeTable {
    fn insert(&mut self, node: CachedNode) {
        if let Some(name) = node.metadata.name.clone() {
            self.0.insert(name.into_boxed_str(), NodeEntry::of(node));
        }
    }

    fn remove(&mut self, node: &CachedNode) {
        if let Some(name) = node.metadata.name.as_deref() {
            self.0.remove(name);
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Every Namespace, by name, with its toleration whitelist when it names one. A whitelist
/// that does not parse is kept as none: `PodTolerationRestriction` refuses every pod with
/// tolerations in that namespace anyway.
#[derive(Debug, Default)]
pub struct NamespaceTable(HashMap<Box<str>, Option<Box<[Toleration]>>>);

impl NamespaceTable {
    /// The tolerations `namespace` allows, when it names them.
    pub fn whitelist(&self, namespace: &str) -> Option<Vec<Toleration>> {
        self.0
            .get(namespace)?
            .as_deref()
            .map(<[Toleration]>::to_vec)
    }
}

impl Table<CachedNamespace> for NamespaceTable {
    fn insert(&mut self, namespace: CachedNamespace) {
        let Some(name) = namespace.metadata.name else {
            return;
        };
        let whitelist = namespace
            .metadata
            .annotations
            .and_then(|mut annotations| annotations.remove(TOLERATIONS_WHITELIST))
            .and_then(|text| serde_json::from_str::<Vec<Toleration>>(&text).ok())
            .map(Vec::into_boxed_slice);
        self.0.insert(name.into_boxed_str(), whitelist);
    }

    fn remove(&mut self, namespace: &CachedNamespace) {
        if let Some(name) = namespace.metadata.name.as_deref() {
            self.0.remove(name);
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// One namespace's LimitRanges, by name.
type RangesByName = BTreeMap<Box<str>, Box<[LimitEntry]>>;

/// Every LimitRange's Container and Pod items, by namespace, then by name.
#[derive(Debug, Default)]
pub struct LimitRangeTable {
    namespaces: HashMap<Box<str>, RangesByName>,
    len: usize,
}

impl LimitRangeTable {
    /// The items of every LimitRange in `namespace`, LimitRanges in name order.
    pub fn items(&self, namespace: &str) -> Vec<LimitRangeItem> {
        self.namespaces
            .get(namespace)
            .into_iter()
            .flat_map(BTreeMap::values)
            .flat_map(|items| items.iter().map(LimitEntry::item))
            .collect()
    }

    fn key(range: &CachedLimitRange) -> Option<(&str, &str)> {
        Some((
            range.metadata.namespace.as_deref()?,
            range.metadata.name.as_deref()?,
        ))
    }
}

impl Table<CachedLimitRange> for LimitRangeTable {
    fn insert(&mut self, range: CachedLimitRange) {
        let Some((namespace, name)) = Self::key(&range) else {
            return;
        };
        let (namespace, name) = (Box::from(namespace), Box::from(name));
        let items: Box<[LimitEntry]> = range
            .spec
            .map(|spec| spec.limits)
            .unwrap_or_default()
            .into_iter()
            .filter_map(LimitEntry::of)
            .collect();
        let ranges = self.namespaces.entry(namespace).or_default();
        if ranges.insert(name, items).is_none() {
            self.len += 1;
        }
    }

    fn remove(&mut self, range: &CachedLimitRange) {
        let Some((namespace, name)) = Self::key(range) else {
            return;
        };
        let Some(ranges) = self.namespaces.get_mut(namespace) else {
            return;
        };
        if ranges.remove(name).is_some() {
            self.len -= 1;
        }
        if ranges.is_empty() {
            self.namespaces.remove(namespace);
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// A table kept current from a watcher's events, with kube's reflector semantics: between
/// `Init` and `InitDone` the objects of a (re)list go into a fresh table, which then replaces
/// the live one at once, so a relist never shows a half-filled table and drops what was
/// deleted while the watch was down.
#[derive(Debug, Default)]
pub struct Projection<T> {
    live: RwLock<T>,
    relisting: Mutex<Option<T>>,
}

impl<T> Projection<T> {
    /// Reads the live table.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.live.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Applies one watcher event; true when it completed a (re)list.
    pub fn apply<O>(&self, event: Event<O>) -> bool
    where
        T: Table<O>,
    {
        let mut relisting = self.relisting.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Init => *relisting = Some(T::default()),
            Event::InitApply(object) => match relisting.as_mut() {
                Some(table) => table.insert(object),
                None => self.write().insert(object),
            },
            Event::InitDone => {
                if let Some(table) = relisting.take() {
                    *self.write() = table;
                }
                return true;
            }
            Event::Apply(object) => self.write().insert(object),
            Event::Delete(object) => self.write().remove(&object),
        }
        false
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.live.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Nodes, LimitRanges and Namespaces listed once and kept as the caches keep them: what `audit
/// --cluster` answers the rules' look-ups from, in the memory `serve` needs for the same.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub nodes: NodeTable,
    pub limit_ranges: LimitRangeTable,
    pub namespaces: NamespaceTable,
}

impl super::ClusterView for Snapshot {
    fn lookups_enabled(&self) -> bool {
        true
    }

    fn node_taints(&self, name: &str) -> Option<Vec<Taint>> {
        self.nodes.get(name).map(NodeEntry::taints)
    }

    fn node_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.nodes.get(name).map(NodeEntry::labels)
    }

    fn limit_range_items(&self, namespace: &str) -> Vec<LimitRangeItem> {
        self.limit_ranges.items(namespace)
    }

    fn toleration_whitelist(&self, namespace: &str) -> Option<Vec<Toleration>> {
        self.namespaces.whitelist(namespace)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_kubelet_reported_node_keeps_its_name_labels_and_taints_only() {
        let node: CachedNode = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "worker-1", "uid": "u1", "resourceVersion": "42",
                "labels": {"kubernetes.io/hostname": "worker-1"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
            "status": {"images": [{"names": ["registry.k8s.io/pause:3.9"], "sizeBytes": 1}]}
        }))
        .expect("a Node decodes");
        assert_eq!(node.metadata.name.as_deref(), Some("worker-1"));
        assert_eq!(node.metadata.resource_version.as_deref(), Some("42"));
        assert!(node.metadata.annotations.is_none() && node.metadata.managed_fields.is_none());
        let entry = NodeEntry::of(node);
        assert_eq!(
            entry.labels(),
            BTreeMap::from([("kubernetes.io/hostname".to_string(), "worker-1".to_string())])
        );
        assert_eq!(entry.taints().len(), 1);
        assert_eq!(entry.taints()[0].key, "gpu");
    }

    #[test]
    fn a_node_without_spec_or_taints_has_none() {
        let node: CachedNode =
            serde_json::from_value(json!({"metadata": {"name": "n"}})).expect("decodes");
        let entry = NodeEntry::of(node);
        assert!(entry.taints().is_empty());
        assert!(entry.labels().is_empty());
    }

    #[test]
    fn a_limit_range_keeps_its_limits_and_drops_its_annotations() {
        let range: CachedLimitRange = serde_json::from_value(json!({
            "metadata": {"name": "defaults", "namespace": "ci",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
            "spec": {"limits": [{"type": "Container", "min": {"cpu": "10m"}}]}
        }))
        .expect("decodes");
        assert_eq!(range.metadata.namespace.as_deref(), Some("ci"));
        assert!(range.metadata.annotations.is_none());
        let mut table = LimitRangeTable::default();
        table.insert(range);
        let items = table.items("ci");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].type_, "Container");
        assert_eq!(
            items[0].min.as_ref().map(|m| m["cpu"].0.as_str()),
            Some("10m")
        );
    }

    #[test]
    fn only_what_rules_read_of_a_limit_range_is_kept() {
        let range: CachedLimitRange = serde_json::from_value(json!({
            "metadata": {"name": "r", "namespace": "ci"},
            "spec": {"limits": [
                {"type": "Container", "default": {"cpu": "1"}, "defaultRequest": {"cpu": "500m"},
                 "min": {"cpu": "10m", "memory": "4Mi"}, "max": {"memory": "1Gi"},
                 "maxLimitRequestRatio": {"cpu": "4"}},
                {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}},
                {"type": "Pod", "max": {"cpu": "2"}}
            ]}
        }))
        .expect("decodes");
        let mut table = LimitRangeTable::default();
        table.insert(range);
        let items = serde_json::to_value(table.items("ci")).expect("serializes");
        assert_eq!(
            items,
            json!([
                {"type": "Container", "min": {"cpu": "10m", "memory": "4Mi"},
                 "max": {"memory": "1Gi"}, "maxLimitRequestRatio": {"cpu": "4"}},
                {"type": "Pod", "max": {"cpu": "2"}}
            ])
        );
    }

    #[test]
    fn a_relist_replaces_the_table_at_once_and_forgets_what_was_deleted_meanwhile() {
        let node = |name: &str| CachedNode {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let projection = Projection::<NodeTable>::default();
        assert!(!projection.apply(Event::Init));
        projection.apply(Event::InitApply(node("a")));
        projection.apply(Event::InitApply(node("b")));
        assert!(
            projection.read(Table::is_empty),
            "nothing shows before the list is complete"
        );
        assert!(projection.apply(Event::InitDone));
        assert_eq!(projection.read(Table::len), 2);
        projection.apply(Event::Delete(node("a")));
        projection.apply(Event::Apply(node("c")));
        assert!(projection.read(|t| t.get("c").is_some()));
        // The watch was down: b was deleted meanwhile; the relist replaces everything.
        projection.apply(Event::Init);
        projection.apply(Event::InitApply(node("c")));
        assert_eq!(
            projection.read(Table::len),
            2,
            "the old table serves during the relist"
        );
        projection.apply(Event::InitDone);
        assert_eq!(projection.read(Table::len), 1);
        assert!(projection.read(|t| t.get("b").is_none()));
    }

    #[test]
    fn limit_ranges_are_counted_and_removed_by_namespace_and_name() {
        let range = |namespace: &str, name: &str| CachedLimitRange {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let mut table = LimitRangeTable::default();
        table.insert(range("a", "x"));
        table.insert(range("a", "x"));
        table.insert(range("b", "x"));
        assert_eq!(table.len(), 2);
        table.remove(&range("a", "x"));
        table.remove(&range("a", "x"));
        assert_eq!(table.len(), 1);
        assert!(!table.namespaces.contains_key("a"));
    }
}
