//! The `dind-rm` rule through the real `podmend serve`, on the real CI pods of issue 15 (Argo,
//! GitLab, Tekton, Jenkins, ARC, monitoring DaemonSets): each AdmissionReview goes over TLS,
//! the answer is checked and its patch applied as the API server does, the result must pass
//! the API's rules and the official schema, a second pass must change nothing, and the guard
//! must stand where each daemon stood with every client as it was.

mod common;

use common::dind::{
    ARGO_EMISSARY, CI_PODS, PRIVATE, all_containers, api_errors, argv, container, env_value,
    fixture_pod, guard, guard_command, mount, mounts,
};
use common::k8s_rules;
use common::schema::validate_with_schema;
use common::server::{Options, Server, create_review, fixture, mutate_h2};
use podmend::dind::{Address, GUARD_CONTAINER, Policy};
use serde_json::{Value, json};

/// What the API server makes of one CREATE through podmend.
struct Admitted {
    object: Value,
    patched: bool,
    warnings: Vec<String>,
}

async fn admit(server: &Server, object: &Value) -> Admitted {
    let name = object["metadata"]["name"].as_str().unwrap_or("x");
    let answer = mutate_h2(server, &create_review(name, object, "ci")).await;
    let object =
        k8s_rules::apply_patch_as_api_server(object, answer.patch.as_deref().unwrap_or(&[]))
            .unwrap_or_else(|e| panic!("{e}"));
    for warning in &answer.warnings {
        assert!(warning.chars().count() <= 256, "{warning}");
    }
    Admitted {
        object,
        patched: answer.patch.is_some(),
        warnings: answer.warnings,
    }
}

/// The API's rules (node affinity, resources, tolerations; names, volumes, mounts, probes).
fn assert_valid(object: &Value) {
    let errors = k8s_rules::validate_object(object);
    assert!(errors.is_empty(), "{errors:#?}\n{object:#}");
    let spec = k8s_rules::pod_spec_of(object).expect("a pod spec");
    let errors = api_errors(spec);
    assert!(errors.is_empty(), "{errors:#?}\n{object:#}");
}

/// The repaired object sent again as a CREATE: nothing more to do.
async fn assert_idempotent(server: &Server, object: &Value) {
    let again = admit(server, object).await;
    assert!(
        !again.patched,
        "a second pass patched again: {:#}",
        again.object
    );
}

/// A repaired object: valid, and a second pass changes nothing.
async fn assert_valid_and_idempotent(server: &Server, object: &Value) {
    assert_valid(object);
    assert_idempotent(server, object).await;
}

/// `podmend serve` with one setting of the rule (`key: value`) in its config file.
fn server_with_dind_rm(setting: &str) -> Server {
    Server::start(Options {
        config: Some(format!("rules:\n  dind-rm:\n    {setting}\n")),
        ..Options::default()
    })
}

/// The input as the API server stores it without podmend: defaulted.
fn defaulted(object: &Value) -> Value {
    let mut object = object.clone();
    k8s_rules::apply_pod_defaults(&mut object);
    object
}

/// The dind-rm lines among the warnings.
fn dind_warnings(admitted: &Admitted) -> Vec<&str> {
    admitted
        .warnings
        .iter()
        .filter_map(|w| w.strip_prefix("podmend dind-rm: "))
        .collect()
}

