//! The AdmissionReviews the fast tier sends podmend (`create_review`, `status_update_review`
//! and `review_of` in `tests/common/server.rs`) against the ones kube-apiserver sends: the
//! differential's own webhook (`differential::AnswersWebhook`) records what the real API
//! server sends for each case, and each is compared, field by field for what podmend reads,
//! with what the fast tier's builder makes of the same object.
//!
//! The cases are created in a namespace labelled `podmend.io/ignore`, which the chart's
//! webhook configuration leaves out, so the test's webhook sees the objects as the API server
//! admits them, not as podmend repaired them.
//!
//! The other tests here are fast-tier sentences (of `admission_http.rs`,
//! `admission_lookups.rs` and `dind_rule.rs`) proved again through the real API server and
//! podmend as the chart installs it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Suite;
use crate::common::k8s_rules::Quantity;
use crate::common::server::{create_review, fixture, status_update_review};
use crate::differential::AnswersWebhook;
use crate::install::{
    assert_success, ensure_installed, kubectl, kubectl_json, kubectl_stdin, kubectl_stdin_output,
    with_values,
};
use crate::node_affinity::{pinned_pod, poll, wait_until_podmend_knows};
use crate::pinniped::create_node;
use crate::reinvocation::podmend_decisions;
use crate::virtual_node::write_status_as_node;

const NAMESPACE: &str = "reviews";
const NODE: &str = "reviews-node";
const CONFIGURATION: &str = "podmend-reviews";
/// The Deployment's name; its ReplicaSet's pods are named after it.
const DEPLOYMENT: &str = "pinniped-concierge-kube-cert-agent";

/// What the API server may send that the fast tier's reviews leave out or set otherwise, by
/// path (`*` for any list index), each with why it is not modelled.
const IGNORED: &[(&str, &str)] = &[
    (
        "request.uid",
        "a fresh uid per request; podmend only echoes it",
    ),
    (
        "request.userInfo",
        "the test's identity: compared by shape (which keys, of which type) only",
    ),
    (
        "request.userInfo.extra",
        "the x509 authenticator's note on the test's client certificate (its credential id); \
         a kubelet's review has none and podmend reads no userInfo",
    ),
    (
        "request.options.fieldManager",
        "the client's name for itself (kubectl-create); podmend reads no option",
    ),
    (
        "request.options.fieldValidation",
        "the client's choice (kubectl sends Strict, a controller nothing); podmend reads no option",
    ),
];

/// What the API server adds to the objects of a review (`object`, `oldObject`, and a
/// template's pod under `spec.template`) that the fast tier's model leaves out, by path within
/// the object, each with why. `k8s_rules::apply_pod_defaults` models the resource lists,
/// which podmend's agent rule reads; these are the other defaults of
/// `pkg/apis/core/v1/defaults.go` (`SetDefaults_PodSpec`, `SetDefaults_Container`) and
/// `pkg/apis/apps/v1/defaults.go` (`SetDefaults_Deployment`), and the Priority admission
/// plugin's (`plugin/pkg/admission/priority/admission.go`, `admitPod`), which podmend's rules
/// read as they read their absence.
const NOT_MODELLED: &[(&str, &str)] = &[
    (
        "metadata.managedFields",
        "the API server's record of which client owns which field, with its timestamps",
    ),
    (
        "spec.schedulerName",
        "default-scheduler, which node_affinity assumes when the field is absent",
    ),
    (
        "spec.serviceAccount",
        "the deprecated copy of serviceAccountName, which no rule reads",
    ),
    ("spec.serviceAccountName", "default: no rule reads it"),
    ("spec.dnsPolicy", "ClusterFirst: no rule reads it"),
    ("spec.enableServiceLinks", "true: no rule reads it"),
    (
        "spec.restartPolicy",
        "Always, which virtual-node-phase assumes when the field is absent",
    ),
    ("spec.terminationGracePeriodSeconds", "30: no rule reads it"),
    (
        "spec.priority",
        "0 from the Priority plugin without a priorityClassName: node_affinity reads the class, \
         not the number",
    ),
    ("spec.preemptionPolicy", "PreemptLowerPriority, as above"),
    (
        "spec.containers[*].terminationMessagePath",
        "/dev/termination-log: no rule reads it",
    ),
    (
        "spec.containers[*].terminationMessagePolicy",
        "File: no rule reads it",
    ),
    (
        "spec.containers[*].imagePullPolicy",
        "Always or IfNotPresent by the image's tag: no rule reads it",
    ),
    (
        "spec.initContainers[*].terminationMessagePath",
        "as for containers",
    ),
    (
        "spec.initContainers[*].terminationMessagePolicy",
        "as for containers",
    ),
    (
        "spec.initContainers[*].imagePullPolicy",
        "as for containers",
    ),
    (
        "status.containerStatuses[*].lastState",
        "an empty state the status write did not send: virtual-node-phase reads `state`",
    ),
    (
        "spec.progressDeadlineSeconds",
        "a Deployment's default: podmend reads its template only",
    ),
    ("spec.revisionHistoryLimit", "as above"),
    ("spec.strategy", "as above"),
];

