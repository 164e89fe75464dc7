//! The rule on small pods, one behaviour per test; the real CI pods are in
//! `tests/dind_rule*.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use serde_json::{Value, json};

use super::*;
// Test-only: the guard args the rule writes are read back by the real command line.
use crate::cli::{Cli, Command};
use crate::cluster::StaticCluster;
use crate::config::{NodeAgents, SidecarMode};
use crate::dind::{Address, GuardCommand};

const PRIVATE: &str = "--host=unix:///podmend/daemon/docker.sock";

fn meta_with(annotations: &[(&str, &str)], controller: Option<&str>) -> PodMeta {
    PodMeta {
        labels: BTreeMap::new(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        controller_kind: controller.map(str::to_string),
    }
}

fn run_meta(config: DindRmConfig, spec: Value, meta: &PodMeta) -> (Value, Vec<String>) {
    let rule = DindRm::new(config);
    let mut pod: PodSpec = serde_json::from_value(spec.clone()).expect("test spec");
    let cluster = StaticCluster::empty();
    let cx = RuleContext {
        namespace: "ci",
        cluster: &cluster,
    };
    let messages = rule.repair(&mut pod, meta, &cx);
    assert!(
        messages.is_empty() || rule.may_apply(&spec, meta),
        "may_apply said no but repair found {messages:?} on {spec}"
    );
    for message in &messages {
        assert!(message.chars().count() <= MAX_MESSAGE, "{message}");
    }
    (serde_json::to_value(&pod).expect("serializes"), messages)
}

fn run_with(
    config: DindRmConfig,
    spec: Value,
    annotations: &[(&str, &str)],
) -> (Value, Vec<String>) {
    run_meta(config, spec, &meta_with(annotations, None))
}

fn repair(spec: Value) -> (Value, Vec<String>) {
    run_with(DindRmConfig::default(), spec, &[])
}

fn container_mode() -> DindRmConfig {
    DindRmConfig {
        sidecar_mode: SidecarMode::Container,
        ..DindRmConfig::default()
    }
}

fn guarding_node_agents() -> DindRmConfig {
    DindRmConfig {
        node_agents: NodeAgents::Guard,
        ..DindRmConfig::default()
    }
}

/// The guard, wherever the mode put it.
fn guard(spec: &Value) -> &Value {
    named(spec, GUARD_CONTAINER)
}

/// The guard's args read back by the real command-line parser.
fn command(spec: &Value) -> GuardCommand {
    let args: Vec<String> = guard(spec)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect();
    let argv = std::iter::once("podmend".to_string())
        .chain(args.iter().cloned())
        .chain(["--owner-pod-uid".to_string(), "uid".to_string()]);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let Command::Guard(guard) = cli.command else {
        panic!("not podmend guard: {args:?}");
    };
    guard.run.command().expect("a guard command")
}

fn listen(spec: &Value) -> Vec<String> {
    command(spec)
        .listen
        .iter()
        .map(Address::to_string)
        .collect()
}

fn upstream(spec: &Value) -> String {
    command(spec).upstream.to_string()
}

fn mounts(container: &Value) -> Vec<(String, String)> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or("").to_string(),
                m["mountPath"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn mount(name: &str, path: &str) -> (String, String) {
    (name.to_string(), path.to_string())
}

fn env(container: &Value, name: &str) -> Option<Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
}

/// The container named `name`.
fn named<'a>(spec: &'a Value, name: &str) -> &'a Value {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A dind sidecar sharing /var/run with a docker client, as in the Jenkins example.
fn shared_var_run() -> Value {
    json!({
        "volumes": [{"name": "docker-socket", "emptyDir": {}}],
        "containers": [
            {"name": "docker", "image": "docker:19.03.1", "command": ["sleep"], "args": ["99d"],
             "volumeMounts": [{"name": "docker-socket", "mountPath": "/var/run"}]},
            {"name": "docker-daemon", "image": "docker:19.03.1-dind", "securityContext": {"privileged": true},
             "volumeMounts": [{"name": "docker-socket", "mountPath": "/var/run"}]}
        ]
    })
}