#[tokio::test]
async fn every_dind_ci_pod_gets_the_guard_where_its_daemon_stood_and_its_clients_as_they_were() {
    let server = Server::start(Options::default());
    let mut repaired = Vec::new();
    for (i, case) in CI_PODS.iter().enumerate() {
        let context = case.fixture;
        let pod = fixture_pod(case.fixture, &format!("dind-{i}"));
        let admitted = admit(&server, &pod).await;
        assert!(admitted.patched, "{context}");
        let spec = &admitted.object["spec"];
        let before = defaulted(&pod);

        // The guard: first of all, a native sidecar, in front of the private socket only.
        assert_eq!(
            spec["initContainers"][0]["name"], GUARD_CONTAINER,
            "{context}"
        );
        let guard = guard(spec);
        assert_eq!(guard["restartPolicy"], "Always", "{context}");
        let command = guard_command(spec);
        let listen: Vec<String> = command.listen.iter().map(Address::to_string).collect();
        assert_eq!(listen, case.listen, "{context}");
        assert_eq!(
            command.upstream.to_string(),
            "unix:///podmend/daemon/docker.sock"
        );
        assert_eq!(command.policy, Policy::Collect, "{context}");
        assert_eq!(
            command
                .tls_certdir
                .as_ref()
                .map(|d| d.display().to_string()),
            case.tls_certdir.map(str::to_string),
            "{context}"
        );
        let expected: Vec<(String, String)> =
            case.guard_mounts.iter().map(|(n, p)| mount(n, p)).collect();
        assert_eq!(mounts(guard), expected, "{context}");

        // The daemon: only its argv, its TLS env and the private socket's mount changed.
        let daemon = container(spec, case.daemon);
        assert_eq!(argv(daemon), case.daemon_argv, "{context}");
        assert!(
            mounts(daemon).contains(&mount("podmend-daemon", "/podmend/daemon")),
            "{context}"
        );
        let original = container(&before["spec"], case.daemon);
        for field in [
            "image",
            "securityContext",
            "readinessProbe",
            "startupProbe",
            "resources",
        ] {
            assert_eq!(daemon.get(field), original.get(field), "{context}: {field}");
        }

        // Everyone else exactly as they were (but for agent-requests' requests): env,
        // mounts, command.
        for c in all_containers(spec) {
            let name = c["name"].as_str().unwrap_or_default();
            if name == GUARD_CONTAINER || name == case.daemon {
                continue;
            }
            let mut c = c.clone();
            let mut was = container(&before["spec"], name).clone();
            for object in [&mut c, &mut was] {
                object.as_object_mut().map(|o| o.remove("resources"));
            }
            assert_eq!(c, was, "{context}: {name}");
        }
        // podmend's own volumes are under /podmend, or where the daemon had them (its
        // certificates, its own run directory, which holds its socket).
        for c in all_containers(spec) {
            let daemons_run = c["name"] == case.daemon;
            for (volume, path) in mounts(c) {
                let daemon_run_dir = daemons_run && volume == "podmend-run" && path == "/var/run";
                if volume.starts_with("podmend-") && volume != "podmend-certs" && !daemon_run_dir {
                    assert!(
                        path.starts_with("/podmend/"),
                        "{context}: {volume} at {path}"
                    );
                }
            }
        }
        let warnings = dind_warnings(&admitted);
        assert!(
            warnings.iter().all(|w| !w.contains("bypassed")),
            "{context}: {warnings:?}"
        );
        assert!(
            warnings.iter().all(|w| w.chars().count() <= 120),
            "{warnings:?}"
        );
        let mutated = admitted.object["metadata"]["annotations"]["podmend.io/mutated"]
            .as_str()
            .unwrap_or_default();
        assert!(
            mutated.split(',').any(|rule| rule == "dind-rm"),
            "{context}: {mutated}"
        );
        assert_valid_and_idempotent(&server, &admitted.object).await;
        repaired.push(admitted.object);
    }
    validate_with_schema(&repaired, true).expect("repaired pods pass the official schema");
}

#[tokio::test]
async fn argo_s_bare_docker_host_reaches_the_guard_on_2375_and_the_daemon_no_longer_listens_there()
{
    let server = Server::start(Options::default());
    let pod = fixture("argo-workflows-sidecar-dind-pod-reconstructed.yaml");
    let admitted = admit(&server, &pod).await;
    let spec = &admitted.object["spec"];
    // DOCKER_HOST=127.0.0.1 is tcp://127.0.0.1:2375 to the docker CLI; it stays as it was.
    let main = container(spec, "main");
    assert_eq!(env_value(main, "DOCKER_HOST"), Some(&json!("127.0.0.1")));
    let address = Address::parse_docker_host("127.0.0.1", false).expect("the CLI reads it");
    let Address::Tcp { port, .. } = address else {
        panic!("{address}");
    };
    let command = guard_command(spec);
    assert!(
        command.listen.iter().any(
            |a| matches!(a, Address::Tcp { host, port: p } if host == "0.0.0.0" && *p == port)
        ),
        "{:?}",
        command.listen
    );
    // The daemon leaves the entrypoint's TCP branch: `dockerd ...` after the entrypoint.
    let dind = container(spec, "dind");
    let after_wrapper: Vec<String> = argv(dind).into_iter().skip(ARGO_EMISSARY.len()).collect();
    assert_eq!(after_wrapper, ["dockerd-entrypoint.sh", "dockerd", PRIVATE]);
    assert!(argv(dind).iter().all(|a| !a.contains("tcp://")));
    assert_valid(&admitted.object);
}

