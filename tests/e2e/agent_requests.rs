//! Issue 51's agent-requests items through the real API server: each pod is created with the
//! real `kubectl` (which prints the webhook's warnings on stderr as `Warning: ...`), the API
//! server calls podmend, applies its patch, defaults and validates again, and the stored pod is
//! read back. The API server computes `status.qosClass` when it stores a pod
//! (`pkg/registry/core/pod/strategy.go`, `PrepareForCreate`), so the QoS class asserted here
//! is the API server's own, not podmend's idea of it.
//!
//! What podmend did under its former defaults, for each test to differ from: the Jenkins preset was on by
//! default and every selected agent was repaired, pinned or not; a request without a limit was
//! copied into the limit, also under a pod-level limit; Guaranteed pods were zeroed whatever
//! their CPUs.

use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::fixture;
use crate::install::{ensure_installed, kubectl_json, kubectl_stdin, with_config};
use crate::pinniped::create_node;

/// The node the pinned pods name; created once, before the first pod, so that podmend's Node
/// cache knows it (node-affinity turns `nodeName` into required node affinity only then).
const NODE: &str = "agent-node";

/// Creates `namespace` and, once, [`NODE`].
fn prepare(suite: &Suite, namespace: &str) {
    ensure_installed(suite);
    let nodes = kubectl_json(suite, &["get", "nodes", "-o", "json"]);
    let exists = nodes["items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|n| n["metadata"]["name"] == NODE));
    if !exists {
        create_node(suite, NODE, "");
    }
    suite
        .block_on(suite.plane.create_namespace(namespace))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Creates `pod` in `namespace` with `kubectl create -f -`: what kubectl printed (warnings
/// included) and the pod the API server stored.
fn create(suite: &Suite, namespace: &str, pod: &Value) -> (String, Value) {
    let printed = kubectl_stdin(suite, &["create", "-n", namespace, "-f", "-"], pod);
    assert!(printed.contains("created"), "kubectl create: {printed}");
    let name = pod["metadata"]["name"].as_str().expect("a named pod");
    let stored = kubectl_json(suite, &["get", "pod", name, "-n", namespace, "-o", "json"]);
    (printed, stored)
}

/// The agent-requests warnings kubectl printed.
fn agent_warnings(printed: &str) -> Vec<&str> {
    printed
        .lines()
        .filter(|line| line.starts_with("Warning: podmend agent-requests"))
        .collect()
}

/// The rules podmend recorded on the stored pod (`podmend.io/mutated`), empty for none.
fn mutated(stored: &Value) -> &str {
    stored["metadata"]["annotations"]["podmend.io/mutated"]
        .as_str()
        .unwrap_or_default()
}

fn resources<'a>(stored: &'a Value, container: &str) -> &'a Value {
    let containers = stored["spec"]["containers"].as_array().expect("containers");
    &containers
        .iter()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("no container {container}: {stored}"))["resources"]
}

/// A pod with one container `app` of these resources, these labels and annotations.
fn pod(name: &str, labels: Value, annotations: Value, resources: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "busybox", "resources": resources}]}
    })
}

/// The config with the Jenkins preset turned on beside Pinniped's.
fn jenkins_preset_on(config: &mut Value) {
    config["rules"]["agent-requests"]["presets"] =
        json!(["pinniped-kube-cert-agent", "jenkins-agent"]);
}

// Item 8: a limit invented from the request.