/// A client reaching a dind sidecar over plain TCP, as in Argo's example.
fn plain_tcp(docker_host: &str) -> Value {
    json!({"containers": [
        {"name": "main", "image": "docker:19.03.13", "command": ["sh", "-c"], "args": ["docker ps"],
         "env": [{"name": "DOCKER_HOST", "value": docker_host}]},
        {"name": "dind", "image": "docker:19.03.13-dind", "command": ["dockerd-entrypoint.sh"],
         "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}], "securityContext": {"privileged": true}}
    ]})
}

/// GitLab's documented TLS service: the client certificates shared at /certs/client.
fn tls_service() -> Value {
    let job_env = json!([
        {"name": "DOCKER_HOST", "value": "tcp://docker:2376"},
        {"name": "DOCKER_TLS_CERTDIR", "value": "/certs"},
        {"name": "DOCKER_TLS_VERIFY", "value": "1"},
        {"name": "DOCKER_CERT_PATH", "value": "/certs/client"}
    ]);
    json!({
        "volumes": [{"name": "docker-certs", "emptyDir": {"medium": "Memory"}}],
        "containers": [
            {"name": "build", "image": "docker:24.0.5-cli", "command": ["sh", "-c", "exec sh"],
             "env": job_env, "volumeMounts": [{"name": "docker-certs", "mountPath": "/certs/client"}]},
            {"name": "svc-0", "image": "docker:24.0.5-dind", "env": job_env,
             "securityContext": {"privileged": true},
             "volumeMounts": [{"name": "docker-certs", "mountPath": "/certs/client"}]}
        ]
    })
}

fn host_socket() -> Value {
    json!({
        "volumes": [{"name": "dockersock", "hostPath": {"path": "/var/run/docker.sock"}}],
        "containers": [{"name": "build", "image": "docker:24", "command": ["sleep", "1d"],
            "volumeMounts": [{"name": "dockersock", "mountPath": "/var/run/docker.sock"}]}]
    })
}

#[test]
fn a_shared_var_run_daemon_moves_to_the_private_socket_and_the_guard_takes_its_socket() {
    let (after, messages) = repair(shared_var_run());
    assert_eq!(listen(&after), vec!["unix:///var/run/docker.sock"]);
    assert_eq!(upstream(&after), "unix:///podmend/daemon/docker.sock");
    assert_eq!(
        mounts(guard(&after)),
        vec![
            mount("podmend-daemon", "/podmend/daemon"),
            mount("docker-socket", "/var/run")
        ]
    );
    let daemon = named(&after, "docker-daemon");
    assert_eq!(daemon["args"], json!(["dockerd", PRIVATE]));
    assert!(daemon.get("command").is_none());
    assert_eq!(
        mounts(daemon),
        vec![
            mount("docker-socket", "/var/run"),
            mount("podmend-daemon", "/podmend/daemon")
        ]
    );
    // The client is as it was: its default socket is now the guard's.
    assert_eq!(named(&after, "docker"), &shared_var_run()["containers"][0]);
    assert_eq!(
        messages,
        vec![
            "injected podmend-guard (policy collect) in daemon docker-daemon's place: unix:///var/run/docker.sock",
            "daemon docker-daemon now listens only on unix:///podmend/daemon/docker.sock, which only podmend-guard mounts",
            "tcp://0.0.0.0:2376 of docker-daemon not kept: no client mounts its client certificates (/certs/client)"
        ]
    );
    assert!(
        after["volumes"]
            .as_array()
            .expect("volumes")
            .contains(&json!({"name": "podmend-daemon", "emptyDir": {}}))
    );
}

#[test]
fn a_dockerd_sidecar_keeps_its_flags_behind_the_private_socket() {
    let (after, _) = repair(json!({
        "volumes": [{"name": "dind-sock", "emptyDir": {}}],
        "containers": [
            {"name": "runner", "image": "ghcr.io/actions/actions-runner:latest",
             "env": [{"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"}],
             "volumeMounts": [{"name": "dind-sock", "mountPath": "/var/run"}]},
            {"name": "dind", "image": "docker:dind",
             "args": ["dockerd", "--host=unix:///var/run/docker.sock", "--group=$(DOCKER_GROUP_GID)"],
             "env": [{"name": "DOCKER_GROUP_GID", "value": "123"}],
             "securityContext": {"privileged": true},
             "volumeMounts": [{"name": "dind-sock", "mountPath": "/var/run"}]}
        ]
    }));
    assert_eq!(
        named(&after, "dind")["args"],
        json!(["dockerd", PRIVATE, "--group=$(DOCKER_GROUP_GID)"])
    );
    assert_eq!(listen(&after), vec!["unix:///var/run/docker.sock"]);
    assert_eq!(
        env(named(&after, "runner"), "DOCKER_HOST"),
        Some(json!({"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"}))
    );
}

#[test]
fn a_bare_host_docker_host_reaches_the_guard_on_the_daemon_s_tcp_port() {
    let (after, messages) = repair(plain_tcp("127.0.0.1"));
    assert_eq!(listen(&after)[0], "tcp://0.0.0.0:2375");
    assert_eq!(
        mounts(guard(&after))[0],
        mount("podmend-daemon", "/podmend/daemon")
    );
    let dind = named(&after, "dind");
    assert_eq!(dind["command"], json!(["dockerd-entrypoint.sh"]));
    assert_eq!(dind["args"], json!(["dockerd", PRIVATE]));
    assert_eq!(
        named(&after, "main"),
        &plain_tcp("127.0.0.1")["containers"][0]
    );
    assert!(messages[0].ends_with("tcp://0.0.0.0:2375"), "{messages:?}");
}

#[test]
fn the_tls_service_s_port_and_certificates_go_to_the_guard_and_the_daemon_s_tls_env_is_blanked() {
    let (after, messages) = repair(tls_service());
    let command = command(&after);
    assert_eq!(
        command.listen,
        vec![
            Address::Tcp {
                host: "0.0.0.0".into(),
                port: 2376
            },
            // The daemon's own socket, in the emptyDir over its /var/run.
            Address::Unix("/podmend/run/docker.sock".into())
        ]
    );
    assert_eq!(command.tls_certdir, Some("/certs".into()));
    assert_eq!(command.tls_san, vec!["$(POD_IP)", "docker"]);
    assert_eq!(command.upstream_cert_path, None);
    assert_eq!(
        mounts(guard(&after)),
        vec![
            mount("podmend-certs", "/certs"),
            mount("podmend-daemon", "/podmend/daemon"),
            mount("docker-certs", "/certs/client"),
            mount("podmend-run", "/podmend/run")
        ]
    );
    let daemon = named(&after, "svc-0");
    assert_eq!(daemon["args"], json!(["dockerd", PRIVATE]));
    assert_eq!(
        env(daemon, "DOCKER_TLS_VERIFY"),
        Some(json!({"name": "DOCKER_TLS_VERIFY", "value": ""}))
    );
    assert_eq!(
        env(daemon, "DOCKER_CERT_PATH"),
        Some(json!({"name": "DOCKER_CERT_PATH", "value": ""}))
    );
    assert_eq!(
        env(daemon, "DOCKER_HOST"),
        Some(json!({"name": "DOCKER_HOST", "value": "tcp://docker:2376"}))
    );
    assert_eq!(named(&after, "build"), &tls_service()["containers"][0]);
    assert_eq!(
        messages[2],
        "set DOCKER_TLS_VERIFY, DOCKER_CERT_PATH of svc-0 to \"\": dockerd turns TLS on from them"
    );
}

#[test]
fn a_certificate_directory_shared_whole_needs_no_private_directory() {
    let mut spec = tls_service();
    for container in spec["containers"].as_array_mut().expect("containers") {
        container["volumeMounts"][0]["mountPath"] = json!("/certs");
    }
    let (after, _) = repair(spec);
    assert_eq!(
        mounts(guard(&after)),
        vec![
            mount("docker-certs", "/certs"),
            mount("podmend-daemon", "/podmend/daemon"),
            mount("podmend-run", "/podmend/run")
        ]
    );
    assert!(
        !after["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == CERTS_VOLUME)
    );
}

#[test]
fn a_digest_pinned_privileged_docker_image_with_flags_is_the_daemon() {
    let digest = "docker.io/library/docker@sha256:18ff92d3d31725b53fa6633d60bed323effb6d5d4588be7b547078d384e0d4bf";
    let mut spec = tls_service();
    spec["containers"][0]["image"] = json!(digest);
    spec["containers"][1]["image"] = json!(digest);
    spec["containers"][1]["args"] = json!(["--storage-driver=vfs", "--debug"]);
    let (after, _) = repair(spec);
    assert_eq!(
        named(&after, "svc-0")["args"],
        json!(["dockerd", PRIVATE, "--storage-driver=vfs", "--debug"])
    );
    assert_eq!(command(&after).tls_certdir, Some("/certs".into()));
}

#[test]
fn a_client_on_a_port_the_daemon_does_not_serve_gets_the_fallback_and_a_bypass_warning() {
    // docker:dind serves TLS on 2376 by default; this client asks for 2375.
    let (after, messages) = repair(json!({"containers": [
        {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}]},
        {"name": "dind", "image": "docker:dind"}
    ]}));
    assert_eq!(upstream(&after), "tcp://localhost:2375");
    assert_eq!(listen(&after), vec!["unix:///podmend/guard/docker.sock"]);
    assert_eq!(
        env(named(&after, "build"), "DOCKER_HOST").expect("env")["value"],
        "unix:///podmend/guard/docker.sock"
    );
    assert!(named(&after, "dind").get("args").is_none());
    assert!(
        messages[0].starts_with(
            "podmend-guard can be bypassed, because build uses tcp://localhost:2375, which daemon dind does not serve"
        ),
        "{messages:?}"
    );
}