#[tokio::test]
async fn gitlab_s_tls_service_is_served_by_the_guard_on_2376_with_the_tls_tree_in_certs() {
    let server = Server::start(Options::default());
    let pod = fixture("gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml");
    let admitted = admit(&server, &pod).await;
    let spec = &admitted.object["spec"];
    let command = guard_command(spec);
    assert_eq!(
        command.listen,
        vec![
            Address::Tcp {
                host: "0.0.0.0".into(),
                port: 2376
            },
            Address::Unix("/podmend/run/docker.sock".into())
        ]
    );
    assert_eq!(command.tls_certdir, Some("/certs".into()));
    // The pod's IP (the guard's env, from the downward API) and the name clients dial.
    assert_eq!(command.tls_san, vec!["$(POD_IP)", "docker"]);
    let guard = guard(spec);
    assert_eq!(
        guard["env"],
        json!([
            {"name": "PODMEND_OWNER_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ])
    );
    // The client certificates' volume at its path, ca/ and server/ in a private directory.
    assert_eq!(
        mounts(guard)
            .into_iter()
            .filter(|(_, p)| p.starts_with("/certs"))
            .collect::<Vec<_>>(),
        vec![
            mount("podmend-certs", "/certs"),
            mount("docker-certs", "/certs/client")
        ]
    );
    // The build container keeps its TLS settings; the daemon's are blanked, or dockerd would
    // turn TLS on from them with files nobody wrote.
    let build = container(spec, "build");
    assert_eq!(env_value(build, "DOCKER_TLS_VERIFY"), Some(&json!("1")));
    assert_eq!(
        env_value(build, "DOCKER_CERT_PATH"),
        Some(&json!("/certs/client"))
    );
    let svc = container(spec, "svc-0");
    assert_eq!(env_value(svc, "DOCKER_TLS_VERIFY"), Some(&json!("")));
    assert_eq!(env_value(svc, "DOCKER_CERT_PATH"), Some(&json!("")));
    assert_eq!(env_value(svc, "DOCKER_TLS_CERTDIR"), Some(&json!("/certs")));
    assert_eq!(argv(svc), ["dockerd", PRIVATE]);
    let warnings = dind_warnings(&admitted);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("DOCKER_TLS_VERIFY, DOCKER_CERT_PATH of svc-0")),
        "{warnings:?}"
    );
    assert_valid_and_idempotent(&server, &admitted.object).await;
}

#[tokio::test]
async fn gitlab_s_exported_docker_host_still_reaches_the_guard_and_nothing_else() {
    let server = Server::start(Options::default());
    let pod = fixture("gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml");
    let admitted = admit(&server, &pod).await;
    let spec = &admitted.object["spec"];
    // The job script exports every job variable over whatever the pod spec says: the build
    // container talks to the address in .gitlab-ci.yml, read as the docker CLI reads it.
    let exported = env_value(container(spec, "build"), "DOCKER_HOST")
        .and_then(Value::as_str)
        .expect("DOCKER_HOST");
    let Ok(Address::Tcp { port, .. }) = Address::parse_docker_host(exported, true) else {
        panic!("{exported}");
    };
    let command = guard_command(spec);
    assert!(
        command
            .listen
            .iter()
            .any(|a| matches!(a, Address::Tcp { port: p, .. } if *p == port)),
        "the guard does not listen on {port}"
    );
    // And no container but the guard listens on a TCP port: the daemon's only host is the
    // private socket, passed after the entrypoint's `dockerd` (so the entrypoint adds none).
    for c in all_containers(spec) {
        if c["name"] == GUARD_CONTAINER {
            continue;
        }
        let argv = argv(c);
        assert!(argv.iter().all(|a| !a.contains("tcp://")), "{argv:?}");
        if argv.iter().any(|a| a.starts_with("--host")) {
            assert_eq!(argv, ["dockerd", PRIVATE]);
        }
    }
}

#[tokio::test]
async fn monitoring_daemon_sets_keep_the_node_s_socket_and_are_told_why() {
    let server = Server::start(Options::default());
    for file in [
        "kubernetes-examples-sysdig-agent-daemonset-host-docker-sock.yaml",
        "kubernetes-examples-newrelic-agent-daemonset-host-docker-sock.yaml",
    ] {
        // The DaemonSet itself: its template is left as it is, with a note (no "would
        // repair": there is nothing to repair).
        let daemon_set = fixture(file);
        let admitted = admit(&server, &daemon_set).await;
        assert!(!admitted.patched, "{file}");
        let warnings: Vec<&str> = admitted
            .warnings
            .iter()
            .filter_map(|w| w.strip_prefix("podmend dind-rm: "))
            .collect();
        assert_eq!(
            warnings,
            [
                "podmend-guard not injected: a DaemonSet's pods are node agents, not CI (nodeAgents: skip)"
            ],
            "{file}: {:?}",
            admitted.warnings
        );
        // The Pods the DaemonSet controller creates: left alone too.
        let mut pod = fixture_pod(file, "agent");
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
            "name": "agent", "uid": "9a1b", "controller": true, "blockOwnerDeletion": true}]);
        let admitted = admit(&server, &pod).await;
        assert!(!admitted.patched, "{file}");
        assert_eq!(dind_warnings(&admitted).len(), 1, "{:?}", admitted.warnings);
        assert_eq!(admitted.object["spec"], defaulted(&pod)["spec"]);
    }
    // Outside a DaemonSet, sysdig's socket at /host/var/run/docker.sock still marks a node agent.
    let pod = fixture_pod(
        "kubernetes-examples-sysdig-agent-daemonset-host-docker-sock.yaml",
        "sysdig",
    );
    let admitted = admit(&server, &pod).await;
    assert!(!admitted.patched);
    assert_eq!(
        dind_warnings(&admitted),
        [
            "left sysdig-agent alone: a node agent (the node's Docker socket at /host/var/run/docker.sock; nodeAgents: skip)"
        ]
    );
}

