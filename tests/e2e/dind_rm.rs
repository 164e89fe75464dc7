//! dind-rm through the real API server: the API server calls podmend, applies its patch, and
//! then runs its own admission plugins on the repaired pod, ResourceQuota among them.

use std::time::{Duration, Instant};

use podmend::dind::GUARD_CONTAINER;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::dind::{
    CI_PODS, CiPod, all_containers, argv, container, env_value, fixture_pod, guard, guard_command,
};
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

/// GitLab's and ARC's pods among the fast tier's [`CI_PODS`], or the others (Jenkins, Argo
/// Workflows, Tekton).
fn ci_pods(gitlab_and_arc: bool) -> Vec<&'static CiPod> {
    CI_PODS
        .iter()
        .filter(|pod| {
            (pod.fixture.starts_with("gitlab") || pod.fixture.starts_with("arc")) == gitlab_and_arc
        })
        .collect()
}

/// Each real CI pod created through the API server is stored (so the API server's own
/// validation accepted the repaired pod: the create handler runs the mutating admission before
/// the registry's `Store.Create`, whose `rest.BeforeCreate` runs the pod strategy's `Validate`;
/// `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go`, `createHandler`, and
/// `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`) with the
/// guard first among the init containers, a native sidecar listening where the daemon
/// listened and forwarding to the daemon's private socket, the daemon on that socket only, and
/// every client's `DOCKER_HOST` as it was. Without podmend the stored pod has no guard and the
/// daemon listens on the clients' address itself.
pub fn gitlab_and_arc_dind_pods_are_stored_with_the_guard_in_the_daemons_place(suite: &Suite) {
    assert_stored_with_the_guard(suite, "dind-ci-pods", &ci_pods(true));
}

/// Jenkins', Argo Workflows' and Tekton's DinD pods (the rest of the fast tier's
/// [`CI_PODS`]), through the API server as GitLab's and ARC's are: stored, so valid to
/// the API server, with the guard where the daemon listened.
pub fn jenkins_argo_and_tekton_dind_pods_are_stored_with_the_guard_in_the_daemons_place(
    suite: &Suite,
) {
    assert_stored_with_the_guard(suite, "dind-more-ci-pods", &ci_pods(false));
}

/// Creates each of `cases` in `namespace` through the API server and checks the stored pod.
fn assert_stored_with_the_guard(suite: &Suite, namespace: &str, cases: &[&CiPod]) {
    ensure_installed(suite);
    suite
        .block_on(suite.plane.create_namespace(namespace))
        .unwrap_or_else(|e| panic!("{e}"));
    for (i, case) in cases.iter().enumerate() {
        let context = case.fixture;
        let name = format!("ci-{i}");
        let mut pod = fixture_pod(case.fixture, &name);
        pod["metadata"]["namespace"] = json!(namespace);
        let printed = kubectl_stdin(suite, &["create", "-f", "-"], &pod);
        assert!(printed.contains("created"), "{context}: {printed}");
        let stored = kubectl_json(suite, &["get", "pod", &name, "-n", namespace, "-o", "json"]);
        let spec = &stored["spec"];
        assert!(
            stored["metadata"]["annotations"]["podmend.io/mutated"]
                .as_str()
                .is_some_and(|rules| rules.split(',').any(|rule| rule == "dind-rm")),
            "{context}: {}",
            stored["metadata"]
        );
        let guards = all_containers(spec)
            .iter()
            .filter(|c| c["name"] == GUARD_CONTAINER)
            .count();
        assert_eq!(guards, 1, "{context}: {spec:#}");
        assert_eq!(
            spec["initContainers"][0]["name"], GUARD_CONTAINER,
            "{context}"
        );
        assert_eq!(guard(spec)["restartPolicy"], "Always", "{context}");
        let command = guard_command(spec);
        let listen: Vec<String> = command.listen.iter().map(ToString::to_string).collect();
        assert_eq!(listen, case.listen, "{context}");
        assert_eq!(
            command.upstream.to_string(),
            "unix:///podmend/daemon/docker.sock",
            "{context}"
        );
        assert_eq!(
            argv(container(spec, case.daemon)),
            case.daemon_argv,
            "{context}"
        );
        for client in all_containers(&pod["spec"]) {
            let client_name = client["name"].as_str().unwrap_or_default();
            if client_name == case.daemon {
                continue;
            }
            assert_eq!(
                env_value(container(spec, client_name), "DOCKER_HOST"),
                env_value(client, "DOCKER_HOST"),
                "{context}: {client_name}'s DOCKER_HOST"
            );
        }
    }
}