#[test]
fn a_daemon_that_cannot_be_moved_leaves_the_clients_pointed_at_the_guard() {
    let (after, messages) = repair(json!({
        "volumes": [{"name": "sock", "emptyDir": {}}],
        "containers": [
            {"name": "build", "image": "docker:24", "env": [
                {"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"},
                {"name": "KEEP", "value": "x"}],
             "volumeMounts": [{"name": "sock", "mountPath": "/var/run"}]},
            {"name": "dind", "image": "docker:dind", "command": ["sh", "-c", "dockerd --debug"],
             "volumeMounts": [{"name": "sock", "mountPath": "/var/run"}]}
        ]
    }));
    assert_eq!(upstream(&after), "unix:///var/run/docker.sock");
    let build = named(&after, "build");
    assert_eq!(
        build["env"],
        json!([{"name": "DOCKER_HOST", "value": "unix:///podmend/guard/docker.sock"}, {"name": "KEEP", "value": "x"}])
    );
    assert_eq!(
        mounts(build),
        vec![
            mount("sock", "/var/run"),
            mount("podmend-docker", "/podmend/guard")
        ]
    );
    assert_eq!(
        mounts(guard(&after)),
        vec![
            mount("podmend-docker", "/podmend/guard"),
            mount("sock", "/var/run")
        ]
    );
    assert_eq!(
        named(&after, "dind")["command"],
        json!(["sh", "-c", "dockerd --debug"])
    );
    assert!(
        messages[0].starts_with(
            "podmend-guard can be bypassed, because daemon dind cannot be moved: its command \"sh\""
        ),
        "{messages:?}"
    );
}

