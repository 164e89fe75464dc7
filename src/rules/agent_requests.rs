//! `agent-requests`: small agent pods pinned to a node (Pinniped's kube-cert-agent) must land
//! there even when its allocatable resources are fully requested. Their requests become an
//! explicit `"0"` (an absent request would be defaulted back to the limit) and their limits
//! stay, so the pod is Burstable, not BestEffort. A namespace LimitRange that forbids zero (a
//! `min`, a `maxLimitRequestRatio`) gets the smallest request it accepts instead. The Docker
//! guard `dind-rm` injects (`podmend-guard`) is left as `dind-rm` made it.
//!
//! What the rule keeps true, and why:
//! - Only pods pinned to one node are repaired by default (`onlyPinned`): a pod the scheduler
//!   may place anywhere fits somewhere, and zeroing its requests only lets nodes be overpacked.
//! - A request no limit bounds is kept (unless `limitFromRequest`): zeroing it leaves the
//!   container unbounded, and a limit invented from it throttles and OOM-kills the container
//!   at its request where it could burst before. A pod-level limit bounds the containers
//!   without limits of their own; with pod-level limits no container limit is ever invented.
//! - A Guaranteed pod with whole-number CPU requests is left alone (unless
//!   `zeroExclusiveCpus`): under the static CPU manager policy its containers have exclusive
//!   cores, which a Burstable pod loses (`pkg/kubelet/cm/cpumanager/policy_static.go`).
//! - The findings say what the repair costs: a Guaranteed pod becomes Burstable; with a memory
//!   request of 0 the OOM score adjustment is 999 (`pkg/kubelet/qos/policy.go`) and, its use
//!   always above its request, the pod is in the first group the kubelet evicts under memory
//!   pressure (`rankMemoryPressure` in `pkg/kubelet/eviction/helpers.go`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, LimitRangeItem, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{Modes, PodMeta, Rule, RuleContext, RuleInfo};
use crate::config::AgentRequestsConfig;
use crate::dind::GUARD_CONTAINER;
use crate::engine::document::{Shape, View};
use crate::quantity::{self, Milli};

/// The rule's id, summary and help (see [`RuleInfo`]).
pub const INFO: RuleInfo = RuleInfo {
    id: "agent-requests",
    summary: "An agent pod that must land on a given node cannot fit when the node's resources are \
              fully requested; podmend sets its cpu and memory requests to 0 and keeps its limits.",
    help: "set the agent's cpu/memory requests to \"0\" and keep its limits",
};
/// The rule's id.
pub const ID: &str = INFO.id;

/// Marks any pod as an agent, whatever its labels.
pub const AGENT_ANNOTATION: &str = "podmend.io/agent";

pub struct AgentRequests {
    config: AgentRequestsConfig,
}

impl AgentRequests {
    pub fn new(config: AgentRequestsConfig) -> Self {
        Self { config }
    }

    fn is_agent(&self, meta: &PodMeta) -> bool {
        opted_in(meta)
            || self
                .config
                .presets
                .iter()
                .any(|preset| meta.labels.contains_key(preset.label_key()))
            || self
                .config
                .selectors
                .iter()
                .any(|selector| selector_matches(selector, &meta.labels))
    }
}

/// Whether the pod carries `podmend.io/agent: "true"`: an explicit opt-in, which `onlyPinned`
/// does not restrict.
fn opted_in(meta: &PodMeta) -> bool {
    meta.annotations.get(AGENT_ANNOTATION).map(String::as_str) == Some("true")
}

/// The note on a selected agent pod that is not pinned to one node, left alone.
pub const NOT_PINNED: &str = "agent pod not pinned to one node: requests kept (onlyPinned); \
                              podmend.io/agent: \"true\" opts it in";

/// The note on a Guaranteed agent pod with whole-number CPU requests, left alone.
pub const EXCLUSIVE_CPUS: &str = "agent pod left alone: Guaranteed with whole CPUs (exclusive \
                                  cores under the static CPU manager); see zeroExclusiveCpus";

/// What the repair reads and changes of a container: its resources, and by its name and
/// restart policy, whether it is the guard and whether it runs beside the others (a sidecar).
static CONTAINER_READS: Shape = Shape::Fields(&[
    ("name", &Shape::All),
    ("resources", &Shape::All),
    ("restartPolicy", &Shape::All),
]);

/// What the repair reads and changes of a pod spec (the parts it compares and restores, see
/// `repaired_parts`), and where it reads the node the pod is pinned to (`nodeName`,
/// `affinity`; never changed): the engine builds only these.
static READS: Shape = Shape::Fields(&[
    ("nodeName", &Shape::All),
    ("affinity", &Shape::All),
    ("containers", &Shape::Items(&CONTAINER_READS)),
    ("initContainers", &Shape::Items(&CONTAINER_READS)),
    ("resources", &Shape::All),
]);

impl Rule for AgentRequests {
    fn info(&self) -> &'static RuleInfo {
        &INFO
    }

    fn modes(&self) -> Modes {
        Modes {
            pods: self.config.mode,
            templates: self.config.templates,
        }
    }

    fn may_apply(&self, _raw_spec: &dyn View, meta: &PodMeta) -> bool {
        self.is_agent(meta)
    }

    fn reads(&self) -> Option<&'static Shape> {
        Some(&READS)
    }

    fn repair(&self, spec: &mut PodSpec, meta: &PodMeta, cx: &RuleContext<'_>) -> Vec<String> {
        if !self.is_agent(meta) {
            return Vec::new();
        }
        // node-affinity runs first and turns nodeName into required node affinity: both count.
        if self.config.only_pinned && !opted_in(meta) && pinned_node(spec).is_none() {
            return vec![NOT_PINNED.to_string()];
        }
        // Debug builds (every unit, property, fixture and fuzz run) check that the repair
        // touches only the parts it compares and restores.
        #[cfg(debug_assertions)]
        let before = spec.clone();
        let messages = self.repair_agent(spec, cx);
        #[cfg(debug_assertions)]
        {
            let mut expected = before;
            restore_repaired_parts(&mut expected, spec);
            debug_assert!(
                expected == *spec,
                "agent-requests changed a part of the pod spec it neither compares nor restores"
            );
        }
        messages
    }
}

impl AgentRequests {
    /// The repair of an agent pod: its containers' and its own requests, within the
    /// namespace's LimitRanges.
    fn repair_agent(&self, spec: &mut PodSpec, cx: &RuleContext<'_>) -> Vec<String> {
        let (container_ranges, pod_ranges): (Vec<LimitRangeItem>, Vec<LimitRangeItem>) = cx
            .cluster
            .limit_range_items(cx.namespace)
            .into_iter()
            .filter(|item| item.type_ == "Container" || item.type_ == "Pod")
            .partition(|item| item.type_ == "Container");
        // Zeroing then meeting a Pod LimitRange can land where it started: compare at the end.
        let original = copy_of_repaired_parts(spec);
        let mut resources: Vec<&str> = self.config.resources.iter().map(String::as_str).collect();
        let mut bounds = PodBounds::of(&original);
        loop {
            let ranges = (&container_ranges[..], &pod_ranges[..]);
            let changed = self.repair_resources(spec, &original, &resources, (ranges, &bounds));
            // A pod-level limit the repair copied from the pod-level request bounds the
            // containers too: the next pass would zero what this one kept for want of a limit.
            // Start again knowing it (the bounds only grow, so this ends).
            if let Some(wider) = bounds.widened_by(&PodBounds::of(spec)) {
                restore_repaired_parts(spec, &original);
                bounds = wider;
                continue;
            }
            // A Pod LimitRange's floor the pod met and the repair cannot (the containers that
            // ran have no room left below their limits): that resource is left as it was, or
            // the LimitRanger would refuse the pod. So is one whose containers, raised to a
            // Container LimitRange's floor, ask for more than the pod-level limit holds: the
            // pod is then invalid, and the LimitRanger's refusal says what is wrong.
            let unmet: Vec<&str> = resources
                .iter()
                .copied()
                .filter(|name| {
                    let below = |spec: &PodSpec| below_pod_floor(spec, name, &pod_ranges);
                    let over = |spec: &PodSpec| over_pod_limit(spec, name);
                    (below(spec) && !below(&original)) || (over(spec) && !over(&original))
                })
                .collect();
            if unmet.is_empty() {
                if repaired_parts(spec) == repaired_parts(&original) {
                    return changed.notes();
                }
                let (before, after) = (qos_class(&original), qos_class(spec));
                let exclusive = exclusive_cpus(&original);
                if exclusive && after != Qos::Guaranteed && !self.config.zero_exclusive_cpus {
                    restore_repaired_parts(spec, &original);
                    return vec![EXCLUSIVE_CPUS.to_string()];
                }
                let mut messages = changed.messages();
                messages.extend(cost_messages((before, after), exclusive, &original, spec));
                return messages;
            }
            restore_repaired_parts(spec, &original);
            resources.retain(|name| !unmet.contains(name));
        }
    }

