//! Shared by the Docker-in-Docker tests: the real CI pods as podmend sees them, the guard and
//! the daemon in a repaired pod, the guard's command line read back by the real CLI, and the
//! API server's checks on what dind-rm adds (names, volumes, mounts, probes, the downward
//! API), which `k8s_rules` does not model.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Parser;
use podmend::cli::{Cli, Command};
use podmend::dind::{GUARD_CONTAINER, GuardCommand};
use serde_json::{Value, json};

/// The fixture as a Pod named `name` in `ci`: a pod template (`template:` or a workload's
/// `spec.template`) or a bare Pod, its metadata (labels, annotations, owners) kept.
pub fn fixture_pod(file: &str, name: &str) -> Value {
    let document = super::server::fixture(file);
    let template = document
        .get("template")
        .or_else(|| document.pointer("/spec/template"));
    let (metadata, spec) = match template {
        Some(template) => (template.get("metadata"), &template["spec"]),
        None => (document.get("metadata"), &document["spec"]),
    };
    let mut metadata = metadata.cloned().unwrap_or_else(|| json!({}));
    if let Some(map) = metadata.as_object_mut() {
        map.remove("generateName");
    }
    metadata["name"] = json!(name);
    metadata["namespace"] = json!("ci");
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// Every container of a pod spec, init containers first.
pub fn all_containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .collect()
}

/// The container named `name`.
pub fn container<'a>(spec: &'a Value, name: &str) -> &'a Value {
    all_containers(spec)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {spec:#}"))
}

pub fn guard(spec: &Value) -> &Value {
    container(spec, GUARD_CONTAINER)
}

/// The guard container's args as strings.
pub fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// A guard's args (its entrypoint is `podmend`) read by the real command-line parser, with
/// the owner UID the downward API gives it.
pub fn parse_guard_args(args: &[String]) -> GuardCommand {
    let argv = std::iter::once("podmend".to_string())
        .chain(args.iter().cloned())
        .chain(["--owner-pod-uid".to_string(), "uid".to_string()]);
    let cli = Cli::try_parse_from(argv)
        .unwrap_or_else(|error| panic!("podmend {} does not parse: {error}", args.join(" ")));
    let Command::Guard(guard) = cli.command else {
        panic!("not podmend guard: {args:?}");
    };
    assert!(guard.command.is_none(), "{args:?} is not the proxy");
    guard
        .run
        .command()
        .unwrap_or_else(|error| panic!("{args:?}: {error}"))
}

/// The guard's command line in a repaired pod spec.
pub fn guard_command(spec: &Value) -> GuardCommand {
    parse_guard_args(&args(guard(spec)))
}

/// (volume, mountPath) of each mount.
pub fn mounts(container: &Value) -> Vec<(String, String)> {
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

pub fn mount(name: &str, path: &str) -> (String, String) {
    (name.to_string(), path.to_string())
}

/// The value of the container's env var `name` (its last entry).
pub fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .rfind(|e| e["name"] == name)
        .map(|e| &e["value"])
}

/// The daemon's command and args as one argv (what the container runs after its image's
/// entrypoint, when it has a command).
pub fn argv(container: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .filter_map(|key| container[key].as_array())
        .flatten()
        .map(|a| a.as_str().expect("string").to_string())
        .collect()
}

/// Field paths the API server accepts in an env var's `fieldRef` (`validEnvDownwardAPIFieldPathExpressions`).
const ENV_FIELD_PATHS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