#[test]
fn a_tls_client_in_the_fallback_gives_the_guard_its_certificates_read_only() {
    let mut spec = tls_service();
    spec["containers"][1]["command"] = json!(["sh", "-c", "dockerd-entrypoint.sh"]);
    let (after, messages) = repair(spec);
    let command = command(&after);
    assert_eq!(command.upstream.to_string(), "tcp://docker:2376");
    assert_eq!(command.upstream_cert_path, Some("/certs/client".into()));
    assert!(
        guard(&after)["volumeMounts"]
            .as_array()
            .expect("mounts")
            .contains(
                &json!({"name": "docker-certs", "mountPath": "/certs/client", "readOnly": true})
            )
    );
    // The TLS settings were for the daemon; the guard's socket is plain.
    assert!(env(named(&after, "build"), "DOCKER_TLS_VERIFY").is_none());
    assert!(
        messages[1].ends_with("tcp://docker:2376 (TLS)"),
        "{messages:?}"
    );
}

#[test]
fn an_upstream_the_guard_cannot_use_leaves_the_pod_alone_with_a_warning() {
    for (host, reason) in [
        ("ssh://me@builder", "ssh:// is not supported"),
        ("tcp://docker:2375/v1.41", "path after the port"),
        ("unix://run/docker.sock", "must be absolute"),
    ] {
        let spec = json!({"containers": [
            {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": host}]},
            {"name": "dind", "image": "docker:dind", "command": ["sh", "-c", "dockerd"]}
        ]});
        let (after, messages) = repair(spec.clone());
        assert_eq!(
            after,
            serde_json::to_value(serde_json::from_value::<PodSpec>(spec).expect("spec"))
                .expect("json")
        );
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].starts_with("podmend-guard not injected"),
            "{messages:?}"
        );
        assert!(messages[0].contains(reason), "{host}: {messages:?}");
    }
}

#[test]
fn a_docker_host_from_value_from_is_not_guessed_in_the_fallback_but_harmless_in_the_rewrite() {
    let mut spec = shared_var_run();
    spec["containers"][0]["env"] = json!([{"name": "DOCKER_HOST", "valueFrom": {"configMapKeyRef": {"name": "ci", "key": "docker"}}}]);
    let (after, _) = repair(spec.clone());
    assert_eq!(listen(&after), vec!["unix:///var/run/docker.sock"]);
    spec["containers"][1]["command"] = json!(["sh", "-c", "dockerd"]);
    let (after, messages) = repair(spec);
    assert!(after["initContainers"].is_null());
    assert!(messages[0].contains("valueFrom"), "{messages:?}");
}

#[test]
fn the_node_s_socket_moves_to_the_guard_whose_socket_appears_where_the_client_had_it() {
    let (after, messages) = repair(host_socket());
    let command = command(&after);
    assert_eq!(
        command.listen,
        vec![Address::Unix("/podmend/guard/var-run/docker.sock".into())]
    );
    assert_eq!(
        command.upstream.to_string(),
        "unix:///podmend/host/docker.sock"
    );
    // A container started with the node's socket bound in gets the guard's, which the node's
    // daemon finds in the pod's emptyDir (the kubelet expands the pod UID in the args).
    assert_eq!(
        command.daemon_socket_paths,
        vec!["/var/run/docker.sock", "/run/docker.sock"]
    );
    assert_eq!(
        command.guard_socket_for_daemon.as_deref(),
        Some(
            "/var/lib/kubelet/pods/$(PODMEND_OWNER_POD_UID)/volumes/kubernetes.io~empty-dir/podmend-docker/var-run/docker.sock"
        )
    );
    assert_eq!(
        mounts(guard(&after)),
        vec![
            mount("podmend-docker", "/podmend/guard"),
            mount("dockersock", "/podmend/host/docker.sock")
        ]
    );
    let build = &after["containers"][0];
    assert_eq!(
        build["volumeMounts"],
        json!([{"name": "podmend-docker", "mountPath": "/var/run", "subPath": "var-run"}])
    );
    assert!(build.get("env").is_none());
    assert_eq!(
        after["volumes"][0]["hostPath"]["path"],
        "/var/run/docker.sock"
    );
    assert_eq!(
        messages,
        vec![
            "injected podmend-guard (policy collect) in front of the node's Docker socket, at /var/run/docker.sock of build",
            "moved the node's Docker socket from build to podmend-guard, whose socket is at the same path",
        ]
    );
}

