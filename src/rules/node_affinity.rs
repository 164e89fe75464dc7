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
/// The scheduler a pod without `schedulerName` gets (API defaulting).
const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// Kubernetes' own taints: the node controller's condition taints (`not-ready`,
/// `unreachable`, `memory-pressure`, `disk-pressure`, `pid-pressure`,
/// `network-unavailable`), the cordon (`unschedulable`) and `out-of-service`. Never tolerated:
/// under a pressure condition the kubelet's eviction admission rejects the pod (`Evicted`) and
/// its controller recreates it at once, the storm this rule exists to stop
/// (`pkg/kubelet/eviction/eviction_manager.go`, `Admit`); without the toleration the pod waits
/// `Pending` until the condition clears.
const KUBERNETES_TAINTS: &str = "node.kubernetes.io/";

/// The taint a cordon (`spec.unschedulable`) puts on a node (the node lifecycle controller's
/// `doNoScheduleTaintingPass`, `pkg/controller/nodelifecycle`).
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

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
    ("schedulerName", &Shape::All),
    ("schedulingGates", &Shape::All),
    ("topologySpreadConstraints", &Shape::All),
    ("priorityClassName", &Shape::All),
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

    /// Rewrites only where the pod keeps what it could do: otherwise the spec stays as it is
    /// and the one message (a note) says why.
    fn repair(&self, spec: &mut PodSpec, _meta: &PodMeta, cx: &RuleContext<'_>) -> Vec<String> {
        let Some(node) = spec.node_name.clone().filter(|name| !name.is_empty()) else {
            return Vec::new();
        };
        if let Some(why) = self.why_leave(spec, &node, cx) {
            return vec![format!("left as is: {why}")];
        }
        let tolerations = match self.tolerations_to_add(spec, &node, cx) {
            Ok(tolerations) => tolerations,
            Err(why) => return vec![format!("left as is: {why}")],
        };
        spec.node_name = None;
        require_node(spec, &node);
        let mut messages = vec![format!(
            "spec.nodeName={node} became required node affinity, so the scheduler checks the pod fits"
        )];
        if !tolerations.is_empty() {
            let keys: Vec<&str> = tolerations
                .iter()
                .filter_map(|t| t.key.as_deref())
                .collect();
            messages.push(format!(
                "tolerations added for node {node}'s NoSchedule taints: {}",
                keys.join(", ")
            ));
            spec.tolerations
                .get_or_insert_with(Vec::new)
                .extend(tolerations);
        }
        messages.extend(untolerated_kubernetes_taints(spec, &node, cx));
        if let Some(class) = spec
            .priority_class_name
            .as_deref()
            .filter(|c| !c.is_empty())
        {
            messages.push(format!(
                "priority class {class}: unlike nodeName, the scheduler may preempt lower-priority pods on {node}"
            ));
        }
        messages
    }
}