/// Whether the list entry `entry` of the API server's object is one an admission plugin of
/// the API server added (and the model's object lacks): the tolerations of
/// DefaultTolerationSeconds (`plugin/pkg/admission/defaulttolerationseconds/admission.go`,
/// `Admit`: not-ready and unreachable, NoExecute, 300 s) and of PodTolerationRestriction as
/// the suite enables it (`plugin/pkg/admission/podtolerationrestriction/admission.go`,
/// `Admit`: memory-pressure, NoSchedule), and the ServiceAccount plugin's token volume and
/// its mount in each container (`plugin/pkg/admission/serviceaccount/admission.go`,
/// `mountServiceAccountToken`: `kube-api-access-*`). The e2e tests of node-affinity
/// (tolerations) and dind-rm (volumes) run podmend against pods that carry them.
fn added_by_a_plugin(list: &str, entry: &Value) -> bool {
    match list {
        "tolerations" => matches!(
            entry["key"].as_str(),
            Some(
                "node.kubernetes.io/not-ready"
                    | "node.kubernetes.io/unreachable"
                    | "node.kubernetes.io/memory-pressure"
            )
        ),
        "volumes" | "volumeMounts" => entry["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kube-api-access-")),
        _ => false,
    }
}

/// The API server's `object` without what [`added_by_a_plugin`] names, where the model's
/// `ours` lacks it.
fn without_plugin_additions(theirs: &mut Value, ours: &Value) {
    match theirs {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if let (Value::Array(list), false) = (
                    &mut *value,
                    ours.get(key).is_some_and(|o| {
                        o.as_array()
                            .is_some_and(|o| o.iter().any(|e| added_by_a_plugin(key, e)))
                    }),
                ) {
                    list.retain(|entry| !added_by_a_plugin(key, entry));
                }
                without_plugin_additions(value, &ours[key.as_str()]);
            }
        }
        Value::Array(list) => {
            for (index, value) in list.iter_mut().enumerate() {
                without_plugin_additions(value, &ours[index]);
            }
        }
        _ => {}
    }
}

/// Every leaf of `value` under `path`: (path, value), lists indexed. An empty map or list
/// has none: it decodes to the same Go value as an absent one, and the API server's encoding
/// drops it (`resources: {limits: {}}` reaches a webhook as `resources: {}`, `status` of a
/// create as `{}`).
fn leaves(path: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                leaves(&format!("{path}.{key}"), value, out);
            }
        }
        Value::Array(list) => {
            for (index, value) in list.iter().enumerate() {
                leaves(&format!("{path}[{index}]"), value, out);
            }
        }
        _ => {
            out.insert(path.to_string(), value.clone());
        }
    }
}

/// `path` with each list index as `*`.
fn pattern(path: &str) -> String {
    let mut out = String::new();
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push_str("[*]");
            }
            ']' => in_index = false,
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path.starts_with(&format!("{prefix}."))
        || path.starts_with(&format!("{prefix}["))
}

/// Whether `path` is one [`IGNORED`] or, within an object (or its template), [`NOT_MODELLED`]
/// names.
fn ignored(path: &str) -> bool {
    let path = pattern(path);
    if IGNORED.iter().any(|(prefix, _)| under(&path, prefix)) {
        return true;
    }
    let within = ["request.object.", "request.oldObject."]
        .iter()
        .find_map(|object| path.strip_prefix(object));
    within.is_some_and(|within| {
        let within = within.strip_prefix("spec.template.").unwrap_or(within);
        NOT_MODELLED.iter().any(|(prefix, _)| under(within, prefix))
    })
}

/// Two leaves agree: equal, or quantities of a resource list with the same exact value
/// (`0.5` and `500m`), or a `false` or `""` the model sends where the API server's encoding
/// drops it (a plain Go bool or string with `omitempty`, as a volume mount's `readOnly` or an
/// emptyDir's `medium`).
fn same(path: &str, theirs: Option<&Value>, ours: Option<&Value>) -> bool {
    let (theirs, ours) = match (theirs, ours) {
        (None, Some(Value::Bool(false))) => return true,
        (None, Some(Value::String(empty))) if empty.is_empty() => return true,
        (Some(theirs), Some(ours)) => (theirs, ours),
        _ => return false,
    };
    if theirs == ours {
        return true;
    }
    let in_resources = path.contains(".requests.") || path.contains(".limits.");
    in_resources
        && matches!((Quantity::from_json(theirs), Quantity::from_json(ours)),
                    (Ok(a), Ok(b)) if a.nanos() == b.nanos())
}

/// The userInfo's shape: each key with its JSON type, but those [`IGNORED`] names.
fn shape(user: &Value) -> Vec<(String, &'static str)> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(items) if items.iter().all(Value::is_string) => "list of strings",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    };
    user.as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| {
            let path = format!("request.userInfo.{key}");
            !IGNORED.iter().any(|(ignored, _)| *ignored == path)
        })
        .map(|(key, value)| (key.clone(), kind(value)))
        .collect()
}

