//! Seed 002's placement through the real kube-scheduler: a pod pinned with `nodeName` is stored
//! with required node affinity on the node's name instead, so kube-scheduler, not the kubelet,
//! judges whether it fits there. Without podmend the API server stores each of these pods with
//! its `nodeName`, bound at once whatever the node holds: kube-scheduler never sees a pod that
//! has one (`pkg/scheduler/eventhandlers.go`, `assignedPod`), so no `Scheduled` or
//! `FailedScheduling` event is ever written for it.

use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::fixture;
use crate::install::{kubectl, kubectl_json, kubectl_stdin};
use crate::node_affinity::{
    dry_run_until, namespace_and_node, scheduler, stored, wait_for_event, wait_until_bound,
};

/// A pod `name` in `namespace` pinned to `node` with `nodeName`, one container of `resources`.
fn pinned(namespace: &str, name: &str, node: &str, resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "busybox", "resources": resources}]}})
}

/// Pinniped's kube-cert-agent pod (its labels, requests == limits 20m/32Mi) pinned to `node`.
pub fn pinniped_agent(namespace: &str, name: &str, node: &str) -> Value {
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let template = &deployment["spec"]["template"];
    let mut agent = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": template["metadata"]["labels"]},
        "spec": template["spec"]});
    agent["spec"]["nodeName"] = json!(node);
    agent["spec"]["serviceAccountName"] = json!("default");
    agent
}

/// Asserts kube-scheduler reported binding pod `name` to `node`: it binds only pods stored
/// without `nodeName`.
pub fn assert_scheduled_by_kube_scheduler(suite: &Suite, namespace: &str, name: &str, node: &str) {
    let events = wait_for_event(suite, namespace, name, "Scheduled");
    assert!(
        events
            .iter()
            .any(|e| e["reportingComponent"] == "default-scheduler"
                && e["message"].as_str().unwrap_or_default().contains(node)),
        "kube-scheduler reported binding {name} to {node}: {events:?}"
    );
}

/// The message of the first `FailedScheduling` event about pod `name`.
fn failed_scheduling(suite: &Suite, namespace: &str, name: &str) -> String {
    let events = wait_for_event(suite, namespace, name, "FailedScheduling");
    events[0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn a_pinned_pod_that_fits_is_bound_by_kube_scheduler_and_one_that_never_fits_waits_pending_for_cpu(
    suite: &Suite,
) {
    scheduler(suite);
    let (namespace, node) = ("pl-fit", "pl-fit");
    namespace_and_node(suite, namespace, "");
    let fits = pinned(
        namespace,
        "fits",
        node,
        json!({"requests": {"cpu": "500m"}}),
    );
    let never = pinned(
        namespace,
        "never-fits",
        node,
        json!({"requests": {"cpu": "3"}}),
    );
    kubectl_stdin(suite, &["create", "-f", "-"], &fits);
    kubectl_stdin(suite, &["create", "-f", "-"], &never);

    let bound = wait_until_bound(suite, namespace, "fits");
    assert_eq!(bound["spec"]["nodeName"], node);
    assert_scheduled_by_kube_scheduler(suite, namespace, "fits", node);

    // The node's 2 CPUs can never hold 3. NodeResourcesFit's filter says so
    // (pkg/scheduler/framework/plugins/noderesources/fit.go, fitsRequest: "Insufficient cpu");
    // bound by nodeName instead, the kubelet rejects it (OutOfcpu) and its controller makes
    // the next one at once.
    let message = failed_scheduling(suite, namespace, "never-fits");
    assert!(
        message.contains("Insufficient cpu"),
        "kube-scheduler says the node lacks cpu: {message}"
    );
    let pending = stored(suite, namespace, "never-fits");
    assert!(
        pending["spec"]["nodeName"].is_null(),
        "Pending, unbound: {}",
        pending["spec"]
    );
    assert_eq!(pending["status"]["phase"], "Pending");
}

pub fn a_pinned_agent_is_bound_by_kube_scheduler_to_a_node_whose_cpu_other_pods_requests_fill(
    suite: &Suite,
) {
    scheduler(suite);
    let (namespace, node) = ("pl-full", "pl-full");
    namespace_and_node(suite, namespace, "");
    // Two pods kube-scheduler places by nodeSelector (no nodeName, no agent labels: podmend
    // leaves them as they are), one CPU each: the node's allocatable CPU is all requested.
    for name in ["filler-1", "filler-2"] {
        let filler = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "1"}}}]}});
        kubectl_stdin(suite, &["create", "-f", "-"], &filler);
        let bound = wait_until_bound(suite, namespace, name);
        assert_eq!(bound["spec"]["nodeName"], node);
    }
    let allocatable = kubectl_json(suite, &["get", "node", node, "-o", "json"]);
    assert_eq!(allocatable["status"]["allocatable"]["cpu"], "2");

    // Without podmend: stored with nodeName and its 20m request, which the kubelet rejects
    // (OutOfcpu). With node-affinity alone: Pending, "Insufficient cpu". A request of 0 fits
    // any node (fitsRequest checks nothing for a pod that requests nothing).
    let agent = pinniped_agent(namespace, "kube-cert-agent", node);
    kubectl_stdin(suite, &["create", "-f", "-"], &agent);
    let bound = wait_until_bound(suite, namespace, "kube-cert-agent");
    assert_eq!(bound["spec"]["nodeName"], node);
    let resources = &bound["spec"]["containers"][0]["resources"];
    assert_eq!(resources["requests"], json!({"cpu": "0", "memory": "0"}));
    assert_eq!(resources["limits"], json!({"cpu": "20m", "memory": "32Mi"}));
    assert_scheduled_by_kube_scheduler(suite, namespace, "kube-cert-agent", node);
}

