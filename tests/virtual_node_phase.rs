//! The opt-in `virtual-node-phase` rule end to end: the real `podmend serve` binary, its Node
//! cache filled from the local HTTPS API stub, `UPDATE pods/status` reviews over real TLS as
//! the API server sends them, the patch applied and then the status strategy and validation
//! the API server runs after the webhooks (§6.1), and the official schema check.
//!
//! The pod is the reconstructed JENKINS-68649 object: on the AKS ACI virtual node its one
//! container runs while the provider still reports phase `Pending`.

mod common;

use common::api_stub::ApiStub;
use common::k8s_rules;
use common::schema;
use common::server::{Options, Server, fixture, mutate_h2 as send, status_update_review};
use serde_json::{Value, json};

const VIRTUAL_NODE: &str = "virtual-node-aci-linux";

fn cluster_fixture(name: &str) -> Value {
    fixture(&format!("cluster/{name}"))
}

async fn start_stub() -> ApiStub {
    ApiStub::start(
        vec![
            cluster_fixture("node-virtual-kubelet-aci.json"),
            cluster_fixture("node-kubeadm-control-plane.json"),
        ],
        vec![],
    )
    .await
}

/// `podmend serve` with look-ups through `stub` and `config`.
async fn start_server(stub: &ApiStub, config: Option<&str>) -> Server {
    let kubeconfig = stub.kubeconfig_path().to_path_buf();
    let config = config.map(str::to_string);
    // The server is a child process; start it off the runtime's threads so the stub keeps
    // answering while we wait for readiness.
    Server::start_async(Options {
        config,
        kubeconfig: Some(kubeconfig),
        wait_ready: true,
        ..Options::default()
    })
    .await
}

const ENFORCE: &str = "rules:\n  virtual-node-phase:\n    mode: enforce\n";

/// The JENKINS-68649 pod as the provider writes it: every container running, phase Pending.
fn jenkins_pod() -> Value {
    let mut pod = fixture(
        "virtual-kubelet-aci-pod-pending-with-running-containers-JENKINS-68649-reconstructed.yaml",
    );
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod["metadata"]["uid"] = json!("5d0c3f3e-6a55-4f0e-9f7a-3b1c2f0c6849");
    pod["metadata"]["resourceVersion"] = json!("4711");
    pod["metadata"]["creationTimestamp"] = json!("2022-05-30T10:00:00Z");
    pod["status"]["qosClass"] = json!("BestEffort");
    pod
}

