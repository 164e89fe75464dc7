//! A real node: containerd 2.x and the kubelet of the control plane's build, registered to the
//! suite's API server, in a network namespace the test creates
//! (`common::control_plane::node`). Pods here use `hostNetwork: true`: they share the node's
//! namespace, so no CNI plugin runs and the node reports `Ready=False` (NetworkPluginNotReady);
//! pods with a network of their own and the node's readiness are not covered yet.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::Suite;
use crate::common::control_plane::node::config::BUSYBOX_IMAGE;
use crate::common::control_plane::node::host::MachineLock;
use crate::common::control_plane::node::{ALLOCATABLE_MILLICPU, Node};

/// How long a pod may take to reach the phase a test waits for.
const POD_TIMEOUT: Duration = Duration::from_secs(90);

/// What the test pod prints before it sleeps.
const GREETING: &str = "podmend on a real node";

/// A pod bound to `node` by `nodeName`, on the node's network, running busybox `command` and
/// requesting `cpu`.
fn pod(name: &str, node: &str, cpu: &str, command: &[&str]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            // busybox sh as PID 1 ignores SIGTERM: the kubelet kills it after this.
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
                "resources": {"requests": {"cpu": cpu}},
            }],
        },
    })
}

/// Creates `manifest` through the API server (which stores it without looking at the node's
/// resources) and waits until the kubelet puts it in `phase`.
async fn create_and_wait(pods: &Api<Pod>, manifest: Value, node: &Node, phase: &str) -> Pod {
    let created: Pod = serde_json::from_value(manifest).expect("a pod");
    let name = created.metadata.name.clone().expect("a named pod");
    pods.create(&PostParams::default(), &created)
        .await
        .expect("the API server stores the pod");
    wait_for_phase(pods, &name, node, phase).await
}

