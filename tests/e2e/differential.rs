//! The fast tier's kube-apiserver (`tests/common/k8s_rules.rs`, which the integration tests
//! judge podmend's answers with) against the real one, case by case: the pod specs podmend's
//! rewrites produce, and valid and invalid variants of the fields those rewrites touch. For
//! each case the emulation's verdict (`validate_object`, `limit_ranger_validate` where a
//! LimitRange applies) and its defaulting (`apply_pod_defaults`) are compared with what
//! `kubectl create --dry-run=server` gets from kube-apiserver: accepted or refused, the
//! refused case's field paths, and the defaulted object the API server returns. A
//! disagreement is a bug in the emulation (or a case it does not cover, to be added to it).
//!
//! The cases are judged in namespaces labelled `podmend.io/ignore`, which the chart's webhook
//! configuration leaves out: what is compared is the API server's own admission, defaulting
//! and validation, not podmend. The pods podmend's rewrites produce come from a dry run in a
//! namespace podmend serves, so they are podmend's real answers as the API server applied them.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::routing::post;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::k8s_rules::{self, Quantity};
use crate::install::{
    assert_success, ensure_installed, kubectl, kubectl_json, kubectl_stdin, kubectl_stdin_output,
};
use crate::node_affinity::wait_until_podmend_knows;
use crate::own_webhook::{OwnWebhook, Registration};
use crate::pinniped::create_node;

/// podmend repairs pods here (dry runs only: nothing is stored).
const REPAIRED_NS: &str = "differential-podmend";
/// The API server alone judges here.
const JUDGE_NS: &str = "differential";
/// The same, with [`limit_range`].
const LIMITS_NS: &str = "differential-limits";
const NODE: &str = "differential-node";
const TAINTED: &str = "differential-tainted";

/// One pod to judge, and where.
struct Case {
    name: String,
    pod: Value,
    limit_range: bool,
}

/// The LimitRange of [`LIMITS_NS`]: a cpu minimum, maximum and limit/request ratio per
/// container. Every pod judged under it sets both its cpu request and limit, so the
/// LimitRanger's defaulting (from `default`/`defaultRequest`, which `SetDefaults_LimitRangeItem`
/// in `pkg/apis/core/v1/defaults.go` derives from `max` and `min`) has nothing to fill and only
/// its validation is compared.
fn limit_range() -> Value {
    json!({"apiVersion": "v1", "kind": "LimitRange",
           "metadata": {"name": "cpu-bounds", "namespace": LIMITS_NS},
           "spec": {"limits": [{"type": "Container",
                                "min": {"cpu": "10m"}, "max": {"cpu": "1"},
                                "maxLimitRequestRatio": {"cpu": "4"}}]}})
}

fn pod(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

/// One container `c` with `resources`.
fn one_container(resources: Value) -> Value {
    json!([{"name": "c", "image": "busybox", "resources": resources}])
}

fn case(name: &str, spec: Value) -> Case {
    Case {
        name: name.to_string(),
        pod: pod(name, spec),
        limit_range: false,
    }
}

/// A pod judged under [`limit_range`], its container's cpu request and limit as given.
fn limited(name: &str, request: &str, limit: &str) -> Case {
    Case {
        name: name.to_string(),
        pod: pod(
            name,
            json!({"containers": one_container(
                json!({"requests": {"cpu": request}, "limits": {"cpu": limit}}))}),
        ),
        limit_range: true,
    }
}

fn match_fields(key: &str, operator: &str, values: Value) -> Value {
    let mut requirement = json!({"key": key, "operator": operator});
    if !values.is_null() {
        requirement["values"] = values;
    }
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [requirement]}]}}})
}