/// The API server's checks (`ValidatePodSpec`) on the parts of a pod spec dind-rm changes:
/// unique container and volume names, mounts of existing volumes at distinct absolute paths,
/// relative subPaths without `..`, probes only where allowed, valid probe ports, a
/// `restartPolicy` only `Always` on init containers, supported downward-API fields.
pub fn api_errors(spec: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    if volumes.iter().collect::<BTreeSet<_>>().len() != volumes.len() {
        errors.push(format!("spec.volumes: duplicate names {volumes:?}"));
    }
    let containers = all_containers(spec);
    let names: BTreeSet<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    if names.len() != containers.len() {
        errors.push("duplicate container names".to_string());
    }
    for (list, is_init) in [("initContainers", true), ("containers", false)] {
        for (i, container) in spec[list].as_array().into_iter().flatten().enumerate() {
            let at = format!("spec.{list}[{i}]");
            let sidecar = container["restartPolicy"] == "Always";
            if is_init && !container["restartPolicy"].is_null() && !sidecar {
                errors.push(format!("{at}.restartPolicy: only Always"));
            }
            if !is_init && !container["restartPolicy"].is_null() {
                errors.push(format!("{at}.restartPolicy: forbidden on a container"));
            }
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                let Some(p) = container.get(probe).filter(|p| !p.is_null()) else {
                    continue;
                };
                if is_init && !sidecar {
                    errors.push(format!(
                        "{at}.{probe}: forbidden on a regular init container"
                    ));
                }
                if let Some(port) = p.pointer("/httpGet/port") {
                    let ok = port.as_i64().is_some_and(|n| (1..=65535).contains(&n))
                        || port.as_str().is_some_and(|s| !s.is_empty());
                    if !ok {
                        errors.push(format!("{at}.{probe}.httpGet.port: invalid {port}"));
                    }
                }
            }
            let mut paths = BTreeSet::new();
            for (j, m) in container["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let mat = format!("{at}.volumeMounts[{j}]");
                let name = m["name"].as_str().unwrap_or_default();
                if !volumes.contains(&name) {
                    errors.push(format!("{mat}.name: volume {name} not found"));
                }
                let path = m["mountPath"].as_str().unwrap_or_default();
                if !path.starts_with('/') {
                    errors.push(format!("{mat}.mountPath: {path:?} not absolute"));
                }
                if !paths.insert(path.trim_end_matches('/').to_string()) {
                    errors.push(format!("{mat}.mountPath: {path} must be unique"));
                }
                if let Some(sub) = m["subPath"].as_str()
                    && (sub.starts_with('/') || sub.split('/').any(|part| part == ".."))
                {
                    errors.push(format!(
                        "{mat}.subPath: {sub:?} must be relative, without .."
                    ));
                }
            }
            for (j, e) in container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(field) = e.pointer("/valueFrom/fieldRef/fieldPath")
                    && !field
                        .as_str()
                        .is_some_and(|f| ENV_FIELD_PATHS.contains(&f) || f.starts_with("metadata."))
                {
                    errors.push(format!(
                        "{at}.env[{j}].valueFrom.fieldRef: {field} unsupported"
                    ));
                }
            }
        }
    }
    errors
}

/// `path` rooted in `root`: `/podmend/daemon/docker.sock` → `<root>/podmend/daemon/docker.sock`.
pub fn under(root: &std::path::Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The daemon's only address after the repair: the socket only the guard dials.
pub const PRIVATE: &str = "--host=unix:///podmend/daemon/docker.sock";

/// A real CI pod the dind-rm rule repairs: its fixture, the daemon's container, where the
/// daemon listened (the guard listens there after the repair), the guard's mounts in order,
/// the daemon's argv after the repair, and the TLS certificates' directory the guard serves
/// from.
pub struct CiPod {
    pub fixture: &'static str,
    pub daemon: &'static str,
    pub listen: &'static [&'static str],
    /// The guard's mounts, in order.
    pub guard_mounts: &'static [(&'static str, &'static str)],
    /// The daemon's command and args after the rewrite, as one argv.
    pub daemon_argv: &'static [&'static str],
    pub tls_certdir: Option<&'static str>,
}

/// The argv Argo's emissary wraps around the daemon's command.
pub const ARGO_EMISSARY: [&str; 9] = [
    "/var/run/argo/argoexec",
    "emissary",
    "--loglevel",
    "info",
    "--log-format",
    "text",
    "--gloglevel",
    "0",
    "--",
];

