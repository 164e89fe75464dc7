//! Property tests: random pod specs (`common::pod_gen`) go the way the API server sends them
//! through podmend (`admission::decode` → `Engine::review` → `AdmissionDecision` → `encode_response`),
//! and the answer is checked the way the API server checks and applies it. For every case,
//! with the default configuration and with every rule enforcing: the response passes
//! `VerifyAdmissionResponse`, the patch applies, the result passes the API's rules, the
//! namespace's LimitRange (when the input did) and the official schema, a second pass changes
//! nothing, every repair is announced, and fields unknown to podmend's types survive where
//! they were. Half the cases take the API server's path (a defaulted Pod, LimitRanger's
//! defaults, the patch applied and defaulted again), half `audit`'s (the manifest as written,
//! the patch applied as it is).
//!
//! Cases: 256 for the generator test and 1,536 for the repair test by default (`PROPTEST_CASES`
//! sets both), from a fresh seed each run, printed on
//! failure (`PROPTEST_RNG_SEED` replays it). A failing case is shrunk and its seed saved in
//! `tests/properties.proptest-regressions`, replayed first on every later run. The schema
//! check runs once over all cases (kubernetes-validate is a Python process); when it
//! rejects something, the run is replayed with the schema checked per case, so that failure
//! is shrunk and saved like any other.

mod common;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::BuildHasher;

use common::k8s_rules;
use common::pod_gen::{self, PodCase};
use common::schema::validate_with_schema;
use common::server::create_review;
use k8s_openapi::api::core::v1::{LimitRangeItem, Taint};
use podmend::admission::{self, AdmissionDecision, Webhook};
use podmend::cluster::StaticCluster;
use podmend::config::{Config, Mode, Preset, SidecarMode};
use podmend::dind::Policy;
use podmend::engine::{Engine, MUTATED_ANNOTATION, Skip};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{
    Config as ProptestConfig, FileFailurePersistence, RngSeed, TestCaseError, TestRunner,
};
use serde_json::{Map, Value, json};

/// The generator test's cases; raise by hand with `PROPTEST_CASES`.
const DEFAULT_CASES: u32 = 256;

/// The repair test's cases, about 45 s in a debug build on 2 cores (most of it the schema
/// check). It also asserts that each rule repairs at least 1 case in 20; the rarest,
/// agent-requests under the default config, repairs about 1 in 15 (6.7 % over 5,376 cases),
/// so at 1,536 cases a fresh seed falls below that floor in about 1 run in 250 (binomial),
/// where at 256 it would in about 1 run in 8.
const REPAIR_CASES: u32 = 1536;

const REPAIR_TEST: &str =
    "every_repair_applies_passes_the_api_rules_is_idempotent_and_keeps_unknown_fields";

/// Objects per kubernetes-validate run.
const SCHEMA_BATCH: usize = 400;

/// The cluster podmend looks at: look-ups on or off, the taints of the known nodes, and the
/// LimitRange of the namespace (only with look-ups: without them podmend cannot know it).
#[derive(Clone, Debug)]
struct ClusterSketch {
    lookups: bool,
    /// Taint indexes into [`pod_gen::taint_pool`], per node of [`pod_gen::NODE_NAMES`]
    /// except the last, which no cluster knows.
    taints: Vec<Vec<usize>>,
    /// Item indexes into [`limit_range_pool`]: the items of one LimitRange.
    limit_range: Vec<usize>,
}

/// LimitRange items as the API server stores them: `SetDefaults_LimitRangeItem` has derived
/// `default` from `max` and `defaultRequest` from `default` or `min`.
fn limit_range_pool() -> Vec<Value> {
    vec![
        json!({"type": "Container", "min": {"cpu": "50m"}, "defaultRequest": {"cpu": "50m"}}),
        json!({"type": "Container", "min": {"memory": "16Mi"}, "defaultRequest": {"memory": "16Mi"}}),
        json!({"type": "Container", "max": {"cpu": "8", "memory": "16Gi"},
            "default": {"cpu": "8", "memory": "16Gi"}, "defaultRequest": {"cpu": "8", "memory": "16Gi"}}),
        json!({"type": "Container", "maxLimitRequestRatio": {"memory": "4"},
            "default": {"memory": "512Mi"}, "defaultRequest": {"memory": "256Mi"}}),
        json!({"type": "Container", "default": {"cpu": "500m"}, "defaultRequest": {"cpu": "100m"}}),
        json!({"type": "Container", "min": {"cpu": "200m"}, "defaultRequest": {"cpu": "200m"},
            "maxLimitRequestRatio": {"cpu": "10"}}),
        json!({"type": "Pod", "min": {"cpu": "100m"}}),
        json!({"type": "Pod", "max": {"memory": "64Gi"}}),
    ]
}

