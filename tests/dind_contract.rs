//! The DinD contract end to end: a guard command line written by [`GuardCommand::to_args`]
//! (what the dind-rm rule injects) is read back by the real command-line parser into the same
//! value, for every setting; and every command line the rule actually injects, into the real
//! CI pods and into generated ones, under every configuration, is one the CLI reads back to
//! the command the rule built (it writes the same arguments again).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::dind::{all_containers, fixture_pod, parse_guard_args};
use common::pod_gen;
use podmend::cluster::StaticCluster;
use podmend::config::{Config, Mode, NodeAgents, SidecarMode};
use podmend::dind::{Address, GUARD_CONTAINER, GuardCommand, Policy};
use podmend::engine::{Engine, Operation, Subject};
use proptest::test_runner::{Config as ProptestConfig, RngSeed, TestRunner};
use serde_json::Value;

fn tcp(host: &str, port: u16) -> Address {
    Address::Tcp {
        host: host.to_string(),
        port,
    }
}

fn unix(path: &str) -> Address {
    Address::Unix(PathBuf::from(path))
}

fn every_setting() -> Vec<GuardCommand> {
    let base = GuardCommand::new(
        vec![unix("/podmend/guard/docker.sock")],
        tcp("docker", 2375),
        Policy::default(),
    );
    let mut commands = Vec::new();
    for policy in Policy::ALL {
        commands.push(GuardCommand {
            policy,
            ..base.clone()
        });
    }
    commands.push(GuardCommand {
        listen: vec![
            unix("/var/run/docker.sock"),
            tcp("0.0.0.0", 2376),
            tcp("::", 2375),
        ],
        tls_certdir: Some(PathBuf::from("/certs")),
        tls_san: vec!["docker".into(), "$(POD_IP)".into(), "10.0.0.7".into()],
        upstream: unix("/podmend/daemon/docker.sock"),
        ..base.clone()
    });
    commands.push(GuardCommand {
        upstream: tcp("127.0.0.1", 2376),
        upstream_cert_path: Some(PathBuf::from("/certs/client")),
        ..base.clone()
    });
    commands.push(GuardCommand {
        min_age: Duration::from_secs(90),
        max_exited: 3,
        health_listen: Some("0.0.0.0:9797".parse().expect("address")),
        health_token: Some("3f9a0c2e7d1b4a66".to_string()),
        ..base.clone()
    });
    commands.push(GuardCommand {
        health_listen: Some("[::]:9797".parse().expect("address")),
        ..base.clone()
    });
    commands.push(GuardCommand {
        min_age: Duration::from_secs(0),
        max_exited: 0,
        upstream_wait: Duration::from_secs(0),
        ..base.clone()
    });
    commands.push(GuardCommand {
        upstream_wait: Duration::from_secs(300),
        daemon_in_pod: true,
        daemon_socket_paths: vec!["/var/run/docker.sock".into(), "/run/docker.sock".into()],
        guard_socket_for_daemon: Some(
            "/var/lib/kubelet/pods/$(PODMEND_OWNER_POD_UID)/volumes/kubernetes.io~empty-dir/podmend-guard/docker.sock"
                .into(),
        ),
        ..base
    });
    commands
}

#[test]
fn every_guard_command_line_parses_back_to_what_was_written() {
    for command in every_setting() {
        let args = command.to_args();
        assert_eq!(args[0], "guard");
        assert_eq!(parse_guard_args(&args), command, "{}", args.join(" "));
    }
}

/// The flags that take no value.
const BARE_FLAGS: [&str; 2] = ["--tls-verify", "--daemon-in-pod"];

#[test]
fn every_value_is_joined_to_its_flag_so_none_can_read_as_a_flag() {
    for command in every_setting() {
        for arg in command.to_args().iter().skip(1) {
            assert!(
                arg.starts_with("--") && (arg.contains('=') || BARE_FLAGS.contains(&arg.as_str())),
                "{arg}"
            );
        }
    }
}

/// Every configuration the rule's output depends on.
fn configs() -> Vec<(String, Config)> {
    let mut configs = Vec::new();
    for sidecar_mode in [SidecarMode::Native, SidecarMode::Container] {
        for node_agents in [NodeAgents::Skip, NodeAgents::Guard] {
            for (policy, min_age, max_exited) in [
                (Policy::Collect, Duration::from_secs(300), 20),
                (Policy::Rm, Duration::from_secs(90), 0),
                (Policy::Audit, Duration::from_secs(3600), 5),
            ] {
                let mut config = Config::default();
                let dind = &mut config.rules.dind_rm;
                (dind.mode, dind.templates) = (Mode::Enforce, Mode::Enforce);
                dind.sidecar_mode = sidecar_mode;
                dind.node_agents = node_agents;
                dind.policy = policy;
                dind.min_age = min_age;
                dind.max_exited = max_exited;
                configs.push((format!("{sidecar_mode:?}/{node_agents:?}/{policy}"), config));
            }
        }
    }
    configs
}

