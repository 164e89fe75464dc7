//! A cluster with a nodeName storm, for the API stub: the Pinniped kube-cert-agent pod the
//! kubelet rejected (`tests/fixtures/cluster/`), copied into thousands of `Failed` pods of
//! one ReplicaSet, among healthy pods, `Failed` pods of other reasons, and a small storm of
//! another owner below any sensible threshold.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::api_stub::ApiStub;

/// The storm's ReplicaSet (namespace [`NS`]).
pub const RS: &str = "pinniped-concierge-kube-cert-agent-5d8c9f7b46";
pub const NS: &str = "pinniped-concierge";
/// The owner of the small storm ([`small_storm`]).
pub const SMALL_RS: &str = "pinniped-concierge-kube-cert-agent-7f6e5d4c3b";
/// The owner of the evicted pods ([`evicted`]).
pub const EVICTED_RS: &str = "pinniped-concierge-7c9b6d5f4a";

pub fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Seeds `stub` with every workload kind the audit lists: the storm's Deployment and
/// ReplicaSet (the Deployment's template pins `spec.nodeName`), no objects of the other
/// template kinds, and `pods`.
pub fn seed_workloads(stub: &ApiStub, pods: Vec<Value>) {
    stub.set_objects(
        "deployments",
        vec![fixture(
            "cluster/deployment-pinniped-kube-cert-agent-nodename-stalled.json",
        )],
    );
    stub.set_objects(
        "replicasets",
        vec![fixture(
            "cluster/replicaset-pinniped-kube-cert-agent-nodename.json",
        )],
    );
    for resource in [
        "podtemplates",
        "replicationcontrollers",
        "statefulsets",
        "daemonsets",
        "jobs",
        "cronjobs",
    ] {
        stub.set_objects(resource, vec![]);
    }
    stub.set_objects("pods", pods);
}

/// The rejected pod, as the API server lists it.
pub fn rejected_pod() -> Value {
    fixture("cluster/pod-pinniped-kube-cert-agent-rejected-outofcpu.json")
}

/// `2025-06-02T09:21:07Z` plus `seconds`.
pub fn created(seconds: i64) -> String {
    let base: Timestamp = "2025-06-02T09:21:07Z".parse().expect("timestamp");
    (base + SignedDuration::from_secs(seconds)).to_string()
}

/// Pod `i` of a storm of `owner` (namespace [`NS`]), rejected with `reason`, created `i`
/// seconds after the first. Names do not sort by age (a hash suffix, as the ReplicaSet
/// controller's), so the clean-up must order by creationTimestamp.
pub fn storm_pod(owner: &str, owner_uid: &str, reason: &str, i: usize) -> Value {
    let mut pod = rejected_pod();
    let suffix = format!("{:05x}", (i * 7919) % 1_048_576);
    pod["metadata"]["name"] = json!(format!("{owner}-{suffix}"));
    pod["metadata"]["uid"] = json!(format!("9b1f3e7a-2c4d-4e6f-a8b0-{i:012x}"));
    pod["metadata"]["creationTimestamp"] = json!(created(i as i64));
    pod["metadata"]["ownerReferences"][0]["name"] = json!(owner);
    pod["metadata"]["ownerReferences"][0]["uid"] = json!(owner_uid);
    pod["status"]["reason"] = json!(reason);
    pod
}

/// The storm: `n` pods of [`RS`], OutOfcpu.
pub fn storm(n: usize) -> Vec<Value> {
    let uid = rejected_pod()["metadata"]["ownerReferences"][0]["uid"].clone();
    let uid = uid.as_str().expect("owner uid").to_string();
    (0..n).map(|i| storm_pod(RS, &uid, "OutOfcpu", i)).collect()
}

/// `n` OutOfmemory pods of [`SMALL_RS`].
pub fn small_storm(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            storm_pod(
                SMALL_RS,
                "5a6b7c8d-0000-4000-8000-000000000002",
                "OutOfmemory",
                i,
            )
        })
        .collect()
}

/// `n` pods of [`EVICTED_RS`] the kubelet evicted (phase Failed, reason Evicted): they ran,
/// they are no admission storm.
pub fn evicted(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut pod = storm_pod(
                EVICTED_RS,
                "5a6b7c8d-0000-4000-8000-000000000003",
                "Evicted",
                i,
            );
            pod["status"]["message"] = json!("The node was low on resource: memory.");
            pod
        })
        .collect()
}

/// `n` pods of the storm's ReplicaSet whose containers failed (phase Failed, no reason).
pub fn failed_without_reason(n: usize) -> Vec<Value> {
    let mut pods = storm(n);
    for (i, pod) in pods.iter_mut().enumerate() {
        pod["metadata"]["name"] = json!(format!("{RS}-exit{i}"));
        pod["metadata"]["uid"] = json!(format!("7e57a1b2-0000-4000-8000-{i:012x}"));
        pod["status"] = json!({"phase": "Failed", "qosClass": "Guaranteed"});
    }
    pods
}

/// `n` running pods of the storm's ReplicaSet (the one that got through), scheduled.
pub fn healthy(n: usize) -> Vec<Value> {
    let mut pods = storm(n);
    for (i, pod) in pods.iter_mut().enumerate() {
        pod["metadata"]["name"] = json!(format!("{RS}-ok{i}"));
        pod["metadata"]["uid"] = json!(format!("0c0ffee0-0000-4000-8000-{i:012x}"));
        pod["status"] = json!({"phase": "Running", "qosClass": "Guaranteed",
            "startTime": "2025-06-02T09:30:00Z", "hostIP": "192.0.2.10", "podIP": "10.244.0.9"});
    }
    pods
}

/// `namespace/name` of a pod.
pub fn key(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or(""),
        pod["metadata"]["name"].as_str().unwrap_or("")
    )
}