pub fn a_pinned_pod_on_a_node_with_a_user_no_schedule_taint_is_tolerated_and_bound_by_kube_scheduler(
    suite: &Suite,
) {
    scheduler(suite);
    let (namespace, node) = ("pl-tainted", "pl-tainted");
    namespace_and_node(
        suite,
        namespace,
        "dedicated=ci:NoSchedule,spot:PreferNoSchedule",
    );
    // Without podmend: stored with nodeName and no toleration. Rewritten without the
    // toleration, TaintToleration's filter keeps it Pending forever
    // (pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go, Filter: NoSchedule
    // and NoExecute taints). A PreferNoSchedule taint only scores, so it needs none.
    let pod = pinned(namespace, "p", node, json!({}));
    let printed = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    assert!(
        printed.contains("tolerations added") && printed.contains("dedicated"),
        "kubectl prints what podmend added: {printed}"
    );
    let bound = wait_until_bound(suite, namespace, "p");
    assert_eq!(bound["spec"]["nodeName"], node);
    let tolerations = bound["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        tolerations.contains(
            &json!({"key": "dedicated", "operator": "Equal", "value": "ci",
                                     "effect": "NoSchedule"})
        ),
        "{tolerations:?}"
    );
    assert!(
        tolerations.iter().all(|t| t["key"] != "spot"),
        "{tolerations:?}"
    );
    assert_scheduled_by_kube_scheduler(suite, namespace, "p", node);
}

pub fn a_pinned_pod_on_a_cordoned_node_is_left_pending_by_kube_scheduler(suite: &Suite) {
    scheduler(suite);
    let (namespace, node) = ("pl-cordoned", "pl-cordoned");
    namespace_and_node(suite, namespace, "");
    kubectl(suite, &["cordon", node]);
    // In Kubernetes 1.37 the node-lifecycle controller turns spec.unschedulable into the
    // node.kubernetes.io/unschedulable:NoSchedule taint
    // (pkg/controller/nodelifecycle/node_lifecycle_controller.go, doNoScheduleTaintingPass);
    // this suite's kube-controller-manager runs without that controller (test Nodes have no
    // kubelet), so the taint is added here as that controller would add it, together with a
    // user taint whose toleration tells when podmend's Node cache holds this update.
    kubectl(
        suite,
        &[
            "taint",
            "node",
            node,
            "node.kubernetes.io/unschedulable:NoSchedule",
            "dedicated=ci:NoSchedule",
        ],
    );
    let pod = pinned(namespace, "p", node, json!({}));
    dry_run_until(suite, &pod, |text| {
        text.contains("tolerations added") && text.contains("dedicated")
    });
    // kube-scheduler's NodeUnschedulable filter reads spec.unschedulable itself
    // (pkg/scheduler/framework/plugins/nodeunschedulable/node_unschedulable.go, Filter: "node(s)
    // were unschedulable"), taint or not. A pod it places there by nodeSelector waiting Pending
    // shows that its cache holds the cordon before the pinned pod comes.
    let canary = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "canary", "namespace": namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                 "containers": [{"name": "c", "image": "busybox"}]}});
    kubectl_stdin(suite, &["create", "-f", "-"], &canary);
    let message = failed_scheduling(suite, namespace, "canary");
    assert!(message.contains("unschedulable"), "{message}");

    // Without podmend: stored with nodeName, bound to the cordoned node at once (the kubelet
    // never checks spec.unschedulable). podmend never tolerates Kubernetes' own taints, so the
    // pod waits Pending until the node is uncordoned.
    let printed = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    let tolerated: Vec<&str> = printed
        .lines()
        .filter(|line| line.contains("tolerations added"))
        .collect();
    assert!(
        !tolerated.is_empty() && tolerated.iter().all(|l| !l.contains("unschedulable")),
        "the cordon is not tolerated: {printed}"
    );
    assert!(
        printed.contains(&format!(
            "the pod waits Pending while node {node} has node.kubernetes.io/unschedulable (cordoned)"
        )),
        "kubectl tells the user what the pod waits for: {printed}"
    );
    let stored_pod = stored(suite, namespace, "p");
    let tolerations = stored_pod["spec"]["tolerations"].to_string();
    assert!(
        tolerations.contains("dedicated") && !tolerations.contains("unschedulable"),
        "{tolerations}"
    );
    let message = failed_scheduling(suite, namespace, "p");
    assert!(
        message.contains("unschedulable"),
        "kube-scheduler says the node is cordoned: {message}"
    );
    assert!(
        stored(suite, namespace, "p")["spec"]["nodeName"].is_null(),
        "Pending, unbound"
    );
}
