//! `agent-requests` under a namespace LimitRange, through the real API server's LimitRanger.
//! It has two halves (`plugin/pkg/admission/limitranger/admission.go`):
//! - defaulting (`Admit`: `PodMutateLimitFunc`, `mergePodResourceRequirements`), a mutating
//!   plugin that runs before the mutating webhooks and sets only the requests and limits a
//!   container lacks. When a webhook's patch changed the object, the API server runs every
//!   in-tree mutating plugin again, LimitRanger included
//!   (`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`,
//!   `Dispatch`: `SetShouldReinvoke`; `staging/src/k8s.io/apiserver/pkg/admission/reinvocation.go`,
//!   `reinvoker.Admit`). A request podmend removed would not stay removed: the dispatcher
//!   defaults the patched object (`callAttrMutatingHook`), which copies the container's limit
//!   into a missing request, and this second run would set `defaultRequest`. podmend writes
//!   an explicit request, which both leave as it is;
//! - validation (`Validate`: `PodValidateLimitFunc`: `minConstraint`,
//!   `limitRequestRatioConstraint`), after every mutating webhook: a request below `min`, or
//!   of 0 under `maxLimitRequestRatio`, is refused (403) whatever podmend's answer was.
//!
//! So the agent's requests are the smallest the LimitRange accepts, written explicitly, and its
//! limits stay. Each test says what the API server stores (or refuses) without podmend.

use serde_json::{Value, json};

use crate::Suite;
use crate::install::kubectl_stdin;
use crate::node_affinity::{
    dry_run_until, namespace_and_node, scheduler, stored, wait_until_bound,
};
use crate::placement::pinniped_agent;

/// podmend installed, kube-scheduler running, and a namespace and node named `name` with a
/// LimitRange of these Container `limits`.
fn namespace_with_limit_range(suite: &Suite, name: &str, limits: Value) {
    scheduler(suite);
    namespace_and_node(suite, name, "");
    let range = json!({"apiVersion": "v1", "kind": "LimitRange",
        "metadata": {"name": "agents", "namespace": name},
        "spec": {"limits": [limits]}});
    kubectl_stdin(suite, &["create", "-f", "-"], &range);
}

/// Waits until podmend's LimitRange cache holds the namespace's range: its dry-run answer for
/// `agent` then raises the requests to the range's floor instead of zeroing them, which the
/// LimitRanger would refuse.
fn wait_until_podmend_knows_the_floor(suite: &Suite, agent: &Value) {
    dry_run_until(suite, agent, |text| {
        text.contains("LimitRange forbids 0, requests set to its floor")
    });
}

/// Creates `agent`, waits until kube-scheduler bound it, and returns the stored pod's first
/// container's resources.
fn create_bound_agent(suite: &Suite, agent: &Value) -> Value {
    let namespace = agent["metadata"]["namespace"].as_str().expect("namespace");
    let name = agent["metadata"]["name"].as_str().expect("name");
    kubectl_stdin(suite, &["create", "-f", "-"], agent);
    let bound = wait_until_bound(suite, namespace, name);
    assert_eq!(bound["spec"]["nodeName"], namespace, "bound to its node");
    bound["spec"]["containers"][0]["resources"].clone()
}

pub fn an_agent_without_resources_keeps_the_limit_range_default_limits_and_requests_zero(
    suite: &Suite,
) {
    let namespace = "lr-defaults";
    namespace_with_limit_range(
        suite,
        namespace,
        json!({"type": "Container",
               "default": {"cpu": "100m", "memory": "64Mi"},
               "defaultRequest": {"cpu": "50m", "memory": "16Mi"}}),
    );
    let mut agent = pinniped_agent(namespace, "agent", namespace);
    agent["spec"]["containers"][0]["resources"] = json!({});
    // podmend sees the LimitRanger's defaults (it would zero nothing in a container with
    // neither requests nor limits), and its explicit "0" survives the defaulting of its patch
    // and the LimitRanger's second run. Without podmend: requests 50m/16Mi stored; with the
    // requests removed instead of zeroed: 100m/64Mi, the limits copied back into them.
    let resources = create_bound_agent(suite, &agent);
    assert_eq!(resources["requests"], json!({"cpu": "0", "memory": "0"}));
    assert_eq!(
        resources["limits"],
        json!({"cpu": "100m", "memory": "64Mi"})
    );
    let pod = stored(suite, namespace, "agent");
    let set_by = pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"]
        .as_str()
        .unwrap_or_default();
    assert!(
        set_by.contains("limit for container sleeper"),
        "the limits are the LimitRanger's defaults: {}",
        pod["metadata"]
    );
}

pub fn an_agent_under_a_limit_range_min_requests_that_min_and_keeps_its_limits(suite: &Suite) {
    let namespace = "lr-min";
    namespace_with_limit_range(
        suite,
        namespace,
        json!({"type": "Container", "min": {"cpu": "10m", "memory": "8Mi"}}),
    );
    let agent = pinniped_agent(namespace, "agent", namespace);
    // Without podmend: requests 20m/32Mi stored. Zeroed regardless of the range: refused,
    // "minimum cpu usage per Container is 10m, but request is 0".
    wait_until_podmend_knows_the_floor(suite, &agent);
    let resources = create_bound_agent(suite, &agent);
    assert_eq!(
        resources["requests"],
        json!({"cpu": "10m", "memory": "8388608"}),
        "the LimitRange's min (8Mi in bytes)"
    );
    assert_eq!(resources["limits"], json!({"cpu": "20m", "memory": "32Mi"}));
}

pub fn an_agent_under_a_limit_range_ratio_requests_the_least_the_ratio_allows_and_keeps_its_limits(
    suite: &Suite,
) {
    let namespace = "lr-ratio";
    namespace_with_limit_range(
        suite,
        namespace,
        json!({"type": "Container", "maxLimitRequestRatio": {"cpu": "4", "memory": "2"}}),
    );
    let agent = pinniped_agent(namespace, "agent", namespace);
    // Limits 20m/32Mi at ratios 4 and 2: requests of 5m and 16Mi. Without podmend: requests
    // 20m/32Mi stored. Zeroed regardless of the range: refused, "cpu max limit to request
    // ratio per Container is 4, but no request is specified or request is 0".
    wait_until_podmend_knows_the_floor(suite, &agent);
    let resources = create_bound_agent(suite, &agent);
    assert_eq!(
        resources["requests"],
        json!({"cpu": "5m", "memory": "16777216"}),
        "limit/request at the ratio (16Mi in bytes)"
    );
    assert_eq!(resources["limits"], json!({"cpu": "20m", "memory": "32Mi"}));
}