pub fn the_jenkins_jnlp_pod_pinned_to_a_node_keeps_its_request_and_gets_no_invented_limit(
    suite: &Suite,
) {
    // Before: jnlp stored with limits 100m/256Mi (copied from its requests: throttled at its
    // request, OOM-killed above it) and requests 0. Without podmend: no warning. Now: its
    // requests and no limit, and the warning says zeroing them safely needs a limit.
    prepare(suite, "agent-jnlp");
    let mut agent = fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml");
    agent["metadata"]["name"] = json!("jnlp-pinned");
    agent["spec"]["nodeName"] = json!(NODE);
    let (printed, stored) = with_config(suite, jenkins_preset_on, || {
        create(suite, "agent-jnlp", &agent)
    });
    let jnlp = resources(&stored, "jnlp");
    assert_eq!(
        jnlp["requests"],
        json!({"cpu": "100m", "memory": "256Mi"}),
        "{stored}"
    );
    assert!(
        jnlp["limits"].as_object().is_none_or(|l| l.is_empty()),
        "no limit invented: {jnlp}"
    );
    assert!(!mutated(&stored).contains("agent-requests"), "{stored}");
    assert_eq!(
        agent_warnings(&printed),
        [
            "Warning: podmend agent-requests: agent pod: requests kept, no limit bounds them: \
          cpu/memory (jnlp); zeroing them safely needs a limit"
        ],
        "{printed}"
    );
    assert_eq!(stored["status"]["qosClass"], "Burstable");
}

pub fn a_pod_level_limit_is_never_narrowed_by_container_limits_invented_from_requests(
    suite: &Suite,
) {
    // Before (limitFromRequest on, as here): the container got limits of 200m/128Mi, its
    // requests, under a pod-level limit of 1 CPU/1Gi that let it use that much. Without podmend:
    // requests 200m/128Mi stored. Now: requests 0 under the pod-level limit, which bounds the
    // container, and no container limit.
    prepare(suite, "agent-pod-level");
    let mut agent = pod(
        "pod-level-limit",
        json!({}),
        json!({"podmend.io/agent": "true"}),
        json!({"requests": {"cpu": "200m", "memory": "128Mi"}}),
    );
    agent["spec"]["nodeName"] = json!(NODE);
    agent["spec"]["resources"] = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
    let limit_from_request = |config: &mut Value| {
        config["rules"]["agent-requests"]["limitFromRequest"] = json!(true);
    };
    let (printed, stored) = with_config(suite, limit_from_request, || {
        create(suite, "agent-pod-level", &agent)
    });
    let app = resources(&stored, "app");
    assert_eq!(
        app["requests"],
        json!({"cpu": "0", "memory": "0"}),
        "{printed}"
    );
    assert!(
        app["limits"].as_object().is_none_or(|l| l.is_empty()),
        "no container limit invented: {app}"
    );
    assert_eq!(
        stored["spec"]["resources"]["limits"],
        json!({"cpu": "1", "memory": "1Gi"})
    );
    assert!(mutated(&stored).contains("agent-requests"), "{stored}");
    assert!(
        agent_warnings(&printed)
            .iter()
            .all(|w| !w.contains("copied")),
        "{printed}"
    );
}

// Item 9: which pods are agents by default.

