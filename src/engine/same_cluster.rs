//! A cluster view that answers each look-up as it did the first time: debug builds review a
//! repaired object twice (from its sketch, and read again) and compare, and the Node and
//! LimitRange caches may change in between. Both reviews then see the cluster as it was.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint, Toleration};

use crate::cluster::ClusterView;

/// `inner`, with every answer it gave kept and given again.
pub(super) struct Remembered<'a> {
    inner: &'a dyn ClusterView,
    taints: Mutex<HashMap<String, Option<Vec<Taint>>>>,
    labels: Mutex<HashMap<String, Option<BTreeMap<String, String>>>>,
    limits: Mutex<HashMap<String, Vec<LimitRangeItem>>>,
    whitelists: Mutex<HashMap<String, Option<Vec<Toleration>>>>,
}

impl<'a> Remembered<'a> {
    pub(super) fn new(inner: &'a dyn ClusterView) -> Self {
        Self {
            inner,
            taints: Mutex::default(),
            labels: Mutex::default(),
            limits: Mutex::default(),
            whitelists: Mutex::default(),
        }
    }
}

/// The answer kept for `key`, or `ask`'s, kept.
fn remembered<T: Clone>(kept: &Mutex<HashMap<String, T>>, key: &str, ask: impl FnOnce() -> T) -> T {
    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    kept.entry(key.to_string()).or_insert_with(ask).clone()
}

impl ClusterView for Remembered<'_> {
    fn lookups_enabled(&self) -> bool {
        self.inner.lookups_enabled()
    }

    fn node_taints(&self, name: &str) -> Option<Vec<Taint>> {
        remembered(&self.taints, name, || self.inner.node_taints(name))
    }

    fn node_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        remembered(&self.labels, name, || self.inner.node_labels(name))
    }

    fn limit_range_items(&self, namespace: &str) -> Vec<LimitRangeItem> {
        remembered(&self.limits, namespace, || {
            self.inner.limit_range_items(namespace)
        })
    }

    fn toleration_whitelist(&self, namespace: &str) -> Option<Vec<Toleration>> {
        remembered(&self.whitelists, namespace, || {
            self.inner.toleration_whitelist(namespace)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster whose node `worker` appears after the first look-up, as a watch event would
    /// bring it between the two reviews.
    struct NodeArrives {
        asked: Mutex<usize>,
    }

    impl ClusterView for NodeArrives {
        fn lookups_enabled(&self) -> bool {
            true
        }
        fn node_taints(&self, _: &str) -> Option<Vec<Taint>> {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            *asked += 1;
            (*asked > 1).then(Vec::new)
        }
        fn node_labels(&self, _: &str) -> Option<BTreeMap<String, String>> {
            None
        }
        fn limit_range_items(&self, _: &str) -> Vec<LimitRangeItem> {
            Vec::new()
        }
    }

    #[test]
    fn a_node_that_arrives_between_two_look_ups_is_unknown_to_both() {
        let cluster = NodeArrives {
            asked: Mutex::new(0),
        };
        let remembered = Remembered::new(&cluster);
        assert_eq!(remembered.node_taints("worker"), None);
        assert_eq!(remembered.node_taints("worker"), None);
        assert_eq!(cluster.node_taints("worker"), Some(Vec::new()));
    }
}