impl ClusterSketch {
    /// The LimitRange items the API server enforces in the namespace.
    fn limit_range_items(&self) -> Vec<Value> {
        let pool = limit_range_pool();
        if !self.lookups {
            return Vec::new();
        }
        self.limit_range.iter().map(|&i| pool[i].clone()).collect()
    }

    fn build(&self) -> StaticCluster {
        let pool = pod_gen::taint_pool();
        let mut cluster = if self.lookups {
            StaticCluster::empty()
        } else {
            StaticCluster::offline()
        };
        for (node, taints) in pod_gen::NODE_NAMES.iter().zip(&self.taints) {
            let taints: Vec<Taint> = taints
                .iter()
                .map(|&i| serde_json::from_value(pool[i].clone()).expect("pool taints decode"))
                .collect();
            cluster = cluster.with_node(node, taints);
        }
        let items: Vec<LimitRangeItem> = self
            .limit_range_items()
            .into_iter()
            .map(|item| serde_json::from_value(item).expect("pool LimitRange items decode"))
            .collect();
        if !items.is_empty() {
            cluster = cluster.with_limit_range(pod_gen::NAMESPACE, items);
        }
        cluster
    }
}

fn cluster() -> impl Strategy<Value = ClusterSketch> {
    let known = pod_gen::NODE_NAMES.len() - 1;
    (
        prop::bool::weighted(0.8),
        prop::collection::vec(
            prop::collection::vec(0..pod_gen::taint_pool().len(), 0..4),
            known,
        ),
        prop::option::weighted(
            0.7,
            prop::sample::subsequence((0..limit_range_pool().len()).collect::<Vec<_>>(), 1..3),
        ),
    )
        .prop_map(|(lookups, taints, limit_range)| ClusterSketch {
            lookups,
            taints,
            limit_range: limit_range.unwrap_or_default(),
        })
}

/// LimitRanger's `Admit` on a Pod (`mergeContainerResources`): every container and init
/// container gets the `default` limits and `defaultRequest` requests it lacks. It runs before
/// the webhook, and again when the API server reinvokes the mutating chain after a patch.
fn limit_ranger_admit(object: &mut Value, items: &[Value]) {
    if object["kind"] != "Pod" {
        return;
    }
    let mut defaults: [(&str, Map<String, Value>); 2] =
        [("limits", Map::new()), ("requests", Map::new())];
    for item in items.iter().filter(|item| item["type"] == "Container") {
        for (field, source) in [(0, "default"), (1, "defaultRequest")] {
            if let Some(Value::Object(values)) = item.get(source) {
                defaults[field].1.extend(values.clone());
            }
        }
    }
    if defaults.iter().all(|(_, values)| values.is_empty()) {
        return;
    }
    for list in ["containers", "initContainers"] {
        let Some(Value::Array(containers)) = object["spec"].get_mut(list) else {
            continue;
        };
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            let resources = container.entry("resources").or_insert_with(|| json!({}));
            for (field, values) in &defaults {
                if values.is_empty() {
                    continue;
                }
                let Some(map) = resources
                    .as_object_mut()
                    .map(|r| r.entry(*field).or_insert_with(|| json!({})))
                    .and_then(Value::as_object_mut)
                else {
                    continue;
                };
                for (name, value) in values {
                    map.entry(name.clone()).or_insert_with(|| value.clone());
                }
            }
        }
    }
}

/// The LimitRanger's validation errors of `object` (a Pod; none for templates).
fn limit_range_errors(object: &Value, items: &[Value]) -> Vec<String> {
    if object["kind"] != "Pod" || items.is_empty() {
        return Vec::new();
    }
    k8s_rules::limit_ranger_validate(&object["spec"], items)
}

