//! `virtual-node-phase` through the real API server: the test plays the virtual kubelet. It
//! writes a pod's status (`PUT pods/status`, as virtual-kubelet's pod controller does) as the
//! node's own identity, every container running and the phase still `Pending`, and reads the
//! stored pod back.
//!
//! The write is authorized and admitted as a kubelet's: the admin impersonates
//! `system:node:NAME` in group `system:nodes` (the impersonation filter,
//! `staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go`,
//! `WithImpersonation`, replaces the user before authorization and admission). The suite's
//! API server runs the Node authorizer, which allows a node `update` on any `pods/status`
//! (`plugin/pkg/auth/authorizer/node/node_authorizer.go`, `authorizePod`), and the
//! NodeRestriction admission plugin, which refuses it unless the pod is bound to that node
//! (`plugin/pkg/admission/noderestriction/admission.go`, `admitPodStatus`).
//!
//! The rule is off by default and its webhook (`status.podmend.io`) is rendered only when it
//! is on: the test turns it on with `helm upgrade` and puts the chart's defaults back
//! afterwards, also when it fails.

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::fixture;
use crate::install::{
    assert_success, installed_name, kubectl, kubectl_json, kubectl_stdin, kubectl_stdin_output,
    rendered_config, with_values,
};
use crate::node_affinity::poll;
use crate::reinvocation::podmend_decisions;

/// The AKS virtual node (its labels carry `type: virtual-kubelet`, the rule's default
/// `nodeSelector`), and a node of the same shape without that label.
const VIRTUAL_NODE: &str = "virtual-node-aci-linux";
const PLAIN_NODE: &str = "plain-node-vnp";
const TEST_NAMESPACE: &str = "virtual-node-phase";

/// `PUT pods/status` of the pod on standard input.
const REPLACE_STATUS: [&str; 4] = ["replace", "--subresource=status", "-f", "-"];