pub fn a_jenkins_build_pod_not_pinned_to_a_node_is_not_touched_by_default(suite: &Suite) {
    // Before (the Jenkins preset on by default, pinned or not): requests 0 stored, and
    // podmend.io/mutated: agent-requests. Now, with the chart's config: as created, no warning.
    prepare(suite, "agent-builds");
    let build = pod(
        "build-unpinned",
        json!({"jenkins/label": "maven-build"}),
        json!({}),
        json!({"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}),
    );
    let (printed, stored) = create(suite, "agent-builds", &build);
    assert_eq!(
        resources(&stored, "app")["requests"],
        json!({"cpu": "1", "memory": "2Gi"})
    );
    assert_eq!(mutated(&stored), "", "{stored}");
    assert!(agent_warnings(&printed).is_empty(), "{printed}");
}

pub fn with_the_jenkins_preset_on_an_unpinned_build_pod_is_left_alone_and_kubectl_says_why(
    suite: &Suite,
) {
    // Before: requests 0. Without podmend: no warning. Now: requests kept, and the warning
    // says the pod is not pinned.
    prepare(suite, "agent-builds-preset");
    let build = pod(
        "build-unpinned",
        json!({"jenkins/label": "maven-build"}),
        json!({}),
        json!({"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}),
    );
    let (printed, stored) = with_config(suite, jenkins_preset_on, || {
        create(suite, "agent-builds-preset", &build)
    });
    assert_eq!(
        resources(&stored, "app")["requests"],
        json!({"cpu": "1", "memory": "2Gi"})
    );
    assert_eq!(mutated(&stored), "", "{stored}");
    assert_eq!(
        agent_warnings(&printed),
        [
            "Warning: podmend agent-requests: agent pod not pinned to one node: requests kept \
          (onlyPinned); podmend.io/agent: \"true\" opts it in"
        ],
        "{printed}"
    );
}

pub fn an_agent_pinned_by_node_name_or_by_node_affinity_on_its_name_is_repaired(suite: &Suite) {
    // node-affinity runs first and turns nodeName into required node affinity; both forms
    // count as pinned. Without podmend (or had pinning been read from nodeName alone, which
    // the pod no longer has when agent-requests runs): requests 200m/64Mi stored. An agent
    // the scheduler may place on two nodes is left alone, which before it was not.
    prepare(suite, "agent-pinned");
    let pinniped = json!({"kube-cert-agent.pinniped.dev": "v3"});
    let burstable = json!({"requests": {"cpu": "200m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"}});
    let name_in = |nodes: Value| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": nodes}]}]}}})
    };
    let mut by_node_name = pod(
        "by-node-name",
        pinniped.clone(),
        json!({}),
        burstable.clone(),
    );
    by_node_name["spec"]["nodeName"] = json!(NODE);
    let mut by_affinity = pod(
        "by-affinity",
        pinniped.clone(),
        json!({}),
        burstable.clone(),
    );
    by_affinity["spec"]["affinity"] = name_in(json!([NODE]));
    let mut two_nodes = pod("two-nodes", pinniped, json!({}), burstable);
    two_nodes["spec"]["affinity"] = json!({"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["agent-other-node"]}]}
    ]}}});
    for agent in [&by_node_name, &by_affinity] {
        let (printed, stored) = create(suite, "agent-pinned", agent);
        assert_eq!(
            resources(&stored, "app")["requests"],
            json!({"cpu": "0", "memory": "0"}),
            "{printed}"
        );
        assert_eq!(
            resources(&stored, "app")["limits"],
            json!({"cpu": "500m", "memory": "128Mi"})
        );
        assert!(mutated(&stored).contains("agent-requests"), "{stored}");
    }
    let (printed, stored) = create(suite, "agent-pinned", &two_nodes);
    assert_eq!(
        resources(&stored, "app")["requests"],
        json!({"cpu": "200m", "memory": "64Mi"})
    );
    assert!(
        agent_warnings(&printed)
            .iter()
            .any(|w| w.contains("not pinned to one node")),
        "{printed}"
    );
}

