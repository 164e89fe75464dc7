//! Pod templates through the real API server and controllers: podmend warns about a template
//! (the chart's default `templates: warn`) and repairs the pods its controller makes, so the
//! workload object is stored as its owner wrote it and the controller that owns it never
//! fights the webhook.

use std::time::Duration;

use serde_json::{Value, json};

use crate::Suite;
use crate::install::{assert_success, kubectl, kubectl_json, kubectl_stdin, with_values};
use crate::modes::{admission_lines, podmend_log};
use crate::node_affinity::{
    namespace_and_node, poll, scheduler, wait_for_event, wait_until_podmend_knows,
};

/// A pod template labelled `app`, pinned to `node` with `spec.nodeName`.
fn pinned_template(app: &str, node: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "busybox",
                                    "resources": {"requests": {"cpu": "10m"}}}]}})
}

/// `kubectl get KIND -n NAMESPACE -l app=APP` items.
fn items(suite: &Suite, kind: &str, namespace: &str, app: &str) -> Vec<Value> {
    let list = kubectl_json(
        suite,
        &[
            "get",
            kind,
            "-n",
            namespace,
            "-l",
            &format!("app={app}"),
            "-o",
            "json",
        ],
    );
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The stored object.
fn stored(suite: &Suite, kind: &str, namespace: &str, name: &str) -> Value {
    kubectl_json(suite, &["get", kind, name, "-n", namespace, "-o", "json"])
}

/// Asserts the stored workload's template is as its owner wrote it: its nodeName, no
/// affinity, and no `podmend.io/mutated` on the object or its template.
fn assert_template_as_written(workload: &Value, node: &str) {
    let template = &workload["spec"]["template"];
    assert_eq!(
        template["spec"]["nodeName"], node,
        "nodeName kept: {}",
        template["spec"]
    );
    assert!(
        template["spec"]["affinity"].is_null(),
        "no affinity: {}",
        template["spec"]
    );
    for metadata in [&workload["metadata"], &template["metadata"]] {
        assert!(
            metadata["annotations"]["podmend.io/mutated"].is_null(),
            "not marked mutated: {metadata}"
        );
    }
}

/// The pods labelled `app=APP` once `done` holds for them (60 s at most).
fn wait_for_pods(
    suite: &Suite,
    namespace: &str,
    app: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    poll(Duration::from_secs(60), || {
        let pods = items(suite, "pods", namespace, app);
        if done(&pods) {
            Ok(pods)
        } else {
            Err(format!(
                "the pods of {app}: {}\n{}",
                Value::from(pods.clone()),
                kubectl(suite, &["get", "all,events", "-n", namespace])
            ))
        }
    })
}

/// Whether kube-scheduler bound the pod (it has a nodeName now) after podmend repaired it.
fn repaired_and_bound(pod: &Value, node: &str) -> bool {
    pod["spec"]["nodeName"] == node
        && pod["metadata"]["annotations"]["podmend.io/mutated"]
            .as_str()
            .is_some_and(|rules| rules.contains("node-affinity"))
}

/// The one required node selector term that pins a pod to `node`.
fn pinned_to(node: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]})
}

pub fn a_deployment_pinned_by_node_name_is_warned_about_on_create_and_update_never_mutated_and_its_pods_are_repaired(
    suite: &Suite,
) {
    let ns = "tpl-deployment";
    scheduler(suite);
    namespace_and_node(suite, ns, "");
    let app = "pinned-app";
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                 "template": pinned_template(app, ns)}});
    // Without podmend: no warning, and the pods keep nodeName (bound by the API server
    // itself, never by the scheduler, and never marked mutated).
    let printed = kubectl_stdin(suite, &["create", "-f", "-"], &deployment);
    let warning = format!(
        "Warning: podmend node-affinity would repair: spec.nodeName={ns} became required node affinity"
    );
    assert!(printed.contains(&warning), "warned on CREATE: {printed}");
    assert_template_as_written(&stored(suite, "deployment", ns, app), ns);
    let pods = wait_for_pods(suite, ns, app, |pods| {
        !pods.is_empty() && pods.iter().all(|p| repaired_and_bound(p, ns))
    });
    assert_eq!(pods.len(), 1, "{}", Value::from(pods.clone()));
    assert_eq!(
        pods[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        pinned_to(ns)
    );
    assert_replica_sets_as_written(suite, ns, app, 1);

    // A template change: warned on UPDATE, stored as written.
    let stderr = patch_template_labels(suite, "deployment", ns, app);
    assert!(stderr.contains(&warning), "warned on UPDATE: {stderr}");
    let updated = stored(suite, "deployment", ns, app);
    assert_template_as_written(&updated, ns);
    assert_eq!(
        updated["spec"]["template"]["metadata"]["labels"]["revision"],
        "2"
    );

    // The controller made one ReplicaSet per template it was given, and none since: it finds
    // each ReplicaSet it made by comparing its template with the Deployment's
    // (pkg/controller/deployment/util/deployment_util.go, FindNewReplicaSet, EqualIgnoreHash),
    // so a ReplicaSet whose template a webhook changed would be replaced by another, and that
    // one too, without end.
    wait_for_pods(suite, ns, app, |pods| {
        pods.iter()
            .any(|p| p["metadata"]["labels"]["revision"] == "2" && repaired_and_bound(p, ns))
    });
    assert_replica_sets_as_written(suite, ns, app, 2);
    let deployment = stored(suite, "deployment", ns, app);
    assert_eq!(
        deployment["status"]["observedGeneration"], deployment["metadata"]["generation"],
        "the controller has seen the last template: {}",
        deployment["status"]
    );
}