    /// Every step of the repair, for these resources.
    fn repair_resources(
        &self,
        spec: &mut PodSpec,
        original: &PodSpec,
        resources: &[&str],
        ((container_ranges, pod_ranges), bounds): (
            (&[LimitRangeItem], &[LimitRangeItem]),
            &PodBounds,
        ),
    ) -> Changes {
        let mut changed = Changes::default();
        // The Docker guard dind-rm injected keeps what podmend gave it: every build context
        // and image of the pod passes through it, and a throttled guard stalls the pipeline.
        let own = |c: &Container| c.name != GUARD_CONTAINER;
        let containers = spec.containers.iter_mut();
        let init_containers = spec.init_containers.iter_mut().flatten();
        for container in containers.chain(init_containers).filter(|c| own(c)) {
            let ranges = container_ranges;
            self.repair_container(container, resources, (ranges, bounds), &mut changed);
        }
        let ranges = (container_ranges, pod_ranges);
        self.meet_pod_limit_ranges(spec, resources, ranges, &mut changed);
        self.undo_idle_limit_copies(spec, original, resources, &mut changed);
        self.repair_pod_level(spec, original, resources, pod_ranges, &mut changed);
        changed
    }

    fn repair_container(
        &self,
        container: &mut Container,
        resources_to_zero: &[&str],
        (limit_ranges, bounds): (&[LimitRangeItem], &PodBounds),
        changed: &mut Changes,
    ) {
        let Some(resources) = container.resources.as_mut() else {
            return;
        };
        for &name in resources_to_zero {
            // A request no limit of the container bounds: a pod-level limit bounds it (zeroed,
            // no container limit invented); without one, it is copied into a limit only when
            // asked and no pod-level limit exists, else kept.
            let floor = |limit: Option<Milli>| limit_range_floor(name, limit, limit_ranges);
            let copy_into_limit = self.config.limit_from_request && !bounds.any_limit;
            if unbounded_request(resources, name) && !bounds.limits(name) && !copy_into_limit {
                // Said only where zeroing would have lowered it: a request at a Container
                // LimitRange's floor stays where it is anyway.
                if request_milli(resources, name).is_some_and(|r| r > floor(None)) {
                    changed.keep(name, &container.name);
                }
                continue;
            }
            let copy_into_limit = copy_into_limit && !bounds.limits(name);
            if let Some(outcome) = zero_request(resources, name, copy_into_limit, floor) {
                changed.record(name, &container.name, outcome);
            }
        }
    }

    /// A `type: Pod` LimitRange checks the pod's total request: when the zeroed containers
    /// fall below its floor, the containers take up the difference in order, each up to its
    /// own limit (a request above the limit is invalid) and from its own Container
    /// LimitRange floor (a request below it is refused).
    fn meet_pod_limit_ranges(
        &self,
        spec: &mut PodSpec,
        resources: &[&str],
        (container_ranges, pod_ranges): (&[LimitRangeItem], &[LimitRangeItem]),
        changed: &mut Changes,
    ) {
        if pod_ranges.is_empty() {
            return;
        }
        // With pod-level resources the pod-level request meets it (`repair_pod_level`).
        if spec.resources.is_some() {
            return;
        }
        for &name in resources {
            let limit = aggregate(spec, name, container_limit);
            let floor = limit_range_floor(name, (limit > 0).then_some(limit), pod_ranges);
            if aggregate(spec, name, container_request) >= floor {
                continue;
            }
            // The total is the larger of what runs together (containers and sidecars) and an
            // init container's peak; both are below the floor, so the former makes up the rest.
            let missing = floor - running_request(spec, name);
            add_to_container_requests(spec, (name, missing), container_ranges, changed);
        }
    }

    /// A lone request copied into the limit, zeroed, then given back in full to meet a Pod
    /// LimitRange ends where it started, plus a limit: the next pass would copy the request
    /// podmend gave back into a limit again. Put such a container back as it was.
    fn undo_idle_limit_copies(
        &self,
        spec: &mut PodSpec,
        original: &PodSpec,
        resources_zeroed: &[&str],
        changed: &mut Changes,
    ) {
        let pairs = spec.containers.iter_mut().zip(&original.containers).chain(
            spec.init_containers
                .iter_mut()
                .flatten()
                .zip(original.init_containers.iter().flatten()),
        );
        for (container, before) in pairs {
            let (Some(resources), Some(before)) =
                (container.resources.as_mut(), before.resources.as_ref())
            else {
                continue;
            };
            for &name in resources_zeroed {
                let had_limit = before.limits.as_ref().is_some_and(|l| l.contains_key(name));
                let Some(before_request) = before.requests.as_ref().and_then(|r| r.get(name))
                else {
                    continue;
                };
                let given_back = quantity::parse_milli(&before_request.0)
                    .is_some_and(|b| request_milli(resources, name) == Some(b));
                if had_limit || !given_back {
                    continue;
                }
                let Some(limits) = resources.limits.as_mut() else {
                    continue;
                };
                if limits.remove(name).is_none() {
                    continue;
                }
                if limits.is_empty() && before.limits.is_none() {
                    resources.limits = None;
                }
                resources
                    .requests
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name.to_string(), before_request.clone());
                let entry = format!("{name} ({})", container.name);
                changed.limits_added.retain(|added| *added != entry);
            }
        }
    }

    /// Pod-level `spec.resources` (PodLevelResources): the same, except the request may not
    /// fall below the containers' aggregate request (`validatePodResourceConsistency`), nor
    /// below a `type: Pod` LimitRange's floor: the LimitRanger checks the pod-level value.
    fn repair_pod_level(
        &self,
        spec: &mut PodSpec,
        original: &PodSpec,
        resources_to_zero: &[&str],
        pod_ranges: &[LimitRangeItem],
        changed: &mut Changes,
    ) {
        let Some(mut resources) = spec.resources.take() else {
            return;
        };
        for &name in resources_to_zero {
            let aggregate = aggregate_container_requests(spec, name);
            let implicit_limit = implicit_pod_limit(spec, &resources, name);
            let within = |floor: Milli| implicit_limit.map_or(floor, |limit| floor.min(limit));
            let unset = request_milli(&resources, name).is_none()
                && resources
                    .limits
                    .as_ref()
                    .is_none_or(|l| !l.contains_key(name));
            if unset {
                // A Pod LimitRange's floor, met here rather than by the containers; and the
                // containers' aggregate, which an absent pod request (0) would not cover. Not
                // where the containers kept what they requested (no limit bounded them) and no
                // floor asks for more: the pod stays as it was.
                let range_floor = limit_range_floor(name, implicit_limit, pod_ranges);
                let kept = aggregate == aggregate_container_requests(original, name);
                if !(kept && range_floor <= aggregate) {
                    set_pod_request(
                        &mut resources,
                        name,
                        within(aggregate.max(range_floor)),
                        changed,
                    );
                }
                continue;
            }
            let max_container_limit = max_container_limit(spec, name);
            // A pod limit below a container's limit, or below the containers' aggregate
            // request, is invalid: only copy the request into a missing limit when both fit.
            let limit_from_request = self.config.limit_from_request
                && request_milli(&resources, name)
                    .is_some_and(|r| max_container_limit.is_none_or(|l| l <= r) && aggregate <= r);
            // A pod-level request that neither a pod-level limit nor the containers' limits
            // bound is kept, as a container's is, unless it becomes the limit; or unless the
            // containers now request more (raised to a LimitRange's floor), which it must hold.
            if unbounded_request(&resources, name)
                && implicit_limit.is_none()
                && !limit_from_request
                && request_milli(&resources, name).is_some_and(|r| r >= aggregate)
            {
                changed.keep(name, "(pod)");
                continue;
            }
            let before = resources.clone();
            if let Some(outcome) = zero_request(&mut resources, name, limit_from_request, |limit| {
                within(aggregate.max(limit_range_floor(
                    name,
                    limit.or(implicit_limit),
                    pod_ranges,
                )))
            }) {
                // The request copied into the limit and then given back in full: as it was
                // (see `undo_idle_limit_copies`).
                if outcome.limit_added && request_milli(&before, name) == Some(outcome.floor) {
                    resources = before;
                    continue;
                }
                changed.record(name, "(pod)", outcome);
            }
        }
        spec.resources = Some(resources);
    }
}

/// The pod-level limits of a pod, which bound its containers that have no limits of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodBounds {
    /// Whether the pod sets any pod-level limit: then no container limit is ever invented (it
    /// could only be tighter than what the pod-level limit lets the container use today).
    any_limit: bool,
    /// The resources the pod limits at pod level.
    names: Vec<String>,
}

impl PodBounds {
    fn of(spec: &PodSpec) -> Self {
        let names: Vec<String> = spec
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .map(|limits| limits.keys().cloned().collect())
            .unwrap_or_default();
        Self {
            any_limit: !names.is_empty(),
            names,
        }
    }

