//! Who is who in a pod: Docker daemons (found by what they run, or by image), Docker
//! clients, node agents (DaemonSet pods, containers reading the node's socket at a path of
//! their own) and the volumes that are the node's Docker socket. Decides nothing about
//! repairs.

use super::PodMeta;
use crate::config::{DindRmConfig, NodeAgents, SidecarMode};
use crate::dind::{HOST_DOCKER_SOCKETS, is_docker_image};
use crate::engine::document::View;
use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};

/// The programs that make a container a Docker daemon, whatever its image.
const DAEMON_PROGRAMS: &[&str] = &["dockerd", "dockerd-entrypoint.sh"];
/// Where the docker CLI and dockerd put the socket when told nothing; `/run/docker.sock` is
/// the same place in images where `/var/run` links to `/run`.
pub(super) const DEFAULT_SOCKETS: &[&str] = &["/var/run/docker.sock", "/run/docker.sock"];
/// The environment that makes a container a Docker client.
const CLIENT_ENV: &[&str] = &[
    "DOCKER_HOST",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS",
];

/// A container by its place in the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Init(usize),
    Main(usize),
}

impl Slot {
    pub(super) fn get(self, spec: &PodSpec) -> Option<&Container> {
        match self {
            Slot::Init(i) => spec.init_containers.as_ref()?.get(i),
            Slot::Main(i) => spec.containers.get(i),
        }
    }

    pub(super) fn get_mut(self, spec: &mut PodSpec) -> Option<&mut Container> {
        match self {
            Slot::Init(i) => spec.init_containers.as_mut()?.get_mut(i),
            Slot::Main(i) => spec.containers.get_mut(i),
        }
    }
}

/// A container's mount of the node's Docker socket.
#[derive(Debug, Clone)]
pub(super) struct NodeSocketMount {
    pub slot: Slot,
    pub mount: VolumeMount,
}

/// Who is who in a pod.
#[derive(Debug, Default)]
pub(super) struct Survey {
    /// Containers that run a Docker daemon, in pod order (init containers first).
    pub daemons: Vec<Slot>,
    /// Containers that talk to Docker (or may), daemons and node agents excepted.
    pub clients: Vec<Slot>,
    /// Mounts of the node's socket by Docker clients.
    pub node_socket_mounts: Vec<NodeSocketMount>,
    /// Containers left alone as node agents, with the path they read the node's socket at.
    pub agents: Vec<(String, String)>,
    /// Volumes that are the node's Docker socket.
    pub node_socket_volumes: Vec<String>,
    /// The pod is a DaemonSet's (node infrastructure), and node agents are skipped.
    pub daemon_set: bool,
}

impl Survey {
    /// Nothing in the pod runs or mounts a Docker daemon.
    pub(super) fn has_docker(&self) -> bool {
        !self.daemons.is_empty() || !self.node_socket_volumes.is_empty()
    }
}

/// Reads the pod: daemons first (their volumes make the containers that share them clients),
/// then everyone else.
pub(super) fn survey(config: &DindRmConfig, spec: &PodSpec, meta: &PodMeta) -> Survey {
    let slots = all_slots(spec);
    let mut survey = Survey {
        daemons: slots
            .iter()
            .filter(|(_, container)| is_daemon(config, container))
            .map(|&(slot, _)| slot)
            .collect(),
        node_socket_volumes: node_socket_volumes(spec),
        daemon_set: config.node_agents == NodeAgents::Skip
            && meta.controller_kind.as_deref() == Some("DaemonSet"),
        ..Survey::default()
    };
    let daemon_volumes: Vec<&str> = survey
        .daemons
        .iter()
        .filter_map(|slot| slot.get(spec))
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str())
        .collect();
    for &(slot, container) in &slots {
        if !survey.daemons.contains(&slot) && !starts_before_guard(config, slot, container) {
            survey.add_other(config, slot, container, &daemon_volumes);
        }
    }
    survey
}