/// The entries of `after` that `before` does not have as often (a multiset difference):
/// LimitRanger messages do not name the container.
fn added_errors<'a>(before: &[String], after: &'a [String]) -> Vec<&'a String> {
    let mut left: Vec<&String> = before.iter().collect();
    after
        .iter()
        .filter(|error| match left.iter().position(|b| b == error) {
            Some(i) => {
                left.swap_remove(i);
                false
            }
            None => true,
        })
        .collect()
}

/// The settings of the all-enforce configuration that vary between cases.
#[derive(Clone, Debug)]
struct Knobs {
    sidecar_mode: SidecarMode,
    policy: Policy,
    tolerate_node_taints: bool,
    limit_from_request: bool,
    only_pinned: bool,
    zero_exclusive_cpus: bool,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        select(vec![SidecarMode::Native, SidecarMode::Container]),
        select(Policy::ALL.to_vec()),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.5),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.5),
    )
        .prop_map(
            |(
                sidecar_mode,
                policy,
                tolerate_node_taints,
                limit_from_request,
                only_pinned,
                zero_exclusive_cpus,
            )| Knobs {
                sidecar_mode,
                policy,
                tolerate_node_taints,
                limit_from_request,
                only_pinned,
                zero_exclusive_cpus,
            },
        )
}

/// Every rule in `enforce`, for Pods and templates alike.
fn all_enforce(knobs: &Knobs) -> Config {
    let mut config = Config::default();
    let rules = &mut config.rules;
    rules.node_affinity.mode = Mode::Enforce;
    rules.node_affinity.templates = Mode::Enforce;
    rules.node_affinity.tolerate_node_taints = knobs.tolerate_node_taints;
    rules.agent_requests.mode = Mode::Enforce;
    rules.agent_requests.templates = Mode::Enforce;
    rules.agent_requests.limit_from_request = knobs.limit_from_request;
    // Both presets, so that the generated Jenkins agents are agents; pinned or not by knob.
    rules.agent_requests.presets = vec![Preset::PinnipedKubeCertAgent, Preset::JenkinsAgent];
    rules.agent_requests.only_pinned = knobs.only_pinned;
    rules.agent_requests.zero_exclusive_cpus = knobs.zero_exclusive_cpus;
    rules.dind_rm.mode = Mode::Enforce;
    rules.dind_rm.templates = Mode::Enforce;
    rules.dind_rm.sidecar_mode = knobs.sidecar_mode;
    rules.dind_rm.policy = knobs.policy;
    config
        .validate("all-enforce")
        .expect("the all-enforce configuration is valid");
    config
}

/// Who sends the object and applies the patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// The API server: it defaults a Pod on decode, applies the patch and defaults again.
    ApiServer,
    /// `podmend audit` on a manifest: the object as written, the patch applied as it is.
    Audit,
}

/// One review: the object, the cluster, the configuration, and the path it takes.
#[derive(Clone, Debug)]
struct Case {
    pod: PodCase,
    cluster: ClusterSketch,
    knobs: Knobs,
    path: Path,
}

impl Case {
    /// The LimitRange items the API server enforces on this object: on its path, for a Pod
    /// without pod-level `spec.resources`. (How LimitRanger's defaults, given after the
    /// decode's defaulting, meet pod-level requests is not modelled here; podmend still sees
    /// the LimitRange and its output must still pass the API's rules.)
    fn enforced_limit_range(&self) -> Vec<Value> {
        let pod_level = self
            .pod
            .object
            .pointer("/spec/resources")
            .is_some_and(|r| !r.is_null());
        if self.path == Path::Audit || self.pod.object["kind"] != "Pod" || pod_level {
            return Vec::new();
        }
        self.cluster.limit_range_items()
    }

    /// The object podmend receives: on the API server's path defaulted on decode, then given
    /// the LimitRange's defaults by LimitRanger (which runs before the webhooks).
    fn input(&self) -> Value {
        let mut object = self.pod.object.clone();
        if self.path == Path::ApiServer {
            k8s_rules::apply_pod_defaults(&mut object);
            limit_ranger_admit(&mut object, &self.enforced_limit_range());
        }
        object
    }

