//! Rule modes and exclusions through the real API server, set the way a chart user sets them:
//! `helm upgrade` with the rule's values. The chart renders them into its ConfigMap, which the
//! in-cluster podmend reloads from its volume; here the suite copies the stored ConfigMap into
//! the file the loopback `podmend serve` reloads (as `install` does at install time).
//!
//! Where the API server itself decides not to call podmend (the chart's `namespaceSelector` and
//! `matchConditions`), the proof is podmend's own log, which has one `admission` line for every
//! review it answers, skipped ones included (`src/server/handlers.rs`, `AdmissionLine`): no
//! line means no call.

use std::time::Duration;

use serde_json::{Value, json};

use crate::Suite;
use crate::install::{
    NAMESPACE, assert_success, ensure_installed, kubectl, kubectl_json, kubectl_stdin,
    kubectl_stdin_output, with_values,
};
use crate::node_affinity::{namespace_and_node, poll, wait_until_podmend_knows};
use crate::pinniped::create_node;

/// What podmend has logged so far.
pub fn podmend_log(suite: &Suite) -> String {
    let podmend = crate::lock(&suite.podmend);
    podmend.as_ref().expect("installed").server.log_text()
}

/// The `admission` lines of `log` about objects in `namespace`.
pub fn admission_lines<'a>(log: &'a str, namespace: &str) -> Vec<&'a str> {
    let field = format!(" namespace=\"{namespace}\" ");
    log.lines()
        .filter(|line| line.contains(" admission ") && line.contains(&field))
        .collect()
}

/// Waits until podmend has logged a review of the object `name` in `namespace`: the log is
/// written in order, so every earlier review is in it too.
fn wait_for_admission_line(suite: &Suite, namespace: &str, name: &str) {
    let wanted = format!(" name={name} ");
    poll(Duration::from_secs(10), || {
        let log = podmend_log(suite);
        if admission_lines(&log, namespace)
            .iter()
            .any(|line| line.contains(&wanted))
        {
            Ok(())
        } else {
            Err(format!("podmend logged no review of {namespace}/{name}"))
        }
    });
}

/// A Pinniped kube-cert-agent pod pinned to `node` with `spec.nodeName`, with requests and
/// limits: both default rules repair it.
fn pinned_agent(namespace: &str, name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kube-cert-agent.pinniped.dev": "v3"}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "agent", "image": "busybox",
                                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                               "limits": {"cpu": "20m", "memory": "32Mi"}}}]}})
}

/// The stored pod.
fn stored_pod(suite: &Suite, namespace: &str, name: &str) -> Value {
    kubectl_json(suite, &["get", "pod", name, "-n", namespace, "-o", "json"])
}

/// Asserts the stored pod is the pinned agent as created: its nodeName, no node affinity, its
/// requests, and no `podmend.io/mutated`.
fn assert_agent_as_created(pod: &Value, node: &str) {
    assert_eq!(
        pod["spec"]["nodeName"], node,
        "nodeName kept: {}",
        pod["spec"]
    );
    assert!(
        pod["spec"]["affinity"].is_null(),
        "no affinity added: {}",
        pod["spec"]
    );
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["requests"],
        json!({"cpu": "10m", "memory": "16Mi"}),
        "requests kept"
    );
    assert!(
        pod["metadata"]["annotations"]["podmend.io/mutated"].is_null(),
        "not marked mutated: {}",
        pod["metadata"]
    );
}

pub fn with_warn_set_in_the_chart_kubectl_prints_what_podmend_would_repair_and_the_pod_is_stored_as_created(
    suite: &Suite,
) {
    let warn =
        json!({"rules": {"nodeAffinity": {"mode": "warn"}, "agentRequests": {"mode": "warn"}}});
    with_values(suite, warn, || {
        namespace_and_node(suite, "mode-warn", "");
        // If podmend ignored `warn` (enforced), the stored pod would have node affinity and
        // requests "0"; if it were not called, kubectl would print no warning.
        let printed = kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &pinned_agent("mode-warn", "agent", "mode-warn"),
        );
        assert!(
            printed.contains(
                "Warning: podmend node-affinity would repair: spec.nodeName=mode-warn became required node affinity"
            ),
            "kubectl prints the node-affinity warning: {printed}"
        );
        assert!(
            printed.contains("Warning: podmend agent-requests would repair: "),
            "kubectl prints the agent-requests warning: {printed}"
        );
        assert_agent_as_created(&stored_pod(suite, "mode-warn", "agent"), "mode-warn");
    });
}