/// Creates the Node of the fixture, named `name`, without its `type: virtual-kubelet` label
/// unless `virtual_labels`, Ready, with the fixture's taint only (the `not-ready` taint `TaintNodesByCondition` adds to
/// every new Node is taken off: no kubelet would clear it).
fn create_node(suite: &Suite, name: &str, virtual_labels: bool) {
    let mut node = fixture("virtual-kubelet-aci-virtual-node-reconstructed.yaml");
    let taints = node["spec"]["taints"].clone();
    node["metadata"]["name"] = json!(name);
    node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
    if let Some(labels) = node["metadata"]["labels"].as_object_mut()
        && !virtual_labels
    {
        labels.remove("type");
    }
    node["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "a test Node without a kubelet"}]);
    kubectl_stdin(suite, &["create", "-f", "-"], &node);
    let patch = json!({"spec": {"taints": taints}}).to_string();
    kubectl(
        suite,
        &["patch", "node", name, "--type=merge", "-p", &patch],
    );
}

/// Creates the JENKINS-68649 pod as `name`, for `node` only, and waits until kube-scheduler
/// bound it there; returns the fixture's status, which the test writes as the node. The pod
/// on the virtual node keeps the fixture's `nodeSelector` (the virtual node's labels), the
/// other selects its node by hostname; both tolerate the provider's taint. podmend's pod
/// webhook takes CREATE only, so the binding reaches no rule.
fn bound_pod(suite: &Suite, name: &str, node: &str) -> Value {
    let mut pod = fixture(
        "virtual-kubelet-aci-pod-pending-with-running-containers-JENKINS-68649-reconstructed.yaml",
    );
    pod["metadata"] = json!({"name": name, "namespace": TEST_NAMESPACE});
    if let Some(spec) = pod["spec"].as_object_mut() {
        spec.remove("nodeName");
        if node != VIRTUAL_NODE {
            spec.insert(
                "nodeSelector".into(),
                json!({"kubernetes.io/hostname": node}),
            );
        }
    }
    let status = pod
        .as_object_mut()
        .and_then(|pod| pod.remove("status"))
        .expect("the fixture's status");
    kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    poll(Duration::from_secs(60), || {
        let stored = kubectl_json(
            suite,
            &["get", "pod", name, "-n", TEST_NAMESPACE, "-o", "json"],
        );
        match stored["spec"]["nodeName"].as_str() {
            Some(bound) if bound == node => Ok(()),
            other => Err(format!("{name} is bound to {other:?}, not {node}")),
        }
    });
    status
}

/// Writes `status` on the pod `name` of `namespace` as the kubelet of `node` (`kubectl
/// replace --subresource=status`, impersonating the node), and returns the stored pod.
pub(crate) fn write_status_as_node(
    suite: &Suite,
    namespace: &str,
    name: &str,
    node: &str,
    status: &Value,
) -> Value {
    let get = ["get", "pod", name, "-n", namespace, "-o", "json"];
    let mut pod = kubectl_json(suite, &get);
    pod["status"] = status.clone();
    let output = kubectl_as_node(suite, node, &REPLACE_STATUS, &pod);
    assert_success(
        &format!("kubectl replace --subresource=status as {node}"),
        &output,
    );
    kubectl_json(suite, &get)
}

/// `kubectl ARGS` with `object` on its standard input as the kubelet of `node`: the admin
/// impersonates `system:node:NODE` in group `system:nodes`.
pub(crate) fn kubectl_as_node(suite: &Suite, node: &str, args: &[&str], object: &Value) -> Output {
    let user = format!("system:node:{node}");
    let mut all = vec!["--as", user.as_str(), "--as-group", "system:nodes"];
    all.extend_from_slice(args);
    kubectl_stdin_output(suite, &all, object)
}

/// The stored MutatingWebhookConfiguration's webhook names.
fn webhook_names(suite: &Suite) -> Vec<String> {
    let name = installed_name(suite, "MutatingWebhookConfiguration");
    let stored = kubectl_json(
        suite,
        &["get", "mutatingwebhookconfiguration", &name, "-o", "json"],
    );
    stored["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["name"].as_str().map(str::to_string))
        .collect()
}

/// Runs `test` with `rules.virtualNodePhase.mode=enforce` installed by `helm upgrade` and
/// served by podmend, then upgrades back to the chart's defaults, whether `test` passed or not.
fn with_virtual_node_phase_on(suite: &Suite, test: impl FnOnce()) {
    with_values(
        suite,
        json!({"rules": {"virtualNodePhase": {"mode": "enforce"}}}),
        || {
            // The chart's ConfigMap says what podmend serves here.
            let config: Value =
                serde_yaml_ng::from_str(&rendered_config(suite)).expect("the config is YAML");
            assert_eq!(config["rules"]["virtual-node-phase"]["mode"], "enforce");
            assert!(
                webhook_names(suite)
                    .iter()
                    .any(|n| n == "status.podmend.io"),
                "the upgrade registered the status webhook"
            );
            test();
        },
    );
    assert!(
        !webhook_names(suite)
            .iter()
            .any(|n| n == "status.podmend.io"),
        "the defaults registered no status webhook"
    );
}

/// On the virtual node, the status the virtual kubelet writes (phase `Pending`, every
/// container running) is stored as `Running`; on a node without the virtual-kubelet label the
/// same write is stored as written. Without podmend both stay `Pending`.
pub fn a_virtual_kubelets_pending_status_with_every_container_running_is_stored_as_running(
    suite: &Suite,
) {
    crate::install::ensure_installed(suite);
    suite
        .block_on(async {
            suite.plane.ensure_scheduler().await?;
            suite.plane.create_namespace(TEST_NAMESPACE).await
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // The plain node first: once podmend's Node cache (one watch, in order) holds the virtual
    // node, it holds the plain one too, so the plain pod is judged on a known node.
    create_node(suite, PLAIN_NODE, false);
    create_node(suite, VIRTUAL_NODE, true);
    let virtual_status = bound_pod(suite, "on-virtual-node", VIRTUAL_NODE);
    let plain_status = bound_pod(suite, "on-plain-node", PLAIN_NODE);
    assert_eq!(virtual_status["phase"], "Pending");

    // The writes are judged as the node's: NodeRestriction refuses the virtual node's write of
    // a pod bound to another node.
    let mut foreign = kubectl_json(
        suite,
        &[
            "get",
            "pod",
            "on-plain-node",
            "-n",
            TEST_NAMESPACE,
            "-o",
            "json",
        ],
    );
    foreign["status"] = plain_status.clone();
    let refused = kubectl_as_node(suite, VIRTUAL_NODE, &REPLACE_STATUS, &foreign);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr
                .contains("can only update pod status for pods with spec.nodeName set to itself"),
        "{stderr}"
    );

    with_virtual_node_phase_on(suite, || {
        // The virtual kubelet writes its status again and again; so does the test, until the
        // API server calls the new webhook and podmend's cache knows the node.
        let stored = poll(Duration::from_secs(30), || {
            let stored = write_status_as_node(
                suite,
                TEST_NAMESPACE,
                "on-virtual-node",
                VIRTUAL_NODE,
                &virtual_status,
            );
            if stored["status"]["phase"] == "Running" {
                Ok(stored)
            } else {
                Err(format!("stored as {:#}", stored["status"]))
            }
        });
        // Only the phase changed: the containers' states are as the node wrote them.
        assert_eq!(
            stored["status"]["containerStatuses"][0]["state"],
            virtual_status["containerStatuses"][0]["state"]
        );

        let stored = write_status_as_node(
            suite,
            TEST_NAMESPACE,
            "on-plain-node",
            PLAIN_NODE,
            &plain_status,
        );
        assert_eq!(
            stored["status"]["phase"], "Pending",
            "a node without type: virtual-kubelet owns its pods' phase: {:#}",
            stored["status"]
        );
        // podmend was asked about that write, and let it be.
        assert_eq!(
            podmend_decisions(suite, TEST_NAMESPACE, "on-plain-node", 2),
            ["CREATE allowed", "UPDATE allowed"]
        );
    });
}

/// With `virtualNodePhase.mode=warn` in the chart, the virtual kubelet's write (phase
/// `Pending`, every container running) is stored as written and kubectl prints podmend's
/// note of what it would repair. Without podmend kubectl prints no note; with `enforce` the
/// stored phase is `Running` (the test above).
pub fn with_virtual_node_phase_warn_the_status_is_stored_as_written_and_kubectl_says_what_podmend_would_repair(
    suite: &Suite,
) {
    crate::install::ensure_installed(suite);
    let exists = |args: &[&str]| {
        suite
            .plane
            .kubectl()
            .args(args)
            .output()
            .is_ok_and(|output| output.status.success())
    };
    suite
        .block_on(async {
            suite.plane.ensure_scheduler().await?;
            if exists(&["get", "namespace", TEST_NAMESPACE]) {
                Ok(())
            } else {
                suite.plane.create_namespace(TEST_NAMESPACE).await
            }
        })
        .unwrap_or_else(|e| panic!("{e}"));
    if !exists(&["get", "node", VIRTUAL_NODE]) {
        create_node(suite, VIRTUAL_NODE, true);
    }
    let name = "warned-on-virtual-node";
    let status = bound_pod(suite, name, VIRTUAL_NODE);
    with_values(
        suite,
        json!({"rules": {"virtualNodePhase": {"mode": "warn"}}}),
        || {
            // Written until the API server calls the status webhook the upgrade registered.
            poll(Duration::from_secs(30), || {
                let mut pod = kubectl_json(
                    suite,
                    &["get", "pod", name, "-n", TEST_NAMESPACE, "-o", "json"],
                );
                pod["status"] = status.clone();
                let output = kubectl_as_node(suite, VIRTUAL_NODE, &REPLACE_STATUS, &pod);
                assert_success("kubectl replace --subresource=status as the node", &output);
                let stderr = String::from_utf8_lossy(&output.stderr);
                if stderr.contains("podmend virtual-node-phase would repair: ") {
                    Ok(())
                } else {
                    Err(format!("kubectl printed no note of podmend: {stderr}"))
                }
            });
            let stored = kubectl_json(
                suite,
                &["get", "pod", name, "-n", TEST_NAMESPACE, "-o", "json"],
            );
            assert_eq!(
                stored["status"]["phase"], "Pending",
                "warn stores the status as written: {:#}",
                stored["status"]
            );
        },
    );
}