/// How the fast tier's review `ours` differs from the API server's `theirs`, leaf by leaf,
/// except what [`IGNORED`] and [`NOT_MODELLED`] name and what [`added_by_a_plugin`] allows.
fn differences(theirs: &Value, ours: &Value) -> Vec<String> {
    let (mut real, mut model) = (BTreeMap::new(), BTreeMap::new());
    let mut theirs = theirs.clone();
    for object in ["object", "oldObject"] {
        without_plugin_additions(&mut theirs["request"][object], &ours["request"][object]);
    }
    let theirs = &theirs;
    leaves("", theirs, &mut real);
    leaves("", ours, &mut model);
    let mut found = Vec::new();
    let (their_user, our_user) = (
        shape(&theirs["request"]["userInfo"]),
        shape(&ours["request"]["userInfo"]),
    );
    if their_user != our_user {
        found.push(format!(
            "request.userInfo's shape: API server {their_user:?}, fast tier {our_user:?}"
        ));
    }
    let paths: std::collections::BTreeSet<&String> = real.keys().chain(model.keys()).collect();
    for path in paths {
        let trimmed = path.trim_start_matches('.');
        if ignored(trimmed) {
            continue;
        }
        match (real.get(path), model.get(path)) {
            (a, b) if same(trimmed, a, b) => {}
            (a, b) => found.push(format!(
                "{trimmed}: API server {}, fast tier {}",
                a.map_or("absent".to_string(), Value::to_string),
                b.map_or("absent".to_string(), Value::to_string)
            )),
        }
    }
    found
}

/// What the test's webhook received, kept until a case takes its review.
struct Recorded<'a> {
    webhook: AnswersWebhook<'a>,
    reviews: Vec<Value>,
}

impl Recorded<'_> {
    /// The first review `matches` picks (30 s at most: a controller's create comes a moment
    /// after the write that causes it), taken out of the record.
    fn take(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        poll(Duration::from_secs(30), || {
            self.reviews.extend(self.webhook.take_reviews());
            match self.reviews.iter().position(|r| matches(&r["request"])) {
                Some(index) => Ok(self.reviews.remove(index)),
                None => Err(format!(
                    "the API server sent the test's webhook no review of {what}; it sent:\n{}",
                    self.reviews
                        .iter()
                        .map(|r| format!(
                            "{} {} {}",
                            r["request"]["operation"],
                            r["request"]["resource"],
                            r["request"]["object"]["metadata"]
                        ))
                        .collect::<Vec<_>>()
                        .join("\n")
                )),
            }
        })
    }
}

/// The case's object as `kubectl create -n NAMESPACE` sends it.
fn in_namespace(mut object: Value, name: &str) -> Value {
    let metadata = object["metadata"].as_object_mut().expect("metadata");
    metadata.remove("namespace");
    if !name.is_empty() {
        metadata.insert("name".into(), json!(name));
    }
    object
}

fn created(request: &Value, kind: &str, name: &str) -> bool {
    request["operation"] == "CREATE"
        && request["kind"]["kind"] == kind
        && (request["object"]["metadata"]["name"] == name
            || request["object"]["metadata"]["generateName"]
                .as_str()
                .is_some_and(|g| !name.is_empty() && g.starts_with(name)))
}

/// The pods and the Deployment of the cases, each as the fast tier's tests build it.
fn pinned() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pinned"},
           "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox",
               "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}}]}})
}

fn agent() -> Value {
    in_namespace(
        fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml"),
        "agent",
    )
}

fn dind() -> Value {
    in_namespace(
        fixture("gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml"),
        "",
    )
}

/// The Pinniped agent's Deployment, pinned to [`NODE`].
fn deployment() -> Value {
    let mut deployment = in_namespace(
        fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml"),
        DEPLOYMENT,
    );
    deployment["spec"]["template"]["spec"]["nodeName"] = json!(NODE);
    deployment
}

/// The namespace (left out by podmend's webhooks), the node, the Deployment's service
/// account, and the test's webhook for pods, their status and Deployments there, once the API
/// server calls it.
fn setup(suite: &Suite) -> Recorded<'_> {
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(NAMESPACE))
        .unwrap_or_else(|e| panic!("{e}"));
    kubectl(
        suite,
        &["label", "namespace", NAMESPACE, "podmend.io/ignore=true"],
    );
    kubectl(
        suite,
        &["create", "serviceaccount", DEPLOYMENT, "-n", NAMESPACE],
    );
    create_node(suite, NODE, "");
    let rules = json!([
        {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
         "resources": ["pods", "pods/status"], "scope": "Namespaced"},
        {"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
         "resources": ["deployments"], "scope": "Namespaced"}]);
    let webhook = AnswersWebhook::start_for(suite, CONFIGURATION, NAMESPACE, rules);
    // The API server sees a new configuration through its watch, a moment later.
    let probe = in_namespace(pinned(), "probe");
    poll(Duration::from_secs(30), || {
        dry_run(suite, &probe);
        if webhook.take_reviews().is_empty() {
            Err("the API server did not call the test's webhook".to_string())
        } else {
            Ok(())
        }
    });
    Recorded {
        webhook,
        reviews: Vec::new(),
    }
}

