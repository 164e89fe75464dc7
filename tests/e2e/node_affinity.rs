//! `node-affinity` through the real API server and kube-scheduler: a pod pinned with
//! `nodeName` is rewritten only where it keeps what it could do, and is otherwise stored as it
//! was created, with the reason in the warning `kubectl` prints. Each test says what it would
//! see if podmend rewrote every `nodeName` pod, as it did before.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::BIN;
use crate::install::{
    ensure_installed, kubectl, kubectl_json, kubectl_stdin, kubectl_stdin_output,
};
use crate::pinniped::create_node;

/// A namespace of this file's, with its `default` ServiceAccount.
fn namespace(suite: &Suite, name: &str) {
    suite
        .block_on(suite.plane.create_namespace(name))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// kube-scheduler running.
pub fn scheduler(suite: &Suite) {
    suite
        .block_on(suite.plane.ensure_scheduler())
        .unwrap_or_else(|e| panic!("{e}"));
}

/// podmend installed, and a namespace and a node of this name (with `taints`, as
/// [`create_node`] takes them) that podmend's caches hold.
pub fn namespace_and_node(suite: &Suite, name: &str, taints: &str) {
    ensure_installed(suite);
    namespace(suite, name);
    create_node(suite, name, taints);
    wait_until_podmend_knows(suite, name, name);
}

/// A pod `name` in `namespace` pinned to `node`, with `extra` merged into its spec.
pub(crate) fn pinned_pod(namespace: &str, name: &str, node: &str, extra: Value) -> Value {
    let mut spec = json!({"nodeName": node, "terminationGracePeriodSeconds": 0,
                          "containers": [{"name": "c", "image": "busybox"}]});
    for (key, value) in extra.as_object().into_iter().flatten() {
        spec[key] = value.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
           "spec": spec})
}