/// The same pod as stored before this write: its container still being created.
fn stored_before(pod: &Value) -> Value {
    let mut old = pod.clone();
    if let Some(status) = old["status"]["containerStatuses"]
        .as_array_mut()
        .and_then(|statuses| statuses.first_mut())
    {
        status["ready"] = json!(false);
        status["started"] = json!(false);
        status["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
    }
    old
}

/// An `UPDATE pods/status` review of `pod` (stored as `old`) by the virtual node's kubelet.
fn status_review(uid: &str, pod: &Value, old: &Value) -> Value {
    status_update_review(uid, pod, old, VIRTUAL_NODE)
}

/// The API server's path after the webhooks: apply the patch, run the status strategy and
/// validation against the stored Pod, and check the stored result against the schema.
fn store(old: &Value, object: &Value, patch: &[u8]) -> Value {
    let patched = k8s_rules::apply_patch_as_api_server(object, patch)
        .unwrap_or_else(|e| panic!("the API server cannot apply the patch: {e}"));
    let stored = k8s_rules::pod_status_update_as_api_server(old, &patched)
        .unwrap_or_else(|errors| panic!("the status update is refused: {errors:?}"));
    schema::validate_with_schema(std::slice::from_ref(&stored), true)
        .unwrap_or_else(|e| panic!("the stored Pod fails the schema: {e}"));
    stored
}

fn rule_actions(server: &Server, action: &str) -> String {
    let metrics = server.metrics_get("/metrics").expect("metrics").1;
    let needle =
        format!("podmend_rule_actions_total{{rule=\"virtual-node-phase\",action=\"{action}\"}}");
    metrics
        .lines()
        .find(|line| line.starts_with(&needle))
        .map_or_else(
            || "absent".to_string(),
            |line| line[needle.len()..].trim().to_string(),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jenkins_68649_pod_on_the_virtual_node_is_stored_running_and_nothing_else_changes() {
    let stub = start_stub().await;
    let server = start_server(&stub, Some(ENFORCE)).await;
    let pod = jenkins_pod();
    let old = stored_before(&pod);
    let answer = send(&server, &status_review("jenkins-68649", &pod, &old)).await;
    let patch = answer.patch.expect("a patch");
    let ops: Value = serde_json::from_slice(&patch).expect("patch JSON");
    assert_eq!(
        ops,
        json!([{"op": "replace", "path": "/status/phase", "value": "Running"}])
    );
    let stored = store(&old, &pod, &patch);
    assert_eq!(stored["status"]["phase"], "Running");
    let mut expected = pod.clone();
    expected["status"]["phase"] = json!("Running");
    assert_eq!(stored["status"], expected["status"]);
    assert_eq!(stored["metadata"], old["metadata"]);
    assert!(
        answer
            .warnings
            .iter()
            .any(|w| w.starts_with("podmend virtual-node-phase: ")),
        "{:?}",
        answer.warnings
    );
    assert_eq!(rule_actions(&server, "repaired"), "1");
}

/// Each variant of the pod that the rule must leave alone.
fn variants() -> Vec<(&'static str, Value)> {
    let pod = jenkins_pod();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut pod = pod.clone();
        edit(&mut pod);
        pod
    };
    let with_init = |init: Value, init_status: Value| {
        with(&|pod: &mut Value| {
            pod["spec"]["initContainers"] = json!([init.clone()]);
            pod["status"]["initContainerStatuses"] = json!([init_status.clone()]);
        })
    };
    let status = |name: &str, state: Value, started: bool| {
        json!({"name": name, "image": "busybox", "imageID": "", "ready": started, "started": started,
               "restartCount": 0, "state": state, "lastState": {}})
    };
    vec![
        (
            "a container waiting",
            with(&|pod| {
                pod["status"]["containerStatuses"][0]["state"] =
                    json!({"waiting": {"reason": "ContainerCreating"}})
            }),
        ),
        (
            "a container without a status",
            with(&|pod| pod["status"]["containerStatuses"] = json!([])),
        ),
        (
            "an init container still running",
            with_init(
                json!({"name": "init", "image": "busybox"}),
                status(
                    "init",
                    json!({"running": {"startedAt": "2022-05-30T10:01:00Z"}}),
                    false,
                ),
            ),
        ),
        (
            "an init container that failed",
            with_init(
                json!({"name": "init", "image": "busybox"}),
                status(
                    "init",
                    json!({"terminated": {"exitCode": 1, "reason": "Error"}}),
                    false,
                ),
            ),
        ),
        (
            "a sidecar not started",
            with_init(
                json!({"name": "proxy", "image": "busybox", "restartPolicy": "Always"}),
                status(
                    "proxy",
                    json!({"running": {"startedAt": "2022-05-30T10:01:00Z"}}),
                    false,
                ),
            ),
        ),
        (
            "phase already Running",
            with(&|pod| pod["status"]["phase"] = json!("Running")),
        ),
        (
            "phase Succeeded",
            with(&|pod| pod["status"]["phase"] = json!("Succeeded")),
        ),
        (
            "phase Failed",
            with(&|pod| pod["status"]["phase"] = json!("Failed")),
        ),
        (
            "deletionTimestamp set",
            with(&|pod| {
                pod["metadata"]["deletionTimestamp"] = json!("2022-05-30T10:01:20Z");
                pod["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            }),
        ),
        (
            "a node without the label",
            with(&|pod| pod["spec"]["nodeName"] = json!("cp-1")),
        ),
        (
            "an unknown node",
            with(&|pod| pod["spec"]["nodeName"] = json!("virtual-node-gone")),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_pod_state_or_node_gets_no_patch() {
    let stub = start_stub().await;
    let server = start_server(&stub, Some(ENFORCE)).await;
    for (name, pod) in variants() {
        let old = stored_before(&pod);
        let answer = send(&server, &status_review(name, &pod, &old)).await;
        assert!(answer.patch.is_none(), "{name}: patched");
        assert!(answer.warnings.is_empty(), "{name}: {:?}", answer.warnings);
    }
    // The sidecar variant is also the case where the sidecar is started: then it is corrected.
    let mut started = variants()
        .into_iter()
        .find(|(name, _)| *name == "a sidecar not started")
        .expect("variant")
        .1;
    started["status"]["initContainerStatuses"][0]["started"] = json!(true);
    started["status"]["initContainerStatuses"][0]["ready"] = json!(true);
    let old = stored_before(&started);
    let answer = send(&server, &status_review("sidecar-started", &started, &old)).await;
    let stored = store(&old, &started, &answer.patch.expect("a patch"));
    assert_eq!(stored["status"]["phase"], "Running");
    assert_eq!(rule_actions(&server, "repaired"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_stored_pod_is_never_moved_back_to_running() {
    let stub = start_stub().await;
    let server = start_server(&stub, Some(ENFORCE)).await;
    let pod = jenkins_pod();
    for phase in ["Succeeded", "Failed"] {
        let mut old = pod.clone();
        old["status"]["phase"] = json!(phase);
        let answer = send(&server, &status_review(phase, &pod, &old)).await;
        assert!(answer.patch.is_none(), "stored {phase}: patched");
    }
    let mut deleting = pod.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2022-05-30T10:01:20Z");
    let answer = send(&server, &status_review("deleting", &pod, &deleting)).await;
    assert!(answer.patch.is_none(), "stored as being deleted: patched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_node_that_joins_later_is_matched_once_the_cache_sees_it() {
    let stub = start_stub().await;
    let server = start_server(&stub, Some(ENFORCE)).await;
    let mut pod = jenkins_pod();
    pod["spec"]["nodeName"] = json!("virtual-node-aci-linux-2");
    let old = stored_before(&pod);
    let review = status_review("late-node", &pod, &old);
    assert!(
        send(&server, &review).await.patch.is_none(),
        "unknown node patched"
    );

    let mut node = cluster_fixture("node-virtual-kubelet-aci.json");
    node["metadata"]["name"] = json!("virtual-node-aci-linux-2");
    node["metadata"]["resourceVersion"] = json!(stub.resource_version().to_string());
    stub.push_node_event("ADDED", node);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(patch) = send(&server, &review).await.patch {
            let stored = store(&old, &pod, &patch);
            assert_eq!(stored["status"]["phase"], "Running");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node added to the cluster was not matched within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_node_selector_replaces_the_default_one() {
    let stub = start_stub().await;
    let config = "rules:\n  virtual-node-phase:\n    mode: enforce\n    nodeSelector:\n      kubernetes.azure.com/role: agent\n      node-role.kubernetes.io/agent: \"\"\n";
    let server = start_server(&stub, Some(config)).await;
    let pod = jenkins_pod();
    let old = stored_before(&pod);
    let answer = send(&server, &status_review("custom", &pod, &old)).await;
    assert!(answer.patch.is_some(), "matching labels, no patch");

    let config = "rules:\n  virtual-node-phase:\n    mode: enforce\n    nodeSelector:\n      type: virtual-kubelet\n      example.com/pool: aci\n";
    let server = start_server(&stub, Some(config)).await;
    let answer = send(&server, &status_review("custom-2", &pod, &old)).await;
    assert!(
        answer.patch.is_none(),
        "a label the node lacks, yet patched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warn_mode_warns_logs_and_counts_without_changing_the_phase() {
    let stub = start_stub().await;
    let server = start_server(
        &stub,
        Some("rules:\n  virtual-node-phase:\n    mode: warn\n"),
    )
    .await;
    let pod = jenkins_pod();
    let answer = send(&server, &status_review("warn", &pod, &stored_before(&pod))).await;
    assert!(answer.patch.is_none());
    assert!(
        answer
            .warnings
            .iter()
            .any(|w| w.starts_with("podmend virtual-node-phase would repair: ")),
        "{:?}",
        answer.warnings
    );
    assert_eq!(rule_actions(&server, "warned"), "1");
    assert_eq!(rule_actions(&server, "repaired"), "absent");
    let warned = |line: &str| {
        line.contains("rules=virtual-node-phase") && line.contains("result=\"warned\"")
    };
    let log = server.log_once(|log| log.lines().any(warned));
    assert!(log.lines().any(warned), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_is_off_by_default() {
    let stub = start_stub().await;
    let server = start_server(&stub, None).await;
    let pod = jenkins_pod();
    let answer = send(
        &server,
        &status_review("default", &pod, &stored_before(&pod)),
    )
    .await;
    assert!(answer.patch.is_none());
    assert!(answer.warnings.is_empty(), "{:?}", answer.warnings);
    assert_eq!(rule_actions(&server, "repaired"), "absent");
}