fn create(suite: &Suite, object: &Value) {
    kubectl_stdin(suite, &["create", "-n", NAMESPACE, "-f", "-"], object);
}

fn dry_run(suite: &Suite, object: &Value) {
    kubectl_stdin(
        suite,
        &["create", "--dry-run=server", "-n", NAMESPACE, "-f", "-"],
        object,
    );
}

/// Writes the status of the pod `name` as the kubelet of [`NODE`] (phase `Pending`, its one
/// container running, as `virtual_node_phase.rs` writes it): the pod as stored before, and
/// the pod sent.
fn write_status(suite: &Suite, name: &str) -> (Value, Value) {
    let stored = kubectl_json(suite, &["get", "pod", name, "-n", NAMESPACE, "-o", "json"]);
    let mut sent = stored.clone();
    sent["status"] = json!({"phase": "Pending", "containerStatuses": [{
        "name": "c", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
        "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]});
    write_status_as_node(suite, NAMESPACE, name, NODE, &sent["status"]);
    (stored, sent)
}

/// One case: the API server's review and the fast tier's.
struct Compared {
    case: &'static str,
    real: Value,
    model: Value,
}

/// Every case's two reviews.
fn captured(suite: &Suite) -> Vec<Compared> {
    let mut recorded = setup(suite);
    let mut cases = Vec::new();
    let mut compare = |case, real: Value, model: Value| cases.push(Compared { case, real, model });
    for (case, object, name) in [
        ("a pinned pod", pinned(), "pinned"),
        ("an agent pod", agent(), "agent"),
        ("a DinD pod named by generateName", dind(), "runner-"),
    ] {
        create(suite, &object);
        let real = recorded.take(case, |r| created(r, "Pod", name));
        let model = create_review("uid", &object, NAMESPACE);
        compare(case, real, model);
    }
    let deployment = deployment();
    create(suite, &deployment);
    let real = recorded.take("the Deployment", |r| created(r, "Deployment", DEPLOYMENT));
    compare(
        "a Deployment",
        real,
        create_review("uid", &deployment, NAMESPACE),
    );
    // The ReplicaSet controller's pod: its metadata is the controller's (generateName, the
    // template's labels and pod-template-hash, ownerReferences), its spec the template's.
    let real = recorded.take("the ReplicaSet controller's pod", |r| {
        created(r, "Pod", &format!("{DEPLOYMENT}-"))
    });
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": real["request"]["object"]["metadata"],
                     "spec": deployment["spec"]["template"]["spec"]});
    compare(
        "a pod the ReplicaSet controller creates",
        real,
        create_review("uid", &pod, NAMESPACE),
    );
    let (stored, sent) = write_status(suite, "pinned");
    let real = recorded.take("the node's status write", |r| {
        r["operation"] == "UPDATE"
            && r["subResource"] == "status"
            && r["userInfo"]["username"] == format!("system:node:{NODE}")
    });
    compare(
        "a kubelet's pods/status UPDATE",
        real,
        status_update_review("uid", &sent, &stored, NODE),
    );
    let object = in_namespace(pinned(), "dry-run");
    dry_run(suite, &object);
    let real = recorded.take("the dry run", |r| created(r, "Pod", "dry-run"));
    let mut model = create_review("uid", &object, NAMESPACE);
    // What makes a server-side dry run: the fast tier sends none, so its review of the same
    // create is the model, with these two set as the API server sets them.
    model["request"]["dryRun"] = json!(true);
    model["request"]["options"]["dryRun"] = json!(["All"]);
    compare("a server-side dry-run create", real, model);
    drop(recorded);
    cases
}

pub fn the_reviews_the_fast_tier_builds_are_the_reviews_the_api_server_sends(suite: &Suite) {
    let cases = captured(suite);
    let mut disagreements = Vec::new();
    for case in &cases {
        let found = differences(&case.real, &case.model);
        if !found.is_empty() {
            disagreements.push(format!("{}:\n  {}", case.case, found.join("\n  ")));
        }
    }
    println!("({} reviews compared)", cases.len());
    assert!(
        disagreements.is_empty(),
        "the fast tier's reviews differ from the API server's in {} of {} cases:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
}

/// Where podmend repairs the Deployment's pods of the next test.
const LOGGED_NAMESPACE: &str = "reviews-logged";

/// A ReplicaSet's pod reaches admission with a `generateName` and no name (the ReplicaSet
/// controller sets only `GenerateName`: `pkg/controller/controller_utils.go`,
/// `GetPodFromTemplate`; the API server names it after admission, in `BeforeCreate`,
/// `staging/src/k8s.io/apiserver/pkg/registry/rest/create.go`). podmend's admission log line
/// names the pod by its `generateName`. Without podmend the pod would be stored with
/// `nodeName` and no `podmend.io/mutated`, and podmend's log would name no such pod.
pub fn a_pod_its_controller_creates_is_logged_by_its_generate_name(suite: &Suite) {
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(LOGGED_NAMESPACE))
        .unwrap_or_else(|e| panic!("{e}"));
    let node = "reviews-logged-node";
    create_node(suite, node, "");
    wait_until_podmend_knows(suite, LOGGED_NAMESPACE, node);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "logged"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "logged"}},
                 "template": {"metadata": {"labels": {"app": "logged"}},
                              "spec": {"nodeName": node,
                                       "containers": [{"name": "c", "image": "busybox"}]}}}});
    kubectl_stdin(
        suite,
        &["create", "-n", LOGGED_NAMESPACE, "-f", "-"],
        &deployment,
    );
    let pod = poll(Duration::from_secs(60), || {
        let pods = kubectl_json(
            suite,
            &[
                "get",
                "pods",
                "-n",
                LOGGED_NAMESPACE,
                "-l",
                "app=logged",
                "-o",
                "json",
            ],
        );
        pods["items"]
            .get(0)
            .cloned()
            .ok_or_else(|| format!("the ReplicaSet controller made no pod yet: {pods}"))
    });
    let generate_name = pod["metadata"]["generateName"].as_str().unwrap_or_else(|| {
        panic!(
            "the controller's pod has no generateName: {}",
            pod["metadata"]
        )
    });
    assert!(
        pod["metadata"]["annotations"]["podmend.io/mutated"].is_string(),
        "the stored pod was repaired by podmend: {}",
        pod["metadata"]
    );
    assert_eq!(
        podmend_decisions(suite, LOGGED_NAMESPACE, generate_name, 1),
        ["CREATE patched"],
        "podmend's log names the pod by its generateName {generate_name}"
    );
}