impl Survey {
    /// A container that runs no daemon: a node agent, or perhaps a client (with its mounts of
    /// the node's socket).
    fn add_other(
        &mut self,
        config: &DindRmConfig,
        slot: Slot,
        container: &Container,
        daemon_volumes: &[&str],
    ) {
        let socket_mounts: Vec<&VolumeMount> = container
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| self.node_socket_volumes.contains(&m.name))
            .collect();
        // A mount without a path is invalid (the API server refuses the pod and says so), not
        // a node agent's.
        let agent_mount = socket_mounts.iter().find(|m| {
            !m.mount_path.is_empty()
                && !DEFAULT_SOCKETS.contains(&m.mount_path.trim_end_matches('/'))
        });
        if let (Some(mount), NodeAgents::Skip) = (agent_mount, config.node_agents) {
            self.agents
                .push((container.name.clone(), mount.mount_path.clone()));
            return;
        }
        self.node_socket_mounts
            .extend(socket_mounts.into_iter().map(|mount| NodeSocketMount {
                slot,
                mount: mount.clone(),
            }));
        if is_client(container, daemon_volumes, &self.node_socket_volumes) {
            self.clients.push(slot);
        }
    }
}

/// The pod's volumes that are the node's Docker socket.
fn node_socket_volumes(spec: &PodSpec) -> Vec<String> {
    spec.volumes
        .iter()
        .flatten()
        .filter(|v| {
            v.host_path
                .as_ref()
                .is_some_and(|h| is_host_docker_socket(&h.path))
        })
        .map(|v| v.name.clone())
        .collect()
}

/// A plain guard container starts after the regular init containers have run: they cannot go
/// through it, so they keep what they had.
fn starts_before_guard(config: &DindRmConfig, slot: Slot, container: &Container) -> bool {
    let regular_init =
        matches!(slot, Slot::Init(_)) && container.restart_policy.as_deref() != Some("Always");
    regular_init && config.sidecar_mode == SidecarMode::Container
}

/// Every container with its slot, init containers first.
pub(super) fn all_slots(spec: &PodSpec) -> Vec<(Slot, &Container)> {
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (Slot::Init(i), c));
    let main = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (Slot::Main(i), c));
    init.chain(main).collect()
}

/// A Docker daemon, by what it runs (`dockerd`, the dind entrypoint, also after Argo's
/// wrapper; the official `docker` image running privileged with no command, so its
/// entrypoint `dockerd-entrypoint.sh` runs, unless it is a `-cli` tag, whose entrypoint runs
/// `sh`), or by a configured image pattern.
pub(super) fn is_daemon(config: &DindRmConfig, container: &Container) -> bool {
    let command = container.command.as_deref();
    let args = container.args.as_deref();
    let image = container.image.as_deref().unwrap_or("");
    runs_daemon(command, args)
        || is_daemon_image(config, image)
        || (is_docker_image(image)
            && !is_cli_tag(image)
            && container
                .security_context
                .as_ref()
                .and_then(|s| s.privileged)
                == Some(true)
            && command.is_none()
            && args
                .and_then(|a| a.first())
                .is_none_or(|first| first.starts_with('-')))
}

/// Whether the docker image's tag is a CLI variant (`cli`, `27-cli`, `27.3.1-cli-alpine3.20`):
/// its entrypoint `docker-entrypoint.sh` runs `sh` when given no command, not a daemon.
fn is_cli_tag(image: &str) -> bool {
    let reference = image.split('@').next().unwrap_or(image);
    let last = reference.rsplit('/').next().unwrap_or(reference);
    last.split_once(':')
        .is_some_and(|(_, tag)| tag.split('-').any(|part| part == "cli"))
}

/// Whether `image` (a digest is ignored) matches one of the configured daemon images.
pub(super) fn is_daemon_image(config: &DindRmConfig, image: &str) -> bool {
    let image = image.split('@').next().unwrap_or(image);
    config
        .daemon_images
        .iter()
        .any(|pattern| glob_match(pattern, image))
}