impl NodeAffinity {
    /// Why the rewrite would take away what the `nodeName` pod could do, if it would. The
    /// kubelet admits a bound pod on resources, node name, host ports, node affinity and
    /// NoExecute taints only (`pkg/kubelet/lifecycle/predicate.go`); the scheduler enforces
    /// more, and only for the pods it is responsible for.
    fn why_leave(&self, spec: &PodSpec, node: &str, cx: &RuleContext<'_>) -> Option<String> {
        if spec
            .scheduling_gates
            .as_ref()
            .is_some_and(|g| !g.is_empty())
        {
            // ValidatePodCreate refuses nodeName with schedulingGates: the client sees why.
            return Some("nodeName with schedulingGates is refused by the API server".to_string());
        }
        let scheduler = spec
            .scheduler_name
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_SCHEDULER);
        if !self.config.schedulers.iter().any(|s| s == scheduler) {
            return Some(format!(
                "schedulerName {scheduler} is not known to honour matchFields (config: schedulers)"
            ));
        }
        if !self.config.rewrite_constrained_pods
            && let Some(constraint) = scheduler_only_constraint(spec)
        {
            return Some(format!(
                "the scheduler would enforce its {constraint}, which the kubelet never did"
            ));
        }
        if self.config.skip_priority_classes
            && let Some(class) = spec
                .priority_class_name
                .as_deref()
                .filter(|c| !c.is_empty())
        {
            return Some(format!(
                "priority class {class}: as affinity it could preempt pods (skipPriorityClasses)"
            ));
        }
        if !cx.cluster.lookups_enabled() {
            return Some(format!(
                "node {node}'s taints are unknown without cluster look-ups"
            ));
        }
        if cx.cluster.node_taints(node).is_none() {
            // PodGC deletes a pod bound to a missing node after 40 s
            // (pkg/controller/podgc); pinned by affinity it would wait Pending forever.
            return Some(format!(
                "node {node} is not known (not in the cluster, or not seen yet)"
            ));
        }
        None
    }

    /// The tolerations the scheduler needs to place the pod where `nodeName` put it: one for
    /// each NoSchedule taint of the node not yet tolerated, except Kubernetes' own and the
    /// configured ones. Err when the namespace's `PodTolerationRestriction` whitelist would
    /// refuse one: that refusal comes after every webhook, and `failurePolicy` cannot help.
    fn tolerations_to_add(
        &self,
        spec: &PodSpec,
        node: &str,
        cx: &RuleContext<'_>,
    ) -> Result<Vec<Toleration>, String> {
        if !self.config.tolerate_node_taints {
            return Ok(Vec::new());
        }
        let taints = cx.cluster.node_taints(node).unwrap_or_default();
        let existing = spec.tolerations.as_deref().unwrap_or_default();
        let mut added: Vec<Toleration> = Vec::new();
        for taint in taints.iter().filter(|t| t.effect == NO_SCHEDULE) {
            if taint.key.starts_with(KUBERNETES_TAINTS)
                || self.config.ignore_taints.contains(&taint.key)
                || existing.iter().chain(&added).any(|t| tolerates(t, taint))
            {
                continue;
            }
            added.push(toleration_for(taint));
        }
        if let Some(whitelist) = cx.cluster.toleration_whitelist(cx.namespace)
            && !whitelist.is_empty()
            && let Some(refused) = added
                .iter()
                .find(|t| !whitelist.iter().any(|w| is_superset(w, t)))
        {
            return Err(format!(
                "namespace {}'s tolerationsWhitelist would refuse a toleration for {}",
                cx.namespace,
                refused.key.as_deref().unwrap_or_default()
            ));
        }
        Ok(added)
    }
}

/// What the pod now waits for: a Kubernetes NoSchedule taint on its node that it does not
/// tolerate (a cordon, a node condition) kept the scheduler away, where `nodeName` went past
/// it. Without the word, a cordoned node's pod sits `Pending` with no reason the user sees.
fn untolerated_kubernetes_taints(
    spec: &PodSpec,
    node: &str,
    cx: &RuleContext<'_>,
) -> Option<String> {
    let existing = spec.tolerations.as_deref().unwrap_or_default();
    let keys: Vec<String> = cx
        .cluster
        .node_taints(node)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.effect == NO_SCHEDULE && t.key.starts_with(KUBERNETES_TAINTS))
        .filter(|t| !existing.iter().any(|toleration| tolerates(toleration, t)))
        .map(|t| {
            if t.key == UNSCHEDULABLE_TAINT {
                format!("{} (cordoned)", t.key)
            } else {
                t.key
            }
        })
        .collect();
    (!keys.is_empty()).then(|| {
        format!(
            "the pod waits Pending while node {node} has {}, which nodeName went past",
            keys.join(", ")
        )
    })
}