/// The CI systems' DinD pods, from `tests/fixtures`.
pub const CI_PODS: &[CiPod] = &[
    CiPod {
        fixture: "jenkins-k8s-plugin-example-dind-pod-template.yaml",
        daemon: "docker-daemon",
        listen: &["unix:///var/run/docker.sock"],
        guard_mounts: &[
            ("podmend-daemon", "/podmend/daemon"),
            ("docker-socket", "/var/run"),
        ],
        daemon_argv: &["dockerd", PRIVATE],
        tls_certdir: None,
    },
    CiPod {
        fixture: "jenkins-k8s-plugin-agent-pod-dind-reconstructed.yaml",
        daemon: "docker-daemon",
        listen: &["unix:///var/run/docker.sock"],
        guard_mounts: &[
            ("podmend-daemon", "/podmend/daemon"),
            ("docker-socket", "/var/run"),
        ],
        daemon_argv: &["dockerd", PRIVATE],
        tls_certdir: None,
    },
    CiPod {
        fixture: "arc-gha-runner-scale-set-0.9.3-dind-mode-template.yaml",
        daemon: "dind",
        listen: &["unix:///var/run/docker.sock"],
        guard_mounts: &[
            ("podmend-daemon", "/podmend/daemon"),
            ("dind-sock", "/var/run"),
        ],
        daemon_argv: &["dockerd", PRIVATE, "--group=$(DOCKER_GROUP_GID)"],
        tls_certdir: None,
    },
    CiPod {
        fixture: "arc-gha-runner-scale-set-values-0041559-dind-native-sidecar-template.yaml",
        daemon: "dind",
        listen: &["unix:///var/run/docker.sock"],
        guard_mounts: &[
            ("podmend-daemon", "/podmend/daemon"),
            ("dind-sock", "/var/run"),
        ],
        daemon_argv: &["dockerd", PRIVATE, "--group=$(DOCKER_GROUP_GID)"],
        tls_certdir: None,
    },
    CiPod {
        fixture: "arc-legacy-summerwind-runner-pod-docker-dind-sidecar-reconstructed.yaml",
        daemon: "docker",
        listen: &["unix:///run/docker.sock"],
        guard_mounts: &[("var-run", "/run"), ("podmend-daemon", "/podmend/daemon")],
        daemon_argv: &["dockerd", PRIVATE, "--group=$(DOCKER_GROUP_GID)"],
        tls_certdir: None,
    },
    CiPod {
        fixture: "argo-workflows-sidecar-dind-pod-reconstructed.yaml",
        daemon: "dind",
        // The daemon's own socket stays, in podmend's emptyDir over its /var/run.
        listen: &["tcp://0.0.0.0:2375", "unix:///podmend/run/docker.sock"],
        guard_mounts: &[
            ("podmend-daemon", "/podmend/daemon"),
            ("podmend-run", "/podmend/run"),
        ],
        daemon_argv: &[
            ARGO_EMISSARY[0],
            ARGO_EMISSARY[1],
            ARGO_EMISSARY[2],
            ARGO_EMISSARY[3],
            ARGO_EMISSARY[4],
            ARGO_EMISSARY[5],
            ARGO_EMISSARY[6],
            ARGO_EMISSARY[7],
            ARGO_EMISSARY[8],
            "dockerd-entrypoint.sh",
            "dockerd",
            PRIVATE,
        ],
        tls_certdir: None,
    },
    CiPod {
        fixture: "gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml",
        daemon: "svc-0",
        listen: &["tcp://0.0.0.0:2376", "unix:///podmend/run/docker.sock"],
        guard_mounts: &[
            ("podmend-certs", "/certs"),
            ("podmend-daemon", "/podmend/daemon"),
            ("docker-certs", "/certs/client"),
            ("podmend-run", "/podmend/run"),
        ],
        daemon_argv: &["dockerd", PRIVATE],
        tls_certdir: Some("/certs"),
    },
    CiPod {
        fixture: "tekton-dind-sidecar-taskrun-digest-pinned-pod-reconstructed.yaml",
        daemon: "sidecar-server",
        listen: &["tcp://0.0.0.0:2376", "unix:///podmend/run/docker.sock"],
        guard_mounts: &[
            ("podmend-certs", "/certs"),
            ("podmend-daemon", "/podmend/daemon"),
            ("dind-certs", "/certs/client"),
            ("podmend-run", "/podmend/run"),
        ],
        daemon_argv: &[
            "dockerd",
            PRIVATE,
            "--storage-driver=vfs",
            "--userland-proxy=false",
            "--debug",
        ],
        tls_certdir: Some("/certs"),
    },
];