/// The virtual-kubelet e2e pod (`nodeName`, a `nodeSelector` on the virtual node's labels, a
/// toleration of the provider's taint) through podmend, pinned to a node podmend knows and
/// which has no taints: stored repaired, with its `nodeSelector` and its own toleration as
/// written, and no toleration but those the API server's DefaultTolerationSeconds and
/// PodTolerationRestriction plugins add (see `differential::modelled`). Without podmend the pod
/// would be stored with `nodeName` and no `podmend.io/mutated`.
pub fn a_virtual_kubelet_pod_keeps_its_node_selector_and_tolerations(suite: &Suite) {
    const VK_NAMESPACE: &str = "reviews-virtual-kubelet";
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(VK_NAMESPACE))
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = in_namespace(
        fixture("virtual-kubelet-aci-e2e-pod-with-nodename-and-nodeselector.yaml"),
        "",
    );
    let node = pod["spec"]["nodeName"]
        .as_str()
        .expect("the fixture's nodeName");
    create_node(suite, node, "");
    wait_until_podmend_knows(suite, VK_NAMESPACE, node);
    kubectl_stdin(suite, &["create", "-n", VK_NAMESPACE, "-f", "-"], &pod);
    let name = pod["metadata"]["name"]
        .as_str()
        .expect("the fixture's name");
    let stored = kubectl_json(
        suite,
        &["get", "pod", name, "-n", VK_NAMESPACE, "-o", "json"],
    );
    assert!(
        stored["metadata"]["annotations"]["podmend.io/mutated"].is_string(),
        "the stored pod was repaired by podmend: {}",
        stored["metadata"]
    );
    assert_eq!(stored["spec"]["nodeSelector"], pod["spec"]["nodeSelector"]);
    let own = pod["spec"]["tolerations"].as_array().expect("tolerations");
    let stored_tolerations = stored["spec"]["tolerations"]
        .as_array()
        .expect("tolerations");
    for toleration in own {
        assert!(
            stored_tolerations.contains(toleration),
            "the pod's toleration {toleration} is stored as written: {stored_tolerations:?}"
        );
    }
    let others: Vec<&Value> = stored_tolerations
        .iter()
        .filter(|t| !own.contains(t) && !added_by_a_plugin("tolerations", t))
        .collect();
    assert!(
        others.is_empty(),
        "podmend added tolerations to a pod for an untainted node: {others:?}"
    );
}