    /// What the API server makes of a patched object before validating it or reinvoking the
    /// webhooks: LimitRanger fills what the patch left without a value.
    fn after_admission(&self, mut object: Value) -> Value {
        limit_ranger_admit(&mut object, &self.enforced_limit_range());
        object
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        pod_gen::pod_case(),
        cluster(),
        knobs(),
        select(vec![Path::ApiServer, Path::Audit]),
    )
        .prop_map(|(pod, cluster, knobs, path)| Case {
            pod,
            cluster,
            knobs,
            path,
        })
}

/// What the API server (or `audit`) makes of one mutating answer.
struct Admitted {
    object: Value,
    /// The decoded JSON Patch, when there was one.
    patch: Option<Value>,
    warnings: Vec<String>,
    /// The rules whose repairs the patch applies.
    changed_by: Vec<&'static str>,
}

/// Sends `object` as a CREATE through podmend's admission path and checks the answer as the
/// The request as a parsed subject (its object filled in by the caller).
fn create_subject<'a>(request: &'a admission::Request<'_>) -> podmend::engine::Subject<'a> {
    let raw = request.subject();
    podmend::engine::Subject {
        operation: raw.operation,
        group: raw.group,
        kind: raw.kind,
        sub_resource: raw.sub_resource,
        namespace: raw.namespace,
        object: None,
        old_object: None,
    }
}

/// API server does (`VerifyAdmissionResponse`), then applies it the way `path` does.
fn admit(
    engine: &Engine,
    cluster: &StaticCluster,
    object: &Value,
    path: Path,
) -> Result<Admitted, String> {
    let uid = "0f5a7c1e-3b2d-4e8f-9a6b-1c2d3e4f5a6b";
    let mut review = create_review(uid, object, pod_gen::NAMESPACE);
    // `create_review` defaults a Pod as the API server does; `podmend audit` reads the
    // manifest as written (and `Case::input` already defaulted it on the API server's path).
    review["request"]["object"] = object.clone();
    let body = serde_json::to_vec(&review).map_err(|e| format!("review does not encode: {e}"))?;
    let request =
        admission::decode(&body).map_err(|e| format!("podmend refused the review: {e}"))?;
    let outcome = engine.review_raw(&request.subject(), cluster);
    // The webhook decides on a sketch of the raw object what `audit` decides on all of it.
    let parsed = Engine::review(
        engine,
        &podmend::engine::Subject {
            object: Some(object),
            ..create_subject(&request)
        },
        cluster,
    );
    if outcome != parsed {
        return Err(format!(
            "the raw review and the parsed one differ:\nraw: {outcome:?}\nparsed: {parsed:?}"
        ));
    }
    if let Some(Skip::UndecodablePodSpec(error)) = &outcome.skipped {
        return Err(format!(
            "podmend could not decode a pod spec the API server accepts: {error}"
        ));
    }
    let decision = AdmissionDecision::from_outcome(&outcome, Webhook::Mutate);
    let response: Value =
        serde_json::from_slice(&admission::encode_response(&request.inner.uid, &decision))
            .map_err(|e| format!("response is not JSON: {e}"))?;
    let patch = k8s_rules::verify_admission_response(uid, &response, true)?;
    if response["response"]["allowed"] != json!(true) {
        return Err(format!("the mutating webhook denied: {response}"));
    }
    let object = match path {
        Path::ApiServer => {
            k8s_rules::apply_patch_as_api_server(object, patch.as_deref().unwrap_or(&[]))?
        }
        Path::Audit => {
            let mut object = object.clone();
            if let Some(bytes) = &patch {
                let ops: json_patch::Patch = serde_json::from_slice(bytes)
                    .map_err(|e| format!("patch does not decode: {e}"))?;
                json_patch::patch(&mut object, &ops)
                    .map_err(|e| format!("patch does not apply: {e}"))?;
            }
            object
        }
    };
    let patch = patch
        .map(|bytes| serde_json::from_slice(&bytes))
        .transpose()
        .map_err(|e| format!("patch is not JSON: {e}"))?;
    let changed_by = outcome
        .in_mode(Mode::Enforce)
        .filter(|finding| !finding.patch.is_empty())
        .map(|finding| finding.rule)
        .collect();
    Ok(Admitted {
        object,
        patch,
        warnings: decision.warnings,
        changed_by,
    })
}

