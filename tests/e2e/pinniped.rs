//! Seed 002 end to end: Pinniped's kube-cert-agent Deployment (`nodeName`, requests set, the
//! Pinniped labels) created with the real `kubectl`; kube-controller-manager makes its
//! ReplicaSet and pod; the API server calls podmend; the pod read back carries the repair and
//! kube-scheduler binds it to the node.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::fixture;
use crate::install::{ensure_installed, kubectl, kubectl_json, kubectl_stdin};

const NODE: &str = "pinniped-node";
const NAMESPACE: &str = "pinniped-concierge";

pub fn the_pinniped_agent_is_repaired_by_the_api_servers_call_and_bound_to_its_node_by_the_scheduler(
    suite: &Suite,
) {
    ensure_installed(suite);
    // Before the pod exists, so podmend's Node cache holds the node and its (no) taints.
    create_node(suite, NODE, "");
    suite
        .block_on(async {
            suite.plane.ensure_scheduler().await?;
            suite.plane.create_namespace(NAMESPACE).await
        })
        .unwrap_or_else(|e| panic!("{e}"));
    kubectl(
        suite,
        &[
            "create",
            "serviceaccount",
            "pinniped-concierge-kube-cert-agent",
            "-n",
            NAMESPACE,
        ],
    );

    let mut deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    deployment["spec"]["template"]["spec"]["nodeName"] = json!(NODE);
    let created = kubectl_stdin(suite, &["create", "-f", "-"], &deployment);
    assert!(created.contains("created"), "kubectl create: {created}");

    let pod = wait_for_bound_pod(suite, "kube-cert-agent.pinniped.dev=v3");
    let name = pod["metadata"]["name"].as_str().expect("name").to_string();
    let mutated = pod["metadata"]["annotations"]["podmend.io/mutated"]
        .as_str()
        .unwrap_or_default();
    assert!(
        mutated.contains("node-affinity") && mutated.contains("agent-requests"),
        "the stored pod carries podmend.io/mutated naming both repairs: {}",
        pod["metadata"]
    );
    let spec = &pod["spec"];
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}
        ]}]}),
        "the placement became required node affinity on metadata.name"
    );
    let container = &spec["containers"][0];
    assert_eq!(
        container["resources"]["requests"],
        json!({"cpu": "0", "memory": "0"})
    );
    assert_eq!(
        container["resources"]["limits"],
        json!({"cpu": "20m", "memory": "32Mi"})
    );

    // nodeName was gone when the pod was stored: kube-scheduler bound it, which it does only
    // for pods without one (pkg/scheduler/eventhandlers.go, assignedPod), and said so.
    assert_eq!(spec["nodeName"], NODE, "bound to its node");
    let events = kubectl_json(
        suite,
        &[
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            &format!("involvedObject.name={name},reason=Scheduled"),
            "-o",
            "json",
        ],
    );
    let scheduled: Vec<&Value> = events["items"].as_array().into_iter().flatten().collect();
    assert!(
        scheduled
            .iter()
            .any(|e| e["reportingComponent"] == "default-scheduler"
                && e["message"].as_str().unwrap_or_default().contains(NODE)),
        "kube-scheduler reported binding {name} to {NODE}: {events}"
    );
}

/// Creates a Ready test Node with 2 CPUs and 4 GiB allocatable; `taints` is empty or
/// `key[=value]:Effect` taints separated by commas.
pub fn create_node(suite: &Suite, name: &str, taints: &str) {
    let taints: Vec<Value> = taints
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|taint| {
            let (key_value, effect) = taint.split_once(':').unwrap_or((taint, "NoSchedule"));
            let (key, value) = key_value.split_once('=').unwrap_or((key_value, ""));
            json!({"key": key, "value": value, "effect": effect})
        })
        .collect();
    suite
        .block_on(suite.plane.create_node(name, "2", "4Gi", json!(taints)))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The pod matching `selector` in [`NAMESPACE`] once it is bound to a node (60 s at most).
fn wait_for_bound_pod(suite: &Suite, selector: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pods = kubectl_json(
            suite,
            &["get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json"],
        );
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        if let Some(pod) = items.iter().find(|p| p["spec"]["nodeName"].is_string()) {
            return pod.clone();
        }
        if Instant::now() >= deadline {
            let replica_sets = kubectl(
                suite,
                &[
                    "get",
                    "replicasets,pods,events",
                    "-n",
                    NAMESPACE,
                    "-o",
                    "wide",
                ],
            );
            panic!(
                "no pod of {selector} was bound within 60 s: {pods}\n{replica_sets}\n{}",
                suite.plane.report()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