/// A taint put on a node podmend already knows reaches podmend through its watch of Nodes (a
/// MODIFIED event), and the next pod pinned there is stored tolerating it. Without podmend
/// (or with a podmend that kept the node as first listed) the stored pod would carry no
/// toleration of `dedicated`: the API server's plugins add only the not-ready, unreachable
/// and memory-pressure ones (see `differential::modelled`).
pub fn a_new_taint_seen_on_the_watch_is_used_for_the_next_pod(suite: &Suite) {
    const WATCH_NAMESPACE: &str = "reviews-watch";
    const WATCH_NODE: &str = "reviews-watch-node";
    let wanted = json!({"key": "dedicated", "operator": "Equal", "value": "agents",
                        "effect": "NoSchedule"});
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(WATCH_NAMESPACE))
        .unwrap_or_else(|e| panic!("{e}"));
    create_node(suite, WATCH_NODE, "");
    wait_until_podmend_knows(suite, WATCH_NAMESPACE, WATCH_NODE);
    let tolerates = |pod: &Value| {
        pod["spec"]["tolerations"]
            .as_array()
            .is_some_and(|t| t.contains(&wanted))
    };
    let probe = pinned_pod(WATCH_NAMESPACE, "probe", WATCH_NODE, json!({}));
    let dry_run = || {
        kubectl_json_stdin(
            suite,
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            &probe,
        )
    };
    assert!(
        !tolerates(&dry_run()),
        "before the taint, the pod tolerates no `dedicated`"
    );
    kubectl(
        suite,
        &["taint", "node", WATCH_NODE, "dedicated=agents:NoSchedule"],
    );
    poll(Duration::from_secs(30), || {
        let pod = dry_run();
        if tolerates(&pod) {
            Ok(())
        } else {
            Err(format!(
                "podmend did not tolerate the new taint: {}",
                pod["spec"]["tolerations"]
            ))
        }
    });
    let pod = pinned_pod(WATCH_NAMESPACE, "after-the-taint", WATCH_NODE, json!({}));
    kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    let stored = kubectl_json(
        suite,
        &[
            "get",
            "pod",
            "after-the-taint",
            "-n",
            WATCH_NAMESPACE,
            "-o",
            "json",
        ],
    );
    assert!(
        tolerates(&stored),
        "the stored pod tolerates the new taint: {}",
        stored["spec"]
    );
}

/// `kubectl ARGS -o json` with `object` on standard input, its standard output read as JSON
/// (warnings go to standard error).
fn kubectl_json_stdin(suite: &Suite, args: &[&str], object: &Value) -> Value {
    let output = kubectl_stdin_output(suite, args, object);
    assert_success(&format!("kubectl {}", args.join(" ")), &output);
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "kubectl {}: {e}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// With both rules' `templates: enforce` set in the chart, the Pinniped agent's Deployment is
/// stored with its template repaired: `nodeName` turned into required node affinity on the
/// node's name, the agent's requests zero and its limits kept, its own toleration as written.
/// Without podmend the stored template would keep `nodeName` and requests of 20m/32Mi (and
/// with templates at the chart's default, `warn`, it is stored so: see
/// `a_deployment_pinned_by_node_name_is_warned_about_on_create_and_update_never_mutated_and_its_pods_are_repaired`).
pub fn a_pinniped_agent_deployment_is_repaired_when_templates_are_enforced(suite: &Suite) {
    const TEMPLATES_NAMESPACE: &str = "reviews-templates";
    const TEMPLATES_NODE: &str = "reviews-templates-node";
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(TEMPLATES_NAMESPACE))
        .unwrap_or_else(|e| panic!("{e}"));
    kubectl(
        suite,
        &[
            "create",
            "serviceaccount",
            DEPLOYMENT,
            "-n",
            TEMPLATES_NAMESPACE,
        ],
    );
    create_node(suite, TEMPLATES_NODE, "");
    let mut deployment = deployment();
    deployment["spec"]["template"]["spec"]["nodeName"] = json!(TEMPLATES_NODE);
    let enforce = json!({"rules": {"nodeAffinity": {"templates": "enforce"},
                                   "agentRequests": {"templates": "enforce"}}});
    let stored = with_values(suite, enforce, || {
        wait_until_podmend_knows(suite, TEMPLATES_NAMESPACE, TEMPLATES_NODE);
        kubectl_stdin(
            suite,
            &["create", "-n", TEMPLATES_NAMESPACE, "-f", "-"],
            &deployment,
        );
        kubectl_json(
            suite,
            &[
                "get",
                "deployment",
                DEPLOYMENT,
                "-n",
                TEMPLATES_NAMESPACE,
                "-o",
                "json",
            ],
        )
    });
    let template = &stored["spec"]["template"];
    assert!(template["spec"]["nodeName"].is_null(), "{template}");
    assert_eq!(
        template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [TEMPLATES_NODE]}]}]}),
        "{template}"
    );
    let resources = &template["spec"]["containers"][0]["resources"];
    assert_eq!(resources["requests"], json!({"cpu": "0", "memory": "0"}));
    assert_eq!(resources["limits"], json!({"cpu": "20m", "memory": "32Mi"}));
    assert_eq!(
        template["metadata"]["annotations"]["podmend.io/mutated"],
        "node-affinity,agent-requests"
    );
    assert_eq!(
        template["spec"]["tolerations"],
        json!([{"effect": "NoExecute", "operator": "Exists"}])
    );
}

