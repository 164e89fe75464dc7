//! The `dind-rm` rule through the engine, on real Docker-in-Docker pods (Jenkins
//! kubernetes-plugin examples, actions-runner-controller runners): the patch the webhook
//! returns is applied, and the result must be a valid pod whose docker clients all go through
//! podmend-guard to the daemon they used before.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use podmend::cluster::StaticCluster;
use podmend::config::{Config, Mode};
use podmend::dind::GUARD_CONTAINER;
use podmend::engine::{Engine, MUTATED_ANNOTATION, Operation, Outcome, Subject};
use podmend::rules::dind_rm::{GUARD_DOCKER_HOST, SOCKET_DIR, SOCKET_VOLUME};
use serde_json::{Value, json};

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn yaml_fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_path(name)).expect("fixture readable");
    serde_yaml_ng::from_str(&text).expect("fixture is YAML")
}

/// The fixture as a Pod named `name` in `ci`: a pod template or a bare Pod, labels kept.
fn pod_from_fixture(file: &str, name: &str) -> Value {
    let document = yaml_fixture(file);
    let (metadata, spec) = match document.get("template") {
        Some(template) => (template.get("metadata"), &template["spec"]),
        None => (document.get("metadata"), &document["spec"]),
    };
    let mut metadata = metadata.cloned().unwrap_or_else(|| json!({}));
    metadata["name"] = json!(name);
    metadata["namespace"] = json!("ci");
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

fn engine() -> Engine {
    Engine::new(&Config::default())
}

fn review_as(engine: &Engine, group: &str, kind: &str, object: &Value) -> Outcome {
    let subject = Subject {
        operation: Operation::Create,
        group,
        kind,
        sub_resource: "",
        namespace: "ci",
        object: Some(object),
        old_object: None,
    };
    engine.review(&subject, &StaticCluster::empty())
}

fn review(object: &Value) -> Outcome {
    review_as(&engine(), "", "Pod", object)
}

fn apply(object: &Value, patch: &[json_patch::PatchOperation]) -> Value {
    let mut patched = object.clone();
    json_patch::patch(&mut patched, patch).expect("the patch applies");
    patched
}

fn all_containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .collect()
}

fn guard(spec: &Value) -> &Value {
    all_containers(spec)
        .into_iter()
        .find(|c| c["name"] == GUARD_CONTAINER)
        .expect("podmend-guard injected")
}

fn arg_after<'a>(container: &'a Value, flag: &str) -> &'a str {
    let args = container["args"].as_array().expect("guard args");
    let i = args.iter().position(|a| a == flag).expect(flag);
    args[i + 1].as_str().expect("string")
}

fn mounts(container: &Value) -> Vec<(String, String)> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_string(),
                m["mountPath"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn docker_host(container: &Value) -> Option<&str> {
    container["env"]
        .as_array()?
        .iter()
        .rfind(|e| e["name"] == "DOCKER_HOST")?["value"]
        .as_str()
}

/// The API server's structural checks on names, volumes and mounts that the rule could break.
fn check_volumes_and_names(spec: &Value) {
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(
        volumes.iter().collect::<BTreeSet<_>>().len(),
        volumes.len(),
        "duplicate volume names: {volumes:?}"
    );
    let containers = all_containers(spec);
    let names: BTreeSet<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names.len(), containers.len(), "duplicate container names");
    for container in containers {
        let mut paths = BTreeSet::new();
        for (volume, path) in mounts(container) {
            assert!(
                volumes.contains(&volume.as_str()),
                "{}: mount of unknown volume {volume}",
                container["name"]
            );
            assert!(
                paths.insert(path.trim_end_matches('/').to_string()),
                "{}: two mounts at {path}",
                container["name"]
            );
        }
    }
}

struct Case {
    fixture: &'static str,
    /// Containers that must get `DOCKER_HOST`, in pod order.
    clients: &'static [&'static str],
    upstream: &'static str,
    /// The guard's mounts besides its own socket volume.
    guard_mounts: &'static [(&'static str, &'static str)],
    /// The volume of the node's Docker socket that the clients must lose.
    host_socket: Option<&'static str>,
}

const CASES: &[Case] = &[
    Case {
        fixture: "jenkins-k8s-plugin-example-dind-pod-template.yaml",
        clients: &["docker"],
        upstream: "unix:///var/run/docker.sock",
        guard_mounts: &[("docker-socket", "/var/run")],
        host_socket: None,
    },
    Case {
        fixture: "jenkins-k8s-plugin-example-dood-pod-template.yaml",
        clients: &["docker"],
        upstream: "unix:///var/run/docker.sock",
        guard_mounts: &[("dockersock", "/var/run/docker.sock")],
        host_socket: Some("dockersock"),
    },
    Case {
        fixture: "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        clients: &["init-dind-externals", "runner"],
        upstream: "unix:///var/run/docker.sock",
        guard_mounts: &[("dind-sock", "/var/run")],
        host_socket: None,
    },
    Case {
        fixture: "arc-legacy-summerwind-runner-pod-docker-dind-sidecar-reconstructed.yaml",
        clients: &["runner"],
        upstream: "unix:///run/docker.sock",
        guard_mounts: &[("var-run", "/run")],
        host_socket: None,
    },
];