/// Whether the program a container runs (its command, or without one its args' first word,
/// after Argo's `argoexec emissary ... --` wrapper) is `dockerd` or the dind entrypoint.
pub(super) fn runs_daemon<S: AsRef<str>>(command: Option<&[S]>, args: Option<&[S]>) -> bool {
    let argv: Vec<&str> = command
        .into_iter()
        .flatten()
        .chain(args.into_iter().flatten())
        .map(AsRef::as_ref)
        .collect();
    let start = command.map_or(0, program_index);
    argv.get(start)
        .and_then(|word| word.split_whitespace().next())
        .map(basename)
        .is_some_and(|name| DAEMON_PROGRAMS.contains(&name))
}

/// The raw form of [`runs_daemon`], for `may_apply`.
pub(super) fn raw_runs_daemon(container: &dyn View) -> bool {
    let words = |key: &str| -> Option<Vec<&str>> {
        let list = container.field(key)?.items()?;
        Some(list.filter_map(|word| word.as_str()).collect())
    };
    let (command, args) = (words("command"), words("args"));
    runs_daemon(command.as_deref(), args.as_deref())
}

/// Where the program starts in `command`: after Argo's emissary executor
/// (`/var/run/argo/argoexec emissary <flags> -- <program>`), else at 0.
pub(super) fn program_index<S: AsRef<str>>(command: &[S]) -> usize {
    let wrapped = command.first().map(|w| basename(w.as_ref())) == Some("argoexec")
        && command.get(1).map(AsRef::as_ref) == Some("emissary");
    if !wrapped {
        return 0;
    }
    command
        .iter()
        .position(|w| w.as_ref() == "--")
        .map_or(0, |i| i + 1)
}

pub(super) fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// A container that talks to Docker, or may: it has Docker client settings in its env, or
/// shares a volume with a daemon (the socket, the TLS certificates), or mounts the node's
/// socket, or runs the official `docker` image.
fn is_client(container: &Container, daemon_volumes: &[&str], node_sockets: &[String]) -> bool {
    container
        .env
        .iter()
        .flatten()
        .any(|e| CLIENT_ENV.contains(&e.name.as_str()))
        || container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| daemon_volumes.contains(&m.name.as_str()) || node_sockets.contains(&m.name))
        || container.image.as_deref().is_some_and(is_docker_image)
}

pub(super) fn is_host_docker_socket(path: &str) -> bool {
    HOST_DOCKER_SOCKETS.contains(&path.trim_end_matches('/'))
}