/// Hand-made cases on the fields podmend's rewrites touch, valid and invalid.
fn hand_made() -> Vec<Case> {
    let busybox = json!([{"name": "c", "image": "busybox"}]);
    let affinity = |key: &str, operator: &str, values: Value| json!({"containers": busybox, "affinity": match_fields(key, operator, values)});
    let tolerating =
        |toleration: Value| json!({"containers": busybox, "tolerations": [toleration]});
    let pod_level = |pod: Value, container: Value| json!({"resources": pod, "containers": one_container(container)});
    vec![
        case(
            "limits-only",
            json!({"containers": one_container(
            json!({"limits": {"cpu": "500m", "memory": "128Mi"}}))}),
        ),
        case(
            "zero-requests-with-limits",
            json!({"containers": one_container(
            json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "20m", "memory": "32Mi"}}))}),
        ),
        case(
            "sub-milli-request",
            json!({"containers": one_container(
            json!({"requests": {"cpu": "0.0001", "memory": "1.5Gi"}}))}),
        ),
        case(
            "requests-above-limits",
            json!({"containers": one_container(
            json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}))}),
        ),
        case(
            "negative-request",
            json!({"containers": one_container(
            json!({"requests": {"cpu": "-1"}}))}),
        ),
        case(
            "extended-resource-without-limit",
            json!({"containers": one_container(
            json!({"requests": {"example.com/gpu": "1"}}))}),
        ),
        case(
            "match-fields-on-the-name",
            affinity("metadata.name", "In", json!([NODE])),
        ),
        case(
            "match-fields-with-two-names",
            affinity("metadata.name", "In", json!([NODE, TAINTED])),
        ),
        case(
            "match-fields-on-another-field",
            affinity("spec.nodeName", "In", json!([NODE])),
        ),
        case(
            "match-fields-exists",
            affinity("metadata.name", "Exists", Value::Null),
        ),
        case(
            "toleration-equal",
            tolerating(
                json!({"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}),
            ),
        ),
        case(
            "toleration-exists-with-a-value",
            tolerating(
                json!({"key": "dedicated", "operator": "Exists", "value": "ci", "effect": "NoSchedule"}),
            ),
        ),
        case(
            "toleration-seconds-without-no-execute",
            tolerating(
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}),
            ),
        ),
        case(
            "node-name-with-scheduling-gates",
            json!({"containers": busybox,
            "nodeName": NODE, "schedulingGates": [{"name": "example.com/gate"}]}),
        ),
        case(
            "node-name-not-a-dns-name",
            json!({"containers": busybox, "nodeName": "Not_A_Node"}),
        ),
        case(
            "pod-level-limits-only",
            pod_level(
                json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
                json!({"requests": {"cpu": "0", "memory": "0"}}),
            ),
        ),
        case(
            "pod-level-limit-below-a-container-limit",
            pod_level(
                json!({"limits": {"cpu": "1"}}),
                json!({"limits": {"cpu": "2"}}),
            ),
        ),
        case(
            "pod-level-request-below-the-containers",
            pod_level(
                json!({"requests": {"cpu": "100m"}}),
                json!({"requests": {"cpu": "200m"}}),
            ),
        ),
        case(
            "pod-level-ephemeral-storage",
            pod_level(json!({"limits": {"ephemeral-storage": "1Gi"}}), json!({})),
        ),
        limited("within-the-limit-range", "10m", "20m"),
        limited("zero-request-under-a-minimum", "0", "20m"),
        limited("request-below-the-minimum", "5m", "20m"),
        limited("limit-above-the-maximum", "500m", "2"),
        limited("ratio-above-the-maximum", "10m", "100m"),
    ]
}

/// Pods podmend repairs (node-affinity, its toleration, agent-requests with and without a
/// pod-level limit, dind-rm's guard), as the API server returns them from a dry run in
/// [`REPAIRED_NS`]: podmend's answer applied, defaulted and validated.
fn repaired_by_podmend(suite: &Suite) -> Vec<Case> {
    let agent = json!({"podmend.io/agent": "true"});
    let limits = json!({"limits": {"cpu": "500m", "memory": "128Mi"}});
    let inputs = [
        pod(
            "pinned",
            json!({"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]}),
        ),
        pod(
            "pinned-to-a-tainted-node",
            json!({"nodeName": TAINTED, "containers": [{"name": "c", "image": "busybox"}]}),
        ),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "agent", "annotations": agent},
               "spec": {"containers": one_container(json!({
                   "requests": {"cpu": "200m", "memory": "64Mi"},
                   "limits": {"cpu": "500m", "memory": "128Mi"}}))}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "agent-under-a-pod-level-limit", "annotations": agent},
               "spec": {"nodeName": NODE,
                        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                        "containers": one_container(json!({"requests": {"cpu": "200m", "memory": "128Mi"}}))}}),
        pod(
            "dind",
            json!({"containers": [
            {"name": "build", "image": "docker:27-cli",
             "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}], "resources": limits},
            {"name": "dind", "image": "docker:27-dind", "securityContext": {"privileged": true},
             "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}], "resources": limits}]}),
        ),
    ];
    inputs
        .iter()
        .map(|input| {
            let name = input["metadata"]["name"].as_str().expect("a name");
            let output = kubectl_stdin_output(
                suite,
                &["create", "--dry-run=server", "-n", REPAIRED_NS, "-o", "json", "-f", "-"],
                input,
            );
            assert_success(&format!("the dry run of {name}"), &output);
            let returned: Value = serde_json::from_slice(&output.stdout)
                .unwrap_or_else(|e| panic!("the dry run of {name}: {e}"));
            // Each case must be podmend's rewrite, not the pod as created.
            assert!(
                returned["metadata"]["annotations"]["podmend.io/mutated"].is_string(),
                "podmend did not repair {name}: {returned}"
            );
            let metadata = &returned["metadata"];
            Case {
                name: format!("repaired-{name}"),
                pod: json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("repaired-{name}"),
                                 "labels": metadata["labels"], "annotations": metadata["annotations"]},
                    "spec": returned["spec"]}),
                limit_range: false,
            }
        })
        .collect()
}