/// The guard's args in `object` after the engine's repair, if a guard was injected.
fn injected_args(engine: &Engine, object: &Value) -> Option<Vec<String>> {
    let kind = object["kind"].as_str().unwrap_or("Pod");
    let group = match kind {
        "Deployment" | "DaemonSet" => "apps",
        "CronJob" => "batch",
        _ => "",
    };
    let subject = Subject {
        operation: Operation::Create,
        group,
        kind,
        sub_resource: "",
        namespace: "ci",
        object: Some(object),
        old_object: None,
    };
    let outcome = engine.review(&subject, &StaticCluster::empty());
    let mut repaired = object.clone();
    json_patch::patch(&mut repaired, outcome.repair()).expect("the repair applies");
    let spec = [
        "/spec/jobTemplate/spec/template/spec",
        "/spec/template/spec",
        "/spec",
    ]
    .iter()
    .find_map(|p| repaired.pointer(p))?;
    let guard = all_containers(spec)
        .into_iter()
        .find(|c| c["name"] == GUARD_CONTAINER)?;
    Some(
        guard["args"]
            .as_array()
            .expect("the guard has args")
            .iter()
            .map(|a| a.as_str().expect("string args").to_string())
            .collect(),
    )
}

/// The rule wrote `args` from a GuardCommand: the CLI reads them back to one that writes the
/// very same arguments, each `--flag=value`.
fn assert_reads_back(args: &[String], context: &str) {
    let command = parse_guard_args(args);
    assert_eq!(command.to_args(), args, "{context}");
    for arg in args.iter().skip(1) {
        assert!(
            arg.starts_with("--") && (arg.contains('=') || BARE_FLAGS.contains(&arg.as_str())),
            "{context}: {arg}"
        );
    }
}

const FIXTURES: &[&str] = &[
    "jenkins-k8s-plugin-example-dind-pod-template.yaml",
    "jenkins-k8s-plugin-example-dood-pod-template.yaml",
    "jenkins-k8s-plugin-agent-pod-dind-reconstructed.yaml",
    "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
    "arc-gha-runner-scale-set-values-0041559-dind-native-sidecar-template.yaml",
    "arc-legacy-summerwind-runner-pod-docker-dind-sidecar-reconstructed.yaml",
    "argo-workflows-sidecar-dind-pod-reconstructed.yaml",
    "gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml",
    "tekton-dind-sidecar-taskrun-digest-pinned-pod-reconstructed.yaml",
    "kubernetes-examples-sysdig-agent-daemonset-host-docker-sock.yaml",
    "kubernetes-examples-newrelic-agent-daemonset-host-docker-sock.yaml",
];

#[test]
fn every_guard_the_rule_injects_into_the_real_ci_pods_reads_back_through_the_cli() {
    let mut injected = 0;
    for (label, config) in configs() {
        let engine = Engine::new(&config);
        for file in FIXTURES {
            let pod = fixture_pod(file, "pod");
            // And with the daemon made one podmend cannot move: the fallback's command line.
            let mut fallback = pod.clone();
            for list in ["initContainers", "containers"] {
                for c in fallback["spec"][list].as_array_mut().into_iter().flatten() {
                    if c["securityContext"]["privileged"] == true {
                        c["command"] = serde_json::json!(["sh", "-c", "dockerd-entrypoint.sh"]);
                    }
                }
            }
            for object in [pod, fallback] {
                if let Some(args) = injected_args(&engine, &object) {
                    assert_reads_back(&args, &format!("{label} {file}"));
                    injected += 1;
                }
            }
        }
    }
    assert!(injected >= 12 * 18, "only {injected} guards injected");
}

#[test]
fn every_guard_the_rule_injects_into_generated_pods_reads_back_through_the_cli() {
    let configs = configs();
    let engines: Vec<(String, Engine)> = configs
        .iter()
        .map(|(label, config)| (label.clone(), Engine::new(config)))
        .collect();
    let mut proptest = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        proptest.cases = 256;
    }
    if proptest.rng_seed == RngSeed::Random {
        proptest.rng_seed = RngSeed::Fixed(0x15_d1d);
    }
    proptest.failure_persistence = None;
    let injected = std::cell::Cell::new(0usize);
    let mut runner = TestRunner::new(proptest);
    runner
        .run(&pod_gen::pod_case(), |case| {
            for (label, engine) in &engines {
                if let Some(args) = injected_args(engine, &case.object) {
                    assert_reads_back(&args, label);
                    injected.set(injected.get() + 1);
                }
            }
            Ok(())
        })
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(
        injected.get() > 100,
        "only {} guards injected",
        injected.get()
    );
}