    /// Whether a pod-level limit bounds `name`.
    fn limits(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// These bounds and `other`'s together, when `other` limits something these do not.
    fn widened_by(&self, other: &PodBounds) -> Option<PodBounds> {
        let new: Vec<&String> = other.names.iter().filter(|n| !self.limits(n)).collect();
        if new.is_empty() {
            return None;
        }
        let mut names = self.names.clone();
        names.extend(new.into_iter().cloned());
        Some(PodBounds {
            any_limit: true,
            names,
        })
    }
}

/// Whether `resources` request some of `name` and set no limit of it: zeroed, nothing would
/// bound what the container (or pod) uses.
fn unbounded_request(resources: &ResourceRequirements, name: &str) -> bool {
    request_milli(resources, name).is_some_and(|r| r > 0)
        && resources
            .limits
            .as_ref()
            .is_none_or(|l| !l.contains_key(name))
}

/// The one node a pod is pinned to: its `spec.nodeName`, or the node its required node
/// affinity names in `matchFields` (`metadata.name In [node]`) in every term that can match
/// (a term with no requirements matches no node), as `node-affinity` writes it. `None` for a
/// pod the scheduler may place on more than one node.
pub(crate) fn pinned_node(spec: &PodSpec) -> Option<&str> {
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(node);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let mut pinned: Option<&str> = None;
    for term in terms {
        let expressions = term
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty());
        let fields = term.match_fields.as_ref().is_some_and(|f| !f.is_empty());
        if !expressions && !fields {
            continue;
        }
        let node = term.match_fields.iter().flatten().find_map(|field| {
            let values = field.values.as_deref().unwrap_or_default();
            let one = field.key == "metadata.name" && field.operator == "In" && values.len() == 1;
            one.then(|| values[0].as_str())
        })?;
        if pinned.is_some_and(|p| p != node) {
            return None;
        }
        pinned = Some(node);
    }
    pinned
}

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    fn name(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }
}

/// The resources the QoS class is computed from.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// The request of `name` after the API server's defaulting: the request, or, when there is
/// none, the limit (`SetDefaults_Container` copies limits into absent requests).
fn defaulted_request(resources: &ResourceRequirements, name: &str) -> Option<Milli> {
    let has_request = resources
        .requests
        .as_ref()
        .is_some_and(|r| r.contains_key(name));
    if has_request {
        request_milli(resources, name)
    } else {
        limit_milli(resources, name)
    }
}

/// Whether the pod sets pod-level cpu or memory, from which its QoS class is then computed.
fn pod_level_qos(spec: &PodSpec) -> bool {
    spec.resources.as_ref().is_some_and(|r| {
        let sets = |list: &Option<BTreeMap<String, Quantity>>| {
            list.as_ref()
                .is_some_and(|l| QOS_RESOURCES.iter().any(|n| l.contains_key(*n)))
        };
        sets(&r.requests) || sets(&r.limits)
    })
}

/// The pod's QoS class once defaulted, as `ComputePodQOS` (pkg/apis/core/v1/helper/qos)
/// computes it: Guaranteed when every container (or the pod level, when it sets cpu or
/// memory) limits cpu and memory and the summed requests equal the summed limits; BestEffort
/// without any request or limit of either; Burstable otherwise. Zero quantities count as unset.
fn qos_class(spec: &PodSpec) -> Qos {
    let mut requests: BTreeMap<&str, Milli> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Milli> = BTreeMap::new();
    let mut guaranteed = true;
    let mut add = |resources: Option<&ResourceRequirements>| {
        let mut limited = 0;
        for name in QOS_RESOURCES {
            let Some(resources) = resources else {
                continue;
            };
            if let Some(request) = defaulted_request(resources, name).filter(|&r| r > 0) {
                *requests.entry(name).or_default() += request;
            }
            if let Some(limit) = limit_milli(resources, name).filter(|&l| l > 0) {
                *limits.entry(name).or_default() += limit;
                limited += 1;
            }
        }
        if limited < QOS_RESOURCES.len() {
            guaranteed = false;
        }
    };
    if pod_level_qos(spec) {
        add(spec.resources.as_ref());
    } else {
        for container in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            add(container.resources.as_ref());
        }
    }
    if requests.is_empty() && limits.is_empty() {
        Qos::BestEffort
    } else if guaranteed && requests == limits {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// Whether a container of the pod has exclusive cores under the static CPU manager policy:
/// the pod is Guaranteed and the container's cpu request is a whole number
/// (`guaranteedCPUs` in pkg/kubelet/cm/cpumanager/policy_static.go).
fn exclusive_cpus(spec: &PodSpec) -> bool {
    qos_class(spec) == Qos::Guaranteed
        && spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| defaulted_request(c.resources.as_ref()?, "cpu"))
            .any(|cpu| cpu > 0 && cpu % 1000 == 0)
}

/// The pod's memory request as the kubelet ranks it for eviction: the pod-level request when
/// set, else the containers' aggregate, once defaulted.
fn pod_memory_request(spec: &PodSpec) -> Milli {
    let pod_level = spec
        .resources
        .as_ref()
        .and_then(|r| defaulted_request(r, "memory"));
    pod_level.unwrap_or_else(|| {
        aggregate(spec, "memory", |c, name| {
            c.resources
                .as_ref()
                .and_then(|r| defaulted_request(r, name))
                .unwrap_or(0)
        })
    })
}

/// What the repair costs the pod, said once: the QoS class it loses, and what a memory
/// request of 0 means (OOM score adjustment 999, `pkg/kubelet/qos/policy.go`; memory use
/// always above the request, so the first group the kubelet evicts under memory pressure,
/// `rankMemoryPressure` in `pkg/kubelet/eviction/helpers.go`); and the exclusive cores a
/// Guaranteed pod with whole CPUs loses (only with `zeroExclusiveCpus`).
fn cost_messages(
    (before, after): (Qos, Qos),
    exclusive: bool,
    original: &PodSpec,
    spec: &PodSpec,
) -> Vec<String> {
    let qos_lost = before != after;
    let memory_zeroed = pod_memory_request(original) > 0 && pod_memory_request(spec) == 0;
    let head = if qos_lost {
        format!("agent pod: QoS {} -> {}", before.name(), after.name())
    } else if memory_zeroed {
        "agent pod: memory request 0".to_string()
    } else {
        return Vec::new();
    };
    let cost = if memory_zeroed {
        Some("OOM score adj 999, among the first evicted under memory pressure")
    } else if before == Qos::Guaranteed {
        Some("the OOM killer no longer spares it before Burstable pods")
    } else {
        None
    };
    let mut messages = vec![match cost {
        Some(cost) => format!("{head}: {cost}"),
        None => head,
    }];
    if exclusive && qos_lost {
        messages.push(
            "agent pod: its containers lose their exclusive CPUs (static CPU manager policy)"
                .to_string(),
        );
    }
    messages
}

/// The pod-level limit of `name` that defaulting gives a pod without any pod-level limit:
/// the containers' aggregate limit, when they all limit it (`defaultPodLimits`).
fn implicit_pod_limit(
    spec: &PodSpec,
    resources: &ResourceRequirements,
    name: &str,
) -> Option<Milli> {
    let no_pod_limits = resources.limits.as_ref().is_none_or(|limits| {
        !limits
            .keys()
            .any(|k| k == "cpu" || k == "memory" || k.starts_with("hugepages-"))
    });
    let all_limited = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .all(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref()?.get(name))
                .is_some()
        });
    (no_pod_limits && all_limited).then(|| aggregate(spec, name, container_limit))
}

/// Sets the pod-level request of `name`, which had none, to `floor`, unless that is 0.
fn set_pod_request(
    resources: &mut ResourceRequirements,
    name: &str,
    floor: Milli,
    changed: &mut Changes,
) {
    if floor <= 0 {
        return;
    }
    resources
        .requests
        .get_or_insert_with(BTreeMap::new)
        .insert(name.to_string(), Quantity(format_quantity(name, floor)));
    let outcome = RequestRepair {
        floor,
        limit_added: false,
    };
    changed.record(name, "(pod)", outcome);
}

/// What the containers and sidecars request of `name` together: what runs at once.
fn running_request(spec: &PodSpec, name: &str) -> Milli {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .map(|c| container_request(c, name))
        .sum()
}

/// Adds `missing` of `name` to the containers' requests, in order, each up to its own limit
/// (a request above the limit is invalid) and at least to its Container LimitRange floor (a
/// container that had no request of `name` would otherwise get one below it, which the
/// LimitRanger refuses, and the next pass would raise it); the guard container is left as it
/// is.
fn add_to_container_requests(
    spec: &mut PodSpec,
    (name, mut missing): (&str, Milli),
    container_ranges: &[LimitRangeItem],
    changed: &mut Changes,
) {
    for container in spec
        .containers
        .iter_mut()
        .filter(|c| c.name != GUARD_CONTAINER)
    {
        if missing <= 0 {
            break;
        }
        let request = container_request(container, name);
        let limit = container
            .resources
            .as_ref()
            .and_then(|r| limit_milli(r, name));
        let room = limit.map_or(missing, |limit| (limit - request).max(0));
        let added = room.min(missing);
        if added <= 0 {
            continue;
        }
        let floor = limit_range_floor(name, limit, container_ranges);
        let new_request = (request + added).max(floor);
        let new_request = limit.map_or(new_request, |limit| new_request.min(limit));
        missing -= new_request - request;
        container
            .resources
            .get_or_insert_with(ResourceRequirements::default)
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert(
                name.to_string(),
                Quantity(format_quantity(name, new_request)),
            );
        changed.record(
            name,
            &container.name,
            RequestRepair {
                floor: new_request,
                limit_added: false,
            },
        );
    }
}

/// What became of one resource request: the floor it was set to, and whether a lone request
/// was copied into the limit first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RequestRepair {
    floor: Milli,
    limit_added: bool,
}