#[test]
fn every_dind_fixture_gets_a_guard_between_its_clients_and_its_daemon() {
    let mut repaired = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let pod = pod_from_fixture(case.fixture, &format!("dind-{i}"));
        let outcome = review(&pod);
        let finding = outcome
            .findings
            .iter()
            .find(|f| f.rule == "dind-rm")
            .unwrap_or_else(|| panic!("{}: no dind-rm finding", case.fixture));
        assert_eq!(finding.mode, Mode::Enforce);
        assert!(
            finding.messages.iter().all(|m| m.chars().count() <= 120),
            "{:?}",
            finding.messages
        );
        assert!(!outcome.patch.is_empty(), "{}", case.fixture);
        let patched = apply(&pod, &outcome.patch);
        let spec = &patched["spec"];
        let context = case.fixture;

        // The guard: first init container, a native sidecar, forwarding to the old daemon.
        assert_eq!(
            spec["initContainers"][0]["name"], GUARD_CONTAINER,
            "{context}"
        );
        let guard = guard(spec);
        assert_eq!(guard["restartPolicy"], "Always", "{context}");
        assert_eq!(arg_after(guard, "--listen"), GUARD_DOCKER_HOST, "{context}");
        assert_eq!(arg_after(guard, "--upstream"), case.upstream, "{context}");
        assert_eq!(arg_after(guard, "--policy"), "rm", "{context}");
        let mut expected_mounts: Vec<(String, String)> = case
            .guard_mounts
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect();
        expected_mounts.push((SOCKET_VOLUME.to_string(), SOCKET_DIR.to_string()));
        let mut guard_mounts = mounts(guard);
        guard_mounts.sort();
        expected_mounts.sort();
        assert_eq!(guard_mounts, expected_mounts, "{context}");

        // DOCKER_HOST on exactly the clients, each with the guard's socket mounted.
        let with_docker_host: Vec<&str> = all_containers(spec)
            .into_iter()
            .filter(|c| docker_host(c).is_some())
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(with_docker_host, case.clients, "{context}");
        for container in all_containers(spec) {
            let name = container["name"].as_str().unwrap_or_default();
            if case.clients.contains(&name) {
                assert_eq!(docker_host(container), Some(GUARD_DOCKER_HOST), "{context}");
                assert!(
                    mounts(container)
                        .contains(&(SOCKET_VOLUME.to_string(), SOCKET_DIR.to_string())),
                    "{context}: {name}"
                );
                if let Some(host_socket) = case.host_socket {
                    assert!(
                        mounts(container).iter().all(|(v, _)| v != host_socket),
                        "{context}: {name} still mounts the host socket"
                    );
                }
            } else if name != GUARD_CONTAINER {
                // The daemon is untouched.
                let original = all_containers(&pod["spec"])
                    .into_iter()
                    .find(|c| c["name"] == name)
                    .expect("same container before");
                assert_eq!(container, original, "{context}: {name}");
            }
        }
        assert!(
            spec["volumes"]
                .as_array()
                .expect("volumes")
                .contains(&json!({"name": SOCKET_VOLUME, "emptyDir": {}})),
            "{context}"
        );
        assert_eq!(
            patched["metadata"]["annotations"][MUTATED_ANNOTATION], "dind-rm",
            "{context}"
        );
        check_volumes_and_names(spec);
        let errors = common::k8s_rules::validate_pod_spec(spec);
        assert!(errors.is_empty(), "{context}: {errors:#?}");
        let errors = common::k8s_rules::validate_object(&patched);
        assert!(errors.is_empty(), "{context}: {errors:#?}");

        // The API server may call the webhook again: nothing more to do.
        let again = review(&patched);
        assert!(again.patch.is_empty(), "{context}: {:?}", again.patch);
        assert!(again.findings.is_empty(), "{context}: {:?}", again.findings);
        repaired.push(patched);
    }
    common::schema::validate_with_schema(&repaired, true).expect("repaired pods pass the schema");
}

#[test]
fn the_host_socket_stays_with_the_clients_when_the_rule_only_warns() {
    let mut config = Config::default();
    config.rules.dind_rm.mode = Mode::Warn;
    let pod = pod_from_fixture("jenkins-k8s-plugin-example-dood-pod-template.yaml", "dood");
    let outcome = review_as(&Engine::new(&config), "", "Pod", &pod);
    assert!(outcome.patch.is_empty());
    assert_eq!(outcome.findings.len(), 1);
    assert_eq!(outcome.findings[0].mode, Mode::Warn);
    assert!(
        outcome.findings[0]
            .messages
            .iter()
            .any(|m| m == "moved the host Docker socket mount from docker to podmend-guard"),
        "{:?}",
        outcome.findings[0].messages
    );
    // The audit's repair is the same as enforce's.
    assert_eq!(outcome.repair, review(&pod).patch);
}