/// Polls pod `name` until `done` says its phase is final for the test; panics with the pod's
/// status and the node's logs after [`POD_TIMEOUT`].
async fn wait_for_phase(pods: &Api<Pod>, name: &str, node: &Node, phase: &str) -> Pod {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let current = pods.get(name).await.expect("read the pod back");
        let now = current
            .status
            .as_ref()
            .and_then(|status| status.phase.clone())
            .unwrap_or_default();
        if now == phase {
            return current;
        }
        assert!(
            Instant::now() < deadline && !(now == "Failed" || now == "Succeeded"),
            "pod {name} is {now:?}, not {phase}, after {} s: {:?}\n{}",
            POD_TIMEOUT.as_secs(),
            current.status,
            node.report()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Stops `node` and asserts nothing of it is left on the host, and that the machine's node lock
/// is held while the node exists and free once it is dropped.
fn stop_and_check(mut node: Node) {
    assert!(
        MachineLock::try_acquire().is_err(),
        "a running node holds the machine's node lock: no other suite's node can start beside it"
    );
    node.stop();
    let left = node.leftovers();
    assert!(
        left.is_empty(),
        "the stopped node left these on the host:\n{}",
        left.join("\n")
    );
    drop(node);
    if let Err(error) = MachineLock::try_acquire() {
        panic!("a dropped node releases the machine's node lock: {error}");
    }
}

/// `kubectl logs` of pod `name`'s container (stdout and stderr), polled for up to 30 s until it
/// holds `expected`. It goes API server -> kubelet at the node's InternalIP -> the container's
/// log file, which the kubelet serves (pkg/kubelet/server/server.go, `getContainerLogs`, which
/// calls pkg/kubelet/kubelet_pods.go, `GetKubeletContainerLogs`).
fn kubectl_logs_once_printed(suite: &Suite, namespace: &str, name: &str, expected: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = suite
            .plane
            .kubectl()
            .args(["logs", "-n", namespace, name])
            .output()
            .expect("run kubectl logs");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if text.contains(expected) || Instant::now() >= deadline {
            return format!("{text}{}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Deletes pod `name` and waits until the object is gone: that happens once the kubelet has
/// stopped its containers and confirms with a deletion of grace 0
/// (pkg/kubelet/status/status_manager.go, `canBeDeleted`).
async fn delete_and_wait_until_gone(suite: &Suite, namespace: &str, name: &str, node: &Node) {
    let pods: Api<Pod> = Api::namespaced(suite.plane.client().await, namespace);
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("delete the pod");
    let deadline = Instant::now() + POD_TIMEOUT;
    while matches!(pods.get_opt(name).await, Ok(Some(_))) {
        assert!(
            Instant::now() < deadline,
            "the kubelet did not finish deleting pod {name} within {} s\n{}",
            POD_TIMEOUT.as_secs(),
            node.report()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn a_pod_the_kubelet_runs_is_running_with_its_output_in_kubectl_logs_and_leaves_nothing_behind(
    suite: &Suite,
) {
    let plane = &suite.plane;
    let namespace = "real-node-runs";
    suite
        .block_on(plane.create_namespace(namespace))
        .expect("namespace");
    let node = suite
        .block_on(Node::start(plane, "real-node-runs"))
        .unwrap_or_else(|error| panic!("{error}"));
    let script = format!("echo {GREETING}; exec sleep 3600");
    let manifest = pod("hello", &node.name, "100m", &["sh", "-c", &script]);
    suite.block_on(async {
        let pods: Api<Pod> = Api::namespaced(plane.client().await, namespace);
        // The kubelet starts the sandbox and the container and reports Running once the
        // container's state is running (pkg/kubelet/kubelet_pods.go, `getPhase`). The sandbox
        // runs in containerd's network namespace because the pod asks for the host's network
        // (containerd internal/cri/server/podsandbox/sandbox_run_linux.go, `sandboxContainerSpec`,
        // NamespaceMode_NODE: no network namespace of its own).
        create_and_wait(&pods, manifest, &node, "Running").await;
    });

    let logs = kubectl_logs_once_printed(suite, namespace, "hello", GREETING);
    assert_eq!(
        logs.trim(),
        GREETING,
        "kubectl logs prints what the container printed\n{}",
        node.report()
    );

    suite.block_on(delete_and_wait_until_gone(suite, namespace, "hello", &node));
    let tasks = node
        .ctr(&["-n", "k8s.io", "tasks", "ls", "-q"])
        .expect("ctr tasks ls");
    assert_eq!(
        tasks.trim(),
        "",
        "the kubelet stopped the deleted pod's container and sandbox"
    );
    stop_and_check(node);
}

/// The CPU the kubelet reported allocatable on Node `name`.
async fn allocatable_cpu(nodes: &Api<NodeObject>, name: &str) -> String {
    let registered = nodes.get(name).await.expect("the kubelet's Node");
    registered
        .status
        .and_then(|status| status.allocatable)
        .and_then(|allocatable| allocatable.get("cpu").cloned())
        .expect("the Node's allocatable cpu")
        .0
}

/// Asserts `pod` carries the kubelet's OutOfcpu rejection and none of its containers runs.
fn assert_rejected_out_of_cpu(pod: Pod) {
    let status = pod.status.expect("a status");
    assert_eq!(status.reason.as_deref(), Some("OutOfcpu"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with("Pod was rejected: ") && message.contains("cpu"),
        "the kubelet says why: {message}"
    );
    assert!(
        status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .all(|container| container.state.as_ref().is_none_or(|s| s.running.is_none())),
        "no container of a rejected pod runs"
    );
}

pub fn the_kubelet_fails_a_pod_whose_cpu_request_exceeds_its_allocatable_with_out_of_cpu(
    suite: &Suite,
) {
    let plane = &suite.plane;
    let namespace = "real-node-full";
    suite
        .block_on(plane.create_namespace(namespace))
        .expect("namespace");
    let node = suite
        .block_on(Node::start(plane, "real-node-full"))
        .unwrap_or_else(|error| panic!("{error}"));
    suite.block_on(async {
        let client = plane.client().await;
        assert_eq!(
            allocatable_cpu(&Api::all(client.clone()), &node.name).await,
            format!("{ALLOCATABLE_MILLICPU}m"),
            "systemReserved leaves {ALLOCATABLE_MILLICPU}m to pods"
        );
        // One CPU more than allocatable: no scheduler is asked (nodeName is set), so only the
        // kubelet's own admission stands between the pod and the node.
        let request = format!("{}m", ALLOCATABLE_MILLICPU + 1000);
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let manifest = pod("too-big", &node.name, &request, &["sleep", "3600"]);
        // The kubelet admits each new pod through its predicate admit handler, whose resource
        // fit failure is reason "OutOf" + the resource (pkg/kubelet/lifecycle/predicate.go,
        // `Admit`); `HandlePodAdditions` then calls `rejectPod` (pkg/kubelet/kubelet.go), which
        // sets phase Failed, that reason and "Pod was rejected: " + the message.
        let rejected = create_and_wait(&pods, manifest, &node, "Failed").await;
        assert_rejected_out_of_cpu(rejected);
        pods.delete("too-big", &DeleteParams::default())
            .await
            .expect("delete the pod");
    });
    assert_eq!(
        node.ctr(&["-n", "k8s.io", "containers", "ls", "-q"])
            .expect("ctr containers ls")
            .trim(),
        "",
        "the kubelet made no sandbox or container for the rejected pod"
    );
    stop_and_check(node);
}

pub fn a_node_whose_kubelet_stops_with_its_pod_still_running_leaves_nothing_behind(suite: &Suite) {
    let plane = &suite.plane;
    let namespace = "real-node-stopped";
    suite
        .block_on(plane.create_namespace(namespace))
        .expect("namespace");
    let node = suite
        .block_on(Node::start(plane, "real-node-stopped"))
        .unwrap_or_else(|error| panic!("{error}"));
    let manifest = pod("left-running", &node.name, "100m", &["sleep", "3600"]);
    suite.block_on(async {
        let pods: Api<Pod> = Api::namespaced(plane.client().await, namespace);
        create_and_wait(&pods, manifest, &node, "Running").await;
    });
    // The kubelet stops without stopping its pods (a node going away): the container, its
    // shim, the sandbox's mounts, the service-account token's tmpfs and the container's log
    // link are the node's teardown to remove.
    assert!(
        !node
            .ctr(&["-n", "k8s.io", "tasks", "ls", "-q"])
            .expect("ctr tasks ls")
            .trim()
            .is_empty(),
        "the pod's sandbox and container run before the node stops"
    );
    stop_and_check(node);
    suite.block_on(async {
        // No kubelet is left to confirm the deletion: grace 0 removes the object at once.
        let pods: Api<Pod> = Api::namespaced(plane.client().await, namespace);
        pods.delete("left-running", &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the pod");
    });
}