/// Adds the label `revision: "2"` to the template of the `kind` object `name` with
/// `kubectl patch`, which must succeed; what kubectl printed on stderr (its warnings).
fn patch_template_labels(suite: &Suite, kind: &str, namespace: &str, name: &str) -> String {
    let output = suite
        .plane
        .kubectl()
        .args([
            "patch", kind, name, "-n", namespace, "--type", "merge", "-p",
        ])
        .arg(r#"{"spec":{"template":{"metadata":{"labels":{"revision":"2"}}}}}"#)
        .output()
        .expect("run kubectl patch");
    assert_success(&format!("kubectl patch {kind} {name}"), &output);
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts the Deployment `app` has `count` ReplicaSets, each with its template as written.
fn assert_replica_sets_as_written(suite: &Suite, namespace: &str, app: &str, count: usize) {
    let replica_sets = items(suite, "replicasets", namespace, app);
    assert_eq!(
        replica_sets.len(),
        count,
        "one ReplicaSet per template: {}",
        Value::from(replica_sets.clone())
    );
    for replica_set in &replica_sets {
        assert_template_as_written(replica_set, namespace);
    }
}

pub fn a_daemon_sets_pod_keeps_the_daemon_set_controllers_own_node_affinity_and_is_bound_by_the_scheduler(
    suite: &Suite,
) {
    let ns = "tpl-daemonset";
    scheduler(suite);
    namespace_and_node(suite, ns, "");
    let app = "node-agent";
    let daemon_set = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": app, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": app}},
                 "template": pinned_template(app, ns)}});
    let printed = kubectl_stdin(suite, &["create", "-f", "-"], &daemon_set);
    assert!(
        printed.contains("Warning: podmend node-affinity would repair: "),
        "warned on CREATE: {printed}"
    );
    assert_template_as_written(&stored(suite, "daemonset", ns, app), ns);

    // The controller runs the pod only on the node its template names
    // (pkg/controller/daemon/daemon_controller.go, predicates: fitsNodeName), and pins each
    // pod it makes with required node affinity on the node's name
    // (pkg/controller/daemon/util/daemonset_util.go, ReplaceDaemonSetPodNodeNameNodeAffinity),
    // keeping the template's nodeName. podmend removes the nodeName and adds nothing: the
    // controller's term already holds the node. Without podmend the pod would be stored
    // with its nodeName, bound without the scheduler and not marked mutated.
    let pods = wait_for_pods(suite, ns, app, |pods| {
        !pods.is_empty() && pods.iter().all(|p| repaired_and_bound(p, ns))
    });
    assert_eq!(pods.len(), 1, "one pod: {}", Value::from(pods.clone()));
    let pod = &pods[0];
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        pinned_to(ns),
        "the controller's own term, and nothing added to it"
    );
    // The controller's tolerations are node.kubernetes.io/* (AddOrUpdateDaemonPodTolerations);
    // podmend adds none for them.
    let tolerations = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        tolerations.iter().all(|t| t["key"]
            .as_str()
            .is_some_and(|k| k.starts_with("node.kubernetes.io/"))),
        "{}",
        pod["spec"]["tolerations"]
    );
    assert_bound_by_the_scheduler(suite, ns, pod);
    // The controller counts the pod as its node's (GetTargetNodeName reads the affinity once
    // nodeName is gone) and makes no other.
    let daemon_set = wait_until_daemon_set_counted(suite, ns, app);
    assert_eq!(daemon_set["status"]["desiredNumberScheduled"], 1);
    assert_eq!(items(suite, "pods", ns, app).len(), 1);
}