#[test]
fn container_mode_appends_the_guard_as_a_plain_container() {
    let mut config = Config::default();
    config.rules.dind_rm.sidecar_mode = podmend::config::SidecarMode::Container;
    let pod = pod_from_fixture(
        "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        "arc",
    );
    let outcome = review_as(&Engine::new(&config), "", "Pod", &pod);
    let patched = apply(&pod, &outcome.patch);
    let spec = &patched["spec"];
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(
        containers.last().expect("a container")["name"],
        GUARD_CONTAINER
    );
    assert!(
        containers
            .last()
            .expect("guard")
            .get("restartPolicy")
            .is_none()
    );
    // The init container runs before a plain guard exists: it keeps its environment.
    assert_eq!(spec["initContainers"], pod["spec"]["initContainers"]);
    check_volumes_and_names(spec);
    assert!(common::k8s_rules::validate_pod_spec(spec).is_empty());
    assert!(
        review_as(&Engine::new(&config), "", "Pod", &patched)
            .patch
            .is_empty()
    );
}

#[test]
fn a_jenkins_agent_with_dind_is_repaired_in_one_pass() {
    // agent-requests zeroes the guard's requests in the same pass, so a reinvocation finds
    // nothing left to do.
    let mut pod = pod_from_fixture("jenkins-k8s-plugin-example-dind-pod-template.yaml", "agent");
    pod["metadata"]["labels"] = json!({"jenkins/label": "dind"});
    let first = review(&pod);
    let rules: Vec<&str> = first.findings.iter().map(|f| f.rule).collect();
    assert_eq!(rules, vec!["dind-rm", "agent-requests"]);
    let patched = apply(&pod, &first.patch);
    let guard = guard(&patched["spec"]);
    assert_eq!(
        guard["resources"],
        json!({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "10m", "memory": "128Mi"}})
    );
    let second = review(&patched);
    assert!(second.patch.is_empty(), "{:?}", second.patch);
    assert!(common::k8s_rules::validate_object(&patched).is_empty());
}

#[test]
fn a_dind_template_is_warned_about_and_the_audit_repair_is_valid() {
    let pod = pod_from_fixture(
        "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        "runner",
    );
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "runner", "namespace": "ci"},
        "spec": {"selector": {"matchLabels": {"app": "runner"}},
            "template": {"metadata": {"labels": {"app": "runner"}}, "spec": pod["spec"]}}});
    let outcome = review_as(&engine(), "apps", "Deployment", &deployment);
    assert!(outcome.patch.is_empty());
    assert_eq!(outcome.findings.len(), 1);
    assert_eq!(outcome.findings[0].mode, Mode::Warn);
    let repaired = apply(&deployment, &outcome.repair);
    let spec = &repaired["spec"]["template"]["spec"];
    assert_eq!(
        arg_after(guard(spec), "--upstream"),
        "unix:///var/run/docker.sock"
    );
    check_volumes_and_names(spec);
    assert!(common::k8s_rules::validate_object(&repaired).is_empty());
    common::schema::validate_with_schema(&[repaired], true).expect("schema");
}

#[test]
fn the_policy_annotation_reaches_the_guard_or_turns_the_rule_off() {
    let mut pod = pod_from_fixture(
        "arc-legacy-summerwind-runner-pod-docker-dind-sidecar-reconstructed.yaml",
        "runner",
    );
    pod["metadata"]["annotations"] = json!({"podmend.io/dind-policy": "deny"});
    let patched = apply(&pod, &review(&pod).patch);
    assert_eq!(arg_after(guard(&patched["spec"]), "--policy"), "deny");
    pod["metadata"]["annotations"] = json!({"podmend.io/dind-policy": "off"});
    let outcome = review(&pod);
    assert!(outcome.patch.is_empty());
    assert!(outcome.findings.is_empty());
}

#[test]
fn a_pod_without_docker_gets_no_patch() {
    let text = std::fs::read_to_string(fixture_path(
        "admissionreview-v1-pod-create-gke-kube-rs.json",
    ))
    .expect("fixture readable");
    let review_json: Value = serde_json::from_str(&text).expect("JSON");
    let pod = &review_json["request"]["object"];
    let outcome = review(pod);
    assert!(outcome.patch.is_empty(), "{:?}", outcome.patch);
    assert!(outcome.findings.is_empty(), "{:?}", outcome.findings);
    // Nor the Jenkins agent as submitted: jnlp only, no daemon, no socket.
    let agent = yaml_fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml");
    assert!(
        review(&agent).findings.iter().all(|f| f.rule != "dind-rm"),
        "the plain Jenkins agent is not Docker-in-Docker"
    );
}
