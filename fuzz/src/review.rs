//! AdmissionReview bytes → `admission::decode` → `Engine::review` → `AdmissionDecision` →
//! `encode_response`, then the answer read back as the API server reads it.

use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use podmend::admission::{self, AdmissionDecision, Request, Webhook};
use podmend::cluster::{ClusterView, StaticCluster};
use podmend::config::{Config, Mode, Preset, SidecarMode};
use podmend::engine::{Engine, Subject, WholeObjects};
use serde_json::Value;

use crate::k8s_rules;

/// The configurations every review runs under: the defaults (templates only warned about),
/// every rule enforcing everywhere, and every rule denying (the `/validate` path).
static ENGINES: LazyLock<Vec<(&'static str, Engine)>> = LazyLock::new(|| {
    let mut enforce = every_rule(Mode::Enforce);
    enforce.rules.dind_rm.sidecar_mode = SidecarMode::Container;
    // agent-requests' non-default branches here, its defaults under "default".
    let agents = &mut enforce.rules.agent_requests;
    agents.presets = vec![Preset::PinnipedKubeCertAgent, Preset::JenkinsAgent];
    agents.only_pinned = false;
    agents.limit_from_request = true;
    agents.zero_exclusive_cpus = true;
    enforce.rules.virtual_node_phase.mode = Mode::Enforce;
    vec![
        ("default", Engine::new(&Config::default())),
        ("enforce", Engine::new(&enforce)),
        ("deny", Engine::new(&every_rule(Mode::Deny))),
    ]
});

/// The default configuration with every rule in `mode`, for Pods and templates alike.
pub fn every_rule(mode: Mode) -> Config {
    let mut config = Config::default();
    let rules = &mut config.rules;
    (rules.node_affinity.mode, rules.node_affinity.templates) = (mode, mode);
    (rules.agent_requests.mode, rules.agent_requests.templates) = (mode, mode);
    (rules.dind_rm.mode, rules.dind_rm.templates) = (mode, mode);
    config
}

/// A cluster whose every node (but those named `unknown*`) has `taints`, and whose every
/// namespace has `limit_ranges`.
#[derive(Debug, Clone, Default)]
pub struct FuzzCluster {
    pub taints: Vec<Taint>,
    pub limit_ranges: Vec<LimitRangeItem>,
}

impl ClusterView for FuzzCluster {
    fn lookups_enabled(&self) -> bool {
        true
    }

    fn node_taints(&self, name: &str) -> Option<Vec<Taint>> {
        (!name.starts_with("unknown")).then(|| self.taints.clone())
    }

    /// Every known node is a virtual-kubelet node, so `virtual-node-phase` is fuzzed too.
    fn node_labels(&self, name: &str) -> Option<std::collections::BTreeMap<String, String>> {
        (!name.starts_with("unknown"))
            .then(|| [("type".to_string(), "virtual-kubelet".to_string())].into())
    }

    fn limit_range_items(&self, _namespace: &str) -> Vec<LimitRangeItem> {
        self.limit_ranges.clone()
    }
}