/// Asserts kube-scheduler reported binding `pod` (a `Scheduled` event from
/// `default-scheduler`).
fn assert_bound_by_the_scheduler(suite: &Suite, namespace: &str, pod: &Value) {
    let name = pod["metadata"]["name"].as_str().expect("name");
    let events = wait_for_event(suite, namespace, name, "Scheduled");
    assert!(
        events
            .iter()
            .any(|e| e["reportingComponent"] == "default-scheduler"),
        "kube-scheduler bound {name}: {events:?}"
    );
}

/// The DaemonSet `name` once its controller has seen its last generation and counts one pod
/// scheduled (30 s at most).
fn wait_until_daemon_set_counted(suite: &Suite, namespace: &str, name: &str) -> Value {
    poll(Duration::from_secs(30), || {
        let stored = stored(suite, "daemonset", namespace, name);
        if stored["status"]["currentNumberScheduled"] == 1
            && stored["status"]["observedGeneration"] == stored["metadata"]["generation"]
        {
            Ok(stored)
        } else {
            Err(format!("{}", stored["status"]))
        }
    })
}

/// A suspended Job pinned to `node`: it makes no pods, and the scheduling directives of its
/// template stay mutable until it first starts.
fn suspended_job(namespace: &str, name: &str, node: &str) -> Value {
    let mut template = pinned_template(name, node);
    template["spec"]["restartPolicy"] = json!("Never");
    json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suspend": true, "template": template}})
}

pub fn a_jobs_template_on_update_is_left_alone_even_with_templates_enforced_by_the_chart(
    suite: &Suite,
) {
    let ns = "tpl-job";
    scheduler(suite);
    namespace_and_node(suite, ns, "");
    // Created while templates are only warned about: stored with its nodeName.
    let printed = kubectl_stdin(
        suite,
        &["create", "-f", "-"],
        &suspended_job(ns, "before", ns),
    );
    assert!(printed.contains("would repair"), "{printed}");

    let enforce = json!({"rules": {"nodeAffinity": {"templates": "enforce"}}});
    with_values(suite, enforce, || {
        wait_until_podmend_knows(suite, ns, ns);
        // Templates are repaired on CREATE now: the chart's value took effect.
        kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &suspended_job(ns, "after", ns),
        );
        let after = stored(suite, "job", ns, "after");
        assert!(
            after["spec"]["template"]["spec"]["nodeName"].is_null(),
            "{}",
            after["spec"]["template"]
        );
        assert_eq!(
            after["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            pinned_to(ns)
        );

        // A Job's template is immutable but for the scheduling directives of a suspended Job
        // that never started (pkg/apis/batch/validation/validation.go, ValidateJobSpecUpdate
        // with JobValidationOptions.AllowMutableSchedulingDirectives): nodeName is not one.
        // Had podmend rewritten the template on this UPDATE, the API server would refuse the
        // update as a change of an immutable field.
        let since = podmend_log(suite).len();
        let stderr = patch_template_labels(suite, "job", ns, "before");
        assert!(!stderr.contains("podmend"), "{stderr}");
        let before = stored(suite, "job", ns, "before");
        assert_eq!(
            before["spec"]["template"]["metadata"]["labels"]["revision"],
            "2"
        );
        assert_template_as_written(&before, ns);
        // The API server did send the UPDATE (the chart's rules take Jobs on UPDATE), and
        // podmend left it alone on purpose.
        let line = review_of_update(suite, ns, "before", since);
        assert!(line.contains("skipped=\"operation\""), "{line}");
    });
}

/// podmend's log line about the UPDATE of `name` in `namespace`, logged after byte `since`
/// of its log (10 s at most).
fn review_of_update(suite: &Suite, namespace: &str, name: &str, since: usize) -> String {
    let wanted = format!(" name={name} ");
    poll(Duration::from_secs(10), || {
        let log = podmend_log(suite);
        admission_lines(log.get(since..).unwrap_or_default(), namespace)
            .into_iter()
            .find(|line| line.contains(&wanted) && line.contains("operation=\"UPDATE\""))
            .map(str::to_string)
            .ok_or_else(|| format!("no review of the update of {name} in:\n{log}"))
    })
}
