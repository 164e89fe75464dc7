//! `podmend audit --cluster-snapshot FILE`: the objects the rules look up in a cluster (Nodes,
//! Namespaces, LimitRanges), read from a file instead of a live cluster, so an offline audit
//! repairs what the webhook would. Without one, `node-affinity` cannot know a node's taints and
//! leaves `nodeName` pods as they are (the finding says so).

use std::path::Path;

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint, Toleration};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::manifests;
use crate::cluster::StaticCluster;
use crate::cluster::TOLERATIONS_WHITELIST;

/// A snapshot that cannot be used: what is wrong, and where.
#[derive(Debug, thiserror::Error)]
#[error(
    "--cluster-snapshot {file}: {message} (give the output of `kubectl get nodes,namespaces,limitranges -A -o yaml`)"
)]
pub struct SnapshotError {
    pub file: String,
    pub message: String,
}

/// Reads `path` (YAML or JSON, one or more documents, `kind: List`) into a cluster view with
/// look-ups on: every Node (taints, labels), Namespace (toleration whitelist) and LimitRange.
pub fn read(path: &Path) -> Result<StaticCluster, SnapshotError> {
    let file = path.display().to_string();
    let fail = |message: String| SnapshotError {
        file: file.clone(),
        message,
    };
    let (files, errors) = manifests::read_paths(std::slice::from_ref(&file));
    if let Some(error) = errors.first() {
        return Err(fail(error.message.clone()));
    }
    let mut cluster = StaticCluster::empty();
    for document in files.iter().flat_map(|f| &f.documents) {
        for (_, object) in document.objects() {
            add(&mut cluster, object)
                .map_err(|message| fail(format!("document {}: {message}", document.index)))?;
        }
    }
    Ok(cluster)
}

/// Adds one object of the snapshot to `cluster`.
fn add(cluster: &mut StaticCluster, object: &Value) -> Result<(), String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"]
        .as_str()
        .ok_or_else(|| format!("a {kind} without metadata.name"))?;
    match kind {
        "Node" => {
            let taints: Vec<Taint> = field(&object["spec"]["taints"], "Node", name, "spec.taints")?;
            cluster.nodes.insert(name.to_string(), taints);
            let labels = field(
                &object["metadata"]["labels"],
                "Node",
                name,
                "metadata.labels",
            )?;
            cluster.node_labels.insert(name.to_string(), labels);
        }
        "Namespace" => {
            if let Some(text) = object["metadata"]["annotations"][TOLERATIONS_WHITELIST].as_str() {
                let allowed: Vec<Toleration> = serde_json::from_str(text).map_err(|e| {
                    format!("Namespace {name}: {TOLERATIONS_WHITELIST} is not a JSON list of tolerations: {e}")
                })?;
                cluster
                    .toleration_whitelists
                    .insert(name.to_string(), allowed);
            }
        }
        "LimitRange" => {
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .ok_or_else(|| format!("LimitRange {name} without metadata.namespace"))?;
            let items: Vec<LimitRangeItem> =
                field(&object["spec"]["limits"], "LimitRange", name, "spec.limits")?;
            cluster
                .limit_ranges
                .entry(namespace.to_string())
                .or_default()
                .extend(items);
        }
        other => {
            return Err(format!(
                "{other} {name} is not a Node, Namespace or LimitRange, the objects rules look up"
            ));
        }
    }
    Ok(())
}

/// `value` as a `T`; an absent value is `T`'s default.
fn field<T: DeserializeOwned + Default>(
    value: &Value,
    kind: &str,
    name: &str,
    path: &str,
) -> Result<T, String> {
    if value.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(value.clone()).map_err(|e| format!("{kind} {name}: {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::ClusterView as _;

    fn snapshot(text: &str) -> Result<StaticCluster, SnapshotError> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("snapshot.yaml");
        std::fs::write(&path, text).expect("write the snapshot");
        read(&path)
    }

    #[test]
    fn a_kubectl_list_of_nodes_namespaces_and_limit_ranges_answers_the_rules_look_ups() {
        let cluster = snapshot(
            &json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "b"}},
                 "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}},
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ci", "annotations": {
                    TOLERATIONS_WHITELIST: "[{\"key\": \"dedicated\", \"operator\": \"Exists\"}]"}}},
                {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr", "namespace": "ci"},
                 "spec": {"limits": [{"type": "Container", "min": {"cpu": "10m"}}]}}
            ]})
            .to_string(),
        )
        .expect("a valid snapshot");
        assert!(cluster.lookups_enabled());
        assert_eq!(cluster.node_taints("n1").map(|t| t.len()), Some(1));
        assert_eq!(cluster.node_taints("n2"), Some(Vec::new()));
        assert_eq!(cluster.node_taints("n3"), None);
        assert_eq!(cluster.node_labels("n1").expect("labels")["a"], "b");
        assert_eq!(cluster.toleration_whitelist("ci").map(|w| w.len()), Some(1));
        assert_eq!(cluster.toleration_whitelist("other"), None);
        assert_eq!(cluster.limit_range_items("ci").len(), 1);
    }

    #[test]
    fn another_kind_or_a_bad_whitelist_is_an_error_naming_the_file_and_what_to_give() {
        for (text, says) in [
            (
                "kind: Pod\napiVersion: v1\nmetadata: {name: p}\n",
                "Pod p is not a Node",
            ),
            (
                "kind: Namespace\napiVersion: v1\nmetadata: {name: ci, annotations: {scheduler.alpha.kubernetes.io/tolerationsWhitelist: nope}}\n",
                "is not a JSON list of tolerations",
            ),
            (
                "kind: Node\napiVersion: v1\nmetadata: {}\n",
                "a Node without metadata.name",
            ),
        ] {
            let error = snapshot(text).expect_err(text).to_string();
            assert!(error.contains(says), "{error}");
            assert!(
                error.contains("kubectl get nodes,namespaces,limitranges"),
                "{error}"
            );
        }
    }
}
