//! The webhook with cluster look-ups on: the real `podmend serve` binary lists and watches
//! Nodes and LimitRanges from a local HTTPS API stub (real API shapes), and its repairs use
//! them: tolerations for the target node's NoSchedule taints, LimitRange-aware requests.

mod common;

use common::api_stub::ApiStub;
use common::k8s_rules;
use common::server::{Options, Server, create_review, fixture, mutate_h2};
use serde_json::{Value, json};

fn cluster_fixture(name: &str) -> Value {
    fixture(&format!("cluster/{name}"))
}

async fn start() -> (ApiStub, Server) {
    let stub = ApiStub::start(
        vec![
            cluster_fixture("node-virtual-kubelet-aci.json"),
            cluster_fixture("node-kubeadm-control-plane.json"),
            cluster_fixture("node-cordoned-worker.json"),
        ],
        vec![
            cluster_fixture("limitrange-ci-agents-container-defaults.json"),
            cluster_fixture("limitrange-default-pod-container-pvc.json"),
        ],
    )
    .await;
    let kubeconfig = stub.kubeconfig_path().to_path_buf();
    // The server is a child process; start it off the runtime's threads so the stub keeps
    // answering while we wait for readiness.
    let server = Server::start_async(Options {
        kubeconfig: Some(kubeconfig),
        wait_ready: true,
        ..Options::default()
    })
    .await;
    (stub, server)
}

async fn mutate(server: &Server, review: &Value) -> Value {
    let patch = mutate_h2(server, review).await.patch.expect("a patch");
    k8s_rules::apply_patch_as_api_server(&review["request"]["object"], &patch)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn pinned_pod(node: &str) -> Value {
    let mut review = fixture("admissionreview-v1-pod-create-gke-kube-rs.json");
    review["request"]["object"]["spec"]["nodeName"] = json!(node);
    review["request"]["object"]["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("tolerations");
    review["request"]["object"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_caches_and_the_log_says_look_ups_are_on() {
    let (_stub, server) = start().await;
    assert_eq!(server.metrics_get("/readyz").expect("readyz").0, 200);
    assert!(
        server
            .log_once(|log| log.contains("cluster look-ups on"))
            .contains("cluster look-ups on"),
        "{}",
        server.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_pinned_to_a_tainted_node_tolerates_its_no_schedule_taints() {
    let (_stub, server) = start().await;
    let pod = pinned_pod("virtual-node-aci-linux");
    let repaired = mutate(&server, &create_review("vk", &pod, "default")).await;
    assert_eq!(
        repaired["spec"]["tolerations"],
        json!([{"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "azure", "effect": "NoSchedule"}])
    );
    let errors = k8s_rules::validate_pod_spec(&repaired["spec"]);
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cordon_taint_is_not_tolerated_but_other_taints_are() {
    let (_stub, server) = start().await;
    let repaired = mutate(
        &server,
        &create_review("cordoned", &pinned_pod("worker-2"), "default"),
    )
    .await;
    assert!(
        repaired["spec"].get("tolerations").is_none(),
        "{:#}",
        repaired["spec"]
    );
    let repaired = mutate(
        &server,
        &create_review("cp", &pinned_pod("cp-1"), "default"),
    )
    .await;
    assert_eq!(
        repaired["spec"]["tolerations"],
        json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_requests_meet_the_namespace_limit_range_instead_of_zero() {
    let (_stub, server) = start().await;
    let limit_range = cluster_fixture("limitrange-ci-agents-container-defaults.json");
    // LimitRanger's defaulting ran before the webhook: the agent arrives with the defaults.
    // Selected explicitly (the Jenkins preset is opt-in), pinned or not.
    let mut pod = fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml");
    pod["metadata"]["annotations"]["podmend.io/agent"] = json!("true");
    for container in pod["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
    {
        container["resources"] = json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}});
    }
    let repaired = mutate(&server, &create_review("lr", &pod, "ci-agents")).await;
    let jnlp = &repaired["spec"]["containers"][1]["resources"];
    // min cpu 50m, ratio 4 over a 500m limit → 125m; min memory 64Mi.
    assert_eq!(
        jnlp["requests"],
        json!({"cpu": "125m", "memory": "67108864"})
    );
    assert_eq!(jnlp["limits"], json!({"cpu": "500m", "memory": "512Mi"}));
    // The LimitRanger validation that runs after the webhook accepts it...
    let errors =
        k8s_rules::limit_ranger_validate(&repaired["spec"], std::slice::from_ref(&limit_range));
    assert!(errors.is_empty(), "{errors:?}");
    // ...where plain zero would have been rejected.
    let mut zeroed = repaired["spec"].clone();
    zeroed["containers"][1]["resources"]["requests"] = json!({"cpu": "0", "memory": "0"});
    assert!(!k8s_rules::limit_ranger_validate(&zeroed, &[limit_range]).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_taint_seen_on_the_watch_is_used_for_the_next_pod() {
    let (stub, server) = start().await;
    let mut node = cluster_fixture("node-kubeadm-control-plane.json");
    node["spec"]["taints"] = json!([
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "agents", "effect": "NoSchedule"}
    ]);
    stub.push_node_event("MODIFIED", node);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let repaired = mutate(
            &server,
            &create_review("watch", &pinned_pod("cp-1"), "default"),
        )
        .await;
        let tolerations = repaired["spec"]["tolerations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if tolerations.len() == 2 {
            assert_eq!(
                tolerations[1],
                json!({"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"})
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "watch event not seen: {tolerations:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