#[tokio::test]
async fn node_agents_are_guarded_when_the_config_says_so() {
    let server = server_with_dind_rm("nodeAgents: guard");
    let pod = fixture_pod(
        "kubernetes-examples-newrelic-agent-daemonset-host-docker-sock.yaml",
        "newrelic",
    );
    let admitted = admit(&server, &pod).await;
    assert!(admitted.patched);
    let spec = &admitted.object["spec"];
    assert_eq!(
        mounts(container(spec, "newrelic"))
            .into_iter()
            .filter(|(v, _)| v == "podmend-docker")
            .collect::<Vec<_>>(),
        vec![mount("podmend-docker", "/var/run")]
    );
    assert_valid_and_idempotent(&server, &admitted.object).await;
}

#[tokio::test]
async fn tekton_s_digest_pinned_daemon_is_found_by_what_it_runs() {
    let server = Server::start(Options::default());
    let pod = fixture("tekton-dind-sidecar-taskrun-digest-pinned-pod-reconstructed.yaml");
    // Client and daemon share one image: only what the daemon runs tells them apart.
    let spec = &pod["spec"];
    assert_eq!(
        container(spec, "step-client")["image"],
        container(spec, "sidecar-server")["image"]
    );
    let admitted = admit(&server, &pod).await;
    assert!(admitted.patched);
    let spec = &admitted.object["spec"];
    assert_eq!(
        argv(container(spec, "sidecar-server")),
        [
            "dockerd",
            PRIVATE,
            "--storage-driver=vfs",
            "--userland-proxy=false",
            "--debug"
        ]
    );
    assert_eq!(
        container(spec, "step-client"),
        container(&defaulted(&pod)["spec"], "step-client")
    );
    // Tekton's own init containers run after the guard, and are no Docker clients.
    let init: Vec<&str> = spec["initContainers"]
        .as_array()
        .expect("init containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(init, [GUARD_CONTAINER, "prepare", "place-scripts"]);
    assert_valid_and_idempotent(&server, &admitted.object).await;
}

#[tokio::test]
async fn a_jenkins_agent_with_dind_keeps_the_guard_s_resources_as_dind_rm_set_them() {
    // agent-requests as a user who opts in to all of it configures it (the Jenkins preset,
    // unpinned agents, limits copied from lone requests), so that it acts on this pod: the
    // jnlp container has a request and no limit, and the pod is not pinned.
    let server = Server::start(Options {
        config: Some(
            "rules:\n  agent-requests:\n    presets: [jenkins-agent]\n    onlyPinned: false\n    limitFromRequest: true\n"
                .to_string(),
        ),
        ..Options::default()
    });
    let pod = fixture("jenkins-k8s-plugin-agent-pod-dind-reconstructed.yaml");
    let admitted = admit(&server, &pod).await;
    let rules = admitted.object["metadata"]["annotations"]["podmend.io/mutated"].clone();
    assert_eq!(rules, "dind-rm,agent-requests");
    let spec = &admitted.object["spec"];
    assert_eq!(
        guard(spec)["resources"],
        json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}})
    );
    // agent-requests still zeroed the agent's own container.
    assert_eq!(container(spec, "jnlp")["resources"]["requests"]["cpu"], "0");
    assert_valid_and_idempotent(&server, &admitted.object).await;
}

