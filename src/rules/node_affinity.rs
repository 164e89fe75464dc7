//! `node-affinity`: `spec.nodeName` bypasses the scheduler, so a node without room rejects
//! the pod (`OutOfcpu`) and its controller recreates it at once, thousands of times. The same
//! placement as required node affinity on `metadata.name` goes through the scheduler, which
//! waits (`Pending`) instead.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity as NodeAffinitySpec, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodSpec, Taint, Toleration,
};

use super::{Modes, PodMeta, Rule, RuleContext, RuleInfo};
use crate::config::NodeAffinityConfig;
use crate::engine::document::{Shape, View};

/// The rule's id, summary and help (see [`RuleInfo`]).
pub const INFO: RuleInfo = RuleInfo {
    id: "node-affinity",
    summary: "spec.nodeName bypasses the scheduler, so a full node rejects the pod and its \
              controller recreates it at once, again and again; podmend turns it into required \
              node affinity on the node's name.",
    help: "replace spec.nodeName with required node affinity (matchFields metadata.name In [<node>])",
};
/// The rule's id.
pub const ID: &str = INFO.id;

/// The only field-selector key the API accepts in `matchFields`.
const NODE_NAME_FIELD: &str = "metadata.name";
const NO_SCHEDULE: &str = "NoSchedule";

pub struct NodeAffinity {
    config: NodeAffinityConfig,
}

impl NodeAffinity {
    pub fn new(config: NodeAffinityConfig) -> Self {
        Self { config }
    }
}

/// What the repair reads and changes of a pod spec: the engine builds only these.
static READS: Shape = Shape::Fields(&[
    ("nodeName", &Shape::All),
    ("affinity", &Shape::All),
    ("tolerations", &Shape::All),
]);

impl Rule for NodeAffinity {
    fn info(&self) -> &'static RuleInfo {
        &INFO
    }

    fn modes(&self) -> Modes {
        Modes {
            pods: self.config.mode,
            templates: self.config.templates,
        }
    }

    fn may_apply(&self, raw_spec: &dyn View, _meta: &PodMeta) -> bool {
        raw_spec
            .string("nodeName")
            .is_some_and(|name| !name.is_empty())
    }

    fn reads(&self) -> Option<&'static Shape> {
        Some(&READS)
    }

    fn repair(&self, spec: &mut PodSpec, _meta: &PodMeta, cx: &RuleContext<'_>) -> Vec<String> {
        let Some(node) = spec.node_name.take().filter(|name| !name.is_empty()) else {
            return Vec::new();
        };
        require_node(spec, &node);
        let mut messages = vec![format!(
            "spec.nodeName={node} became required node affinity, so the scheduler checks the pod fits"
        )];
        if self.config.tolerate_node_taints {
            messages.extend(self.tolerate_taints(spec, &node, cx));
        }
        messages
    }
}

impl NodeAffinity {
    /// nodeName ignored the node's NoSchedule taints; the scheduler will not. Tolerate them
    /// so the placement keeps working, except the ones configured to keep their meaning.
    fn tolerate_taints(
        &self,
        spec: &mut PodSpec,
        node: &str,
        cx: &RuleContext<'_>,
    ) -> Option<String> {
        if !cx.cluster.lookups_enabled() {
            return Some(format!(
                "no cluster look-ups: tolerations for node {node}'s NoSchedule taints were not added"
            ));
        }
        let Some(taints) = cx.cluster.node_taints(node) else {
            return Some(format!(
                "node {node} is not known: no tolerations were added for its taints"
            ));
        };
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        let mut added = Vec::new();
        for taint in taints.iter().filter(|t| t.effect == NO_SCHEDULE) {
            if self.config.ignore_taints.contains(&taint.key)
                || tolerations.iter().any(|t| tolerates(t, taint))
            {
                continue;
            }
            tolerations.push(toleration_for(taint));
            added.push(taint.key.clone());
        }
        if tolerations.is_empty() {
            spec.tolerations = None;
        }
        (!added.is_empty()).then(|| {
            format!(
                "tolerations added for node {node}'s NoSchedule taints: {}",
                added.join(", ")
            )
        })
    }
}