#[test]
fn a_node_socket_in_a_directory_of_its_own_or_at_the_root_falls_back() {
    let mut spec = host_socket();
    spec["containers"][0]["volumeMounts"][0]["mountPath"] = json!("/docker.sock");
    let (after, messages) = run_with(guarding_node_agents(), spec, &[]);
    assert_eq!(upstream(&after), "unix:///podmend/host/docker.sock");
    assert_eq!(
        mounts(&after["containers"][0]),
        vec![mount("podmend-docker", "/podmend/guard")]
    );
    assert!(
        messages[2].contains("at /docker.sock, in /"),
        "{messages:?}"
    );

    let mut spec = host_socket();
    spec["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({"name": "run", "emptyDir": {}}));
    spec["containers"][0]["volumeMounts"]
        .as_array_mut()
        .expect("mounts")
        .push(json!({"name": "run", "mountPath": "/var/run"}));
    let (_, messages) = repair(spec);
    assert!(
        messages[2].contains("mounts run at /var/run"),
        "{messages:?}"
    );
}

#[test]
fn a_container_reading_the_node_s_socket_at_a_path_of_its_own_is_a_node_agent() {
    let mut spec = host_socket();
    spec["containers"][0]["volumeMounts"][0]["mountPath"] = json!("/host/var/run/docker.sock");
    let (after, messages) = repair(spec.clone());
    assert!(after["initContainers"].is_null());
    assert_eq!(
        messages,
        vec![
            "left build alone: a node agent (the node's Docker socket at /host/var/run/docker.sock; nodeAgents: skip)"
        ]
    );
    let (after, _) = run_with(guarding_node_agents(), spec, &[]);
    assert_eq!(
        after["containers"][0]["volumeMounts"],
        json!([{"name": "podmend-docker", "mountPath": "/host/var/run", "subPath": "host-var-run"}])
    );
}

#[test]
fn the_pods_of_a_daemon_set_are_left_alone_unless_node_agents_are_guarded() {
    let daemon_set = meta_with(&[], Some("DaemonSet"));
    let (after, messages) = run_meta(DindRmConfig::default(), host_socket(), &daemon_set);
    assert!(after["initContainers"].is_null());
    assert_eq!(
        messages,
        vec![
            "podmend-guard not injected: a DaemonSet's pods are node agents, not CI (nodeAgents: skip)"
        ]
    );
    let (after, _) = run_meta(guarding_node_agents(), host_socket(), &daemon_set);
    assert_eq!(after["initContainers"][0]["name"], GUARD_CONTAINER);
    // Other controllers are CI like any pod.
    let (after, _) = run_meta(
        DindRmConfig::default(),
        host_socket(),
        &meta_with(&[], Some("Job")),
    );
    assert_eq!(after["initContainers"][0]["name"], GUARD_CONTAINER);
}

#[test]
fn in_native_mode_the_guard_is_the_first_init_container_and_restarts_always() {
    let mut spec = shared_var_run();
    spec["initContainers"] = json!([{"name": "checkout", "image": "alpine/git"}]);
    let (after, _) = repair(spec);
    let init = after["initContainers"].as_array().expect("init containers");
    assert_eq!(init.len(), 2);
    assert_eq!(init[0]["name"], GUARD_CONTAINER);
    assert_eq!(init[0]["restartPolicy"], "Always");
    assert_eq!(init[1], json!({"name": "checkout", "image": "alpine/git"}));
}

#[test]
fn in_container_mode_the_guard_is_the_last_container_and_init_containers_keep_the_node_s_socket() {
    let mut spec = host_socket();
    spec["initContainers"] = json!([{"name": "setup", "image": "docker:24",
        "volumeMounts": [{"name": "dockersock", "mountPath": "/var/run/docker.sock"}]}]);
    let (after, _) = run_with(container_mode(), spec.clone(), &[]);
    let containers = after["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[1]["name"], GUARD_CONTAINER);
    assert!(containers[1].get("restartPolicy").is_none());
    assert_eq!(after["initContainers"], spec["initContainers"]);
}

#[test]
fn in_container_mode_a_daemon_among_init_containers_is_not_moved() {
    let spec = json!({
        "volumes": [{"name": "sock", "emptyDir": {}}],
        "initContainers": [{"name": "dind", "image": "docker:dind", "restartPolicy": "Always",
            "args": ["dockerd", "--host=unix:///var/run/docker.sock"],
            "volumeMounts": [{"name": "sock", "mountPath": "/var/run"}]}],
        "containers": [{"name": "runner", "image": "runner",
            "env": [{"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"}],
            "volumeMounts": [{"name": "sock", "mountPath": "/var/run"}]}]
    });
    let (after, messages) = run_with(container_mode(), spec.clone(), &[]);
    assert_eq!(after["initContainers"], spec["initContainers"]);
    assert!(messages[0].contains("is an init container"), "{messages:?}");
    // Native: the guard goes right after the daemon, so that the kubelet stops the guard
    // first at the pod's end and its clean-up still reaches the daemon...
    let (after, _) = repair(spec.clone());
    assert_eq!(after["initContainers"][1]["name"], GUARD_CONTAINER);
    assert_eq!(
        after["initContainers"][0]["args"],
        json!(["dockerd", PRIVATE])
    );
    // ...unless the daemon's startup probe reaches it through the guard: a later sidecar
    // starts only once it passed, so the guard goes first.
    let mut probed = spec;
    probed["initContainers"][0]["startupProbe"] =
        json!({"exec": {"command": ["docker", "info"]}, "periodSeconds": 1});
    let (after, _) = repair(probed);
    assert_eq!(after["initContainers"][0]["name"], GUARD_CONTAINER);
    assert_eq!(after["initContainers"][1]["name"], "dind");
}

#[test]
fn the_guard_is_built_from_its_command_with_probes_on_a_free_port_and_no_capability_but_chown() {
    let mut spec = shared_var_run();
    spec["containers"][0]["ports"] = json!([{"containerPort": 9797}]);
    let (after, _) = repair(spec);
    let guard = guard(&after);
    assert_eq!(
        guard["image"],
        concat!("ghcr.io/podmend/podmend:", env!("CARGO_PKG_VERSION"))
    );
    let mut expected = GuardCommand::new(
        vec![Address::Unix("/var/run/docker.sock".into())],
        Address::Unix("/podmend/daemon/docker.sock".into()),
        Policy::Collect,
    );
    // `[::]`: the kubelet probes the pod IP, IPv6 on IPv6 clusters.
    expected.health_listen = Some("[::]:9798".parse().expect("address"));
    expected.daemon_in_pod = true;
    expected.daemon_socket_paths = vec!["/podmend/daemon/docker.sock".to_string()];
    assert_eq!(guard["args"], json!(expected.to_args()));
    assert_eq!(
        guard["env"],
        json!([
            {"name": "PODMEND_OWNER_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ])
    );
    assert_eq!(
        guard["startupProbe"],
        json!({"httpGet": {"path": "/healthz", "port": 9798}, "periodSeconds": 1, "failureThreshold": 60})
    );
    assert_eq!(
        guard["readinessProbe"],
        json!({"httpGet": {"path": "/readyz", "port": 9798}, "periodSeconds": 5, "failureThreshold": 3})
    );
    assert_eq!(
        guard["resources"],
        json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}})
    );
    assert_eq!(
        guard["securityContext"],
        json!({"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"add": ["CHOWN"], "drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    for (_, path) in mounts(guard) {
        assert!(
            !path.starts_with("/podmend") || !path.contains("/run"),
            "{path}"
        );
    }
}

#[test]
fn the_collection_settings_reach_the_guard() {
    let config = DindRmConfig {
        min_age: Duration::from_secs(90),
        max_exited: 3,
        ..DindRmConfig::default()
    };
    let (after, _) = run_with(config, shared_var_run(), &[]);
    let command = command(&after);
    assert_eq!(command.min_age, Duration::from_secs(90));
    assert_eq!(command.max_exited, 3);
}

#[test]
fn with_pod_level_resources_the_guard_has_none_and_shares_the_pod_budget() {
    let mut spec = shared_var_run();
    spec["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
    let (after, _) = repair(spec);
    assert!(guard(&after).get("resources").is_none(), "{after:#}");
}

#[test]
fn the_policy_comes_from_the_config_or_the_pod_annotation() {
    let reap = DindRmConfig {
        policy: Policy::Reap,
        ..DindRmConfig::default()
    };
    type Annotations<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Annotations<'_>, Policy, Option<&str>); 4] = [
        (&[], Policy::Reap, None),
        (&[(POLICY_ANNOTATION, "deny")], Policy::Deny, None),
        (&[(POLICY_ANNOTATION, " Audit ")], Policy::Audit, None),
        (
            &[(POLICY_ANNOTATION, "strict")],
            Policy::Reap,
            Some("\"strict\" is not collect, rm, deny, reap, audit or off: using policy reap"),
        ),
    ];
    for (annotations, expected, note) in cases {
        let (after, messages) = run_with(reap.clone(), shared_var_run(), annotations);
        assert_eq!(command(&after).policy, expected, "{annotations:?}");
        assert!(
            messages[0].contains(&format!("(policy {expected})")),
            "{messages:?}"
        );
        match note {
            Some(note) => assert!(messages.iter().any(|m| m.contains(note)), "{messages:?}"),
            None => assert!(
                messages.iter().all(|m| !m.contains("is not")),
                "{messages:?}"
            ),
        }
    }
    assert_eq!(DindRmConfig::default().policy, Policy::Collect);
}

#[test]
fn the_annotation_turns_the_rule_off_for_one_pod() {
    let (after, messages) = run_with(
        DindRmConfig::default(),
        host_socket(),
        &[(POLICY_ANNOTATION, "off")],
    );
    assert!(messages.is_empty());
    assert_eq!(
        mounts(&after["containers"][0]),
        vec![mount("dockersock", "/var/run/docker.sock")]
    );
}

#[test]
fn the_repair_is_idempotent() {
    for (config, spec) in [
        (DindRmConfig::default(), shared_var_run()),
        (DindRmConfig::default(), tls_service()),
        (DindRmConfig::default(), plain_tcp("127.0.0.1")),
        (DindRmConfig::default(), host_socket()),
        (container_mode(), host_socket()),
        (container_mode(), shared_var_run()),
    ] {
        let (after, messages) = run_with(config.clone(), spec, &[]);
        assert!(!messages.is_empty());
        let (again, messages) = run_with(config, after.clone(), &[]);
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(again, after);
    }
}

#[test]
fn podmend_s_volume_names_taken_by_the_pod_stop_the_repair() {
    let mut spec = shared_var_run();
    spec["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({"name": "podmend-daemon", "hostPath": {"path": "/tmp"}}));
    let (after, messages) = repair(spec.clone());
    assert!(after["initContainers"].is_null());
    assert_eq!(
        messages,
        vec!["podmend-guard not injected: the pod already has a volume named podmend-daemon"]
    );
}

#[test]
fn two_daemons_fall_back_to_the_clients_docker_host() {
    let (after, messages) = repair(json!({"containers": [
        {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}]},
        {"name": "a", "image": "docker:dind", "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]},
        {"name": "b", "image": "docker:dind", "args": ["dockerd", "-H", "tcp://0.0.0.0:2377"]}
    ]}));
    assert_eq!(upstream(&after), "tcp://localhost:2375");
    assert!(
        messages[0].contains("2 Docker daemons (a, b)"),
        "{messages:?}"
    );
}

#[test]
fn a_docker_client_image_alone_is_not_dind() {
    let (after, messages) = repair(json!({"containers": [
        {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://dind.ci:2375"}]}
    ]}));
    assert!(messages.is_empty(), "{messages:?}");
    assert!(after.get("initContainers").is_none());
}

#[test]
fn a_pod_without_docker_or_without_clients_is_left_alone() {
    let (_, messages) = repair(json!({"containers": [{"name": "web", "image": "nginx"}],
        "volumes": [{"name": "run", "hostPath": {"path": "/var/run"}}]}));
    assert!(messages.is_empty(), "{messages:?}");
}

#[test]
fn a_tcp_only_daemon_keeps_its_own_socket_leading_to_the_guard() {
    // GitLab's TCP-only service: no client mounts the daemon's /var/run/docker.sock, but what
    // the daemon binds from its own filesystem (Testcontainers' Ryuk) and `kubectl exec -c
    // dind docker ps` need it there.
    let (after, messages) = repair(plain_tcp("tcp://localhost:2375"));
    assert_eq!(
        listen(&after),
        vec!["tcp://0.0.0.0:2375", "unix:///podmend/run/docker.sock"]
    );
    assert_eq!(
        mounts(named(&after, "dind")),
        vec![
            mount("podmend-daemon", "/podmend/daemon"),
            mount("podmend-run", "/var/run")
        ]
    );
    assert_eq!(
        mounts(guard(&after)),
        vec![
            mount("podmend-daemon", "/podmend/daemon"),
            mount("podmend-run", "/podmend/run")
        ]
    );
    assert!(
        after["volumes"]
            .as_array()
            .expect("volumes")
            .contains(&json!({"name": "podmend-run", "emptyDir": {}}))
    );
    assert!(
        messages.contains(
            &"dind's own unix:///var/run/docker.sock now leads to podmend-guard (an emptyDir over /var/run)"
                .to_string()
        ),
        "{messages:?}"
    );
}

#[test]
fn a_daemon_socket_in_a_volume_no_client_shares_is_kept_in_that_volume() {
    let mut spec = plain_tcp("tcp://localhost:2375");
    spec["volumes"] = json!([{"name": "dind-run", "emptyDir": {}}]);
    spec["containers"][1]["volumeMounts"] = json!([{"name": "dind-run", "mountPath": "/run"}]);
    let (after, _) = repair(spec);
    assert_eq!(
        listen(&after),
        vec!["tcp://0.0.0.0:2375", "unix:///run/docker.sock"]
    );
    assert!(mounts(guard(&after)).contains(&mount("dind-run", "/run")));
    assert!(!mounts(named(&after, "dind")).contains(&mount("podmend-run", "/var/run")));
}

#[test]
fn a_daemon_no_container_is_known_to_use_gets_the_guard_in_its_place() {
    // Jenkins: DOCKER_HOST is set in the Jenkinsfile, so no container of the pod is a known
    // client; the daemon's plain TCP port is still open to every container.
    let (after, messages) = repair(json!({"containers": [
        {"name": "jnlp", "image": "jenkins/inbound-agent:3309.v27b_9314fd1a_4-1"},
        {"name": "dind", "image": "docker:27-dind", "securityContext": {"privileged": true},
         "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}
    ]}));
    assert!(
        messages[0].starts_with("injected podmend-guard (policy collect) in daemon dind's place"),
        "{messages:?}"
    );
    assert_eq!(
        listen(&after),
        vec!["tcp://0.0.0.0:2375", "unix:///podmend/run/docker.sock"]
    );
    assert_eq!(named(&after, "dind")["args"], json!(["dockerd", PRIVATE]));
    assert_eq!(
        named(&after, "jnlp"),
        &json!({"name": "jnlp", "image": "jenkins/inbound-agent:3309.v27b_9314fd1a_4-1"})
    );
    // The image alone names a daemon too.
    let (after, messages) =
        repair(json!({"containers": [{"name": "dind", "image": "docker:dind"}]}));
    assert!(
        messages[0].starts_with("injected podmend-guard"),
        "{messages:?}"
    );
    assert_eq!(listen(&after), vec!["unix:///podmend/run/docker.sock"]);
}

#[test]
fn a_daemon_no_container_uses_that_cannot_be_moved_is_reported() {
    let (after, messages) = repair(json!({"containers": [
        {"name": "dind", "image": "docker:dind", "command": ["sh", "-c", "dockerd &"]}
    ]}));
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0].starts_with("podmend-guard not injected: daemon dind cannot be moved"),
        "{messages:?}"
    );
    assert!(after.get("initContainers").is_none());
}

#[test]
fn a_privileged_docker_cli_image_without_a_command_is_not_a_daemon() {
    let (after, messages) = repair(json!({"containers": [
        {"name": "docker", "image": "docker:27-cli", "securityContext": {"privileged": true}}
    ]}));
    assert!(messages.is_empty(), "{messages:?}");
    assert!(after.get("initContainers").is_none());
}

#[test]
fn may_apply_skips_guarded_pods_pods_turned_off_and_pods_without_docker() {
    let rule = DindRm::new(DindRmConfig::default());
    let meta = |policy: Option<&str>| {
        meta_with(
            &policy
                .map(|p| vec![(POLICY_ANNOTATION, p)])
                .unwrap_or_default(),
            None,
        )
    };
    let (guarded, _) = repair(shared_var_run());
    assert!(rule.may_apply(&shared_var_run(), &meta(None)));
    assert!(rule.may_apply(&host_socket(), &meta(Some("deny"))));
    assert!(!rule.may_apply(&guarded, &meta(None)));
    assert!(!rule.may_apply(&shared_var_run(), &meta(Some("off"))));
    assert!(!rule.may_apply(
        &json!({"containers": [{"name": "a", "image": "nginx"}]}),
        &meta(None)
    ));
    assert!(!rule.may_apply(&json!({"containers": "not a list"}), &meta(None)));
}

#[test]
fn long_lists_are_shortened() {
    let list: Vec<String> = ["a", "b", "c", "d", "e"].map(str::to_string).to_vec();
    assert_eq!(names(&list[..3]), "a, b, c");
    assert_eq!(names(&list), "a, b and 3 more");
    let long = truncate("x".repeat(200));
    assert_eq!(long.chars().count(), MAX_MESSAGE);
}

#[test]
fn a_tls_client_whose_certificates_the_guard_cannot_mount_leaves_the_pod_alone() {
    for (cert_path, reason) in [
        (None, "verifies TLS without DOCKER_CERT_PATH"),
        (
            Some("/root/.docker"),
            "DOCKER_CERT_PATH /root/.docker of build is in no volume",
        ),
    ] {
        let mut env = vec![
            json!({"name": "DOCKER_HOST", "value": "tcp://localhost:2376"}),
            json!({"name": "DOCKER_TLS_VERIFY", "value": "1"}),
        ];
        if let Some(path) = cert_path {
            env.push(json!({"name": "DOCKER_CERT_PATH", "value": path}));
        }
        let (after, messages) = repair(json!({"containers": [
            {"name": "build", "image": "docker:24", "env": env},
            {"name": "dind", "image": "docker:dind", "command": ["sh", "-c", "dockerd-entrypoint.sh"]}
        ]}));
        assert!(after["initContainers"].is_null());
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains(reason), "{messages:?}");
    }
}

#[test]
fn a_host_alias_for_the_pod_makes_a_client_s_unserved_port_a_misreading() {
    // docker:2377 is a remote daemon unless a hostAlias makes "docker" the pod itself.
    let mut spec = plain_tcp("tcp://docker:2377");
    let (after, _) = repair(spec.clone());
    assert_eq!(
        listen(&after),
        vec!["tcp://0.0.0.0:2375", "unix:///podmend/run/docker.sock"]
    );
    spec["hostAliases"] = json!([{"ip": "127.0.0.1", "hostnames": ["docker"]}]);
    let (after, messages) = repair(spec);
    assert_eq!(upstream(&after), "tcp://docker:2377");
    assert!(
        messages[0].contains("main uses tcp://docker:2377"),
        "{messages:?}"
    );
}

/// The chart's image from a private registry: a pod in another namespace, without pull
/// secrets, would wait in Init:ErrImagePull for a guard its node cannot pull. It is left as it
/// is, and the finding says why; with a pull secret (its own or its ServiceAccount's, which
/// the ServiceAccount admission plugin has copied in before any webhook) it gets the guard.
#[test]
fn a_pod_without_pull_secrets_is_left_alone_when_the_guard_image_needs_one() {
    let private = DindRmConfig {
        guard_image_needs_pull_secret: true,
        ..DindRmConfig::default()
    };
    let spec = shared_var_run();
    let (after, messages) = run_with(private.clone(), spec.clone(), &[]);
    let typed: PodSpec = serde_json::from_value(spec.clone()).expect("test spec");
    assert_eq!(after, serde_json::to_value(typed).expect("serializes"));
    assert_eq!(
        messages,
        [format!(
            "{GUARD_CONTAINER} not injected: its image needs a pull secret and the pod has no imagePullSecrets"
        )]
    );
    let mut with_secret = spec;
    with_secret["imagePullSecrets"] = json!([{"name": "registry"}]);
    let (after, _) = run_with(private, with_secret, &[]);
    assert_eq!(guard(&after)["image"], DindRmConfig::default().guard_image);
}

#[test]
fn a_host_network_pod_s_guard_gets_a_port_and_a_probe_token_of_its_own() {
    let mut spec = plain_tcp("127.0.0.1");
    spec["hostNetwork"] = json!(true);
    let (first, _) = repair(spec.clone());
    let (second, _) = repair(spec);
    let (one, two) = (command(&first), command(&second));
    let port = one.health_listen.expect("a health port").port();
    assert!((HOST_NETWORK_PORTS.0..=HOST_NETWORK_PORTS.1).contains(&port));
    let token = one.health_token.clone().expect("a token");
    assert_ne!(one.health_token, two.health_token);
    let injected = guard(&first);
    assert_eq!(
        injected["startupProbe"]["httpGet"],
        json!({"path": format!("/healthz/{token}"), "port": port})
    );
    assert_eq!(
        injected["readinessProbe"]["httpGet"],
        json!({"path": format!("/readyz/{token}"), "port": port})
    );
    assert_eq!(
        injected["ports"],
        json!([{"name": HEALTH_PORT_NAME, "containerPort": port, "protocol": "TCP"}])
    );
    // Off the node's network: the fixed port, plain paths, nothing declared.
    let (after, _) = repair(plain_tcp("127.0.0.1"));
    assert_eq!(command(&after).health_token, None);
    assert!(guard(&after).get("ports").is_none());
}