/// The metadata that goes with the pod spec (the Pod's, or the template's).
fn pod_metadata(object: &Value) -> &Value {
    let pointer = match object["kind"].as_str() {
        Some("Deployment") => "/spec/template/metadata",
        Some("CronJob") => "/spec/jobTemplate/spec/template/metadata",
        _ => "/metadata",
    };
    object.pointer(pointer).unwrap_or(&Value::Null)
}

thread_local! {
    /// How many cases each rule repaired, per configuration: the properties are only as good
    /// as the repairs the generator provokes.
    static REPAIRS: RefCell<BTreeMap<(&'static str, &'static str), usize>> =
        const { RefCell::new(BTreeMap::new()) };
}

/// Counted like a rule: cases checked against a LimitRange the input met.
const LIMIT_RANGE_CHECKED: &str = "(acceptable input under a LimitRange)";

fn count_repair(config: &'static str, rule: &'static str) {
    REPAIRS.with(|r| *r.borrow_mut().entry((config, rule)).or_default() += 1);
}

/// The repair properties of one case; returns the repaired objects for the schema check.
fn check_repairs(case: &Case) -> Result<Vec<Value>, TestCaseError> {
    let cluster = case.cluster.build();
    let generated_errors = k8s_rules::validate_object(&case.pod.object);
    prop_assert!(
        !case.pod.api_valid || generated_errors.is_empty(),
        "generator bug: an input meant to be valid is not: {generated_errors:?}"
    );
    let input = case.input();
    let input_errors = k8s_rules::validate_object(&input);
    let limit_range = case.enforced_limit_range();
    let acceptable = input_errors.iter().all(|e| generated_errors.contains(e))
        && limit_range_errors(&input, &limit_range).is_empty();
    let mut schema_objects = Vec::new();
    for (label, config) in [
        ("default config", Config::default()),
        ("all-enforce config", all_enforce(&case.knobs)),
    ] {
        let engine = Engine::new(&config);
        let first = admit(&engine, &cluster, &input, case.path)
            .map_err(|e| TestCaseError::fail(format!("{label}: {e}")))?;
        for rule in &first.changed_by {
            count_repair(label, rule);
        }
        let shown_patch = first
            .patch
            .as_ref()
            .map_or("none".to_string(), |p| format!("{p:#}"));
        let output = case.after_admission(first.object);

        // What the API server accepts, it still accepts after podmend: its own rules and the
        // LimitRanger's. Webhooks run before validation, so podmend also sees objects the
        // API server will reject; it must not add errors to the generator's deliberate one.
        // (LimitRanger's defaults can make an input unacceptable on their own: such a pod
        // is rejected whatever podmend does, and the errors' container indexes may shift.)
        if acceptable {
            if !limit_range.is_empty() {
                count_repair(label, LIMIT_RANGE_CHECKED);
            }
            let output_errors = k8s_rules::validate_object(&output);
            let new_errors = added_errors(&input_errors, &output_errors);
            prop_assert!(
                new_errors.is_empty(),
                "{label}: the repaired object breaks the API's rules: {new_errors:#?}\npatch: {shown_patch}\nresult: {output:#}"
            );
            // Names, volumes, mounts, probes and the downward API, which the guard adds to.
            let spec_errors = |object: &Value| {
                k8s_rules::pod_spec_of(object).map_or_else(Vec::new, common::dind::api_errors)
            };
            let (before, after) = (spec_errors(&input), spec_errors(&output));
            let new_errors = added_errors(&before, &after);
            prop_assert!(
                new_errors.is_empty(),
                "{label}: the repaired pod spec breaks the API's rules: {new_errors:#?}\npatch: {shown_patch}\nresult: {output:#}"
            );
            let new_errors = limit_range_errors(&output, &limit_range);
            prop_assert!(
                new_errors.is_empty(),
                "{label}: the repaired object breaks the namespace's LimitRange {limit_range:?}: {new_errors:#?}\npatch: {shown_patch}\nresult: {output:#}"
            );
        }

        let lost = pod_gen::unknown_fields_errors(&output, &case.pod.unknown_fields);
        prop_assert!(
            lost.is_empty(),
            "{label}: unknown fields did not survive: {lost:#?}\npatch: {shown_patch}\nresult: {output:#}"
        );

        if first.patch.is_some() {
            prop_assert!(
                !first.warnings.is_empty(),
                "{label}: a repair without a warning; patch: {shown_patch}"
            );
            let mutated = pod_metadata(&output).pointer(&format!(
                "/annotations/{}",
                MUTATED_ANNOTATION.replace('/', "~1")
            ));
            prop_assert!(
                mutated.is_some_and(Value::is_string),
                "{label}: a repair without the {MUTATED_ANNOTATION} annotation; patch: {shown_patch}"
            );
        }

        let second = admit(&engine, &cluster, &output, case.path)
            .map_err(|e| TestCaseError::fail(format!("{label}, second pass: {e}")))?;
        prop_assert!(
            second.patch.is_none(),
            "{label}: a second pass over podmend's own output patched again: {:#}\nfirst patch: {shown_patch}\nafter the first pass: {output:#}",
            second.patch.unwrap_or_default()
        );

        if first.patch.is_some() {
            let mut object = output;
            pod_gen::strip_unknown_fields(&mut object, &case.pod.unknown_fields);
            schema_objects.push(object);
        }
    }
    Ok(schema_objects)
}