/// The emulation's verdict: its errors, and the pod as it defaults it.
fn emulated(case: &Case) -> (Vec<String>, Value) {
    let mut errors = k8s_rules::validate_object(&case.pod);
    let mut defaulted = case.pod.clone();
    k8s_rules::apply_pod_defaults(&mut defaulted);
    if case.limit_range {
        errors.extend(k8s_rules::limit_ranger_validate(
            &defaulted["spec"],
            &[limit_range()],
        ));
    }
    (errors, defaulted)
}

/// kube-apiserver's verdict: the defaulted pod it returns, or its refusal.
fn real(suite: &Suite, case: &Case) -> Result<Value, String> {
    let namespace = if case.limit_range {
        LIMITS_NS
    } else {
        JUDGE_NS
    };
    let output = kubectl_stdin_output(
        suite,
        &[
            "create",
            "--dry-run=server",
            "-n",
            namespace,
            "-o",
            "json",
            "-f",
            "-",
        ],
        &case.pod,
    );
    if output.status.success() {
        serde_json::from_slice(&output.stdout).map_err(|e| format!("unreadable: {e}"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Each quantity of a resource list as its exact value, so `0.5` and `500m` compare equal.
fn exact(list: &Value) -> Value {
    match list.as_object() {
        Some(map) => map
            .iter()
            .map(|(name, quantity)| {
                let value = Quantity::from_json(quantity)
                    .map_or_else(|e| format!("unparsed {e}"), |q| q.nanos().to_string());
                (name.clone(), json!(value))
            })
            .collect(),
        None => list.clone(),
    }
}

fn exact_resources(resources: &Value) -> Value {
    json!({"requests": exact(&resources["requests"]), "limits": exact(&resources["limits"])})
}

/// What the emulation claims to model of a defaulted pod: placement, tolerations and every
/// resource list. The tolerations two admission plugins add are theirs and left out: the
/// DefaultTolerationSeconds plugin's (`plugin/pkg/admission/defaulttolerationseconds/admission.go`,
/// `Admit`: not-ready and unreachable, NoExecute, 300 s, to a pod without them) and, as the
/// suite enables it, the PodTolerationRestriction plugin's
/// (`plugin/pkg/admission/podtolerationrestriction/admission.go`, `Admit`: memory-pressure,
/// NoSchedule, to every pod that is not BestEffort).
fn modelled(pod: &Value) -> Value {
    let spec = &pod["spec"];
    let containers = |list: &str| -> Vec<Value> {
        spec[list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| json!({"name": c["name"], "resources": exact_resources(&c["resources"])}))
            .collect()
    };
    let added_by_the_api_server = |t: &&Value| {
        let default_seconds = t["effect"] == "NoExecute"
            && t["tolerationSeconds"] == 300
            && (t["key"] == "node.kubernetes.io/not-ready"
                || t["key"] == "node.kubernetes.io/unreachable");
        let memory_pressure = t["effect"] == "NoSchedule"
            && t["operator"] == "Exists"
            && t["key"] == "node.kubernetes.io/memory-pressure";
        default_seconds || memory_pressure
    };
    let tolerations: Vec<&Value> = spec["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| !added_by_the_api_server(t))
        .collect();
    json!({"nodeName": spec["nodeName"], "affinity": spec["affinity"],
           "tolerations": tolerations, "resources": exact_resources(&spec["resources"]),
           "containers": containers("containers"), "initContainers": containers("initContainers")})
}

/// How the emulation and the API server disagree on `case`, if they do.
fn disagreement(suite: &Suite, case: &Case) -> Option<String> {
    let (errors, defaulted) = emulated(case);
    match real(suite, case) {
        Ok(_) if !errors.is_empty() => Some(format!(
            "the API server accepts it; the emulation refuses it: {errors:?}"
        )),
        Ok(stored) => {
            let (theirs, ours) = (modelled(&stored), modelled(&defaulted));
            (theirs != ours).then(|| {
                format!("defaulted differently:\n  API server: {theirs}\n  emulation:  {ours}")
            })
        }
        Err(refusal) if errors.is_empty() => Some(format!(
            "the API server refuses it; the emulation accepts it: {refusal}"
        )),
        // Both refuse: the API server names each field the emulation does (LimitRanger's
        // messages name no field).
        Err(refusal) => {
            let missing: Vec<&String> = errors
                .iter()
                .filter(|e| e.starts_with("spec"))
                .filter(|e| !refusal.contains(e.split(": ").next().unwrap_or(e)))
                .collect();
            (!missing.is_empty()).then(|| {
                format!("both refuse, but the API server names other fields: {missing:?}\n  API server: {refusal}")
            })
        }
    }
}

/// The namespaces, nodes and LimitRange the cases need; once the API server applies the
/// LimitRange (its LimitRanger reads LimitRanges through an informer, a moment behind).
fn setup(suite: &Suite) {
    ensure_installed(suite);
    for namespace in [REPAIRED_NS, JUDGE_NS, LIMITS_NS] {
        suite
            .block_on(suite.plane.create_namespace(namespace))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for namespace in [JUDGE_NS, LIMITS_NS] {
        kubectl(
            suite,
            &["label", "namespace", namespace, "podmend.io/ignore=true"],
        );
    }
    create_node(suite, NODE, "");
    create_node(suite, TAINTED, "dedicated=ci:NoSchedule");
    wait_until_podmend_knows(suite, REPAIRED_NS, NODE);
    wait_until_podmend_knows(suite, REPAIRED_NS, TAINTED);
    kubectl_stdin(suite, &["create", "-f", "-"], &limit_range());
    let probe = limited("probe", "0", "20m");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while real(suite, &probe).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the API server did not apply the LimitRange within 30 s: {}",
            kubectl_json(suite, &["get", "limitrange", "-n", LIMITS_NS, "-o", "json"])
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

pub fn the_emulated_api_server_accepts_refuses_and_defaults_each_pod_as_the_real_one_does(
    suite: &Suite,
) {
    setup(suite);
    let mut cases = repaired_by_podmend(suite);
    cases.extend(hand_made());
    let mut refused = 0;
    let mut disagreements = Vec::new();
    for case in &cases {
        if !emulated(case).0.is_empty() {
            refused += 1;
        }
        if let Some(how) = disagreement(suite, case) {
            disagreements.push(format!("{}: {how}", case.name));
        }
    }
    println!(
        "({} cases, {refused} refused by the emulation)",
        cases.len()
    );
    assert!(
        disagreements.is_empty(),
        "the emulation and kube-apiserver disagree on {} of {} cases:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
}

// ------------------------------------------------------------------------------------------------
// Webhook answers: `verify_admission_response` and `apply_patch_as_api_server`
// ------------------------------------------------------------------------------------------------

/// Where pods meet [`ANSWERS_WEBHOOK`] (and not podmend).
const ANSWERS_NS: &str = "differential-answers";
const ANSWERS_CONFIGURATION: &str = "podmend-differential-answers";
const ANSWERS_WEBHOOK: &str = "answers.differential.podmend.io";

/// A webhook's answer to the AdmissionReview of request `uid`.
type Answer = fn(&str) -> Value;

/// What the test's webhook received and sent: the request's object, its uid, the answer.
type Exchange = (Value, String, Value);

/// What the test's webhook answers, what it last received and sent, and every review it
/// received.
struct Hook {
    answer: Answer,
    seen: Option<Exchange>,
    reviews: Vec<Value>,
}

type SharedHook = Arc<Mutex<Hook>>;

async fn answer(
    State(hook): State<SharedHook>,
    body: Bytes,
) -> ([(header::HeaderName, &'static str); 1], String) {
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut hook = crate::lock(&hook);
    let uid = review["request"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let answer = (hook.answer)(&uid);
    hook.seen = Some((review["request"]["object"].clone(), uid, answer.clone()));
    hook.reviews.push(review);
    (
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
}

fn review(response: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn patched_with(uid: &str, patch: &str) -> Value {
    review(json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": b64(patch)}))
}

/// Answers a webhook may give, each as the API server receives it. Two the emulation refuses
/// on purpose while the API server takes them (a missing `allowed`, a patch as a list of
/// bytes: see `verify_admission_response`) are not among them.
const ANSWERS: &[(&str, Answer)] = &[
    ("allowed-without-a-patch", |uid| {
        review(json!({"uid": uid, "allowed": true}))
    }),
    ("a-json-patch", |uid| {
        patched_with(
            uid,
            r#"[{"op":"add","path":"/metadata/annotations","value":{"differential":"patched"}}]"#,
        )
    }),
    ("a-denial", |uid| {
        review(json!({"uid": uid, "allowed": false,
                      "status": {"code": 403, "message": "the differential says no"}}))
    }),
    ("another-uid", |_| {
        review(json!({"uid": "not-the-request", "allowed": true}))
    }),
    ("a-patch-without-its-type", |uid| {
        review(json!({"uid": uid, "allowed": true, "patch": b64("[]")}))
    }),
    ("a-patch-type-without-a-patch", |uid| {
        review(json!({"uid": uid, "allowed": true, "patchType": "JSONPatch"}))
    }),
    ("a-merge-patch-type", |uid| {
        review(json!({"uid": uid, "allowed": true, "patchType": "MergePatch", "patch": b64("{}")}))
    }),
    ("a-v1beta1-answer", |uid| {
        let mut body = review(json!({"uid": uid, "allowed": true}));
        body["apiVersion"] = json!("admission.k8s.io/v1beta1");
        body
    }),
    ("another-kind", |uid| {
        let mut body = review(json!({"uid": uid, "allowed": true}));
        body["kind"] = json!("AdmissionResponse");
        body
    }),
    (
        "no-response",
        |_| json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    ),
    ("a-patch-not-in-base64", |uid| {
        review(json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": "%%%"}))
    }),
    ("a-patch-that-is-not-a-list", |uid| {
        patched_with(uid, r#"{"op":"add","path":"/metadata/labels","value":{}}"#)
    }),
    ("a-patch-that-does-not-apply", |uid| {
        patched_with(
            uid,
            r#"[{"op":"replace","path":"/metadata/labels/missing","value":"x"}]"#,
        )
    }),
    ("a-patch-that-makes-the-pod-invalid", |uid| {
        patched_with(
            uid,
            r#"[{"op":"add","path":"/spec/containers/0/resources","value":{"requests":{"cpu":"2"},"limits":{"cpu":"1"}}}]"#,
        )
    }),
];

/// The emulation's verdict on `answer` to a review of `object`: the pod it stores, or why
/// it refuses.
fn emulated_answer(object: &Value, uid: &str, answer: &Value) -> Result<Value, String> {
    let patch = k8s_rules::verify_admission_response(uid, answer, true)?;
    if answer["response"]["allowed"] != true {
        return Err("denied".to_string());
    }
    let Some(patch) = patch else {
        return Ok(object.clone());
    };
    let patched = k8s_rules::apply_patch_as_api_server(object, &patch)?;
    let errors = k8s_rules::validate_object(&patched);
    if errors.is_empty() {
        Ok(patched)
    } else {
        Err(errors.join("; "))
    }
}

/// The test's webhook on loopback and a configuration (`failurePolicy: Fail`) sending it
/// what its rules match in one namespace; both gone when dropped, also when the test fails.
pub(crate) struct AnswersWebhook<'a> {
    suite: &'a Suite,
    hook: SharedHook,
    _webhook: OwnWebhook<'a>,
}

impl<'a> AnswersWebhook<'a> {
    /// The webhook for the pods created in [`ANSWERS_NS`].
    fn start(suite: &'a Suite) -> Self {
        let rules = json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                            "resources": ["pods"], "scope": "Namespaced"}]);
        Self::start_for(suite, ANSWERS_CONFIGURATION, ANSWERS_NS, rules)
    }

    /// The webhook, allowing everything without a patch, for what `rules` match in
    /// `namespace`, registered as the MutatingWebhookConfiguration `configuration`.
    pub(crate) fn start_for(
        suite: &'a Suite,
        configuration: &str,
        namespace: &str,
        rules: Value,
    ) -> Self {
        let hook: SharedHook = Arc::new(Mutex::new(Hook {
            answer: ANSWERS[0].1,
            seen: None,
            reviews: Vec::new(),
        }));
        let app = Router::new()
            .route("/mutate", post(answer))
            .with_state(hook.clone());
        let registration = Registration {
            configuration,
            webhook: ANSWERS_WEBHOOK,
            namespace,
            failure_policy: "Fail",
            path: "/mutate",
            rules: Some(rules),
        };
        AnswersWebhook {
            suite,
            hook,
            _webhook: OwnWebhook::start(suite, &registration, app),
        }
    }

    /// Creates `pod` (a dry run) while the webhook gives `answer`: the API server's verdict,
    /// and what the webhook received and sent, if it was called.
    fn create(&self, pod: &Value, answer: Answer) -> (Result<Value, String>, Option<Exchange>) {
        {
            let mut hook = crate::lock(&self.hook);
            hook.answer = answer;
            hook.seen = None;
        }
        let output = kubectl_stdin_output(
            self.suite,
            &[
                "create",
                "--dry-run=server",
                "-n",
                ANSWERS_NS,
                "-o",
                "json",
                "-f",
                "-",
            ],
            pod,
        );
        let verdict = if output.status.success() {
            serde_json::from_slice(&output.stdout).map_err(|e| format!("unreadable: {e}"))
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        };
        (verdict, crate::lock(&self.hook).seen.take())
    }

    /// The reviews the webhook received since the last call, oldest first.
    pub(crate) fn take_reviews(&self) -> Vec<Value> {
        std::mem::take(&mut crate::lock(&self.hook).reviews)
    }
}

pub fn the_emulated_api_server_takes_or_refuses_each_webhook_answer_as_the_real_one_does(
    suite: &Suite,
) {
    suite
        .block_on(suite.plane.create_namespace(ANSWERS_NS))
        .unwrap_or_else(|e| panic!("{e}"));
    kubectl(
        suite,
        &["label", "namespace", ANSWERS_NS, "podmend.io/ignore=true"],
    );
    let webhook = AnswersWebhook::start(suite);
    let pod = pod(
        "answered",
        json!({"containers": [{"name": "c", "image": "busybox"}]}),
    );
    // The API server sees a new configuration through its watch, a moment later.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while webhook.create(&pod, ANSWERS[0].1).1.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the API server did not call the test's webhook within 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut disagreements = Vec::new();
    let mut refused = 0;
    for (name, answer) in ANSWERS {
        let (real, seen) = webhook.create(&pod, *answer);
        let Some((object, uid, body)) = seen else {
            disagreements.push(format!("{name}: the API server did not call the webhook"));
            continue;
        };
        let ours = emulated_answer(&object, &uid, &body);
        let how = match (&real, &ours) {
            (Ok(stored), Ok(patched)) => {
                let (theirs, ours) = (
                    (modelled(stored), &stored["metadata"]["annotations"]),
                    (modelled(patched), &patched["metadata"]["annotations"]),
                );
                (theirs != ours).then(|| {
                    format!("stored differently:\n  API server: {theirs:?}\n  emulation:  {ours:?}")
                })
            }
            (Ok(_), Err(why)) => Some(format!(
                "the API server takes it; the emulation refuses it: {why}"
            )),
            (Err(refusal), Ok(_)) => Some(format!(
                "the API server refuses it; the emulation takes it: {refusal}"
            )),
            (Err(_), Err(_)) => {
                refused += 1;
                None
            }
        };
        if let Some(how) = how {
            disagreements.push(format!("{name}: {how}"));
        }
    }
    println!("({} answers, {refused} refused by both)", ANSWERS.len());
    drop(webhook);
    assert!(
        disagreements.is_empty(),
        "the emulation and kube-apiserver disagree on {} of {} webhook answers:\n{}",
        disagreements.len(),
        ANSWERS.len(),
        disagreements.join("\n")
    );
}