/// Sets `requests[name]` to the floor (0 unless a LimitRange needs more), copying a lone
/// request into the limit first when asked. `None` when nothing changed.
fn zero_request(
    resources: &mut ResourceRequirements,
    name: &str,
    limit_from_request: bool,
    floor: impl Fn(Option<Milli>) -> Milli,
) -> Option<RequestRepair> {
    let request = resources
        .requests
        .as_ref()
        .and_then(|r| r.get(name))
        .cloned();
    let limit = resources.limits.as_ref().and_then(|l| l.get(name)).cloned();
    let mut limit_added = false;
    let limit_milli = match (&request, &limit) {
        (None, None) => return None,
        (_, Some(limit)) => quantity::parse_milli(&limit.0),
        (Some(request), None) => {
            let request_milli = quantity::parse_milli(&request.0);
            if limit_from_request && request_milli.is_some_and(|r| r > 0) {
                resources
                    .limits
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name.to_string(), request.clone());
                limit_added = true;
            }
            request_milli.filter(|_| limit_added)
        }
    };
    // Whole bytes, rounded up; but never above the limit (invalid): where a LimitRange floor
    // is higher, no request meets both, and the LimitRanger's refusal says so better than a
    // request above its limit. (A limit of a fraction of a byte is legal, if odd.)
    let floor = floor(limit_milli);
    let floor = match limit_milli {
        Some(limit) if round_for_resource(name, floor) > limit => floor.min(limit),
        _ => round_for_resource(name, floor),
    };
    let current = request.as_ref().and_then(|r| quantity::parse_milli(&r.0));
    if current == Some(floor) && !limit_added {
        return None;
    }
    let text = if floor % 1000 == 0 {
        format_quantity(name, floor)
    } else {
        quantity::format_milli(floor)
    };
    resources
        .requests
        .get_or_insert_with(BTreeMap::new)
        .insert(name.to_string(), Quantity(text));
    Some(RequestRepair { floor, limit_added })
}

/// The smallest request the namespace's Container LimitRanges accept: their `min`, and
/// for `maxLimitRequestRatio` the request that keeps limit/request within the ratio,
/// compared exactly as LimitRanger's `limitRequestRatioConstraint` does.
pub(crate) fn limit_range_floor(
    name: &str,
    limit: Option<Milli>,
    items: &[LimitRangeItem],
) -> Milli {
    let mut floor: Milli = 0;
    for item in items {
        if let Some(min) = item
            .min
            .as_ref()
            .and_then(|m| m.get(name))
            .and_then(|q| quantity::parse_milli(&q.0))
        {
            floor = floor.max(min);
        }
        let ratio = item
            .max_limit_request_ratio
            .as_ref()
            .and_then(|r| r.get(name))
            .and_then(|q| quantity::parse_milli(&q.0));
        if let (Some(ratio), Some(limit)) = (ratio, limit) {
            floor = floor.max(ratio_floor(name, limit, ratio));
        }
    }
    round_for_resource(name, floor)
}

fn ratio_floor(name: &str, limit: Milli, ratio: Milli) -> Milli {
    if ratio <= 0 || limit <= 0 {
        return 0;
    }
    let mut request = round_for_resource(name, (limit * 1000 + ratio - 1) / ratio);
    let step = if is_byte_resource(name) { 1000 } else { 1 };
    // LimitRanger compares as float64: (limit / request) * 1000 > ratio is rejected.
    while (limit as f64 / request as f64) * 1000.0 > ratio as f64 {
        request += step;
    }
    request
}

pub(crate) fn is_byte_resource(name: &str) -> bool {
    name != "cpu"
}

/// Memory and storage requests are whole bytes; cpu keeps milli-cores.
fn round_for_resource(name: &str, milli: Milli) -> Milli {
    if is_byte_resource(name) && milli % 1000 != 0 {
        (milli / 1000 + 1) * 1000
    } else {
        milli
    }
}

pub(crate) fn format_quantity(name: &str, milli: Milli) -> String {
    if is_byte_resource(name) {
        quantity::format_whole_units_up(milli)
    } else {
        quantity::format_milli(milli)
    }
}

fn request_milli(resources: &ResourceRequirements, name: &str) -> Option<Milli> {
    resources
        .requests
        .as_ref()
        .and_then(|r| r.get(name))
        .and_then(|q| quantity::parse_milli(&q.0))
}

fn limit_milli(resources: &ResourceRequirements, name: &str) -> Option<Milli> {
    resources
        .limits
        .as_ref()
        .and_then(|l| l.get(name))
        .and_then(|q| quantity::parse_milli(&q.0))
}

fn container_request(container: &Container, name: &str) -> Milli {
    container
        .resources
        .as_ref()
        .and_then(|r| request_milli(r, name))
        .unwrap_or(0)
}

fn container_limit(container: &Container, name: &str) -> Milli {
    container
        .resources
        .as_ref()
        .and_then(|r| limit_milli(r, name))
        .unwrap_or(0)
}

/// The parts of a pod spec this rule repairs: containers, init containers, pod-level
/// resources. The repair compares and restores these only; debug builds check it changes
/// nothing else.
type RepairedParts<'a> = (
    &'a Vec<Container>,
    &'a Option<Vec<Container>>,
    &'a Option<ResourceRequirements>,
);

fn repaired_parts(spec: &PodSpec) -> RepairedParts<'_> {
    (&spec.containers, &spec.init_containers, &spec.resources)
}

/// Puts `original`'s repaired parts back into `spec`.
fn restore_repaired_parts(spec: &mut PodSpec, original: &PodSpec) {
    spec.containers.clone_from(&original.containers);
    spec.init_containers.clone_from(&original.init_containers);
    spec.resources.clone_from(&original.resources);
}

/// A pod spec with only `spec`'s repaired parts, the rest left default: what the repair
/// compares with and goes back to. Copying the whole spec copied every volume too.
fn copy_of_repaired_parts(spec: &PodSpec) -> PodSpec {
    let mut copy = PodSpec::default();
    restore_repaired_parts(&mut copy, spec);
    copy
}

/// Whether the containers' aggregate request of `name` is below a `type: Pod` LimitRange's
/// floor, as the LimitRanger checks a pod without pod-level resources (`repair_pod_level`
/// meets the floor of one with them).
fn below_pod_floor(spec: &PodSpec, name: &str, pod_ranges: &[LimitRangeItem]) -> bool {
    if pod_ranges.is_empty() || spec.resources.is_some() {
        return false;
    }
    let limit = aggregate(spec, name, container_limit);
    let floor = limit_range_floor(name, (limit > 0).then_some(limit), pod_ranges);
    aggregate(spec, name, container_request) < floor
}

/// Whether the containers' aggregate request of `name` is above the pod-level limit, which
/// the pod-level request may not exceed nor fall below that aggregate
/// (`validatePodResourceConsistency`): no pod-level request is then valid.
fn over_pod_limit(spec: &PodSpec, name: &str) -> bool {
    let limit = spec.resources.as_ref().and_then(|r| limit_milli(r, name));
    limit.is_some_and(|limit| aggregate_container_requests(spec, name) > limit)
}

fn aggregate_container_requests(spec: &PodSpec, name: &str) -> Milli {
    aggregate(spec, name, container_request)
}

/// The containers' aggregate as the API computes it for pod-level checks
/// (`AggregateContainerRequests`): regular containers and sidecars add up; a regular init
/// container runs alone beside the sidecars started before it.
fn aggregate(spec: &PodSpec, name: &str, of: fn(&Container, &str) -> Milli) -> Milli {
    let mut sum: Milli = spec.containers.iter().map(|c| of(c, name)).sum();
    let mut sidecars: Milli = 0;
    let mut init_peak: Milli = 0;
    for init in spec.init_containers.iter().flatten() {
        let value = of(init, name);
        if init.restart_policy.as_deref() == Some("Always") {
            sum += value;
            sidecars += value;
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(value + sidecars);
        }
    }
    sum.max(init_peak)
}

fn max_container_limit(spec: &PodSpec, name: &str) -> Option<Milli> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(name))
        .filter_map(|q| quantity::parse_milli(&q.0))
        .max()
}