/// The generator's own promise: inputs flagged valid pass the API's rules; the others fail
/// only for the empty `nodeSelectorTerms` they were given; every unknown field is where the
/// generator says. Returns the input (without unknown fields) for the schema check.
fn check_generator(case: &PodCase) -> Result<Vec<Value>, TestCaseError> {
    let errors = k8s_rules::validate_object(&case.object);
    if case.api_valid {
        prop_assert!(
            errors.is_empty(),
            "generated an invalid object: {errors:#?}"
        );
    } else {
        prop_assert!(
            !errors.is_empty()
                && errors.iter().all(|e| e.contains(
                    "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: Required value"
                )),
            "an object with empty nodeSelectorTerms has other errors: {errors:#?}"
        );
    }
    let misplaced = pod_gen::unknown_fields_errors(&case.object, &case.unknown_fields);
    prop_assert!(misplaced.is_empty(), "{misplaced:#?}");
    let mut object = case.object.clone();
    pod_gen::strip_unknown_fields(&mut object, &case.unknown_fields);
    Ok(vec![object])
}

fn proptest_config(test_name: &'static str) -> ProptestConfig {
    // `default()` reads the PROPTEST_* environment variables.
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = if test_name == REPAIR_TEST {
            REPAIR_CASES
        } else {
            DEFAULT_CASES
        };
    }
    if config.rng_seed == RngSeed::Random {
        // A known seed, so the schema replay below sees the same cases.
        let seed = std::collections::hash_map::RandomState::new().hash_one(test_name);
        config.rng_seed = RngSeed::Fixed(seed);
    }
    if config.failure_persistence.is_some() {
        // What the default falls back to for a test outside `src/`, without its warning.
        config.failure_persistence = Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        )));
    }
    config.source_file = Some(file!());
    config.test_name = Some(test_name);
    config
}

/// Runs `check` on generated cases, then the official schema over every object the cases
/// returned, in a few kubernetes-validate runs. A schema failure is replayed case by case to
/// shrink and persist it.
fn run_property<S>(
    test_name: &'static str,
    strategy: S,
    check: impl Fn(&S::Value) -> Result<Vec<Value>, TestCaseError>,
) where
    S: Strategy,
    S::Value: fmt::Debug,
{
    let config = proptest_config(test_name);
    let seed = config.rng_seed;
    let collected: RefCell<Vec<(String, Vec<Value>)>> = RefCell::new(Vec::new());
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(&strategy, |case| {
        let objects = check(&case)?;
        collected.borrow_mut().push((format!("{case:?}"), objects));
        Ok(())
    });
    if let Err(error) = result {
        panic!("{test_name} (PROPTEST_RNG_SEED={seed}): {error}");
    }
    let collected = collected.into_inner();
    let Err((failing, report)) = schema_check(&collected) else {
        eprintln!(
            "{test_name}: {} cases, {} objects passed the schema (PROPTEST_RNG_SEED={seed})",
            collected.len(),
            collected.iter().map(|(_, o)| o.len()).sum::<usize>()
        );
        return;
    };
    let found = Cell::new(false);
    let mut runner = TestRunner::new(config);
    let replay = runner.run(&strategy, |case| {
        if !found.get() && !failing.contains(&format!("{case:?}")) {
            return Ok(());
        }
        found.set(true);
        let objects = check(&case)?;
        validate_with_schema(&objects, true).map_err(TestCaseError::fail)
    });
    match replay {
        Err(error) => panic!(
            "{test_name} (PROPTEST_RNG_SEED={seed}): the official schema rejected a result: {error}"
        ),
        Ok(()) => panic!(
            "{test_name} (PROPTEST_RNG_SEED={seed}): the official schema rejected results, and the \
             replay did not reproduce it: {report}"
        ),
    }
}