/// The sysdig and New Relic agents' DaemonSets (the node's Docker socket by `hostPath`)
/// through the API server: stored with their templates as written, and kubectl prints
/// podmend's note that a DaemonSet's pods are node agents; a sysdig agent pod of its own is
/// stored as written, with the note naming the node's socket. Without podmend kubectl would
/// print no note. Each DaemonSet's template selects no node of the suite (a `nodeSelector`
/// added here, which podmend's node-agent decision does not read), so the DaemonSet
/// controller makes no pods on the other tests' nodes.
pub fn monitoring_daemon_sets_keep_the_node_s_socket_and_are_told_why(suite: &Suite) {
    const AGENTS_NAMESPACE: &str = "reviews-node-agents";
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(AGENTS_NAMESPACE))
        .unwrap_or_else(|e| panic!("{e}"));
    for file in [
        "kubernetes-examples-sysdig-agent-daemonset-host-docker-sock.yaml",
        "kubernetes-examples-newrelic-agent-daemonset-host-docker-sock.yaml",
    ] {
        let mut daemon_set = in_namespace(fixture(file), "");
        daemon_set["spec"]["template"]["spec"]["nodeSelector"] =
            json!({"reviews.podmend.io/no-node": "true"});
        let printed = kubectl_stdin(
            suite,
            &["create", "-n", AGENTS_NAMESPACE, "-f", "-"],
            &daemon_set,
        );
        assert!(
            printed.contains(
                "podmend dind-rm: podmend-guard not injected: a DaemonSet's pods are node agents, not CI (nodeAgents: skip)"
            ),
            "{file}: {printed}"
        );
        let name = daemon_set["metadata"]["name"].as_str().expect("a name");
        let stored = kubectl_json(
            suite,
            &[
                "get",
                "daemonset",
                name,
                "-n",
                AGENTS_NAMESPACE,
                "-o",
                "json",
            ],
        );
        let template = &stored["spec"]["template"];
        assert!(
            template["metadata"]["annotations"]["podmend.io/mutated"].is_null(),
            "{file}: {template}"
        );
        assert_keeps_the_node_socket(
            file,
            &daemon_set["spec"]["template"]["spec"],
            &template["spec"],
        );
    }
    let mut pod = crate::common::dind::fixture_pod(
        "kubernetes-examples-sysdig-agent-daemonset-host-docker-sock.yaml",
        "sysdig",
    );
    pod["metadata"]["namespace"] = json!(AGENTS_NAMESPACE);
    pod["spec"]["nodeSelector"] = json!({"reviews.podmend.io/no-node": "true"});
    let printed = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    assert!(
        printed.contains(
            "podmend dind-rm: left sysdig-agent alone: a node agent (the node's Docker socket at /host/var/run/docker.sock; nodeAgents: skip)"
        ),
        "{printed}"
    );
    let stored = kubectl_json(
        suite,
        &["get", "pod", "sysdig", "-n", AGENTS_NAMESPACE, "-o", "json"],
    );
    assert_keeps_the_node_socket("the sysdig pod", &pod["spec"], &stored["spec"]);
}

/// The stored pod spec `kept` has each of `sent`'s volumes at the same host path, each
/// container's mounts as sent, and nothing of podmend's (no guard, no `podmend-*` volume).
/// The API server's defaults (a hostPath's empty `type`) and the ServiceAccount plugin's
/// `kube-api-access-*` volume and mounts may come on top.
fn assert_keeps_the_node_socket(what: &str, sent: &Value, kept: &Value) {
    let named = |list: &Value, name: &Value| -> Value {
        list.as_array()
            .into_iter()
            .flatten()
            .find(|item| item["name"] == *name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    for volume in sent["volumes"].as_array().into_iter().flatten() {
        let stored = named(&kept["volumes"], &volume["name"]);
        assert_eq!(
            stored["hostPath"]["path"], volume["hostPath"]["path"],
            "{what}: volume {}",
            volume["name"]
        );
    }
    for container in sent["containers"].as_array().into_iter().flatten() {
        let stored = named(&kept["containers"], &container["name"]);
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let stored_mount = named(&stored["volumeMounts"], &mount["name"]);
            assert_eq!(
                stored_mount["mountPath"], mount["mountPath"],
                "{what}: {}'s mount of {}",
                container["name"], mount["name"]
            );
        }
    }
    let podmends: Vec<&Value> = ["volumes", "containers", "initContainers"]
        .iter()
        .flat_map(|list| kept[*list].as_array().into_iter().flatten())
        .filter(|item| {
            item["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("podmend"))
        })
        .collect();
    assert!(podmends.is_empty(), "{what}: podmend added {podmends:?}");
}

/// Creates `namespace` (one per test: each runs alone too) for a DinD test below; podmend
/// serves it.
fn dind_namespace(suite: &Suite, namespace: &str) {
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(namespace))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The summerwind runner pod with `podmend.io/dind-policy: rm` is stored with a guard whose
/// policy is `rm`; with `off` it is stored with no guard and kubectl prints no note of
/// dind-rm. Without podmend the first pod would be stored with no guard at all.
pub fn the_policy_annotation_reaches_the_guard_or_turns_the_rule_off(suite: &Suite) {
    const DIND_NAMESPACE: &str = "reviews-dind-policy";
    dind_namespace(suite, DIND_NAMESPACE);
    for (policy, name) in [("rm", "policy-rm"), ("off", "policy-off")] {
        let mut pod = crate::common::dind::fixture_pod(
            "arc-legacy-summerwind-runner-pod-docker-dind-sidecar-reconstructed.yaml",
            name,
        );
        pod["metadata"]["namespace"] = json!(DIND_NAMESPACE);
        pod["metadata"]["annotations"] = json!({"podmend.io/dind-policy": policy});
        let printed = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
        let stored = kubectl_json(
            suite,
            &["get", "pod", name, "-n", DIND_NAMESPACE, "-o", "json"],
        );
        let guards = crate::common::dind::all_containers(&stored["spec"])
            .iter()
            .filter(|c| c["name"] == podmend::dind::GUARD_CONTAINER)
            .count();
        if policy == "off" {
            assert_eq!(guards, 0, "{policy}: {}", stored["spec"]);
            assert!(!printed.contains("podmend dind-rm"), "{policy}: {printed}");
        } else {
            assert_eq!(guards, 1, "{policy}: {}", stored["spec"]);
            let command = crate::common::dind::guard_command(&stored["spec"]);
            assert_eq!(command.policy, podmend::dind::Policy::Rm, "{policy}");
        }
    }
}

/// A Deployment whose template is ARC's DinD runner is warned about (templates are `warn` by
/// default) and stored with its template as written. Without podmend kubectl would print no
/// such warning.
pub fn a_dind_template_is_warned_about_and_stored_as_written(suite: &Suite) {
    const DIND_NAMESPACE: &str = "reviews-dind-template";
    dind_namespace(suite, DIND_NAMESPACE);
    let pod = crate::common::dind::fixture_pod(
        "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        "runner",
    );
    // No replicas: the template's review is the subject, not the pods.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "runner", "namespace": DIND_NAMESPACE},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "runner"}},
            "template": {"metadata": {"labels": {"app": "runner"}}, "spec": pod["spec"]}}});
    let printed = kubectl_stdin(suite, &["create", "-f", "-"], &deployment);
    assert!(
        printed.contains("podmend dind-rm would repair: injected podmend-guard"),
        "{printed}"
    );
    let stored = kubectl_json(
        suite,
        &[
            "get",
            "deployment",
            "runner",
            "-n",
            DIND_NAMESPACE,
            "-o",
            "json",
        ],
    );
    assert_keeps_the_node_socket(
        "the runner's template",
        &pod["spec"],
        &stored["spec"]["template"]["spec"],
    );
}