/// The nodes and LimitRanges of `tests/fixtures/cluster/`: a control-plane taint, a
/// virtual-kubelet taint with a value, the cordon taint (never tolerated), a NoExecute taint
/// (not podmend's business), and the `ci-agents` LimitRange plus a Pod-level one.
pub fn fixture_cluster() -> FuzzCluster {
    let taint = |key: &str, value: Option<&str>, effect: &str| Taint {
        key: key.to_string(),
        value: value.map(str::to_string),
        effect: effect.to_string(),
        time_added: None,
    };
    let list = |entries: &[(&str, &str)]| {
        Some(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    };
    FuzzCluster {
        taints: vec![
            taint("node-role.kubernetes.io/control-plane", None, "NoSchedule"),
            taint("virtual-kubelet.io/provider", Some("azure"), "NoSchedule"),
            taint("node.kubernetes.io/unschedulable", None, "NoSchedule"),
            taint("example.com/draining", Some("x"), "NoExecute"),
        ],
        limit_ranges: vec![
            LimitRangeItem {
                type_: "Container".to_string(),
                default: list(&[("cpu", "500m"), ("memory", "512Mi")]),
                default_request: list(&[("cpu", "250m"), ("memory", "256Mi")]),
                max_limit_request_ratio: list(&[("cpu", "4")]),
                min: list(&[("cpu", "50m"), ("memory", "64Mi")]),
                max: None,
            },
            LimitRangeItem {
                type_: "Pod".to_string(),
                min: list(&[("cpu", "100m"), ("memory", "100Mi")]),
                ..LimitRangeItem::default()
            },
        ],
    }
}

static FIXTURE_CLUSTER: LazyLock<FuzzCluster> = LazyLock::new(fixture_cluster);

/// The `review` target: one body, reviewed without a cluster and with the fixture cluster.
pub fn check_body(body: &[u8]) {
    let Some(request) = decode(body) else {
        return;
    };
    check_request(&request, &StaticCluster::offline(), &[]);
    let cluster = &*FIXTURE_CLUSTER;
    check_request(
        &request,
        cluster,
        &limit_range_values(&cluster.limit_ranges),
    );
}

/// Decodes like `/mutate` does; a body that is refused must say why.
pub fn decode(body: &[u8]) -> Option<Request<'_>> {
    match admission::decode(body) {
        Ok(request) => Some(request),
        Err(error) => {
            assert!(!error.to_string().is_empty(), "an error without a message");
            None
        }
    }
}

pub fn limit_range_values(items: &[LimitRangeItem]) -> Vec<Value> {
    items
        .iter()
        .map(|item| serde_json::to_value(item).expect("a LimitRangeItem serializes"))
        .collect()
}

/// Reviews `request` under every configuration and checks each answer. `limit_ranges` are the
/// LimitRange items `cluster` answers with, for the LimitRanger check.
pub fn check_request(request: &Request, cluster: &dyn ClusterView, limit_ranges: &[Value]) {
    // The objects parsed, as `audit` gives them to the engine.
    let (parsed_object, parsed_old) = request.read_whole().unwrap_or_default();
    let raw = request.subject();
    let parsed = Subject {
        operation: raw.operation,
        group: raw.group,
        kind: raw.kind,
        sub_resource: raw.sub_resource,
        namespace: raw.namespace,
        object: parsed_object.as_ref().filter(|o| !o.is_null()),
        old_object: parsed_old.as_ref().filter(|o| !o.is_null()),
    };
    for (name, engine) in ENGINES.iter() {
        // The body as the webhook gets it: whatever the client sent, after decoding.
        let outcome = engine.review_raw(&raw, cluster);
        // The webhook decides on a sketch of the object what `audit` decides on all of it.
        assert_eq!(
            outcome,
            engine.review(&parsed, cluster),
            "[{name}] the raw review and the parsed one differ"
        );
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            let decision = AdmissionDecision::from_outcome(&outcome, webhook);
            verified_patch(name, request, &decision, webhook);
        }
        // The API server's flow: the object it sends is defaulted; the patched object is
        // defaulted again and, with reinvocation, sent again.
        let Some(object) = parsed.object.filter(|o| o.is_object()) else {
            continue;
        };
        // The API server's object always carries the kind it was sent as.
        let mut typed = object.clone();
        let kind = &request.inner.kind;
        typed["kind"] = Value::from(kind.kind.as_ref());
        typed["apiVersion"] = Value::from(match kind.group.as_ref() {
            "" => kind.version.to_string(),
            group => format!("{group}/{}", kind.version),
        });
        let mut defaulted = k8s_rules::apply_patch_as_api_server(&typed, b"")
            .expect("defaulting an object cannot fail");
        limit_ranger_defaults(&mut defaulted, limit_ranges);
        let subject = Subject {
            object: Some(&defaulted),
            ..parsed
        };
        let first = engine.review(&subject, cluster);
        let decision = AdmissionDecision::from_outcome(&first, Webhook::Mutate);
        let Some(patch) = verified_patch(name, request, &decision, Webhook::Mutate) else {
            continue;
        };
        let patch_text = String::from_utf8_lossy(&patch).into_owned();
        let patched = match k8s_rules::apply_patch_as_api_server(&defaulted, &patch) {
            Ok(patched) => patched,
            Err(error) => panic!(
                "[{name}] the API server cannot apply the patch: {error}\npatch: {patch_text}\nobject: {defaulted}"
            ),
        };
        let again = Subject {
            object: Some(&patched),
            ..subject
        };
        let second = engine.review(&again, cluster);
        assert!(
            second.patch.is_empty(),
            "[{name}] a second pass over the patched object changes it again\nfirst patch: {patch_text}\nsecond patch: {}\npatched: {patched}",
            serde_json::to_string(&second.patch).unwrap_or_default()
        );
        // A valid object stays valid: podmend must never turn an accepted create into a
        // rejected one.
        if k8s_rules::validate_object(&defaulted).is_empty() {
            let errors = k8s_rules::validate_object(&patched);
            assert!(
                errors.is_empty(),
                "[{name}] the patch makes a valid object invalid: {errors:?}\npatch: {patch_text}\nobject: {defaulted}"
            );
        }
        if defaulted.get("kind").and_then(Value::as_str) == Some("Pod") && !limit_ranges.is_empty()
        {
            let spec = |object: &Value| object.get("spec").cloned().unwrap_or(Value::Null);
            if k8s_rules::limit_ranger_validate(&spec(&defaulted), limit_ranges).is_empty() {
                let errors = k8s_rules::limit_ranger_validate(&spec(&patched), limit_ranges);
                assert!(
                    errors.is_empty(),
                    "[{name}] the patch makes a pod the namespace's LimitRanges accept rejected: {errors:?}\npatch: {patch_text}\nobject: {defaulted}"
                );
            }
        }
    }
}