/// Validates every collected object with the strict schema. On failure: the keys of the
/// cases whose objects were rejected, and the tool's report.
fn schema_check(collected: &[(String, Vec<Value>)]) -> Result<(), (HashSet<String>, String)> {
    let mut tagged: Vec<(usize, String, Value)> = Vec::new();
    for (i, (_, objects)) in collected.iter().enumerate() {
        for (j, object) in objects.iter().enumerate() {
            let tag = format!("case-{i}-{j}");
            let mut object = object.clone();
            object["metadata"]["name"] = json!(tag);
            tagged.push((i, tag, object));
        }
    }
    let mut failing = HashSet::new();
    let mut reports = Vec::new();
    for chunk in tagged.chunks(SCHEMA_BATCH) {
        let objects: Vec<Value> = chunk.iter().map(|(_, _, o)| o.clone()).collect();
        let Err(report) = validate_with_schema(&objects, true) else {
            continue;
        };
        let named: Vec<usize> = chunk
            .iter()
            .filter(|(_, tag, _)| report.contains(&format!("/{tag})")))
            .map(|(i, _, _)| *i)
            .collect();
        // If the report names no object, every case of the batch is a suspect.
        let suspects = if named.is_empty() {
            chunk.iter().map(|(i, _, _)| *i).collect()
        } else {
            named
        };
        failing.extend(suspects.into_iter().map(|i| collected[i].0.clone()));
        reports.push(report);
    }
    if reports.is_empty() {
        Ok(())
    } else {
        Err((failing, reports.join("\n")))
    }
}

#[test]
fn generated_objects_are_ones_the_api_server_accepts() {
    run_property(
        "generated_objects_are_ones_the_api_server_accepts",
        pod_gen::pod_case(),
        check_generator,
    );
}

#[test]
fn every_repair_applies_passes_the_api_rules_is_idempotent_and_keeps_unknown_fields() {
    let cases = proptest_config(REPAIR_TEST).cases as usize;
    run_property(REPAIR_TEST, case(), check_repairs);
    let repairs = REPAIRS.with(|r| r.borrow().clone());
    eprintln!("repairs per configuration and rule: {repairs:?}");
    // Each rule must repair a fair share of the cases, or the properties above say little.
    // (1 in 20 or more each, at REPAIR_CASES; a handful of cases run by hand
    // are too few to judge.)
    if cases < 100 {
        eprintln!("{cases} cases: too few to check how often each rule repaired");
        return;
    }
    let limit_range = ("all-enforce config", LIMIT_RANGE_CHECKED);
    let checked = repairs.get(&limit_range).copied().unwrap_or(0);
    assert!(
        checked * 128 >= cases,
        "only {checked} of {cases} cases were checked against a LimitRange"
    );
    // Every rule of the spec registry (the status rules act on pods/status writes, which
    // these pod specs never are).
    let spec_rules: Vec<&str> = podmend::rules::registry(&Config::default())
        .iter()
        .map(|rule| rule.id())
        .collect();
    for rule in &spec_rules {
        for config in ["default config", "all-enforce config"] {
            let repaired = repairs.get(&(config, rule)).copied().unwrap_or(0);
            assert!(
                repaired * 20 >= cases,
                "{rule} repaired only {repaired} of {cases} cases with the {config}: the generator \
                 no longer provokes it"
            );
        }
    }
}