/// A glob where `*` matches any run of characters (`/` included) and everything else matches
/// itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    // The last star seen, and the text position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn container(value: Value) -> Container {
        let mut value = value;
        value["name"] = json!("c");
        serde_json::from_value(value).expect("container")
    }

    #[test]
    fn daemon_images_are_recognised_by_the_default_patterns() {
        let config = DindRmConfig::default();
        let cases = [
            ("docker:dind", true),
            ("docker:19.03.1-dind", true),
            ("docker:24-dind", true),
            ("docker:dind-rootless", true),
            ("docker:24.0.7-dind-rootless", true),
            ("docker:27.3.1-dind-alpine3.20", true),
            ("docker.io/library/docker:dind", true),
            ("mirror.gcr.io/library/docker:24.0.7-dind", true),
            ("registry.example.com:5000/docker:dind-rootless", true),
            ("docker:dind@sha256:0123456789abcdef", true),
            ("docker:24", false),
            ("docker:19.03.1", false),
            ("docker:cli", false),
            ("docker", false),
            ("docker.io/library/docker:27", false),
            ("mydocker:dind", false),
            ("busybox", false),
            ("ghcr.io/actions/actions-runner:latest", false),
        ];
        for (image, expected) in cases {
            assert_eq!(is_daemon_image(&config, image), expected, "{image}");
        }
    }

    #[test]
    fn the_glob_matcher_knows_only_the_star() {
        let cases = [
            ("docker:dind", "docker:dind", true),
            ("docker:dind", "docker:dind2", false),
            ("docker:*", "docker:", true),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("*dind*", "docker:24-dind-rootless", true),
            ("*/docker:*", "docker:24", false),
            ("*/docker:*", "a/b/docker:24", true),
            ("docker:?", "docker:1", false),
            ("**a", "ba", true),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(glob_match(pattern, text), expected, "{pattern} vs {text}");
        }
    }

    #[test]
    fn a_daemon_is_known_by_what_it_runs_whatever_its_image() {
        let config = DindRmConfig::default();
        let digest = "docker.io/library/docker@sha256:18ff92d3d31725b53fa6633d60bed323effb6d5d4588be7b547078d384e0d4bf";
        let cases = [
            (json!({"image": "ci/engine", "command": ["dockerd"]}), true),
            (
                json!({"image": "ci/engine", "command": ["/usr/local/bin/dockerd-entrypoint.sh"], "args": ["--tls=false"]}),
                true,
            ),
            (
                json!({"image": "ci/engine", "args": ["dockerd", "--host=unix:///var/run/docker.sock"]}),
                true,
            ),
            (
                json!({"image": "ci/engine", "command": ["dockerd --host=tcp://0.0.0.0:2375"]}),
                true,
            ),
            (
                json!({"image": "ci/engine", "command": ["/var/run/argo/argoexec", "emissary", "--loglevel", "info", "--", "dockerd-entrypoint.sh"]}),
                true,
            ),
            (
                json!({"image": digest, "args": ["--storage-driver=vfs"], "securityContext": {"privileged": true}}),
                true,
            ),
            (
                json!({"image": digest, "securityContext": {"privileged": true}}),
                true,
            ),
            // The CLI tags run `sh`, privileged or not.
            (
                json!({"image": "docker:27-cli", "securityContext": {"privileged": true}}),
                false,
            ),
            (
                json!({"image": "docker:cli", "securityContext": {"privileged": true}}),
                false,
            ),
            (
                json!({"image": "mirror.example:5000/docker:27.3.1-cli-alpine3.20", "securityContext": {"privileged": true}}),
                false,
            ),
            (
                json!({"image": "docker:27", "securityContext": {"privileged": true}}),
                true,
            ),
            // A client: a command of its own, or not privileged.
            (
                json!({"image": digest, "command": ["sh", "-c", "docker build ."], "securityContext": {"privileged": true}}),
                false,
            ),
            (
                json!({"image": digest, "args": ["--storage-driver=vfs"]}),
                false,
            ),
            (
                json!({"image": "ci/engine", "command": ["/var/run/argo/argoexec", "emissary", "--", "sh", "-c"], "args": ["dockerd"]}),
                false,
            ),
            (
                json!({"image": "ci/engine", "command": ["docker", "ps"]}),
                false,
            ),
            (
                json!({"image": "ci/engine", "command": ["sleep"], "args": ["dockerd"]}),
                false,
            ),
            (
                json!({"image": "ci/engine", "args": ["--debug"], "securityContext": {"privileged": true}}),
                false,
            ),
        ];
        for (spec, expected) in cases {
            assert_eq!(
                is_daemon(&config, &container(spec.clone())),
                expected,
                "{spec}"
            );
            let raw = raw_runs_daemon(&spec);
            assert!(!raw || expected, "raw {spec}");
        }
    }

    #[test]
    fn argo_s_wrapper_is_skipped_up_to_its_double_dash() {
        let wrapped = [
            "/var/run/argo/argoexec",
            "emissary",
            "--loglevel",
            "info",
            "--",
            "x",
        ];
        assert_eq!(program_index(&wrapped), 5);
        assert_eq!(program_index(&["argoexec", "wait", "--", "x"]), 0);
        assert_eq!(program_index(&["dockerd"]), 0);
        assert_eq!(program_index::<&str>(&[]), 0);
    }
}