/// The LimitRanger's mutating half, which runs before the webhooks on a Pod CREATE: every
/// container gets the namespace's default limits and requests it lacks (`mergeContainerResources`),
/// with the item defaults completed as `SetDefaults_LimitRangeItem` does (default limit ← max,
/// default request ← default limit, then ← min).
pub fn limit_ranger_defaults(object: &mut Value, limit_ranges: &[Value]) {
    if object.get("kind").and_then(Value::as_str) != Some("Pod") {
        return;
    }
    for item in limit_ranges {
        if item.get("type").and_then(Value::as_str) != Some("Container") {
            continue;
        }
        let list = |key: &str| {
            item.get(key)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        let mut limits = list("default");
        for (name, value) in list("max") {
            limits.entry(name).or_insert(value);
        }
        let mut requests = list("defaultRequest");
        for (name, value) in limits.iter().chain(list("min").iter()) {
            requests.entry(name.clone()).or_insert(value.clone());
        }
        for list_name in ["containers", "initContainers"] {
            let Some(containers) = object
                .pointer_mut(&format!("/spec/{list_name}"))
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for container in containers.iter_mut().filter(|c| c.is_object()) {
                for (field, defaults) in [("limits", &limits), ("requests", &requests)] {
                    if defaults.is_empty() {
                        continue;
                    }
                    let resources = &mut container["resources"];
                    if !resources.is_object() {
                        *resources = Value::Object(Default::default());
                    }
                    let target = &mut resources[field];
                    if !target.is_object() {
                        *target = Value::Object(Default::default());
                    }
                    if let Some(target) = target.as_object_mut() {
                        for (name, value) in defaults {
                            target.entry(name.clone()).or_insert(value.clone());
                        }
                    }
                }
            }
        }
    }
}

/// Encodes `decision` as the webhook does, has the API server verify the response
/// (`VerifyAdmissionResponse`), and returns the decoded patch, if any.
fn verified_patch(
    name: &str,
    request: &Request,
    decision: &AdmissionDecision,
    webhook: Webhook,
) -> Option<Vec<u8>> {
    let uid = &request.inner.uid;
    let body = admission::encode_response(uid, decision);
    let value: Value = serde_json::from_slice(&body).expect("the response is JSON");
    let mutating = webhook == Webhook::Mutate;
    let patch = match k8s_rules::verify_admission_response(uid, &value, mutating) {
        Ok(patch) => patch,
        Err(error) => panic!(
            "[{name}] the API server refuses the /{} response: {error}\n{value}",
            webhook.as_str()
        ),
    };
    for warning in &decision.warnings {
        assert!(
            warning.chars().count() <= 256,
            "a warning the API server cuts: {warning}"
        );
    }
    if !mutating {
        assert_eq!(decision.allowed, decision.denial.is_none());
    }
    patch
}
