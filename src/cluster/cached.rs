//! What the caches keep of a Node and of a LimitRange: only the fields rules read, read
//! straight from the API server's JSON. A kubelet-reported Node is mostly status (~50 cached
//! image names, conditions, addresses, nodeInfo) and a LimitRange often carries a
//! `last-applied-configuration` annotation; none of it is ever deserialized into memory.
//!
//! The watchers list and watch these types through the same paths as `Node` and
//! `LimitRange` (they name the same resource): serde skips every field they do not declare.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Deserializer};

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

impl CachedNode {
    pub fn taints(&self) -> &[Taint] {
        self.spec
            .as_ref()
            .and_then(|spec| spec.taints.as_deref())
            .unwrap_or_default()
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }
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

impl CachedLimitRange {
    pub fn items(&self) -> &[LimitRangeItem] {
        self.spec.as_ref().map_or(&[], |spec| &spec.limits)
    }
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
        assert_eq!(node.labels().len(), 1);
        assert_eq!(node.taints().len(), 1);
        assert_eq!(node.taints()[0].key, "gpu");
        assert!(node.metadata.annotations.is_none() && node.metadata.managed_fields.is_none());
    }

    #[test]
    fn a_node_without_spec_or_taints_has_none() {
        let node: CachedNode =
            serde_json::from_value(json!({"metadata": {"name": "n"}})).expect("decodes");
        assert!(node.taints().is_empty());
        assert!(node.labels().is_empty());
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
        assert_eq!(range.items().len(), 1);
        assert_eq!(range.items()[0].type_, "Container");
        assert!(range.metadata.annotations.is_none());
    }
}
