//! What rules may ask of the cluster, behind a small trait so rules and tests never see
//! the Kubernetes client: taints of a node, LimitRanges of a namespace.
//!
//! [`StaticCluster`] answers from plain maps (tests, `audit` without a cluster);
//! [`watch`] keeps reflector caches of Nodes, LimitRanges and Namespaces for `serve`.

pub mod cached;
pub mod watch;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint, Toleration};

/// The namespace annotation `PodTolerationRestriction` reads: the tolerations a pod in the
/// namespace may have (`plugin/pkg/admission/podtolerationrestriction`).
pub const TOLERATIONS_WHITELIST: &str = "scheduler.alpha.kubernetes.io/tolerationsWhitelist";

/// Read-only cluster facts a rule may use. Answers may be stale: they come from caches.
pub trait ClusterView: Send + Sync {
    /// Whether look-ups are possible at all (false outside a cluster).
    fn lookups_enabled(&self) -> bool;
    /// The taints of node `name`, or `None` when the node is not known.
    fn node_taints(&self, name: &str) -> Option<Vec<Taint>>;
    /// The labels of node `name`, or `None` when the node is not known.
    fn node_labels(&self, name: &str) -> Option<BTreeMap<String, String>>;
    /// The LimitRange items of every LimitRange in `namespace` (empty when none).
    fn limit_range_items(&self, namespace: &str) -> Vec<LimitRangeItem>;
    /// The tolerations `namespace` allows its pods (its annotation
    /// `scheduler.alpha.kubernetes.io/tolerationsWhitelist`, which the
    /// `PodTolerationRestriction` admission plugin enforces), or `None` when it names none or
    /// the namespace is not known.
    fn toleration_whitelist(&self, namespace: &str) -> Option<Vec<Toleration>> {
        let _ = namespace;
        None
    }
}

/// A cluster described by plain maps: for tests, and for running without look-ups.
#[derive(Debug, Clone, Default)]
pub struct StaticCluster {
    /// When false, behaves as "no cluster": every node is unknown.
    pub lookups: bool,
    pub nodes: HashMap<String, Vec<Taint>>,
    /// Labels of the nodes in `nodes` (a node missing here has none).
    pub node_labels: HashMap<String, BTreeMap<String, String>>,
    pub limit_ranges: HashMap<String, Vec<LimitRangeItem>>,
    /// Namespaces' toleration whitelists (a namespace missing here names none).
    pub toleration_whitelists: HashMap<String, Vec<Toleration>>,
}

impl StaticCluster {
    /// No cluster at all: look-ups off.
    pub fn offline() -> Self {
        Self::default()
    }

    /// A cluster with look-ups on and nothing in it yet.
    pub fn empty() -> Self {
        Self {
            lookups: true,
            ..Self::default()
        }
    }

    pub fn with_node(mut self, name: &str, taints: Vec<Taint>) -> Self {
        self.nodes.insert(name.to_string(), taints);
        self
    }

    /// Adds node `name` (without taints, unless it has some already) with these labels.
    pub fn with_labeled_node(mut self, name: &str, labels: &[(&str, &str)]) -> Self {
        self.nodes.entry(name.to_string()).or_default();
        self.node_labels.insert(
            name.to_string(),
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self
    }

    pub fn with_toleration_whitelist(mut self, namespace: &str, allowed: Vec<Toleration>) -> Self {
        self.toleration_whitelists
            .insert(namespace.to_string(), allowed);
        self
    }

    pub fn with_limit_range(mut self, namespace: &str, items: Vec<LimitRangeItem>) -> Self {
        self.limit_ranges
            .entry(namespace.to_string())
            .or_default()
            .extend(items);
        self
    }
}

impl ClusterView for StaticCluster {
    fn lookups_enabled(&self) -> bool {
        self.lookups
    }

    fn node_taints(&self, name: &str) -> Option<Vec<Taint>> {
        if !self.lookups {
            return None;
        }
        self.nodes.get(name).cloned()
    }

    fn node_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        if !self.lookups || !self.nodes.contains_key(name) {
            return None;
        }
        Some(self.node_labels.get(name).cloned().unwrap_or_default())
    }

    fn limit_range_items(&self, namespace: &str) -> Vec<LimitRangeItem> {
        self.limit_ranges
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    fn toleration_whitelist(&self, namespace: &str) -> Option<Vec<Toleration>> {
        if !self.lookups {
            return None;
        }
        self.toleration_whitelists.get(namespace).cloned()
    }
}