#[tokio::test]
async fn arc_s_var_run_empty_dir_holds_the_guard_s_socket_and_nothing_of_podmend_is_under_run() {
    let server = Server::start(Options::default());
    let pod = fixture_pod(
        "arc-gha-runner-scale-set-values-0041559-dind-native-sidecar-template.yaml",
        "runner",
    );
    let admitted = admit(&server, &pod).await;
    let spec = &admitted.object["spec"];
    let command = guard_command(spec);
    // The socket the runner (and dind's startupProbe `docker info`) dials is the guard's, in
    // the shared /var/run emptyDir.
    assert_eq!(
        command.listen,
        vec![Address::Unix("/var/run/docker.sock".into())]
    );
    assert!(mounts(guard(spec)).contains(&mount("dind-sock", "/var/run")));
    // podmend's own paths: none under /run or /var/run, in any container or argument.
    for c in all_containers(spec) {
        for (volume, path) in mounts(c) {
            if volume.starts_with("podmend-") {
                assert!(
                    !path.starts_with("/run") && !path.starts_with("/var/run"),
                    "{path}"
                );
            }
        }
    }
    assert_eq!(
        command.upstream,
        Address::Unix("/podmend/daemon/docker.sock".into())
    );
    // The guard starts before the daemon, whose startup probe goes through it.
    let init: Vec<&str> = spec["initContainers"]
        .as_array()
        .expect("init containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(init, [GUARD_CONTAINER, "init-dind-externals", "dind"]);
    assert_valid(&admitted.object);
}

#[tokio::test]
async fn the_node_s_socket_moves_to_the_guard_whose_socket_the_client_finds_at_the_same_path() {
    let server = Server::start(Options::default());
    let pod = fixture_pod("jenkins-k8s-plugin-example-dood-pod-template.yaml", "dood");
    let admitted = admit(&server, &pod).await;
    let spec = &admitted.object["spec"];
    let command = guard_command(spec);
    assert_eq!(
        command.listen,
        vec![Address::Unix("/podmend/guard/var-run/docker.sock".into())]
    );
    assert_eq!(
        command.upstream,
        Address::Unix("/podmend/host/docker.sock".into())
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        json!([{"name": "podmend-docker", "mountPath": "/var/run", "subPath": "var-run"}])
    );
    assert!(spec["containers"][0].get("env").is_none());
    assert_eq!(
        mounts(guard(spec)),
        vec![
            mount("podmend-docker", "/podmend/guard"),
            mount("dockersock", "/podmend/host/docker.sock")
        ]
    );
    assert_valid_and_idempotent(&server, &admitted.object).await;
    validate_with_schema(&[admitted.object], true).expect("schema");
}

#[tokio::test]
async fn in_warn_mode_nothing_moves_and_the_warning_says_what_would() {
    let server = server_with_dind_rm("mode: warn");
    let pod = fixture_pod("jenkins-k8s-plugin-example-dood-pod-template.yaml", "dood");
    let admitted = admit(&server, &pod).await;
    assert!(!admitted.patched);
    assert!(
        admitted.warnings.iter().any(|w| w
            == "podmend dind-rm would repair: moved the node's Docker socket from docker to podmend-guard, whose socket is at the same path"),
        "{:?}",
        admitted.warnings
    );
}

#[tokio::test]
async fn container_mode_appends_the_guard_as_a_plain_container() {
    let server = server_with_dind_rm("sidecarMode: container");
    let pod = fixture_pod(
        "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        "arc",
    );
    let admitted = admit(&server, &pod).await;
    let spec = &admitted.object["spec"];
    let containers = spec["containers"].as_array().expect("containers");
    let last = containers.last().expect("a container");
    assert_eq!(last["name"], GUARD_CONTAINER);
    assert!(last.get("restartPolicy").is_none());
    assert_eq!(
        spec["initContainers"],
        defaulted(&pod)["spec"]["initContainers"]
    );
    assert_valid_and_idempotent(&server, &admitted.object).await;
}

#[tokio::test]
async fn a_dind_template_is_warned_about_and_its_audit_repair_is_valid() {
    let server = Server::start(Options::default());
    let pod = fixture_pod(
        "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        "runner",
    );
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "runner", "namespace": "ci"},
        "spec": {"selector": {"matchLabels": {"app": "runner"}},
            "template": {"metadata": {"labels": {"app": "runner"}}, "spec": pod["spec"]}}});
    let admitted = admit(&server, &deployment).await;
    assert!(!admitted.patched);
    assert!(
        admitted
            .warnings
            .iter()
            .any(|w| w.starts_with("podmend dind-rm would repair: injected podmend-guard")),
        "{:?}",
        admitted.warnings
    );
    // The audit applies the same repair: it passes the API's rules and the schema.
    let engine = podmend::engine::Engine::new(&podmend::config::Config::default());
    let subject = podmend::engine::Subject {
        operation: podmend::engine::Operation::Create,
        group: "apps",
        kind: "Deployment",
        sub_resource: "",
        namespace: "ci",
        object: Some(&deployment),
        old_object: None,
    };
    let outcome = engine.review(&subject, &podmend::cluster::StaticCluster::empty());
    let mut repaired = deployment.clone();
    json_patch::patch(&mut repaired, outcome.repair()).expect("the repair applies");
    assert_eq!(
        guard_command(&repaired["spec"]["template"]["spec"]).listen,
        vec![Address::Unix("/var/run/docker.sock".into())]
    );
    assert_valid(&repaired);
    validate_with_schema(&[repaired], true).expect("schema");
}