/// The first constraint of the pod that the scheduler enforces and the kubelet never checked
/// for a bound pod: required pod affinity or anti-affinity, or a topology spread constraint
/// with `whenUnsatisfiable: DoNotSchedule`.
fn scheduler_only_constraint(spec: &PodSpec) -> Option<&'static str> {
    let affinity = spec.affinity.as_ref();
    let required_affinity = affinity
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|terms| !terms.is_empty());
    let required_anti_affinity = affinity
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|terms| !terms.is_empty());
    let spread = spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .any(|c| c.when_unsatisfiable == "DoNotSchedule");
    if required_affinity {
        Some("required pod affinity")
    } else if required_anti_affinity {
        Some("required pod anti-affinity")
    } else if spread {
        Some("DoNotSchedule topology spread")
    } else {
        None
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

/// `isSuperset` of `pkg/util/tolerations`: whether the whitelisted `allowed` admits `t`
/// (`PodTolerationRestriction`'s `VerifyAgainstWhitelist`).
fn is_superset(allowed: &Toleration, t: &Toleration) -> bool {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    if allowed == t {
        return true;
    }
    let allowed_op = text(&allowed.operator);
    if text(&t.key) != text(&allowed.key)
        && (!text(&allowed.key).is_empty() || allowed_op != "Exists")
    {
        return false;
    }
    let allowed_effect = text(&allowed.effect);
    if text(&t.effect) != allowed_effect && !allowed_effect.is_empty() {
        return false;
    }
    if allowed_effect == "NoExecute"
        && let Some(limit) = allowed.toleration_seconds
        && t.toleration_seconds.is_none_or(|s| s > limit)
    {
        return false;
    }
    match allowed_op.as_str() {
        "" | "Equal" => text(&t.operator) == "Equal" && text(&t.value) == text(&allowed.value),
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
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                       "labelSelector": {"matchLabels": {"app": "x"}}}}
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
            after["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                [0]["weight"],
            10
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
    fn user_no_schedule_taints_are_tolerated_and_kubernetes_own_taints_never() {
        let cluster = StaticCluster::empty().with_node(
            "vk",
            vec![
                taint("virtual-kubelet.io/provider", Some("azure"), "NoSchedule"),
                taint("dedicated", None, "NoSchedule"),
                taint("node.kubernetes.io/unschedulable", None, "NoSchedule"),
                taint("node.kubernetes.io/disk-pressure", None, "NoSchedule"),
                taint("node.kubernetes.io/memory-pressure", None, "NoSchedule"),
                taint("node.kubernetes.io/pid-pressure", None, "NoSchedule"),
                taint("node.kubernetes.io/network-unavailable", None, "NoSchedule"),
                taint("node.kubernetes.io/not-ready", None, "NoSchedule"),
                taint("node.kubernetes.io/unreachable", None, "NoSchedule"),
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
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[1].contains("virtual-kubelet.io/provider"));
        assert!(
            messages[2].starts_with(
                "the pod waits Pending while node vk has node.kubernetes.io/unschedulable (cordoned), node.kubernetes.io/disk-pressure,"
            ),
            "{messages:?}"
        );
    }

    #[test]
    fn configured_taints_are_never_tolerated_either() {
        let cluster =
            StaticCluster::empty().with_node("n1", vec![taint("dedicated", None, "NoSchedule")]);
        let config = NodeAffinityConfig {
            ignore_taints: vec!["dedicated".to_string()],
            ..NodeAffinityConfig::default()
        };
        let (after, _) = repair_with(
            config,
            spec(json!({"nodeName": "n1", "containers": [{"name": "a"}]})),
            &cluster,
        );
        assert!(after.get("nodeName").is_none());
        assert!(after.get("tolerations").is_none());
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

    /// The pod's spec unchanged and one note starting "left as is:" that contains `why`.
    fn assert_left(pod: Value, cluster: &StaticCluster, config: NodeAffinityConfig, why: &str) {
        let before = serde_json::to_value(spec(pod.clone())).expect("serializes");
        let (after, messages) = repair_with(config, spec(pod), cluster);
        assert_eq!(after, before, "the spec is unchanged");
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].starts_with("left as is: ") && messages[0].contains(why),
            "{messages:?}"
        );
        assert!(messages[0].len() <= 120, "{}", messages[0]);
    }

    fn toleration(value: Value) -> Toleration {
        serde_json::from_value(value).expect("toleration")
    }

    #[test]
    fn a_node_not_in_the_cluster_leaves_the_pod_as_it_is() {
        // PodGC deletes a pod bound to a missing node after 40 s (pkg/controller/podgc);
        // pinned by affinity it would wait Pending forever.
        assert_left(
            json!({"nodeName": "ghost", "containers": [{"name": "a"}]}),
            &StaticCluster::empty(),
            NodeAffinityConfig::default(),
            "node ghost is not known",
        );
    }

    #[test]
    fn without_cluster_look_ups_the_pod_is_left_as_it_is_and_the_note_says_why() {
        // Without the node's taints a rewrite could leave a pod that ran on a tainted node
        // (control plane, virtual-kubelet, dedicated) Pending forever.
        assert_left(
            json!({"nodeName": "n1", "containers": [{"name": "a"}]}),
            &StaticCluster::offline(),
            NodeAffinityConfig::default(),
            "taints are unknown without cluster look-ups",
        );
    }

    #[test]
    fn constraints_the_kubelet_never_enforced_leave_the_pod_as_it_is_unless_configured() {
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        let term = json!({"topologyKey": "kubernetes.io/hostname",
                          "labelSelector": {"matchLabels": {"app": "x"}}});
        let spread = json!([{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                             "labelSelector": {"matchLabels": {"app": "x"}}}]);
        let cases = [
            (
                "affinity",
                json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}),
                "required pod affinity",
            ),
            (
                "affinity",
                json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}),
                "required pod anti-affinity",
            ),
            (
                "topologySpreadConstraints",
                spread,
                "DoNotSchedule topology spread",
            ),
        ];
        for (field, value, why) in cases {
            let mut pod = json!({"nodeName": "n1", "containers": [{"name": "a"}]});
            pod[field] = value;
            assert_left(pod.clone(), &cluster, NodeAffinityConfig::default(), why);
            let rewrite = NodeAffinityConfig {
                rewrite_constrained_pods: true,
                ..NodeAffinityConfig::default()
            };
            let (after, _) = repair_with(rewrite, spec(pod), &cluster);
            assert!(
                after.get("nodeName").is_none(),
                "{why}: rewritten when configured"
            );
        }
        // A ScheduleAnyway spread is a preference the scheduler may ignore.
        let (after, _) = repair(
            spec(json!({"nodeName": "n1", "containers": [{"name": "a"}],
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                    "whenUnsatisfiable": "ScheduleAnyway"}]})),
            &cluster,
        );
        assert!(after.get("nodeName").is_none());
    }

    #[test]
    fn a_pod_for_a_scheduler_not_known_to_honour_match_fields_is_left_as_it_is() {
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        let pod =
            json!({"nodeName": "n1", "schedulerName": "volcano", "containers": [{"name": "a"}]});
        assert_left(
            pod.clone(),
            &cluster,
            NodeAffinityConfig::default(),
            "schedulerName volcano",
        );
        let known = NodeAffinityConfig {
            schedulers: vec!["default-scheduler".to_string(), "volcano".to_string()],
            ..NodeAffinityConfig::default()
        };
        let (after, _) = repair_with(known, spec(pod), &cluster);
        assert!(after.get("nodeName").is_none());
        let (after, _) = repair(
            spec(
                json!({"nodeName": "n1", "schedulerName": "default-scheduler",
                        "containers": [{"name": "a"}]}),
            ),
            &cluster,
        );
        assert!(after.get("nodeName").is_none());
    }

    #[test]
    fn a_gated_pod_is_left_as_it_is_for_the_api_server_to_refuse() {
        assert_left(
            json!({"nodeName": "n1", "schedulingGates": [{"name": "example.com/wait"}],
                   "containers": [{"name": "a"}]}),
            &StaticCluster::empty().with_node("n1", vec![]),
            NodeAffinityConfig::default(),
            "schedulingGates",
        );
    }

    #[test]
    fn a_pod_with_a_priority_class_is_told_it_may_preempt_or_left_when_configured() {
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        let pod =
            json!({"nodeName": "n1", "priorityClassName": "high", "containers": [{"name": "a"}]});
        let (after, messages) = repair(spec(pod.clone()), &cluster);
        assert!(after.get("nodeName").is_none());
        assert!(
            messages
                .iter()
                .any(|m| m.contains("priority class high") && m.contains("preempt")),
            "{messages:?}"
        );
        let skip = NodeAffinityConfig {
            skip_priority_classes: true,
            ..NodeAffinityConfig::default()
        };
        assert_left(pod, &cluster, skip, "priority class high");
    }

    #[test]
    fn a_toleration_the_namespace_whitelist_refuses_leaves_the_pod_as_it_is() {
        let pod = json!({"nodeName": "n1", "containers": [{"name": "a"}]});
        let cluster = StaticCluster::empty()
            .with_node("n1", vec![taint("dedicated", Some("ci"), "NoSchedule")]);
        let refusing = cluster.clone().with_toleration_whitelist(
            "default",
            vec![toleration(json!({"key": "other", "operator": "Exists"}))],
        );
        assert_left(
            pod.clone(),
            &refusing,
            NodeAffinityConfig::default(),
            "tolerationsWhitelist",
        );
        let allowing = cluster.with_toleration_whitelist(
            "default",
            vec![toleration(
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}),
            )],
        );
        let (after, _) = repair(spec(pod), &allowing);
        assert_eq!(
            after["tolerations"],
            json!([{"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn whitelist_matching_follows_pod_toleration_restriction() {
        let added = toleration(
            json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}),
        );
        let cases = [
            (json!({"operator": "Exists"}), true),
            (json!({"key": "k", "operator": "Exists"}), true),
            (json!({"key": "k", "operator": "Equal", "value": "v"}), true),
            (
                json!({"key": "k", "value": "v", "effect": "NoSchedule"}),
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
        for (allowed, expected) in cases {
            assert_eq!(
                is_superset(&toleration(allowed.clone()), &added),
                expected,
                "{allowed}"
            );
        }
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