/// `metav1.LabelSelector` semantics: every matchLabels pair and every expression must hold.
fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let expressions_match = selector.match_expressions.iter().flatten().all(|expr| {
        let value = labels.get(&expr.key);
        let values = expr.values.as_deref().unwrap_or_default();
        match expr.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_match && expressions_match
}

/// Collects what changed across containers into a few short messages.
#[derive(Default)]
struct Changes {
    zeroed: Vec<String>,
    floors: Vec<String>,
    limits_added: Vec<String>,
    containers: Vec<String>,
    /// Requests kept because nothing would bound them: per container, the resources.
    kept: Vec<(String, Vec<String>)>,
}

impl Changes {
    /// A request of `resource` kept on `container`: no limit bounds it.
    fn keep(&mut self, resource: &str, container: &str) {
        let at = match self.kept.iter().position(|(name, _)| name == container) {
            Some(at) => at,
            None => {
                self.kept.push((container.to_string(), Vec::new()));
                self.kept.len() - 1
            }
        };
        push_unique(&mut self.kept[at].1, resource);
    }

    /// What the repair left alone and why, when it changed nothing.
    fn notes(&self) -> Vec<String> {
        if self.kept.is_empty() {
            return Vec::new();
        }
        let kept: Vec<String> = self
            .kept
            .iter()
            .map(|(container, resources)| {
                let at = if container == "(pod)" {
                    "pod level"
                } else {
                    container
                };
                format!("{} ({at})", resources.join("/"))
            })
            .collect();
        vec![format!(
            "agent pod: requests kept, no limit bounds them: {}; zeroing them safely needs a limit",
            kept.join(", ")
        )]
    }

    fn record(&mut self, resource: &str, container: &str, outcome: RequestRepair) {
        if !self.containers.iter().any(|c| c == container) {
            self.containers.push(container.to_string());
        }
        if outcome.floor == 0 {
            push_unique(&mut self.zeroed, resource);
        } else {
            push_unique(
                &mut self.floors,
                &format!(
                    "{resource}={} ({container})",
                    format_quantity(resource, outcome.floor)
                ),
            );
        }
        if outcome.limit_added {
            push_unique(&mut self.limits_added, &format!("{resource} ({container})"));
        }
    }

    fn messages(self) -> Vec<String> {
        let mut messages = Vec::new();
        let containers = self.containers.join(", ");
        if !self.zeroed.is_empty() {
            messages.push(format!(
                "agent pod: {} requests set to 0, limits kept, on {containers}",
                self.zeroed.join("/")
            ));
        }
        if !self.floors.is_empty() {
            messages.push(format!(
                "agent pod: namespace LimitRange forbids 0, requests set to its floor: {}",
                self.floors.join(", ")
            ));
        }
        if !self.limits_added.is_empty() {
            messages.push(format!(
                "agent pod: request copied to the missing limit for {}",
                self.limits_added.join(", ")
            ));
        }
        messages.extend(self.notes());
        messages
    }
}

fn push_unique(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|existing| existing == item) {
        list.push(item.to_string());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::cluster::StaticCluster;
    use crate::config::Preset;

    /// A cluster whose namespace `ci` has these LimitRange items.
    fn ci_limit_ranges(items: Value) -> StaticCluster {
        let items = serde_json::from_value(items).expect("LimitRange items");
        StaticCluster::empty().with_limit_range("ci", items)
    }

    /// A pod selected explicitly (`podmend.io/agent: "true"`), pinned or not.
    fn agent_meta() -> PodMeta {
        PodMeta {
            annotations: BTreeMap::from([(AGENT_ANNOTATION.to_string(), "true".to_string())]),
            ..PodMeta::default()
        }
    }

    fn run(
        config: AgentRequestsConfig,
        spec: Value,
        meta: &PodMeta,
        cluster: &StaticCluster,
    ) -> (Value, Vec<String>) {
        let mut pod: PodSpec = serde_json::from_value(spec).expect("test spec");
        let cx = RuleContext {
            namespace: "ci",
            cluster,
        };
        let messages = AgentRequests::new(config).repair(&mut pod, meta, &cx);
        (serde_json::to_value(&pod).expect("serializes"), messages)
    }

    /// [`run`] with the default config, on an agent pod, in `cluster`.
    fn repair_in(cluster: &StaticCluster, spec: Value) -> (Value, Vec<String>) {
        run(AgentRequestsConfig::default(), spec, &agent_meta(), cluster)
    }

    fn repair(spec: Value) -> (Value, Vec<String>) {
        repair_in(&StaticCluster::empty(), spec)
    }

    fn with_resources(resources: Value) -> Value {
        json!({"containers": [{"name": "agent", "resources": resources}]})
    }

    #[test]
    fn the_docker_guard_keeps_the_resources_dind_rm_gave_it() {
        let guard = json!({"name": "podmend-guard", "image": "ghcr.io/podmend/podmend",
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}});
        for (list, spec) in [
            (
                "initContainers",
                json!({"initContainers": [guard.clone()],
                "containers": [{"name": "jnlp", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}]}),
            ),
            (
                "containers",
                json!({"containers": [
                {"name": "jnlp", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}, guard.clone()]}),
            ),
        ] {
            let (after, messages) = repair(spec);
            let kept = after[list]
                .as_array()
                .expect("containers")
                .iter()
                .find(|c| c["name"] == "podmend-guard")
                .expect("guard");
            assert_eq!(kept["resources"], guard["resources"], "{list}");
            assert!(
                messages.iter().all(|m| !m.contains("podmend-guard")),
                "{messages:?}"
            );
            assert_eq!(after["containers"][0]["resources"]["requests"]["cpu"], "0");
        }
        // Nor does a Pod LimitRange's floor land on it.
        let cluster = ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "300m"}}]));
        let spec = json!({"containers": [guard.clone(),
            {"name": "jnlp", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}]});
        let (after, _) = repair_in(&cluster, spec);
        assert_eq!(after["containers"][0]["resources"], guard["resources"]);
        assert_eq!(
            after["containers"][1]["resources"]["requests"]["cpu"],
            "200m"
        );
    }

    #[test]
    fn requests_become_zero_and_limits_stay() {
        let (after, messages) = repair(with_resources(json!({
            "requests": {"cpu": "20m", "memory": "32Mi"},
            "limits": {"cpu": "20m", "memory": "32Mi"}
        })));
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "20m", "memory": "32Mi"}})
        );
        // What changed, and what it costs the pod (see `cost_messages`).
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages.iter().all(|m| m.len() <= 120), "{messages:?}");
        assert!(
            messages[1].contains("Guaranteed -> Burstable"),
            "{messages:?}"
        );
    }

    #[test]
    fn a_limit_without_a_request_gets_an_explicit_zero_request() {
        let (after, _) = repair(with_resources(
            json!({"limits": {"cpu": "500m", "memory": "1Gi"}}),
        ));
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"})
        );
    }

    /// The default configuration with `limitFromRequest` on.
    fn limit_from_request() -> AgentRequestsConfig {
        AgentRequestsConfig {
            limit_from_request: true,
            ..AgentRequestsConfig::default()
        }
    }

    #[test]
    fn a_request_without_a_limit_becomes_the_limit_first_when_limit_from_request_is_on() {
        let (after, messages) = run(
            limit_from_request(),
            with_resources(json!({"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {}})),
            &agent_meta(),
            &StaticCluster::empty(),
        );
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "100m", "memory": "256Mi"}})
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("copied to the missing limit")),
            "{messages:?}"
        );
    }

    #[test]
    fn a_request_without_a_limit_is_kept_and_the_finding_says_it_needs_a_limit() {
        // With limitFromRequest on (the former default) this container got limit = request
        // (100m/256Mi): throttled at its request and OOM-killed above it, where it could use
        // what the node had free. Zeroed without a limit, nothing would bound it at all.
        let resources = json!({"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {}});
        let (after, messages) = repair(with_resources(resources.clone()));
        assert_eq!(after["containers"][0]["resources"], resources);
        assert_eq!(
            messages,
            [
                "agent pod: requests kept, no limit bounds them: cpu/memory (agent); zeroing them safely needs a limit"
            ]
        );
    }

    #[test]
    fn a_container_with_a_limit_for_one_resource_is_zeroed_for_that_one_only() {
        let (after, messages) = repair(with_resources(
            json!({"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1"}}),
        ));
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "0", "memory": "256Mi"}, "limits": {"cpu": "1"}})
        );
        assert!(
            messages.iter().any(|m| m.contains("them: memory (agent);")),
            "{messages:?}"
        );
    }

    #[test]
    fn the_jenkins_jnlp_container_keeps_its_request_and_gets_no_invented_limit() {
        // The kubernetes-plugin's default jnlp container: requests 100m/256Mi, `limits: {}`.
        let pod: Value = serde_yaml_ng::from_str(include_str!(
            "../../tests/fixtures/jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml"
        ))
        .expect("the fixture");
        let (after, messages) = repair(pod["spec"].clone());
        assert_eq!(after["containers"], pod["spec"]["containers"]);
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].contains("cpu/memory (jnlp)") && messages[0].len() <= 120,
            "{messages:?}"
        );
        // With limitFromRequest on, as before: the limit is invented, and the finding says so.
        let (after, messages) = run(
            limit_from_request(),
            pod["spec"].clone(),
            &agent_meta(),
            &StaticCluster::empty(),
        );
        assert_eq!(
            after["containers"][1]["resources"],
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "100m", "memory": "256Mi"}})
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("copied to the missing limit")),
            "{messages:?}"
        );
    }

    #[test]
    fn with_a_pod_level_limit_no_container_limit_is_invented_even_when_limit_from_request_is_on() {
        // The pod-level limit of 1 CPU/1Gi lets the container use up to that today. Before,
        // it got container limits of 200m/128Mi (its requests); now its requests are zeroed
        // under the pod-level limit, which bounds it, and no container limit is written.
        let spec = json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}}}],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}
        });
        for config in [AgentRequestsConfig::default(), limit_from_request()] {
            let (after, messages) =
                run(config, spec.clone(), &agent_meta(), &StaticCluster::empty());
            assert_eq!(
                after["containers"][0]["resources"],
                json!({"requests": {"cpu": "0", "memory": "0"}}),
                "{messages:?}"
            );
            assert_eq!(
                after["resources"]["limits"],
                json!({"cpu": "1", "memory": "1Gi"})
            );
            assert!(
                messages.iter().all(|m| !m.contains("copied")),
                "{messages:?}"
            );
        }
    }

    #[test]
    fn with_a_pod_level_limit_of_another_resource_a_lone_request_is_kept() {
        // A pod-level cpu limit does not bound memory: the memory request stays, and no
        // container limit is invented beside pod-level limits.
        let spec = json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}}}],
            "resources": {"limits": {"cpu": "1"}}
        });
        let (after, messages) = run(
            limit_from_request(),
            spec,
            &agent_meta(),
            &StaticCluster::empty(),
        );
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "0", "memory": "128Mi"}})
        );
        assert!(
            messages.iter().any(|m| m.contains("them: memory (a);")),
            "{messages:?}"
        );
    }

    #[test]
    fn extended_resources_and_hugepages_are_never_touched() {
        let (after, _) = repair(with_resources(json!({
            "requests": {"cpu": "500m", "nvidia.com/gpu": "1", "hugepages-2Mi": "100Mi"},
            "limits": {"cpu": "500m", "nvidia.com/gpu": "1", "hugepages-2Mi": "100Mi", "memory": "1Gi"}
        })));
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0", "nvidia.com/gpu": "1", "hugepages-2Mi": "100Mi"})
        );
    }

    #[test]
    fn init_containers_are_repaired_too() {
        let (after, _) = repair(json!({
            "containers": [{"name": "a"}],
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}]
        }));
        assert_eq!(
            after["initContainers"][0]["resources"]["requests"],
            json!({"cpu": "0"})
        );
    }

    #[test]
    fn containers_without_resources_are_left_alone() {
        let (after, messages) = repair(
            json!({"containers": [{"name": "a", "resources": {"limits": {}, "requests": {}}}, {"name": "b"}]}),
        );
        assert!(messages.is_empty());
        assert_eq!(after["containers"][1], json!({"name": "b"}));
    }

    #[test]
    fn pods_that_are_not_agents_are_left_alone() {
        let (_, messages) = run(
            AgentRequestsConfig::default(),
            with_resources(json!({"requests": {"cpu": "1"}})),
            &PodMeta::default(),
            &StaticCluster::empty(),
        );
        assert!(messages.is_empty());
    }

    #[test]
    fn agents_are_recognised_by_preset_selector_or_annotation() {
        let rule = AgentRequests::new(AgentRequestsConfig {
            presets: vec![Preset::PinnipedKubeCertAgent],
            selectors: vec![serde_json::from_value(json!({"matchExpressions": [{"key": "role", "operator": "In", "values": ["ci-agent"]}]})).expect("selector")],
            ..AgentRequestsConfig::default()
        });
        let meta = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| PodMeta {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..PodMeta::default()
        };
        assert!(rule.is_agent(&meta(&[("kube-cert-agent.pinniped.dev", "v3")], &[])));
        assert!(rule.is_agent(&meta(&[("role", "ci-agent")], &[])));
        assert!(rule.is_agent(&meta(&[], &[("podmend.io/agent", "true")])));
        assert!(
            !rule.is_agent(&meta(&[("jenkins/label", "x")], &[])),
            "preset not enabled"
        );
        assert!(!rule.is_agent(&meta(&[("role", "web")], &[("podmend.io/agent", "false")])));
    }

    #[test]
    fn label_selectors_follow_the_api_semantics() {
        let labels = BTreeMap::from([("a".to_string(), "1".to_string())]);
        let cases = [
            (json!({"matchLabels": {"a": "1"}}), true),
            (json!({"matchLabels": {"a": "2"}}), false),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["2"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["2"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]}),
                false,
            ),
        ];
        for (selector, expected) in cases {
            let parsed: LabelSelector = serde_json::from_value(selector.clone()).expect("selector");
            assert_eq!(selector_matches(&parsed, &labels), expected, "{selector}");
        }
    }

    #[test]
    fn a_limit_range_minimum_becomes_the_request() {
        let cluster = ci_limit_ranges(
            json!([{"type": "Container", "min": {"cpu": "100m", "memory": "64Mi"}}]),
        );
        let (after, messages) = repair_in(
            &cluster,
            with_resources(
                json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
            ),
        );
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "100m", "memory": "67108864"})
        );
        assert!(
            messages.iter().any(|m| m.contains("LimitRange")),
            "{messages:?}"
        );
    }

    #[test]
    fn a_limit_to_request_ratio_gives_the_smallest_request_it_allows() {
        let cluster = ci_limit_ranges(
            json!([{"type": "Container", "maxLimitRequestRatio": {"cpu": "4", "memory": "3"}}]),
        );
        let (after, _) = repair_in(
            &cluster,
            with_resources(
                json!({"requests": {"cpu": "1200m", "memory": "100"}, "limits": {"cpu": "1200m", "memory": "100"}}),
            ),
        );
        // cpu: 1200m / 4 = 300m exactly; memory: 100 bytes / 3 = 33.3 → 34 bytes.
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "300m", "memory": "34"})
        );
    }

    #[test]
    fn a_pod_limit_range_minimum_is_met_by_the_first_container() {
        let cluster =
            ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "5m", "memory": "5Mi"}}]));
        let (after, messages) = repair_in(
            &cluster,
            json!({"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}}
            ]}),
        );
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "5m", "memory": "5242880"})
        );
        assert_eq!(
            after["containers"][1]["resources"]["requests"],
            json!({"cpu": "0"})
        );
        assert!(
            messages.iter().any(|m| m.contains("LimitRange")),
            "{messages:?}"
        );
        let (again, messages) = repair_in(&cluster, after.clone());
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
    }

    #[test]
    fn a_pod_limit_range_minimum_met_by_a_container_is_at_least_that_containers_own_minimum() {
        // The property tests' case: a template's container without resources, a Pod minimum
        // of 100m and a Container minimum of 200m. 100m would be refused by the LimitRanger
        // and raised to 200m by the next pass.
        let cluster = ci_limit_ranges(json!([
            {"type": "Container", "min": {"cpu": "200m"}, "defaultRequest": {"cpu": "200m"},
                "maxLimitRequestRatio": {"cpu": "10"}},
            {"type": "Pod", "min": {"cpu": "100m"}}
        ]));
        let spec = json!({"containers": [{"name": "a", "image": "busybox"}]});
        let (after, messages) = repair_in(&cluster, spec);
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "200m"}}),
            "{messages:?}"
        );
        let (again, messages) = repair_in(&cluster, after.clone());
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
    }

    #[test]
    fn a_pod_floor_only_an_init_container_met_leaves_that_resource_as_it_was() {
        // The pod met the floor with its init container's request; the container that runs
        // has no room below its limit of 0 to take it up (found by tests/properties.rs).
        let cluster = ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "100m"}}]));
        let spec = json!({
            "initContainers": [{"name": "init", "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1500m", "memory": "1Gi"}}}],
            "containers": [{"name": "app", "resources": {
                "requests": {"cpu": "0"}, "limits": {"cpu": "0"}}}]
        });
        let (after, messages) = repair_in(&cluster, spec.clone());
        let init = &after["initContainers"][0]["resources"];
        assert_eq!(init["requests"]["cpu"], "500m", "{after:#}");
        // Memory, which no floor holds up, is still repaired, and only memory is reported.
        assert_eq!(init["requests"]["memory"], "0", "{after:#}");
        assert_eq!(init["limits"]["memory"], "1Gi", "{after:#}");
        assert_eq!(after["containers"], spec["containers"]);
        assert!(
            messages.iter().all(|m| !m.contains("cpu")) && !messages.is_empty(),
            "{messages:?}"
        );
    }

    #[test]
    fn a_pod_limit_range_minimum_is_shared_out_within_each_container_limit() {
        let cluster = ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "100m"}}]));
        let (after, _) = repair_in(
            &cluster,
            json!({"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "40m"}, "limits": {"cpu": "40m"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}
            ]}),
        );
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "40m"})
        );
        assert_eq!(
            after["containers"][1]["resources"]["requests"],
            json!({"cpu": "60m"})
        );
        let (again, messages) = repair_in(&cluster, after.clone());
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
    }

    #[test]
    fn a_limit_range_minimum_above_the_limit_leaves_the_request_at_the_limit() {
        let cluster = ci_limit_ranges(json!([{"type": "Container", "min": {"cpu": "200m"}}]));
        let (after, _) = repair_in(
            &cluster,
            with_resources(json!({"requests": {"cpu": "50m"}, "limits": {"cpu": "50m"}})),
        );
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "50m"})
        );
    }

    #[test]
    fn a_request_given_back_in_full_for_a_pod_limit_range_gets_no_limit_and_stays() {
        let cluster = ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "100m"}}]));
        let (after, _) = repair_in(
            &cluster,
            json!({"containers": [{"name": "a", "resources": {}}]}),
        );
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "100m"}})
        );
        // The next pass changes nothing; it only notes the request no limit bounds.
        let (again, messages) = repair_in(&cluster, after.clone());
        assert!(
            messages.iter().all(|m| m.contains("requests kept")),
            "{messages:?}"
        );
        assert_eq!(again, after);
    }

    #[test]
    fn an_init_container_counts_beside_the_sidecars_started_before_it() {
        let spec: PodSpec = serde_json::from_value(json!({
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1m"}}},
                {"name": "setup", "resources": {"requests": {"cpu": "1m"}}}
            ],
            "containers": [{"name": "a"}]
        }))
        .expect("spec");
        assert_eq!(aggregate(&spec, "cpu", container_request), 2);
    }

    #[test]
    fn a_pod_limit_range_minimum_is_met_by_the_pod_level_request_when_there_is_one() {
        let cluster = ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "100m"}}]));
        let (after, _) = repair_in(
            &cluster,
            json!({
                "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}}],
                "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}
            }),
        );
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0"})
        );
        assert_eq!(
            after["resources"],
            json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "2"}})
        );
    }

    #[test]
    fn a_pod_level_request_stays_within_the_limit_defaulting_will_give_the_pod() {
        let cluster = ci_limit_ranges(json!([{"type": "Pod", "min": {"cpu": "100m"}}]));
        let (after, _) = repair_in(
            &cluster,
            json!({
                "containers": [{"name": "a", "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "50m"}}}],
                "resources": {"requests": {"cpu": "50m"}}
            }),
        );
        assert_eq!(after["resources"], json!({"requests": {"cpu": "50m"}}));
    }

    #[test]
    fn a_container_floor_the_pod_level_limit_cannot_hold_is_left_to_the_limit_ranger() {
        // Raising the request to the LimitRange's 16Mi would ask for more than the pod's limit
        // of 0: no pod-level request is then valid. Memory stays as it was; so does cpu, even
        // with limitFromRequest on: beside a pod-level limit no container limit is invented,
        // and no limit bounds its request.
        let cluster = ci_limit_ranges(json!([{"type": "Container", "min": {"memory": "16Mi"}}]));
        let spec = json!({
            "containers": [{"name": "a", "resources": {"requests": {"memory": "0", "cpu": "1"}}}],
            "resources": {"limits": {"memory": "0"}}
        });
        let (after, messages) = run(limit_from_request(), spec, &agent_meta(), &cluster);
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"memory": "0", "cpu": "1"}})
        );
        assert_eq!(
            after["resources"],
            json!({"limits": {"memory": "0"}}),
            "{messages:?}"
        );
        assert!(!messages.is_empty());
    }

    #[test]
    fn limit_ranges_of_other_types_do_not_apply_to_containers() {
        let cluster =
            ci_limit_ranges(json!([{"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}}]));
        let (after, _) = repair_in(
            &cluster,
            with_resources(json!({"requests": {"cpu": "1"}, "limits": {"cpu": "1"}})),
        );
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0"})
        );
    }

    #[test]
    fn pod_level_resources_are_zeroed_like_containers() {
        // The pod-level memory request has no limit to bound it (neither the pod's nor every
        // container's): kept, unless limitFromRequest makes it the limit.
        let spec = json!({
            "containers": [{"name": "a", "resources": {"limits": {"cpu": "500m"}}}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1"}}
        });
        let (after, messages) = repair(spec.clone());
        assert_eq!(
            after["resources"],
            json!({"requests": {"cpu": "0", "memory": "1Gi"}, "limits": {"cpu": "1"}})
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("them: memory (pod level);")),
            "{messages:?}"
        );
        let (after, _) = run(
            limit_from_request(),
            spec,
            &agent_meta(),
            &StaticCluster::empty(),
        );
        assert_eq!(
            after["resources"],
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "1", "memory": "1Gi"}})
        );
    }

    #[test]
    fn a_pod_level_request_is_not_copied_into_a_limit_smaller_than_a_container_limit() {
        let (after, _) = repair(json!({
            "containers": [{"name": "a", "resources": {"limits": {"memory": "2Gi"}}}],
            "resources": {"requests": {"memory": "1Gi"}}
        }));
        assert_eq!(after["resources"], json!({"requests": {"memory": "0"}}));
    }

    #[test]
    fn the_repair_is_idempotent() {
        let (after, _) = repair(with_resources(
            json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
        ));
        let (again, messages) = repair(after.clone());
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
        // A request kept for want of a limit is noted again, and still not changed.
        let (after, _) = repair(with_resources(json!({"requests": {"cpu": "100m"}})));
        let (again, messages) = repair(after.clone());
        assert!(
            messages.iter().all(|m| m.contains("requests kept")),
            "{messages:?}"
        );
        assert_eq!(again, after);
    }

    #[test]
    fn zero_written_differently_is_already_zero() {
        let (_, messages) = repair(with_resources(
            json!({"requests": {"cpu": "0m"}, "limits": {"cpu": "1"}}),
        ));
        assert!(messages.is_empty());
    }

    /// Pinniped's kube-cert-agent as its Deployment's template makes it: pinned with nodeName,
    /// requests == limits (20m/32Mi), so Guaranteed without whole CPUs.
    fn pinniped_spec() -> Value {
        json!({
            "nodeName": "control-plane-1",
            "containers": [{"name": "sleeper", "image": "pinniped", "resources": {
                "requests": {"cpu": "20m", "memory": "32Mi"},
                "limits": {"cpu": "20m", "memory": "32Mi"}}}]
        })
    }

    fn labeled(key: &str, value: &str) -> PodMeta {
        PodMeta {
            labels: BTreeMap::from([(key.to_string(), value.to_string())]),
            ..PodMeta::default()
        }
    }

    #[test]
    fn the_jenkins_preset_is_opt_in_and_the_pinniped_preset_is_on_by_default() {
        // With both presets on (the former default), a Jenkins build pod pinned or not got its
        // requests zeroed, so the scheduler overpacked nodes with builds first in line for
        // eviction.
        assert_eq!(
            AgentRequestsConfig::default().presets,
            [Preset::PinnipedKubeCertAgent]
        );
        let pinned_build = json!({"nodeName": "n1", "containers": [{"name": "build",
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4"}}}]});
        let cluster = StaticCluster::empty();
        let jenkins = labeled("jenkins/label", "build");
        let config = AgentRequestsConfig::default();
        let (after, messages) = run(config, pinned_build.clone(), &jenkins, &cluster);
        assert_eq!(after, pinned_build);
        assert!(messages.is_empty(), "not an agent: no finding at all");
        let config = AgentRequestsConfig {
            presets: vec![Preset::PinnipedKubeCertAgent, Preset::JenkinsAgent],
            ..AgentRequestsConfig::default()
        };
        let (after, _) = run(config, pinned_build, &jenkins, &cluster);
        assert_eq!(after["containers"][0]["resources"]["requests"]["cpu"], "0");
        let pinniped = labeled("kube-cert-agent.pinniped.dev", "v3");
        let (after, _) = repair_default(pinniped_spec(), &pinniped);
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"})
        );
    }

    /// [`run`] with the default config, in an empty cluster.
    fn repair_default(spec: Value, meta: &PodMeta) -> (Value, Vec<String>) {
        run(
            AgentRequestsConfig::default(),
            spec,
            meta,
            &StaticCluster::empty(),
        )
    }

    #[test]
    fn an_agent_pod_not_pinned_to_one_node_is_left_alone_and_the_finding_says_why() {
        // With onlyPinned off (the former behaviour) every selected agent is repaired, pinned or not.
        let mut spec = pinniped_spec();
        spec.as_object_mut().expect("spec").remove("nodeName");
        let pinniped = labeled("kube-cert-agent.pinniped.dev", "v3");
        let (after, messages) = repair_default(spec.clone(), &pinniped);
        assert_eq!(after, spec);
        assert_eq!(messages, [NOT_PINNED]);
        assert!(NOT_PINNED.len() <= 120, "{NOT_PINNED}");
        // onlyPinned: false repairs every selected agent.
        let config = AgentRequestsConfig {
            only_pinned: false,
            ..AgentRequestsConfig::default()
        };
        let (after, _) = run(config, spec, &pinniped, &StaticCluster::empty());
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"})
        );
    }

    #[test]
    fn the_agent_annotation_opts_a_pod_in_whether_it_is_pinned_or_not() {
        let mut spec = pinniped_spec();
        spec.as_object_mut().expect("spec").remove("nodeName");
        let (after, messages) = repair_default(spec, &agent_meta());
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"}),
            "{messages:?}"
        );
    }

    #[test]
    fn a_pod_pinned_by_node_name_or_by_required_node_affinity_on_its_name_is_pinned() {
        let pinned = |spec: Value| {
            let spec: PodSpec = serde_json::from_value(spec).expect("spec");
            pinned_node(&spec).map(str::to_string)
        };
        let on = |key: &str, operator: &str, values: Value| json!({"key": key, "operator": operator, "values": values});
        let affinity = |terms: Value| {
            json!({"containers": [{"name": "a"}], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
        };
        let name_in = |node: &str| on("metadata.name", "In", json!([node]));
        assert_eq!(
            pinned(json!({"nodeName": "n1", "containers": [{"name": "a"}]})).as_deref(),
            Some("n1")
        );
        assert_eq!(
            pinned(affinity(json!([{"matchFields": [name_in("n1")]}]))).as_deref(),
            Some("n1")
        );
        // Every term names the node (terms are ORed); other requirements (ANDed) only narrow
        // it; a term with no requirements matches no node.
        let zone = on("topology.kubernetes.io/zone", "In", json!(["a"]));
        assert_eq!(
            pinned(affinity(json!([
                {"matchExpressions": [zone], "matchFields": [name_in("n1")]},
                {"matchFields": [name_in("n1")]},
                {}
            ])))
            .as_deref(),
            Some("n1")
        );
        for spec in [
            json!({"containers": [{"name": "a"}]}),
            json!({"nodeName": "", "containers": [{"name": "a"}]}),
            affinity(json!([{"matchFields": [name_in("n1")]}, {"matchFields": [name_in("n2")]}])),
            affinity(json!([{"matchFields": [name_in("n1")]}, {"matchExpressions": [zone]}])),
            affinity(json!([{"matchFields": [on("metadata.name", "NotIn", json!(["n1"]))]}])),
            affinity(
                json!([{"matchExpressions": [on("kubernetes.io/hostname", "In", json!(["n1"]))]}]),
            ),
            affinity(json!([{}])),
        ] {
            assert_eq!(pinned(spec.clone()), None, "{spec}");
        }
    }

    #[test]
    fn a_pinned_agent_is_repaired_after_node_affinity_turned_its_node_name_into_affinity() {
        // node-affinity runs first (rules::registry) and removes nodeName: the affinity it
        // writes must count as pinned, or no pinned agent would ever be repaired.
        let config = crate::config::Config::default();
        let cluster = StaticCluster::empty().with_node("control-plane-1", Vec::new());
        let cx = RuleContext {
            namespace: "ci",
            cluster: &cluster,
        };
        let meta = labeled("kube-cert-agent.pinniped.dev", "v3");
        let mut spec: PodSpec = serde_json::from_value(pinniped_spec()).expect("spec");
        let mut found = Vec::new();
        for rule in crate::rules::registry(&config) {
            if !rule.repair(&mut spec, &meta, &cx).is_empty() {
                found.push(rule.id());
            }
        }
        assert_eq!(found, ["node-affinity", ID]);
        assert_eq!(spec.node_name, None);
        assert_eq!(pinned_node(&spec), Some("control-plane-1"));
        let resources = spec.containers[0].resources.as_ref().expect("resources");
        assert_eq!(request_milli(resources, "cpu"), Some(0));
        assert_eq!(request_milli(resources, "memory"), Some(0));
    }

    #[test]
    fn a_guaranteed_agent_with_whole_cpus_is_left_alone_and_the_finding_says_why() {
        // Under the static CPU manager policy its container has exclusive cores
        // (pkg/kubelet/cm/cpumanager/policy_static.go, guaranteedCPUs): zeroed, the pod is
        // Burstable and loses them. Formerly it was zeroed all the same.
        let spec = json!({"nodeName": "n1", "containers": [{"name": "a", "resources": {
            "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}]});
        let (after, messages) = repair_default(spec.clone(), &agent_meta());
        assert_eq!(after, spec);
        assert_eq!(messages, [EXCLUSIVE_CPUS]);
        assert!(EXCLUSIVE_CPUS.len() <= 120, "{EXCLUSIVE_CPUS}");
        // Requests defaulted from the limits count as the API server defaults them.
        let limits_only = json!({"nodeName": "n1", "containers": [{"name": "a", "resources": {
            "limits": {"cpu": "1", "memory": "1Gi"}}}]});
        let (after, messages) = repair_default(limits_only.clone(), &agent_meta());
        assert_eq!(
            (after, messages),
            (limits_only, vec![EXCLUSIVE_CPUS.to_string()])
        );
        // zeroExclusiveCpus: true zeroes it anyway, and the finding says what it loses.
        let config = AgentRequestsConfig {
            zero_exclusive_cpus: true,
            ..AgentRequestsConfig::default()
        };
        let (after, messages) = run(config, spec, &agent_meta(), &StaticCluster::empty());
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"})
        );
        assert_eq!(
            messages[1..],
            [
                "agent pod: QoS Guaranteed -> Burstable: OOM score adj 999, among the first evicted under memory pressure",
                "agent pod: its containers lose their exclusive CPUs (static CPU manager policy)"
            ],
            "{messages:?}"
        );
    }

    #[test]
    fn a_guaranteed_agent_with_fractional_cpus_is_repaired_and_told_it_becomes_burstable() {
        // Pinniped's kube-cert-agent: no exclusive cores to lose (20m is not a whole CPU).
        // A memory request of 0 gives an OOM score adjustment of 999 (pkg/kubelet/qos/policy.go:
        // 1000 - 1000*0/capacity, then 999 to stay below BestEffort's 1000), and memory use
        // always above the request: the first group rankMemoryPressure
        // (pkg/kubelet/eviction/helpers.go) evicts, by priority then usage.
        let pinniped = labeled("kube-cert-agent.pinniped.dev", "v3");
        let (after, messages) = repair_default(pinniped_spec(), &pinniped);
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "20m", "memory": "32Mi"}})
        );
        assert_eq!(
            messages,
            [
                "agent pod: cpu/memory requests set to 0, limits kept, on sleeper",
                "agent pod: QoS Guaranteed -> Burstable: OOM score adj 999, among the first evicted under memory pressure"
            ]
        );
    }

    #[test]
    fn a_burstable_agent_whose_memory_request_becomes_zero_is_told_what_that_costs() {
        let spec = json!({"nodeName": "n1", "containers": [{"name": "a", "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}}]});
        let (_, messages) = repair_default(spec, &agent_meta());
        assert_eq!(
            messages[1],
            "agent pod: memory request 0: OOM score adj 999, among the first evicted under memory pressure"
        );
        // cpu alone: no memory cost to tell, and the class stays Burstable.
        let spec = json!({"nodeName": "n1", "containers": [{"name": "a", "resources": {
            "requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}]});
        let (_, messages) = repair_default(spec, &agent_meta());
        assert_eq!(messages.len(), 1, "{messages:?}");
    }

    #[test]
    fn the_qos_class_is_computed_as_the_api_server_computes_it_after_defaulting() {
        let class = |spec: Value| qos_class(&serde_json::from_value(spec).expect("spec"));
        let container =
            |resources: Value| json!({"containers": [{"name": "a", "resources": resources}]});
        assert_eq!(
            class(json!({"containers": [{"name": "a"}]})),
            Qos::BestEffort
        );
        assert_eq!(
            class(container(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            Qos::Guaranteed,
            "requests default to the limits"
        );
        assert_eq!(
            class(container(
                json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "1", "memory": "1Gi"}})
            )),
            Qos::Burstable
        );
        assert_eq!(
            class(container(
                json!({"requests": {"cpu": "1"}, "limits": {"cpu": "1"}})
            )),
            Qos::Burstable,
            "no memory limit"
        );
        assert_eq!(
            class(json!({"containers": [
                {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "b"}
            ]})),
            Qos::Burstable,
            "every container must limit cpu and memory"
        );
        assert_eq!(
            class(json!({"containers": [{"name": "a"}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}})),
            Qos::Guaranteed,
            "pod-level resources decide when set"
        );
    }

    #[test]
    fn every_finding_is_at_most_120_characters() {
        // The longest of each message: long container names, every cost at once.
        let specs = [
            json!({"nodeName": "n1", "containers": [
                {"name": "jnlp-with-a-longish-name", "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}},
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
            ]}),
            json!({"nodeName": "n1", "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}
            ]}),
            json!({"nodeName": "n1", "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}
            ], "resources": {"requests": {"memory": "2Gi"}}}),
        ];
        let config = AgentRequestsConfig {
            zero_exclusive_cpus: true,
            ..AgentRequestsConfig::default()
        };
        let mut messages = Vec::new();
        for spec in specs {
            let (_, found) = run(config.clone(), spec, &agent_meta(), &StaticCluster::empty());
            assert!(!found.is_empty());
            messages.extend(found);
        }
        assert!(
            messages.iter().any(|m| m.contains("exclusive CPUs")),
            "{messages:?}"
        );
        let notes = [NOT_PINNED, EXCLUSIVE_CPUS];
        for message in messages.iter().map(String::as_str).chain(notes) {
            assert!(
                message.len() <= 120,
                "{} characters: {message}",
                message.len()
            );
        }
    }

    #[test]
    fn a_pod_level_limit_copied_from_the_request_bounds_the_containers_in_the_same_pass() {
        // Found by tests/properties.rs: the init container's lone request was kept (no limit),
        // then limitFromRequest gave the pod a cpu limit, which bounds it: the next pass zeroed
        // it. One pass now does what both did.
        let spec = json!({
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1m"}}}],
            "containers": [{"name": "app", "resources": {"limits": {"cpu": "501m"}}}],
            "resources": {"requests": {"cpu": "501m"}, "limits": {"memory": "0"}}
        });
        let config = limit_from_request;
        let (after, _) = run(config(), spec, &agent_meta(), &StaticCluster::empty());
        assert_eq!(
            after["initContainers"][0]["resources"],
            json!({"requests": {"cpu": "0"}})
        );
        assert_eq!(
            after["resources"],
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"memory": "0", "cpu": "501m"}})
        );
        let (again, messages) = run(
            config(),
            after.clone(),
            &agent_meta(),
            &StaticCluster::empty(),
        );
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
    }

    #[test]
    fn a_kept_pod_level_request_still_holds_what_the_containers_request() {
        // Found by tests/properties.rs: the pod-level memory request (no limit bounds it) was
        // kept at half a byte while the LimitRange's ratio raised the container's to a whole
        // byte; the API refuses a pod-level request below the containers' aggregate
        // (validatePodResourceConsistency). It follows the containers up instead.
        let cluster = ci_limit_ranges(
            json!([{"type": "Container", "maxLimitRequestRatio": {"memory": "3"}}]),
        );
        let spec = json!({
            "containers": [{"name": "a", "resources": {"requests": {"memory": "500m"}, "limits": {"memory": "1"}}}],
            "resources": {"requests": {"memory": "500m"}, "limits": {"cpu": "1"}}
        });
        let (after, _) = repair_in(&cluster, spec);
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"memory": "1"})
        );
        assert_eq!(
            after["resources"]["requests"],
            json!({"memory": "1", "cpu": "0"})
        );
    }
}