pub fn with_deny_set_in_the_chart_the_api_server_refuses_the_pod_and_kubectl_shows_podmends_message(
    suite: &Suite,
) {
    let deny = json!({"rules": {"nodeAffinity": {"mode": "deny"}}});
    with_values(suite, deny, || {
        // The chart registers the validating webhook only while a rule denies.
        let url = stored_webhook(
            suite,
            "validatingwebhookconfigurations",
            "validate.podmend.io",
        )["clientConfig"]["url"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(url.ends_with("/validate"), "{url}");

        namespace_and_node(suite, "mode-deny", "");
        let pod = pinned_agent("mode-deny", "agent", "mode-deny");
        // The API server learns of a new webhook configuration through its informer: a dry
        // run tells when it calls /validate.
        poll(Duration::from_secs(30), || {
            let output =
                kubectl_stdin_output(suite, &["create", "--dry-run=server", "-f", "-"], &pod);
            if output.status.success() {
                Err("the API server does not call /validate yet".to_string())
            } else {
                Ok(())
            }
        });
        // Without podmend's deny the pod would be created (and repaired by /mutate).
        let refused = kubectl_stdin_output(suite, &["create", "-f", "-"], &pod);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "refused: {stderr}");
        assert!(
            stderr.contains("admission webhook \"validate.podmend.io\" denied the request: podmend node-affinity: spec.nodeName=mode-deny became required node affinity"),
            "kubectl shows podmend's message: {stderr}"
        );
        let left = kubectl(suite, &["get", "pods", "-n", "mode-deny", "-o", "name"]);
        assert!(left.trim().is_empty(), "nothing stored: {left}");

        // A pod podmend would leave as it is (its node is unknown) is a note, never denied.
        let printed = kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &pinned_agent("mode-deny", "unknown-node", "no-such-node"),
        );
        assert!(printed.contains("is not known"), "{printed}");
        assert_eq!(
            stored_pod(suite, "mode-deny", "unknown-node")["spec"]["nodeName"],
            "no-such-node"
        );
    });
    // Back to the defaults: nothing denies, so no validating webhook.
    let validating = kubectl(
        suite,
        &["get", "validatingwebhookconfigurations", "-o", "name"],
    );
    assert!(!validating.contains("podmend"), "{validating}");
}

pub fn with_a_rule_off_in_the_chart_the_pod_keeps_what_it_governs_and_the_other_rules_still_repair(
    suite: &Suite,
) {
    let off = json!({"rules": {"nodeAffinity": {"mode": "off"}}});
    with_values(suite, off, || {
        namespace_and_node(suite, "mode-off", "");
        // If podmend ignored `off`, nodeName would become node affinity; if podmend were not
        // called at all, the requests would stay.
        let printed = kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &pinned_agent("mode-off", "agent", "mode-off"),
        );
        assert!(!printed.contains("node-affinity"), "{printed}");
        let pod = stored_pod(suite, "mode-off", "agent");
        assert_eq!(pod["spec"]["nodeName"], "mode-off", "{}", pod["spec"]);
        assert!(pod["spec"]["affinity"].is_null(), "{}", pod["spec"]);
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"],
            json!({"cpu": "0", "memory": "0"})
        );
        assert_eq!(
            pod["metadata"]["annotations"]["podmend.io/mutated"], "agent-requests",
            "{}",
            pod["metadata"]
        );
    });
}

