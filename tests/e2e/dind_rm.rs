//! dind-rm through the real API server: the API server calls podmend, applies its patch, and
//! then runs its own admission plugins on the repaired pod, ResourceQuota among them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Suite;
use crate::install::{
    ensure_installed, kubectl_json, kubectl_stdin, kubectl_stdin_output, with_config,
};

/// A GitLab-style DinD pod (TCP-only daemon, the job's client on `tcp://localhost:2375`),
/// every container of its own with cpu and memory limits, as a namespace whose quota covers
/// `limits.cpu` requires.
fn dind_pod(name: &str) -> Value {
    let limits = json!({"limits": {"cpu": "500m", "memory": "256Mi"}});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [
            {"name": "build", "image": "docker:27-cli", "command": ["sh", "-c", "docker info"],
             "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}],
             "resources": limits},
            {"name": "dind", "image": "docker:27-dind",
             "securityContext": {"privileged": true},
             "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}],
             "resources": limits}
        ]}
    })
}

/// Creates `namespace` with a ResourceQuota on `limits.cpu` and `limits.memory`, and waits
/// until the quota controller has written its `status.hard`: the quota admission plugin
/// (`k8s.io/apiserver` `pkg/admission/plugin/resourcequota/controller.go`, `checkRequest`)
/// checks a pod's containers only against a quota whose status is known.
fn namespace_with_limits_quota(suite: &Suite, namespace: &str) {
    suite
        .block_on(suite.plane.create_namespace(namespace))
        .unwrap_or_else(|e| panic!("{e}"));
    let quota = json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "ci-limits"},
        "spec": {"hard": {"limits.cpu": "8", "limits.memory": "8Gi"}}
    });
    let printed = kubectl_stdin(suite, &["create", "-n", namespace, "-f", "-"], &quota);
    assert!(
        printed.contains("created"),
        "kubectl create quota: {printed}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stored = kubectl_json(
            suite,
            &[
                "get",
                "resourcequota",
                "ci-limits",
                "-n",
                namespace,
                "-o",
                "json",
            ],
        );
        if stored["status"]["hard"]["limits.cpu"].is_string() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the quota controller did not compute the quota's status: {stored:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A namespace whose ResourceQuota covers `limits.cpu` refuses a pod with a container
/// without a cpu limit (`pkg/quota/v1/evaluator/core/pods.go`, `podEvaluator.Constraints`,
/// which checks init containers too, so the native-sidecar guard counts). With the guard's
/// cpu limit turned off the API server refuses the repaired pod, naming the guard; with the
/// default one it stores it, the guard's limit as configured.
pub fn a_dind_pod_in_a_namespace_whose_quota_covers_cpu_limits_is_admitted_with_its_guard(
    suite: &Suite,
) {
    ensure_installed(suite);
    let namespace = "dind-quota";
    namespace_with_limits_quota(suite, namespace);
    let refused = with_config(
        suite,
        |config| config["rules"]["dind-rm"]["guardCpuLimit"] = json!(""),
        || {
            kubectl_stdin_output(
                suite,
                &["create", "-n", namespace, "-f", "-"],
                &dind_pod("no-guard-limit"),
            )
        },
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("must specify limits.cpu for: podmend-guard"),
        "without a cpu limit the guard's pod should be refused by the quota: {stderr}"
    );

    let printed = kubectl_stdin(
        suite,
        &["create", "-n", namespace, "-f", "-"],
        &dind_pod("guarded"),
    );
    assert!(printed.contains("created"), "kubectl create: {printed}");
    let stored = kubectl_json(
        suite,
        &["get", "pod", "guarded", "-n", namespace, "-o", "json"],
    );
    let guard = stored["spec"]["initContainers"]
        .as_array()
        .and_then(|init| init.iter().find(|c| c["name"] == "podmend-guard"))
        .unwrap_or_else(|| panic!("no guard in the stored pod: {stored:#}"));
    assert_eq!(guard["resources"]["limits"]["cpu"], "1", "{guard:#}");
}
