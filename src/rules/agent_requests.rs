//! `agent-requests`: small agent pods (Pinniped's kube-cert-agent, Jenkins agents) must land
//! on a node even when its allocatable resources are fully requested. Their requests become
//! an explicit `"0"` (an absent request would be defaulted back to the limit) and their
//! limits stay, so the pod is Burstable, not BestEffort. A namespace LimitRange that forbids
//! zero (a `min`, a `maxLimitRequestRatio`) gets the smallest request it accepts instead.
//! The Docker guard `dind-rm` injects (`podmend-guard`) is left as `dind-rm` made it.

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
        meta.annotations.get(AGENT_ANNOTATION).map(String::as_str) == Some("true")
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

/// What the repair reads and changes of a container: its resources, and by its name and
/// restart policy, whether it is the guard and whether it runs beside the others (a sidecar).
static CONTAINER_READS: Shape = Shape::Fields(&[
    ("name", &Shape::All),
    ("resources", &Shape::All),
    ("restartPolicy", &Shape::All),
]);

/// What the repair reads and changes of a pod spec (the parts it compares and restores, see
/// `repaired_parts`): the engine builds only these.
static READS: Shape = Shape::Fields(&[
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
        loop {
            let ranges = (&container_ranges[..], &pod_ranges[..]);
            let changed = self.repair_resources(spec, &original, &resources, ranges);
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
                return if repaired_parts(spec) == repaired_parts(&original) {
                    Vec::new()
                } else {
                    changed.messages()
                };
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
        (container_ranges, pod_ranges): (&[LimitRangeItem], &[LimitRangeItem]),
    ) -> Changes {
        let mut changed = Changes::default();
        // The Docker guard dind-rm injected keeps what podmend gave it: every build context
        // and image of the pod passes through it, and a throttled guard stalls the pipeline.
        let own = |c: &Container| c.name != GUARD_CONTAINER;
        for container in spec.containers.iter_mut().filter(|c| own(c)) {
            self.repair_container(container, resources, container_ranges, &mut changed);
        }
        for container in spec.init_containers.iter_mut().flatten().filter(|c| own(c)) {
            self.repair_container(container, resources, container_ranges, &mut changed);
        }
        let ranges = (container_ranges, pod_ranges);
        self.meet_pod_limit_ranges(spec, resources, ranges, &mut changed);
        self.undo_idle_limit_copies(spec, original, resources, &mut changed);
        self.repair_pod_level(spec, resources, pod_ranges, &mut changed);
        changed
    }

    fn repair_container(
        &self,
        container: &mut Container,
        resources_to_zero: &[&str],
        limit_ranges: &[LimitRangeItem],
        changed: &mut Changes,
    ) {
        let Some(resources) = container.resources.as_mut() else {
            return;
        };
        for &name in resources_to_zero {
            let floor = |limit: Option<Milli>| limit_range_floor(name, limit, limit_ranges);
            if let Some(outcome) =
                zero_request(resources, name, self.config.limit_from_request, floor)
            {
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
                // containers' aggregate, which an absent pod request (0) would not cover.
                let floor =
                    within(aggregate.max(limit_range_floor(name, implicit_limit, pod_ranges)));
                set_pod_request(&mut resources, name, floor, changed);
                continue;
            }
            let max_container_limit = max_container_limit(spec, name);
            // A pod limit below a container's limit, or below the containers' aggregate
            // request, is invalid: only copy the request into a missing limit when both fit.
            let limit_from_request = self.config.limit_from_request
                && request_milli(&resources, name)
                    .is_some_and(|r| max_container_limit.is_none_or(|l| l <= r) && aggregate <= r);
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
}

impl Changes {
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
        if self.containers.is_empty() {
            return Vec::new();
        }
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

    fn agent_meta() -> PodMeta {
        PodMeta {
            labels: BTreeMap::from([("jenkins/label".to_string(), "mypod".to_string())]),
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
                "containers": [{"name": "jnlp", "resources": {"requests": {"cpu": "100m"}}}]}),
            ),
            (
                "containers",
                json!({"containers": [
                {"name": "jnlp", "resources": {"requests": {"cpu": "100m"}}}, guard.clone()]}),
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
        assert_eq!(messages.len(), 1);
        assert!(messages[0].len() <= 120, "{}", messages[0]);
    }

    #[test]
    fn a_limit_without_a_request_gets_an_explicit_zero_request() {
        let (after, _) = repair(with_resources(
            json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
        ));
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"})
        );
    }

    #[test]
    fn a_request_without_a_limit_becomes_the_limit_first() {
        let (after, messages) = repair(with_resources(
            json!({"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {}}),
        ));
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
    fn a_request_without_a_limit_is_only_zeroed_when_limit_copying_is_off() {
        let config = AgentRequestsConfig {
            limit_from_request: false,
            ..AgentRequestsConfig::default()
        };
        let (after, _) = run(
            config,
            with_resources(json!({"requests": {"cpu": "100m"}})),
            &agent_meta(),
            &StaticCluster::empty(),
        );
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"cpu": "0"}})
        );
    }

    #[test]
    fn extended_resources_and_hugepages_are_never_touched() {
        let (after, _) = repair(with_resources(json!({
            "requests": {"cpu": "1", "nvidia.com/gpu": "1", "hugepages-2Mi": "100Mi"},
            "limits": {"cpu": "1", "nvidia.com/gpu": "1", "hugepages-2Mi": "100Mi", "memory": "1Gi"}
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
                json!({"requests": {"cpu": "1", "memory": "100"}, "limits": {"cpu": "1", "memory": "100"}}),
            ),
        );
        // cpu: 1000m / 4 = 250m exactly; memory: 100 bytes / 3 = 33.3 → 34 bytes.
        assert_eq!(
            after["containers"][0]["resources"]["requests"],
            json!({"cpu": "250m", "memory": "34"})
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
                "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1500m"}}}],
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
        let (again, messages) = repair_in(&cluster, after.clone());
        assert!(messages.is_empty(), "{messages:?}");
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
        // of 0: no pod-level request is then valid. Memory stays as it was; cpu is repaired
        // (its lone request copied into the limit first, as by default).
        let cluster = ci_limit_ranges(json!([{"type": "Container", "min": {"memory": "16Mi"}}]));
        let spec = json!({
            "containers": [{"name": "a", "resources": {"requests": {"memory": "0", "cpu": "1"}}}],
            "resources": {"limits": {"memory": "0"}}
        });
        let (after, messages) = repair_in(&cluster, spec);
        assert_eq!(
            after["containers"][0]["resources"],
            json!({"requests": {"memory": "0", "cpu": "0"}, "limits": {"cpu": "1"}})
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
        let (after, _) = repair(json!({
            "containers": [{"name": "a", "resources": {"limits": {"cpu": "500m"}}}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1"}}
        }));
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
            json!({"requests": {"cpu": "100m"}, "limits": {"memory": "1Gi"}}),
        ));
        let (again, messages) = repair(after.clone());
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
    }

    #[test]
    fn zero_written_differently_is_already_zero() {
        let (_, messages) = repair(with_resources(
            json!({"requests": {"cpu": "0m"}, "limits": {"cpu": "1"}}),
        ));
        assert!(messages.is_empty());
    }
}