/// With `dindRm.mode=warn` in the chart, the Jenkins DooD pod (the node's docker.sock) is
/// stored as written and kubectl prints what podmend would move. Without podmend kubectl
/// prints no note; with the chart's default (`enforce`) the socket would move to the guard.
pub fn in_warn_mode_nothing_moves_and_the_warning_says_what_would(suite: &Suite) {
    const WARN_NAMESPACE: &str = "reviews-dind-warn";
    dind_namespace(suite, WARN_NAMESPACE);
    let mut pod = crate::common::dind::fixture_pod(
        "jenkins-k8s-plugin-example-dood-pod-template.yaml",
        "dood",
    );
    pod["metadata"]["namespace"] = json!(WARN_NAMESPACE);
    let printed = with_values(
        suite,
        json!({"rules": {"dindRm": {"mode": "warn"}}}),
        || kubectl_stdin(suite, &["create", "-f", "-"], &pod),
    );
    assert!(
        printed.contains(
            "podmend dind-rm would repair: moved the node's Docker socket from docker to podmend-guard, whose socket is at the same path"
        ),
        "{printed}"
    );
    let stored = kubectl_json(
        suite,
        &["get", "pod", "dood", "-n", WARN_NAMESPACE, "-o", "json"],
    );
    assert_keeps_the_node_socket("the DooD pod", &pod["spec"], &stored["spec"]);
}

/// With `dindRm.sidecarMode=container` in the chart, ARC's DinD runner is stored with the
/// guard appended as a plain container (no `restartPolicy`) and its init containers as
/// written. Without podmend there would be no guard; with the chart's default (`native`) the
/// guard would be the first init container.
pub fn container_mode_appends_the_guard_as_a_plain_container(suite: &Suite) {
    const CONTAINER_NAMESPACE: &str = "reviews-dind-container";
    dind_namespace(suite, CONTAINER_NAMESPACE);
    let mut pod = crate::common::dind::fixture_pod(
        "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        "arc",
    );
    pod["metadata"]["namespace"] = json!(CONTAINER_NAMESPACE);
    with_values(
        suite,
        json!({"rules": {"dindRm": {"sidecarMode": "container"}}}),
        || kubectl_stdin(suite, &["create", "-f", "-"], &pod),
    );
    let stored = kubectl_json(
        suite,
        &["get", "pod", "arc", "-n", CONTAINER_NAMESPACE, "-o", "json"],
    );
    let spec = &stored["spec"];
    let last = spec["containers"]
        .as_array()
        .and_then(|c| c.last())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(last["name"], podmend::dind::GUARD_CONTAINER, "{spec}");
    assert!(last.get("restartPolicy").is_none(), "{last}");
    let names = |spec: &Value| -> Vec<Value> {
        spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].clone())
            .collect()
    };
    assert_eq!(names(spec), names(&pod["spec"]), "{spec}");
}