/// `attempt`'s value once it gives one, polling every 200 ms; fails after `within` with the
/// last reason it gave.
pub fn poll<T>(within: Duration, mut attempt: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("not within {} s: {why}", within.as_secs())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Waits until a server-side dry run of `pod` (through podmend) prints what `done` wants:
/// podmend's caches follow the API server a moment behind, and a test must not race them.
pub fn dry_run_until(suite: &Suite, pod: &Value, done: impl Fn(&str) -> bool) {
    poll(Duration::from_secs(30), || {
        let output = kubectl_stdin_output(suite, &["create", "--dry-run=server", "-f", "-"], pod);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if done(&text) {
            Ok(())
        } else {
            Err(format!(
                "podmend never answered as expected for {pod}: {text}"
            ))
        }
    })
}

/// Waits until podmend's Node cache holds `node` (a dry run no longer says it is not known).
pub fn wait_until_podmend_knows(suite: &Suite, namespace: &str, node: &str) {
    let probe = pinned_pod(namespace, "probe", node, json!({}));
    dry_run_until(suite, &probe, |text| !text.contains("is not known"));
}

/// The stored pod.
pub fn stored(suite: &Suite, namespace: &str, name: &str) -> Value {
    kubectl_json(suite, &["get", "pod", name, "-n", namespace, "-o", "json"])
}

/// Asserts the stored pod is as created: its `nodeName`, no node affinity, not marked mutated.
fn assert_stored_as_created(pod: &Value, node: &str) {
    assert_eq!(
        pod["spec"]["nodeName"], node,
        "nodeName kept: {}",
        pod["spec"]
    );
    assert!(
        pod["spec"]["affinity"]["nodeAffinity"].is_null(),
        "no node affinity added: {}",
        pod["spec"]
    );
    assert!(
        pod["metadata"]["annotations"]["podmend.io/mutated"].is_null(),
        "not marked mutated: {}",
        pod["metadata"]
    );
}

/// The events of `reason` about pod `name` once one exists (60 s at most).
pub fn wait_for_event(suite: &Suite, namespace: &str, name: &str, reason: &str) -> Vec<Value> {
    let selector = format!("involvedObject.name={name},reason={reason}");
    poll(Duration::from_secs(60), || {
        let events = kubectl_json(
            suite,
            &[
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                &selector,
                "-o",
                "json",
            ],
        );
        let items = events["items"].as_array().cloned().unwrap_or_default();
        if items.is_empty() {
            Err(format!("no {reason} event for {name}"))
        } else {
            Ok(items)
        }
    })
}

/// The pod once kube-scheduler bound it (60 s at most).
pub fn wait_until_bound(suite: &Suite, namespace: &str, name: &str) -> Value {
    poll(Duration::from_secs(60), || {
        let pod = stored(suite, namespace, name);
        if pod["spec"]["nodeName"].is_string() {
            Ok(pod)
        } else {
            Err(format!("{name} was not bound: {pod}"))
        }
    })
}

pub fn a_pod_pinned_to_a_node_the_cluster_does_not_have_is_stored_as_created_and_kubectl_says_why(
    suite: &Suite,
) {
    ensure_installed(suite);
    namespace(suite, "na-missing");
    // Before: the pod became affinity to a node that does not exist and waited Pending
    // forever; as created, the pod GC deletes it after 40 s (pkg/controller/podgc).
    let output = kubectl_stdin(
        suite,
        &["create", "-f", "-"],
        &pinned_pod("na-missing", "ghost", "no-such-node", json!({})),
    );
    assert!(
        output.contains("left as is: node no-such-node is not known"),
        "kubectl prints podmend's reason: {output}"
    );
    assert_stored_as_created(&stored(suite, "na-missing", "ghost"), "no-such-node");
}

pub fn an_offline_audit_reports_a_pinned_pod_without_a_patch_until_given_a_cluster_snapshot(
    suite: &Suite,
) {
    create_node(suite, "na-snapshot", "dedicated=ci:NoSchedule");
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(
        &manifest,
        pinned_pod("default", "p", "na-snapshot", json!({})).to_string(),
    )
    .expect("write the manifest");
    let audit = |extra: &[&str]| -> Value {
        let output = std::process::Command::new(BIN)
            .arg("audit")
            .arg(&manifest)
            .args(["-o", "json"])
            .args(extra)
            .output()
            .expect("run podmend audit");
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "audit -o json: {e}: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
    };
    // Without look-ups podmend cannot know the node's taints: a rewrite could leave the pod
    // Pending forever on it. Before, the offline audit rewrote it without the toleration.
    let offline = audit(&[]);
    let finding = &offline["findings"][0];
    assert!(
        finding["message"]
            .as_str()
            .unwrap_or_default()
            .contains("left as is"),
        "{offline}"
    );
    assert!(
        finding["patch"].as_array().is_none_or(Vec::is_empty),
        "no patch: {offline}"
    );

    // The snapshot the real kubectl writes turns the look-ups on: the patch tolerates the
    // node's taint, as the webhook's would.
    let snapshot = kubectl(
        suite,
        &["get", "nodes,namespaces,limitranges", "-A", "-o", "yaml"],
    );
    let snapshot_file = dir.path().join("snapshot.yaml");
    std::fs::write(&snapshot_file, snapshot).expect("write the snapshot");
    let repaired = audit(&["--cluster-snapshot", &snapshot_file.display().to_string()]);
    let patch = repaired["findings"][0]["patch"].to_string();
    assert!(
        patch.contains("/spec/nodeName") && patch.contains("dedicated"),
        "{repaired}"
    );
}

pub fn a_node_under_pressure_is_never_tolerated_so_the_pod_waits_pending_instead_of_being_evicted(
    suite: &Suite,
) {
    scheduler(suite);
    namespace_and_node(
        suite,
        "na-pressure",
        "dedicated=ci:NoSchedule,node.kubernetes.io/disk-pressure:NoSchedule",
    );
    kubectl_stdin(
        suite,
        &["create", "-f", "-"],
        &pinned_pod("na-pressure", "p", "na-pressure", json!({})),
    );
    let pod = stored(suite, "na-pressure", "p");
    let tolerations = pod["spec"]["tolerations"].to_string();
    assert!(
        tolerations.contains("dedicated"),
        "the user taint is tolerated: {tolerations}"
    );
    // Before, disk-pressure was tolerated too: the scheduler bound the pod, the kubelet's
    // eviction admission rejected it (Evicted), and its controller made the next one.
    assert!(!tolerations.contains("disk-pressure"), "{tolerations}");
    let events = wait_for_event(suite, "na-pressure", "p", "FailedScheduling");
    let message = events[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("untolerated taint"),
        "the scheduler says why: {message}"
    );
    assert!(
        stored(suite, "na-pressure", "p")["spec"]["nodeName"].is_null(),
        "Pending, unbound"
    );
}

pub fn pinned_replicas_with_required_anti_affinity_keep_their_node_name(suite: &Suite) {
    namespace_and_node(suite, "na-anti", "");
    // Two replicas pinned side by side with anti-affinity on the hostname: the kubelet never
    // checked inter-pod affinity (pkg/kubelet/lifecycle/predicate.go), so both ran. Rewritten
    // (before), the scheduler enforces it and the second waits Pending forever.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"tier": "agent"}}}]}}});
    for name in ["replica-1", "replica-2"] {
        let mut pod = pinned_pod("na-anti", name, "na-anti", anti.clone());
        pod["metadata"]["labels"]["tier"] = json!("agent");
        let output = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
        assert!(
            output.contains("required pod anti-affinity"),
            "kubectl says why: {output}"
        );
        assert_stored_as_created(&stored(suite, "na-anti", name), "na-anti");
    }
}

pub fn a_pod_for_another_scheduler_keeps_its_node_name(suite: &Suite) {
    namespace_and_node(suite, "na-scheduler", "");
    // Before: rewritten to affinity that only a running "volcano" scheduler could act on.
    let pod = pinned_pod(
        "na-scheduler",
        "p",
        "na-scheduler",
        json!({"schedulerName": "volcano"}),
    );
    let output = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    assert!(
        output.contains("schedulerName volcano"),
        "kubectl says why: {output}"
    );
    assert_stored_as_created(&stored(suite, "na-scheduler", "p"), "na-scheduler");
}

pub fn a_gated_pod_with_a_node_name_gets_the_api_servers_own_refusal(suite: &Suite) {
    namespace_and_node(suite, "na-gated", "");
    // Before: rewritten into a valid gated pod, hiding the client's mistake.
    let pod = pinned_pod(
        "na-gated",
        "p",
        "na-gated",
        json!({"schedulingGates": [{"name": "example.com/wait"}]}),
    );
    let output = kubectl_stdin_output(suite, &["create", "-f", "-"], &pod);
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the API server refused the pod");
    assert!(
        text.contains("cannot be set until all schedulingGates have been cleared"),
        "ValidatePodCreate's message reaches the client: {text}"
    );
}

pub fn a_pinned_pod_with_a_priority_class_is_rewritten_bound_and_told_it_may_preempt(
    suite: &Suite,
) {
    scheduler(suite);
    namespace_and_node(suite, "na-priority", "");
    kubectl_stdin(
        suite,
        &["create", "-f", "-"],
        &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "na-high"}, "value": 1000}),
    );
    let pod = pinned_pod(
        "na-priority",
        "p",
        "na-priority",
        json!({"priorityClassName": "na-high"}),
    );
    let output = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    assert!(
        output.contains("priority class na-high") && output.contains("preempt"),
        "kubectl prints the preemption warning: {output}"
    );
    let bound = wait_until_bound(suite, "na-priority", "p");
    assert_eq!(bound["spec"]["nodeName"], "na-priority");
    assert!(
        bound["spec"]["affinity"]["nodeAffinity"].is_object(),
        "{}",
        bound["spec"]
    );
}