/// `apiserver_admission_match_condition_exclusions_total` for podmend's mutating webhook on
/// CREATE, from the API server's /metrics: the requests a match condition kept from it
/// (`ShouldCallHook` in k8s.io/apiserver pkg/admission/plugin/webhook/generic/webhook.go
/// counts each through `ObserveMatchConditionExclusion` and skips the webhook).
fn match_condition_exclusions(suite: &Suite) -> f64 {
    let metrics = kubectl(suite, &["get", "--raw", "/metrics"]);
    metrics
        .lines()
        .filter(|line| line.starts_with("apiserver_admission_match_condition_exclusions_total{"))
        .filter(|line| {
            line.contains("name=\"mutate.podmend.io\"") && line.contains("operation=\"CREATE\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn the_charts_match_conditions_keep_skipped_and_mirror_pods_from_podmend_and_a_named_rule_skips_only_that_rule(
    suite: &Suite,
) {
    let ns = "mode-skip";
    namespace_and_node(suite, ns, "");
    let before = match_condition_exclusions(suite);

    // `podmend.io/skip: all` and the kubelet's mirror annotation: the chart's matchConditions
    // `not-skipped` and `not-a-mirror-pod` keep these from podmend. Without them podmend
    // would be called (a log line); without any exclusion the pods would be repaired.
    let mut skipped = pinned_agent(ns, "skipped-all", ns);
    skipped["metadata"]["annotations"] = json!({"podmend.io/skip": "all"});
    kubectl_stdin(suite, &["create", "-f", "-"], &skipped);
    let mut mirror = pinned_agent(ns, "mirror", ns);
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "mirror-hash"});
    kubectl_stdin(suite, &["create", "-f", "-"], &mirror);

    // One rule named: podmend is called and that rule alone stays out.
    let mut one = pinned_agent(ns, "skip-one", ns);
    one["metadata"]["annotations"] = json!({"podmend.io/skip": "node-affinity"});
    kubectl_stdin(suite, &["create", "-f", "-"], &one);
    let pod = stored_pod(suite, ns, "skip-one");
    assert_eq!(pod["spec"]["nodeName"], ns, "{}", pod["spec"]);
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["requests"],
        json!({"cpu": "0", "memory": "0"})
    );
    assert_eq!(
        pod["metadata"]["annotations"]["podmend.io/mutated"],
        "agent-requests"
    );

    wait_for_admission_line(suite, ns, "skip-one");
    let log = podmend_log(suite);
    for name in ["skipped-all", "mirror"] {
        assert_agent_as_created(&stored_pod(suite, ns, name), ns);
        let called: Vec<&str> = admission_lines(&log, ns)
            .into_iter()
            .filter(|line| line.contains(&format!(" name={name} ")))
            .collect();
        assert!(
            called.is_empty(),
            "podmend was called for {name}: {called:?}"
        );
    }
    let excluded = match_condition_exclusions(suite) - before;
    assert_eq!(
        excluded, 2.0,
        "the API server counts both pods as excluded by podmend's match conditions"
    );
}

/// Waits until the API server no longer calls podmend for pods in `namespace`: dry-run
/// creates of probe pods until one leaves no line in podmend's log 200 ms after kubectl
/// returned (podmend answers before kubectl returns and writes its log every 20 ms).
fn wait_until_not_called(suite: &Suite, namespace: &str) {
    let mut sent: Option<String> = None;
    let mut probes = 0;
    poll(Duration::from_secs(30), || {
        if let Some(name) = &sent {
            let log = podmend_log(suite);
            let wanted = format!(" name={name} ");
            if !admission_lines(&log, namespace)
                .iter()
                .any(|line| line.contains(&wanted))
            {
                return Ok(());
            }
        }
        probes += 1;
        let name = format!("probe-{probes}");
        let probe = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        kubectl_stdin(suite, &["create", "--dry-run=server", "-f", "-"], &probe);
        sent = Some(name);
        Err(format!(
            "the API server still calls podmend for {namespace}"
        ))
    });
}