/// Adds `metadata.name In [node]` to every existing required term (terms are ORed,
/// requirements ANDed, so every constraint the pod had still holds), or creates the
/// affinity with one such term. An empty term matches nothing and stays empty.
fn require_node(spec: &mut PodSpec, node: &str) {
    let requirement = NodeSelectorRequirement {
        key: NODE_NAME_FIELD.to_string(),
        operator: "In".to_string(),
        values: Some(vec![node.to_string()]),
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinitySpec::default);
    let required = node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm {
            match_fields: Some(vec![requirement]),
            ..NodeSelectorTerm::default()
        });
        return;
    }
    for term in &mut required.node_selector_terms {
        let is_empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
            && term.match_fields.as_ref().is_none_or(Vec::is_empty);
        if is_empty {
            continue;
        }
        let fields = term.match_fields.get_or_insert_with(Vec::new);
        if !fields.contains(&requirement) {
            fields.push(requirement.clone());
        }
    }
}

/// `Toleration.ToleratesTaint` from the Kubernetes API.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

fn toleration_for(taint: &Taint) -> Toleration {
    let value = taint.value.clone().filter(|v| !v.is_empty());
    Toleration {
        key: Some(taint.key.clone()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_string()),
        value,
        effect: Some(taint.effect.clone()),
        toleration_seconds: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::cluster::StaticCluster;

    fn spec(value: Value) -> PodSpec {
        serde_json::from_value(value).expect("test spec")
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.to_string(),
            value: value.map(str::to_string),
            effect: effect.to_string(),
            time_added: None,
        }
    }

    fn repair_with(
        config: NodeAffinityConfig,
        mut pod: PodSpec,
        cluster: &StaticCluster,
    ) -> (Value, Vec<String>) {
        let cx = RuleContext {
            namespace: "default",
            cluster,
        };
        let messages = NodeAffinity::new(config).repair(&mut pod, &PodMeta::default(), &cx);
        (serde_json::to_value(&pod).expect("serializes"), messages)
    }

    fn repair(pod: PodSpec, cluster: &StaticCluster) -> (Value, Vec<String>) {
        repair_with(NodeAffinityConfig::default(), pod, cluster)
    }

    fn node_term(node: &str) -> Value {
        json!({"key": "metadata.name", "operator": "In", "values": [node]})
    }

    #[test]
    fn a_pod_without_node_name_is_left_alone() {
        let pod = spec(json!({"containers": [{"name": "a"}]}));
        let (after, messages) = repair(pod.clone(), &StaticCluster::empty());
        assert!(messages.is_empty());
        assert_eq!(after, serde_json::to_value(&pod).expect("serializes"));
    }

    #[test]
    fn node_name_becomes_a_single_match_fields_term_when_there_is_no_affinity() {
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        let (after, messages) = repair(
            spec(json!({"nodeName": "n1", "containers": [{"name": "a"}]})),
            &cluster,
        );
        assert!(after.get("nodeName").is_none());
        assert_eq!(
            after["affinity"],
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [node_term("n1")]}]}}})
        );
        assert_eq!(messages.len(), 1);
        assert!(messages[0].len() <= 120, "{}", messages[0]);
    }

    #[test]
    fn the_requirement_is_appended_to_every_existing_term_and_empty_terms_stay_empty() {
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        let pod = spec(json!({
            "nodeName": "n1",
            "containers": [{"name": "a"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {},
                        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}
                    ]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}
                    ]
                },
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}
                ]}
            },
            "nodeSelector": {"disk": "ssd"}
        }));
        let (after, _) = repair(pod, &cluster);
        let terms = &after["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchFields"], json!([node_term("n1")]));
        assert_eq!(terms[0]["matchExpressions"][0]["key"], "zone");
        assert_eq!(terms[1], json!({}));
        assert_eq!(
            terms[2]["matchFields"],
            json!([{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}, node_term("n1")])
        );
        assert_eq!(after["nodeSelector"], json!({"disk": "ssd"}));
        assert_eq!(
            after["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                [0]["topologyKey"],
            "kubernetes.io/hostname"
        );
        assert_eq!(
            after["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
                ["weight"],
            1
        );
    }

    #[test]
    fn required_affinity_with_no_terms_gets_one_term() {
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        let pod = spec(json!({"nodeName": "n1", "containers": [{"name": "a"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}));
        let (after, _) = repair(pod, &cluster);
        assert_eq!(
            after["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json!([{"matchFields": [node_term("n1")]}])
        );
    }

    #[test]
    fn no_schedule_taints_of_the_node_are_tolerated_except_the_cordon_taint() {
        let cluster = StaticCluster::empty().with_node(
            "vk",
            vec![
                taint("virtual-kubelet.io/provider", Some("azure"), "NoSchedule"),
                taint("dedicated", None, "NoSchedule"),
                taint("node.kubernetes.io/unschedulable", None, "NoSchedule"),
                taint("evict", None, "NoExecute"),
                taint("soft", None, "PreferNoSchedule"),
            ],
        );
        let (after, messages) = repair(
            spec(json!({"nodeName": "vk", "containers": [{"name": "a"}]})),
            &cluster,
        );
        assert_eq!(
            after["tolerations"],
            json!([
                {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "azure", "effect": "NoSchedule"},
                {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
            ])
        );
        assert_eq!(messages.len(), 2);
        assert!(messages[1].contains("virtual-kubelet.io/provider"));
    }

    #[test]
    fn taints_already_tolerated_get_no_second_toleration() {
        let cluster = StaticCluster::empty().with_node(
            "vk",
            vec![
                taint("virtual-kubelet.io/provider", Some("azure"), "NoSchedule"),
                taint("a", Some("1"), "NoSchedule"),
            ],
        );
        let pod = spec(
            json!({"nodeName": "vk", "containers": [{"name": "a"}], "tolerations": [
                {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                {"operator": "Exists", "effect": "NoExecute"}
            ]}),
        );
        let (after, _) = repair(pod, &cluster);
        assert_eq!(
            after["tolerations"],
            json!([
                {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                {"operator": "Exists", "effect": "NoExecute"},
                {"key": "a", "operator": "Equal", "value": "1", "effect": "NoSchedule"}
            ])
        );
    }

    #[test]
    fn an_unknown_node_gets_no_tolerations_and_a_warning() {
        let (after, messages) = repair(
            spec(json!({"nodeName": "ghost", "containers": [{"name": "a"}]})),
            &StaticCluster::empty(),
        );
        assert!(after.get("tolerations").is_none());
        assert!(
            messages.iter().any(|m| m.contains("ghost is not known")),
            "{messages:?}"
        );
    }

    #[test]
    fn without_cluster_look_ups_no_tolerations_are_added_and_the_warning_says_why() {
        let (after, messages) = repair(
            spec(json!({"nodeName": "n1", "containers": [{"name": "a"}]})),
            &StaticCluster::offline(),
        );
        assert!(after.get("tolerations").is_none());
        assert!(
            messages.iter().any(|m| m.contains("no cluster look-ups")),
            "{messages:?}"
        );
    }

    #[test]
    fn tolerations_are_not_added_when_turned_off() {
        let cluster = StaticCluster::empty().with_node("n1", vec![taint("a", None, "NoSchedule")]);
        let config = NodeAffinityConfig {
            tolerate_node_taints: false,
            ..NodeAffinityConfig::default()
        };
        let (after, messages) = repair_with(
            config,
            spec(json!({"nodeName": "n1", "containers": [{"name": "a"}]})),
            &cluster,
        );
        assert!(after.get("tolerations").is_none());
        assert_eq!(messages.len(), 1);
    }

    #[test]
    fn the_repair_is_idempotent() {
        let cluster = StaticCluster::empty().with_node("n1", vec![taint("a", None, "NoSchedule")]);
        let (after, _) = repair(
            spec(json!({"nodeName": "n1", "containers": [{"name": "a"}]})),
            &cluster,
        );
        let (again, messages) = repair(spec(after.clone()), &cluster);
        assert!(messages.is_empty());
        assert_eq!(again, after);
    }

    #[test]
    fn toleration_matching_follows_the_api() {
        let t = taint("k", Some("v"), "NoSchedule");
        let cases = [
            (json!({"operator": "Exists"}), true),
            (json!({"key": "k", "operator": "Exists"}), true),
            (json!({"key": "k", "value": "v"}), true),
            (
                json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}),
                true,
            ),
            (
                json!({"key": "k", "operator": "Equal", "value": "w"}),
                false,
            ),
            (
                json!({"key": "k", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
        ];
        for (toleration, expected) in cases {
            let parsed: Toleration =
                serde_json::from_value(toleration.clone()).expect("toleration");
            assert_eq!(tolerates(&parsed, &t), expected, "{toleration}");
        }
    }
}