pub fn a_toleration_the_namespace_whitelist_would_refuse_is_never_added(suite: &Suite) {
    ensure_installed(suite);
    scheduler(suite);
    create_node(suite, "na-whitelist", "dedicated=ci:NoSchedule");
    let whitelisted = |name: &str, allowed: Value| {
        namespace(suite, name);
        kubectl(
            suite,
            &[
                "annotate",
                "namespace",
                name,
                &format!("scheduler.alpha.kubernetes.io/tolerationsWhitelist={allowed}"),
            ],
        );
    };
    // Every pod gets the DefaultTolerationSeconds plugin's NoExecute tolerations before the
    // webhooks run, so a whitelist that admits any pod names them.
    let with_defaults = |allowed: Value| {
        json!([
            allowed,
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
        ])
    };
    whitelisted(
        "na-refusing",
        with_defaults(json!({"key": "other", "operator": "Exists"})),
    );
    whitelisted(
        "na-allowing",
        with_defaults(json!({"key": "dedicated", "operator": "Exists"})),
    );

    // The control plane runs PodTolerationRestriction: before, podmend added a toleration
    // for `dedicated`, and the plugin refused the pod (403) after every webhook.
    let refused = pinned_pod("na-refusing", "p", "na-whitelist", json!({}));
    dry_run_until(suite, &refused, |text| {
        text.contains("tolerationsWhitelist")
    });
    let output = kubectl_stdin(suite, &["create", "-f", "-"], &refused);
    assert!(
        output.contains("tolerationsWhitelist"),
        "kubectl says why: {output}"
    );
    assert_stored_as_created(&stored(suite, "na-refusing", "p"), "na-whitelist");

    let allowed = pinned_pod("na-allowing", "p", "na-whitelist", json!({}));
    dry_run_until(suite, &allowed, |text| {
        text.contains("became required node affinity")
    });
    kubectl_stdin(suite, &["create", "-f", "-"], &allowed);
    let bound = wait_until_bound(suite, "na-allowing", "p");
    assert!(
        bound["spec"]["tolerations"]
            .to_string()
            .contains("dedicated"),
        "{}",
        bound["spec"]
    );
}