pub fn the_agent_annotation_opts_in_a_pod_that_is_not_pinned(suite: &Suite) {
    // An explicit opt-in: onlyPinned does not restrict it. Without podmend: requests
    // 200m/64Mi stored, no annotation.
    prepare(suite, "agent-annotated");
    let agent = pod(
        "annotated",
        json!({}),
        json!({"podmend.io/agent": "true"}),
        json!({"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}),
    );
    let (printed, stored) = create(suite, "agent-annotated", &agent);
    assert_eq!(
        resources(&stored, "app")["requests"],
        json!({"cpu": "0", "memory": "0"}),
        "{printed}"
    );
    assert_eq!(mutated(&stored), "agent-requests");
}

// Item 10: QoS and eviction, said truthfully.

pub fn a_guaranteed_agent_with_whole_cpus_is_left_alone_and_kubectl_prints_why(suite: &Suite) {
    // Under the static CPU manager policy its container has exclusive cores
    // (pkg/kubelet/cm/cpumanager/policy_static.go, guaranteedCPUs: Guaranteed QoS and a
    // whole-number cpu request). Before: requests 0, qosClass Burstable, the cores gone.
    // Without podmend: as here, but no warning.
    prepare(suite, "agent-exclusive");
    let mut agent = pod(
        "whole-cpus",
        json!({"kube-cert-agent.pinniped.dev": "v3"}),
        json!({}),
        json!({"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}),
    );
    agent["spec"]["nodeName"] = json!(NODE);
    let (printed, stored) = create(suite, "agent-exclusive", &agent);
    assert_eq!(
        resources(&stored, "app")["requests"],
        json!({"cpu": "1", "memory": "64Mi"})
    );
    assert_eq!(stored["status"]["qosClass"], "Guaranteed");
    assert!(!mutated(&stored).contains("agent-requests"), "{stored}");
    assert_eq!(
        agent_warnings(&printed),
        [
            "Warning: podmend agent-requests: agent pod left alone: Guaranteed with whole CPUs \
          (exclusive cores under the static CPU manager); see zeroExclusiveCpus"
        ],
        "{printed}"
    );
}

pub fn with_zero_exclusive_cpus_a_guaranteed_agent_with_whole_cpus_is_zeroed_and_told_what_it_loses(
    suite: &Suite,
) {
    // Without podmend: requests 1/64Mi and qosClass Guaranteed. Now: the API server stores it
    // Burstable, and the warning says what that costs.
    prepare(suite, "agent-exclusive-zeroed");
    let mut agent = pod(
        "whole-cpus",
        json!({"kube-cert-agent.pinniped.dev": "v3"}),
        json!({}),
        json!({"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}),
    );
    agent["spec"]["nodeName"] = json!(NODE);
    let zero_them = |config: &mut Value| {
        config["rules"]["agent-requests"]["zeroExclusiveCpus"] = json!(true);
    };
    let (printed, stored) = with_config(suite, zero_them, || {
        create(suite, "agent-exclusive-zeroed", &agent)
    });
    assert_eq!(
        resources(&stored, "app")["requests"],
        json!({"cpu": "0", "memory": "0"})
    );
    assert_eq!(stored["status"]["qosClass"], "Burstable");
    let warnings = agent_warnings(&printed);
    for expected in [
        "Warning: podmend agent-requests: agent pod: QoS Guaranteed -> Burstable: OOM score adj \
         999, among the first evicted under memory pressure",
        "Warning: podmend agent-requests: agent pod: its containers lose their exclusive CPUs \
         (static CPU manager policy)",
    ] {
        assert!(warnings.contains(&expected), "{printed}");
    }
}

pub fn the_pinniped_agent_becomes_burstable_and_kubectl_says_what_that_costs(suite: &Suite) {
    // Pinniped's kube-cert-agent (requests == limits 20m/32Mi: Guaranteed, not whole CPUs) is
    // still repaired by default. A memory request of 0 gives an OOM score adjustment of 999
    // (pkg/kubelet/qos/policy.go, GetContainerOOMScoreAdjust: 1000 - 1000*0/capacity, then one
    // below BestEffort's 1000) and memory use always above the request, the first group
    // rankMemoryPressure (pkg/kubelet/eviction/helpers.go) evicts, by priority then usage;
    // before, the README promised it was "not first to be evicted". Without podmend: requests
    // 20m/32Mi, qosClass Guaranteed, no warning.
    prepare(suite, "agent-qos");
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let template = &deployment["spec"]["template"];
    let mut agent = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kube-cert-agent", "labels": template["metadata"]["labels"]},
        "spec": template["spec"]});
    agent["spec"]["nodeName"] = json!(NODE);
    agent["spec"]["serviceAccountName"] = json!("default");
    let (printed, stored) = create(suite, "agent-qos", &agent);
    let container = &stored["spec"]["containers"][0]["resources"];
    assert_eq!(container["requests"], json!({"cpu": "0", "memory": "0"}));
    assert_eq!(container["limits"], json!({"cpu": "20m", "memory": "32Mi"}));
    assert_eq!(stored["status"]["qosClass"], "Burstable");
    assert!(
        agent_warnings(&printed).contains(
            &"Warning: podmend agent-requests: agent pod: QoS Guaranteed -> Burstable: OOM score \
              adj 999, among the first evicted under memory pressure"
        ),
        "{printed}"
    );
}