#[tokio::test]
async fn the_policy_annotation_reaches_the_guard_or_turns_the_rule_off() {
    let server = Server::start(Options::default());
    let mut pod = fixture_pod(
        "arc-legacy-summerwind-runner-pod-docker-dind-sidecar-reconstructed.yaml",
        "runner",
    );
    pod["metadata"]["annotations"] = json!({"podmend.io/dind-policy": "rm"});
    let admitted = admit(&server, &pod).await;
    assert_eq!(guard_command(&admitted.object["spec"]).policy, Policy::Rm);
    pod["metadata"]["annotations"] = json!({"podmend.io/dind-policy": "off"});
    let admitted = admit(&server, &pod).await;
    assert!(!admitted.patched);
    assert!(dind_warnings(&admitted).is_empty());
}

#[tokio::test]
async fn fields_podmend_does_not_know_survive_the_repair() {
    let server = Server::start(Options::default());
    let mut pod = fixture("gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml");
    pod["spec"]["futurePodField"] = json!({"keep": true});
    pod["spec"]["containers"][2]["futureContainerField"] = json!([1, 2]);
    pod["spec"]["containers"][2]["volumeMounts"][2]["futureMountField"] = json!("x");
    pod["spec"]["containers"][0]["futureContainerField"] = json!("build");
    let admitted = admit(&server, &pod).await;
    assert!(admitted.patched);
    let spec = &admitted.object["spec"];
    assert_eq!(spec["futurePodField"], json!({"keep": true}));
    let svc = container(spec, "svc-0");
    assert_eq!(svc["futureContainerField"], json!([1, 2]));
    assert_eq!(
        svc["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["name"] == "docker-certs")
            .expect("the certificates' mount")["futureMountField"],
        "x"
    );
    assert_eq!(container(spec, "build")["futureContainerField"], "build");
    assert!(guard(spec).get("futureContainerField").is_none());
}

#[tokio::test]
async fn a_pod_without_docker_gets_no_patch() {
    let server = Server::start(Options::default());
    let review = fixture("admissionreview-v1-pod-create-gke-kube-rs.json");
    let admitted = admit(&server, &review["request"]["object"]).await;
    assert!(!admitted.patched);
    assert!(dind_warnings(&admitted).is_empty());
    // Nor the Jenkins agent as submitted: jnlp only, no daemon, no socket.
    let agent = fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml");
    let admitted = admit(&server, &agent).await;
    assert!(
        dind_warnings(&admitted).is_empty(),
        "{:?}",
        admitted.warnings
    );
}