pub fn the_api_server_never_calls_podmend_for_a_namespace_the_chart_excludes(suite: &Suite) {
    ensure_installed(suite);
    let node = "mode-excluded";
    create_node(suite, node, "");
    let included = "mode-included";
    let ignored = "mode-ignored";
    let skipped = "mode-skipped";
    for namespace in [included, ignored, skipped] {
        suite
            .block_on(suite.plane.create_namespace(namespace))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_until_podmend_knows(suite, included, node);
    kubectl(
        suite,
        &["label", "namespace", ignored, "podmend.io/ignore=true"],
    );

    let values = json!({"webhook": {"skipNamespaces": [skipped]}});
    with_values(suite, values, || {
        // The namespaceSelector the chart rendered is the one the API server stores, and
        // matches before anything else (`ShouldCallHook` asks
        // pkg/admission/plugin/webhook/predicates/namespace/matcher.go,
        // `MatchNamespaceSelector`, first, against the namespace's labels, which include
        // `kubernetes.io/metadata.name`).
        let webhook = stored_webhook(suite, "mutatingwebhookconfigurations", "mutate.podmend.io");
        let selector = webhook["namespaceSelector"].to_string();
        for name in ["kube-system", NAMESPACE, skipped, "podmend.io/ignore"] {
            assert!(selector.contains(name), "{name} in {selector}");
        }

        let excluded = ["kube-system", NAMESPACE, ignored, skipped];
        for namespace in excluded {
            wait_until_not_called(suite, namespace);
        }
        assert_never_called(suite, &excluded, included, node);
    });
    // The pods in the shared namespaces go: no kubelet runs on their node.
    for namespace in ["kube-system", NAMESPACE] {
        force_delete_pod(suite, namespace, "mode-excluded-agent");
    }
}

/// Creates the pinned agent in each namespace of `excluded` and asserts it is stored as
/// created and podmend logged no review of it; then creates it in `included`, where it is
/// repaired and logged (the log is written in order, so the earlier creates' lines would be
/// in it by then). Were podmend called for the excluded ones, it would repair them (their
/// node is known) or, for its own excluded namespaces, log them as skipped.
fn assert_never_called(suite: &Suite, excluded: &[&str], included: &str, node: &str) {
    let name = "mode-excluded-agent";
    let since = podmend_log(suite).len();
    for &namespace in excluded {
        kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &pinned_agent(namespace, name, node),
        );
        assert_agent_as_created(&stored_pod(suite, namespace, name), node);
    }
    kubectl_stdin(
        suite,
        &["create", "-f", "-"],
        &pinned_agent(included, name, node),
    );
    let control = stored_pod(suite, included, name);
    assert!(
        control["metadata"]["annotations"]["podmend.io/mutated"].is_string(),
        "{}",
        control["metadata"]
    );
    wait_for_admission_line(suite, included, name);
    let log = podmend_log(suite);
    let new = log.get(since..).unwrap_or_default();
    for &namespace in excluded {
        let lines = admission_lines(new, namespace);
        assert!(
            lines.is_empty(),
            "the API server called podmend for {namespace}: {lines:?}"
        );
    }
}

/// Deletes the pod at once (a pod bound to a node without a kubelet waits for it otherwise).
fn force_delete_pod(suite: &Suite, namespace: &str, name: &str) {
    let output = suite
        .plane
        .kubectl()
        .args(["delete", "pod", name, "-n", namespace])
        .args(["--grace-period=0", "--force", "--wait=false"])
        .output()
        .expect("run kubectl delete");
    assert_success("kubectl delete pod", &output);
}

/// The webhook `name` of the stored webhook configurations of `resource`
/// (`mutatingwebhookconfigurations` or `validatingwebhookconfigurations`); fails unless
/// exactly one has it.
fn stored_webhook(suite: &Suite, resource: &str, name: &str) -> Value {
    let configurations = kubectl_json(suite, &["get", resource, "-o", "json"]);
    let found: Vec<&Value> = configurations["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["webhooks"].as_array().into_iter().flatten())
        .filter(|w| w["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one {name} in {configurations}");
    found[0].clone()
}
