//! `dind-rm`: `docker run` without `--rm` against a Docker daemon in the pod (a dind sidecar)
//! or on the node (a hostPath `docker.sock`) leaves stopped containers that Kubernetes never
//! sees, until the node's disk fills. This rule puts `podmend guard`, a Docker API proxy that
//! enforces `--rm`, between the pod's docker clients and that daemon. It only injects the
//! guard; the guard itself is `podmend guard`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, LimitRangeItem,
    ObjectFieldSelector, PodSpec, ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

use super::agent_requests::{format_quantity, is_byte_resource, limit_range_floor};
use super::{Modes, PodMeta, Rule, RuleContext, RuleInfo};
use crate::config::{DindRmConfig, SidecarMode};
use crate::dind::{GUARD_CONTAINER, HOST_DOCKER_SOCKETS, OWNER_UID_ENV, POLICY_ANNOTATION, Policy};
use crate::quantity::{self, Milli};

/// The rule's id, summary and help (see [`RuleInfo`]).
pub const INFO: RuleInfo = RuleInfo {
    id: "dind-rm",
    summary: "Containers a Docker-in-Docker pod starts without --rm outlive it on the daemon, pin \
              images and fill the node's disk; podmend puts its Docker guard between the pod's \
              clients and the daemon.",
    help: "run containers with `docker run --rm` (or remove them when done), or set the pod's \
         podmend.io/dind-policy annotation; use a dind sidecar, not the node's docker.sock",
};
/// The rule's id.
pub const ID: &str = INFO.id;

/// The emptyDir that carries the guard's socket to the clients.
pub const SOCKET_VOLUME: &str = "podmend-docker";
/// Where the clients and the guard mount [`SOCKET_VOLUME`].
pub const SOCKET_DIR: &str = "/run/podmend";
/// What every client's `DOCKER_HOST` becomes.
pub const GUARD_DOCKER_HOST: &str = "unix:///run/podmend/docker.sock";

/// The command that marks a container as a Docker daemon, whatever its image.
const DAEMON_COMMANDS: &[&str] = &["dockerd", "dockerd-entrypoint.sh"];
/// Where the docker CLI looks without `DOCKER_HOST`; `/run/docker.sock` is the same place in
/// images where `/var/run` links to `/run`.
const DEFAULT_SOCKETS: &[&str] = &["/var/run/docker.sock", "/run/docker.sock"];
const DOCKER_HOST: &str = "DOCKER_HOST";
const DOCKER_TLS_VERIFY: &str = "DOCKER_TLS_VERIFY";
const DOCKER_CERT_PATH: &str = "DOCKER_CERT_PATH";
const MAX_MESSAGE: usize = 120;

pub struct DindRm {
    config: DindRmConfig,
}

impl DindRm {
    pub fn new(config: DindRmConfig) -> Self {
        Self { config }
    }

    /// Whether `image` (a digest is ignored) matches one of the configured daemon images.
    pub fn is_daemon_image(&self, image: &str) -> bool {
        let image = image.split('@').next().unwrap_or(image);
        self.config
            .daemon_images
            .iter()
            .any(|pattern| glob_match(pattern, image))
    }

    fn is_daemon_parts(
        &self,
        image: Option<&str>,
        command: Option<&str>,
        first_arg: Option<&str>,
    ) -> bool {
        image.is_some_and(|image| self.is_daemon_image(image)) || runs_dockerd(command, first_arg)
    }

    fn is_daemon(&self, container: &Container) -> bool {
        self.is_daemon_parts(
            container.image.as_deref(),
            first_word(&container.command),
            first_word(&container.args),
        )
    }

    /// The policy for this pod: `None` when the annotation turns the rule off; a note when the
    /// annotation holds a value podmend does not know.
    fn policy(&self, meta: &PodMeta) -> Option<(Policy, Option<String>)> {
        let Some(value) = meta.annotations.get(POLICY_ANNOTATION) else {
            return Some((self.config.policy, None));
        };
        let value = value.trim().to_ascii_lowercase();
        if value == "off" {
            return None;
        }
        Some(match Policy::parse(&value) {
            Some(policy) => (policy, None),
            None => (
                self.config.policy,
                Some(truncate(format!(
                    "{POLICY_ANNOTATION} {value:?} is not {} or off: using policy {}",
                    Policy::names(),
                    self.config.policy.as_str()
                ))),
            ),
        })
    }
}

impl Rule for DindRm {
    fn info(&self) -> &'static RuleInfo {
        &INFO
    }

    fn modes(&self) -> Modes {
        Modes {
            pods: self.config.mode,
            templates: self.config.templates,
        }
    }

    fn may_apply(&self, raw_spec: &Value, meta: &PodMeta) -> bool {
        if self.policy(meta).is_none() {
            return false;
        }
        let containers: Vec<&Value> = ["containers", "initContainers"]
            .iter()
            .filter_map(|list| raw_spec.get(list).and_then(Value::as_array))
            .flatten()
            .collect();
        if containers
            .iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(GUARD_CONTAINER))
        {
            return false;
        }
        let daemon = containers.iter().any(|c| {
            self.is_daemon_parts(
                c.get("image").and_then(Value::as_str),
                first_raw_word(c, "command"),
                first_raw_word(c, "args"),
            )
        });
        daemon
            || raw_spec
                .get("volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.pointer("/hostPath/path").and_then(Value::as_str))
                .any(is_host_docker_socket)
    }

    fn repair(&self, spec: &mut PodSpec, meta: &PodMeta, cx: &RuleContext<'_>) -> Vec<String> {
        let Some((policy, policy_note)) = self.policy(meta) else {
            return Vec::new();
        };
        if all_containers(spec).any(|c| c.name == GUARD_CONTAINER) {
            return Vec::new();
        }
        let survey = self.survey(spec);
        if (survey.daemons.is_empty() && survey.host_sockets.is_empty())
            || survey.clients.is_empty()
        {
            return Vec::new();
        }
        let upstream = match find_upstream(spec, &survey) {
            Found::Upstream(upstream) => upstream,
            Found::Nothing => return Vec::new(),
            Found::Cannot(message) => return vec![truncate(message)],
        };
        let mut messages = Vec::new();
        let client_names: Vec<String> = survey
            .clients
            .iter()
            .filter_map(|slot| Some(slot.get(spec)?.name.clone()))
            .collect();
        let mut unplugged = Vec::new();
        for slot in &survey.clients {
            let Some(client) = slot.get_mut(spec) else {
                continue;
            };
            point_at_guard(client);
            if remove_mounts_of(client, &survey.host_sockets) {
                unplugged.push(client.name.clone());
            }
        }
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        if !volumes.iter().any(|v| v.name == SOCKET_VOLUME) {
            volumes.push(Volume {
                name: SOCKET_VOLUME.to_string(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
        }
        let limit_ranges: Vec<LimitRangeItem> = cx
            .cluster
            .limit_range_items(cx.namespace)
            .into_iter()
            .filter(|item| item.type_ == "Container")
            .collect();
        let resources = spec
            .resources
            .is_none()
            .then(|| guard_resources(&limit_ranges));
        let guard = self.guard(policy, &upstream, resources);
        let guard_has_host_socket = guard
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| survey.host_sockets.contains(&m.name));
        match self.config.sidecar_mode {
            SidecarMode::Native => spec
                .init_containers
                .get_or_insert_with(Vec::new)
                .insert(0, guard),
            SidecarMode::Container => spec.containers.push(guard),
        }

        let tls = if upstream.tls.is_some() { " (TLS)" } else { "" };
        let clients = if client_names.len() == 1 {
            format!("docker client {}", client_names[0])
        } else {
            format!("{} docker clients", client_names.len())
        };
        messages.push(truncate(format!(
            "injected {GUARD_CONTAINER} (policy {}) between {clients} and {}{tls}",
            policy.as_str(),
            upstream.url
        )));
        if !unplugged.is_empty() {
            let verb = if guard_has_host_socket {
                format!(
                    "moved the host Docker socket mount from {} to {GUARD_CONTAINER}",
                    names(&unplugged)
                )
            } else {
                format!(
                    "removed the host Docker socket mount from {}",
                    names(&unplugged)
                )
            };
            messages.push(truncate(verb));
        }
        messages.extend(upstream.notes.into_iter().map(truncate));
        messages.extend(policy_note);
        messages
    }
}

/// A container by its place in the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Init(usize),
    Main(usize),
}

impl Slot {
    fn get(self, spec: &PodSpec) -> Option<&Container> {
        match self {
            Slot::Init(i) => spec.init_containers.as_ref()?.get(i),
            Slot::Main(i) => spec.containers.get(i),
        }
    }

    fn get_mut(self, spec: &mut PodSpec) -> Option<&mut Container> {
        match self {
            Slot::Init(i) => spec.init_containers.as_mut()?.get_mut(i),
            Slot::Main(i) => spec.containers.get_mut(i),
        }
    }
}

/// Who is who in a pod.
#[derive(Debug, Default)]
struct Survey {
    daemons: Vec<Slot>,
    /// Containers that talk to the daemon, in pod order (init containers first).
    clients: Vec<Slot>,
    /// Volumes that are the node's Docker socket.
    host_sockets: Vec<String>,
}

impl DindRm {
    fn survey(&self, spec: &PodSpec) -> Survey {
        let mut survey = Survey {
            host_sockets: spec
                .volumes
                .iter()
                .flatten()
                .filter(|v| {
                    v.host_path
                        .as_ref()
                        .is_some_and(|h| is_host_docker_socket(&h.path))
                })
                .map(|v| v.name.clone())
                .collect(),
            ..Survey::default()
        };
        let init = spec.init_containers.iter().flatten().enumerate();
        for (i, container) in init {
            // A plain guard container starts after the regular init containers have run:
            // they cannot go through it, so they keep what they had.
            let sidecar = container.restart_policy.as_deref() == Some("Always");
            if self.is_daemon(container) {
                survey.daemons.push(Slot::Init(i));
            } else if sidecar || self.config.sidecar_mode == SidecarMode::Native {
                survey.clients.push(Slot::Init(i));
            }
        }
        for (i, container) in spec.containers.iter().enumerate() {
            if self.is_daemon(container) {
                survey.daemons.push(Slot::Main(i));
            } else {
                survey.clients.push(Slot::Main(i));
            }
        }
        survey
    }

    /// The guard container, with `resources` from [`guard_resources`], or none when the pod
    /// has pod-level `spec.resources`: then it shares the pod's budget, as containers there
    /// may, because its requests would raise the containers' aggregate above the pod's
    /// request and the API would reject the pod.
    fn guard(
        &self,
        policy: Policy,
        upstream: &Upstream,
        resources: Option<ResourceRequirements>,
    ) -> Container {
        let mut args: Vec<String> = [
            "guard",
            "--listen",
            GUARD_DOCKER_HOST,
            "--upstream",
            &upstream.url,
            "--policy",
            policy.as_str(),
        ]
        .map(str::to_string)
        .to_vec();
        if let Some(cert_path) = &upstream.tls {
            args.push("--tls-verify".to_string());
            if let Some(cert_path) = cert_path {
                args.extend(["--cert-path".to_string(), cert_path.clone()]);
            }
        }
        let mut mounts = vec![VolumeMount {
            name: SOCKET_VOLUME.to_string(),
            mount_path: SOCKET_DIR.to_string(),
            ..VolumeMount::default()
        }];
        for mount in &upstream.mounts {
            if !mounts
                .iter()
                .any(|m| same_path(&m.mount_path, &mount.mount_path))
            {
                mounts.push(mount.clone());
            }
        }
        // Parents before children, so a mount at /run cannot hide the one at /run/podmend.
        mounts.sort_by_key(|m| depth(&m.mount_path));
        Container {
            name: GUARD_CONTAINER.to_string(),
            image: Some(self.config.guard_image.clone()),
            args: Some(args),
            env: Some(vec![EnvVar {
                name: OWNER_UID_ENV.to_string(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: "metadata.uid".to_string(),
                    }),
                    ..EnvVarSource::default()
                }),
            }]),
            volume_mounts: Some(mounts),
            resources,
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    add: None,
                    drop: Some(vec!["ALL".to_string()]),
                }),
                ..SecurityContext::default()
            }),
            restart_policy: (self.config.sidecar_mode == SidecarMode::Native)
                .then(|| "Always".to_string()),
            ..Container::default()
        }
    }
}

/// The guard's requests and limits: 10m cpu and 32Mi memory requested, memory limited to
/// 128Mi, moved into the namespace's Container LimitRanges, which LimitRanger enforces after
/// the webhook: a limit no higher than a `max`, and one wherever a `maxLimitRequestRatio`
/// needs it; a request no lower than a `min` or than the ratio allows.
fn guard_resources(limit_ranges: &[LimitRangeItem]) -> ResourceRequirements {
    const OWN: [(&str, &str, Option<&str>); 2] =
        [("cpu", "10m", None), ("memory", "32Mi", Some("128Mi"))];
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    for (name, own_request, own_limit) in OWN {
        let tightest = |field: fn(&LimitRangeItem) -> Option<&BTreeMap<String, Quantity>>| {
            limit_ranges
                .iter()
                .filter_map(|item| field(item)?.get(name))
                .filter_map(|q| quantity::parse_milli(&q.0))
                .min()
        };
        let max = tightest(|item| item.max.as_ref());
        let ratio = tightest(|item| item.max_limit_request_ratio.as_ref());
        let own_request_milli = quantity::parse_milli(own_request).unwrap_or(0);
        let own_limit_milli = own_limit.and_then(quantity::parse_milli);
        let mut request = own_request_milli.max(limit_range_floor(name, None, limit_ranges));
        let mut limit = own_limit_milli.map(|l| l.max(request));
        if let Some(max) = max {
            limit = Some(limit.map_or(max, |l| l.min(max)));
        }
        if let (None, Some(ratio)) = (limit, ratio) {
            let widest = request.saturating_mul(ratio) / 1000;
            limit = Some(if is_byte_resource(name) {
                widest / 1000 * 1000
            } else {
                widest
            });
        }
        request = request.max(limit_range_floor(name, limit, limit_ranges));
        if let Some(limit) = limit {
            request = request.min(limit);
        }
        let spelled = |milli: Milli, own: &str, own_milli: Option<Milli>| {
            Quantity(if own_milli == Some(milli) {
                own.to_string()
            } else {
                format_quantity(name, milli)
            })
        };
        requests.insert(
            name.to_string(),
            spelled(request, own_request, Some(own_request_milli)),
        );
        if let Some(limit) = limit {
            limits.insert(
                name.to_string(),
                spelled(limit, own_limit.unwrap_or(""), own_limit_milli),
            );
        }
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        ..ResourceRequirements::default()
    }
}

/// Where the guard forwards to, and what it needs to get there.
#[derive(Debug)]
struct Upstream {
    url: String,
    /// `Some` for a TLS daemon, with the certificate directory when the clients had one.
    tls: Option<Option<String>>,
    /// The clients' mounts the guard needs too (the socket's volume, the TLS certificates).
    mounts: Vec<VolumeMount>,
    /// Messages about what the guard could not take over from the clients.
    notes: Vec<String>,
}

enum Found {
    Upstream(Upstream),
    /// Nothing in the pod talks to a daemon: nothing to guard.
    Nothing,
    /// The pod talks to a daemon the guard cannot reach; the message says why.
    Cannot(String),
}

/// What the clients used before: the first `DOCKER_HOST` a client sets; else the docker CLI's
/// default socket in a volume a client (or the daemon) mounts; else the node's socket where a
/// client mounts it.
fn find_upstream(spec: &PodSpec, survey: &Survey) -> Found {
    let clients: Vec<&Container> = survey.clients.iter().filter_map(|s| s.get(spec)).collect();
    let daemons: Vec<&Container> = survey.daemons.iter().filter_map(|s| s.get(spec)).collect();
    let mut hosts = Vec::new();
    for client in &clients {
        match env_var(client, DOCKER_HOST) {
            Some(EnvVar {
                value_from: Some(_),
                ..
            }) => {
                return Found::Cannot(format!(
                    "{GUARD_CONTAINER} not injected: DOCKER_HOST of {} comes from valueFrom, so the daemon is unknown",
                    client.name
                ));
            }
            Some(EnvVar {
                value: Some(value), ..
            }) if !value.is_empty() && value != GUARD_DOCKER_HOST => {
                hosts.push((*client, value.as_str()));
            }
            _ => {}
        }
    }
    if let Some(&(client, host)) = hosts.first() {
        let mut found = from_docker_host(client, host, &daemons);
        if let Found::Upstream(upstream) = &mut found
            && hosts.iter().any(|(_, other)| *other != host)
        {
            upstream.notes.push(format!(
                "docker clients had different DOCKER_HOSTs; all now reach {host} through {GUARD_CONTAINER}"
            ));
        }
        return found;
    }
    for path in DEFAULT_SOCKETS {
        if let Some(mount) = clients.iter().find_map(|c| mount_holding(c, path)) {
            return Found::Upstream(unix_upstream(path, mount));
        }
    }
    for client in &clients {
        let host_mount = client
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| survey.host_sockets.contains(&m.name));
        if let Some(mount) = host_mount {
            return Found::Upstream(unix_upstream(&mount.mount_path, mount));
        }
    }
    for path in DEFAULT_SOCKETS {
        if let Some(mount) = daemons.iter().find_map(|c| mount_holding(c, path)) {
            return Found::Upstream(unix_upstream(path, mount));
        }
    }
    if daemons.is_empty() {
        Found::Nothing
    } else {
        Found::Cannot(format!(
            "{GUARD_CONTAINER} not injected: no volume shares the daemon's socket (/var/run or /run) with the clients"
        ))
    }
}

fn from_docker_host(client: &Container, host: &str, daemons: &[&Container]) -> Found {
    if let Some(path) = host.strip_prefix("unix://") {
        let mount = mount_holding(client, path)
            .or_else(|| daemons.iter().find_map(|d| mount_holding(d, path)));
        return match mount {
            Some(mount) => Found::Upstream(unix_upstream(path, mount)),
            None => Found::Cannot(format!(
                "{GUARD_CONTAINER} not injected: DOCKER_HOST {host} of {} is in no volume it could share",
                client.name
            )),
        };
    }
    let url = if host.contains("://") {
        host.to_string()
    } else {
        format!("tcp://{host}")
    };
    if !url.starts_with("tcp://") {
        return Found::Cannot(format!(
            "{GUARD_CONTAINER} not injected: it forwards to unix:// and tcp:// daemons, not DOCKER_HOST {host}"
        ));
    }
    let mut upstream = Upstream {
        url,
        tls: None,
        mounts: Vec::new(),
        notes: Vec::new(),
    };
    // The docker CLI verifies TLS whenever DOCKER_TLS_VERIFY is non-empty, even "0".
    let verify = env_value(client, DOCKER_TLS_VERIFY).is_some_and(|v| !v.is_empty());
    if verify {
        let cert_path = env_value(client, DOCKER_CERT_PATH).filter(|p| !p.is_empty());
        match cert_path {
            Some(path) => match mount_holding(client, path) {
                Some(mount) => upstream.mounts.push(VolumeMount {
                    read_only: Some(true),
                    ..mount.clone()
                }),
                None => upstream.notes.push(format!(
                    "DOCKER_CERT_PATH {path} of {} is in no volume: {GUARD_CONTAINER} cannot read the certificates",
                    client.name
                )),
            },
            None => upstream.notes.push(format!(
                "{} verifies TLS without DOCKER_CERT_PATH: {GUARD_CONTAINER} has no certificates for the daemon",
                client.name
            )),
        }
        upstream.tls = Some(cert_path.map(str::to_string));
    }
    Found::Upstream(upstream)
}

fn unix_upstream(path: &str, mount: &VolumeMount) -> Upstream {
    Upstream {
        url: format!("unix://{path}"),
        tls: None,
        mounts: vec![mount.clone()],
        notes: Vec::new(),
    }
}

/// Sets `DOCKER_HOST` to the guard (in place of the one the container had) and drops the TLS
/// settings, which were for the daemon; mounts the guard's socket.
fn point_at_guard(container: &mut Container) {
    let env = container.env.get_or_insert_with(Vec::new);
    let docker_host = EnvVar {
        name: DOCKER_HOST.to_string(),
        value: Some(GUARD_DOCKER_HOST.to_string()),
        value_from: None,
    };
    match env.iter().position(|e| e.name == DOCKER_HOST) {
        Some(i) => env[i] = docker_host,
        None => env.push(docker_host),
    }
    let mut seen = false;
    env.retain(|e| match e.name.as_str() {
        DOCKER_HOST => !std::mem::replace(&mut seen, true),
        DOCKER_TLS_VERIFY | DOCKER_CERT_PATH => false,
        _ => true,
    });
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| same_path(&m.mount_path, SOCKET_DIR)) {
        mounts.push(VolumeMount {
            name: SOCKET_VOLUME.to_string(),
            mount_path: SOCKET_DIR.to_string(),
            ..VolumeMount::default()
        });
    }
}

/// Removes the container's mounts of `volumes`; true when there was one.
fn remove_mounts_of(container: &mut Container, volumes: &[String]) -> bool {
    let Some(mounts) = container.volume_mounts.as_mut() else {
        return false;
    };
    let before = mounts.len();
    mounts.retain(|m| !volumes.contains(&m.name));
    mounts.len() != before
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

/// The container's last `name` entry (the one that wins).
fn env_var<'a>(container: &'a Container, name: &str) -> Option<&'a EnvVar> {
    container.env.iter().flatten().rfind(|e| e.name == name)
}

fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    env_var(container, name).and_then(|e| e.value.as_deref())
}

/// The container's mount whose path holds `path` (the deepest one).
fn mount_holding<'a>(container: &'a Container, path: &str) -> Option<&'a VolumeMount> {
    let path = path.trim_end_matches('/');
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            let mount = m.mount_path.trim_end_matches('/');
            path == mount
                || path
                    .strip_prefix(mount)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .max_by_key(|m| depth(&m.mount_path))
}

fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

fn depth(path: &str) -> usize {
    path.split('/').filter(|part| !part.is_empty()).count()
}

fn is_host_docker_socket(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    HOST_DOCKER_SOCKETS.contains(&path)
}

fn first_word(list: &Option<Vec<String>>) -> Option<&str> {
    list.as_ref()?.first().map(String::as_str)
}

fn first_raw_word<'a>(container: &'a Value, key: &str) -> Option<&'a str> {
    container.get(key)?.as_array()?.first()?.as_str()
}

/// Whether the container's command (or, without one, its args) starts with `dockerd` or the
/// dind image's entrypoint script.
fn runs_dockerd(command: Option<&str>, first_arg: Option<&str>) -> bool {
    command
        .or(first_arg)
        .and_then(|word| word.split_whitespace().next())
        .map(|word| word.rsplit('/').next().unwrap_or(word))
        .is_some_and(|name| DAEMON_COMMANDS.contains(&name))
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

/// Up to three names, then how many more.
fn names(list: &[String]) -> String {
    match list.len() {
        0..=3 => list.join(", "),
        n => format!("{} and {} more", list[..2].join(", "), n - 2),
    }
}

fn truncate(message: String) -> String {
    if message.chars().count() <= MAX_MESSAGE {
        return message;
    }
    let mut short: String = message.chars().take(MAX_MESSAGE - 1).collect();
    short.push('…');
    short
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::StaticCluster;

    fn run_with(
        config: DindRmConfig,
        spec: Value,
        annotations: &[(&str, &str)],
    ) -> (Value, Vec<String>) {
        let meta = PodMeta {
            labels: BTreeMap::new(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let rule = DindRm::new(config);
        let mut pod: PodSpec = serde_json::from_value(spec.clone()).expect("test spec");
        let cluster = StaticCluster::empty();
        let cx = RuleContext {
            namespace: "ci",
            cluster: &cluster,
        };
        let messages = rule.repair(&mut pod, &meta, &cx);
        assert!(
            messages.is_empty() || rule.may_apply(&spec, &meta),
            "may_apply said no but repair found {messages:?} on {spec}"
        );
        for message in &messages {
            assert!(message.chars().count() <= MAX_MESSAGE, "{message}");
        }
        (serde_json::to_value(&pod).expect("serializes"), messages)
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

    /// The guard, wherever the mode put it.
    fn guard(spec: &Value) -> &Value {
        ["initContainers", "containers"]
            .iter()
            .filter_map(|list| spec[list].as_array())
            .flatten()
            .find(|c| c["name"] == GUARD_CONTAINER)
            .expect("guard injected")
    }

    fn arg_after<'a>(guard: &'a Value, flag: &str) -> &'a str {
        let args = guard["args"].as_array().expect("args");
        let i = args.iter().position(|a| a == flag).expect(flag);
        args[i + 1].as_str().expect("string arg")
    }

    fn upstream(spec: &Value) -> &str {
        arg_after(guard(spec), "--upstream")
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

    fn env(container: &Value, name: &str) -> Option<Value> {
        container["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
    }

    fn mount(name: &str, path: &str) -> (String, String) {
        (name.to_string(), path.to_string())
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

    fn host_socket() -> Value {
        json!({
            "volumes": [{"name": "dockersock", "hostPath": {"path": "/var/run/docker.sock"}}],
            "containers": [{"name": "build", "image": "docker:24", "command": ["sleep", "1d"],
                "volumeMounts": [{"name": "dockersock", "mountPath": "/var/run/docker.sock"}]}]
        })
    }

    fn with_daemon_image(image: &str) -> Value {
        json!({"containers": [
            {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}]},
            {"name": "dind", "image": image}
        ]})
    }

    #[test]
    fn daemon_images_are_recognised_by_the_default_patterns() {
        let rule = DindRm::new(DindRmConfig::default());
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
            assert_eq!(rule.is_daemon_image(image), expected, "{image}");
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
    fn each_default_daemon_image_makes_a_pod_dind() {
        for image in [
            "docker:dind",
            "docker:19.03.1-dind",
            "docker:dind-rootless",
            "docker:24.0.7-dind-rootless",
            "docker.io/library/docker:dind",
        ] {
            let (after, messages) = repair(with_daemon_image(image));
            assert_eq!(messages.len(), 1, "{image}: {messages:?}");
            assert_eq!(upstream(&after), "tcp://localhost:2375", "{image}");
        }
    }

    #[test]
    fn a_docker_client_image_alone_is_not_dind() {
        let (after, messages) = repair(with_daemon_image("docker:24"));
        assert!(messages.is_empty(), "{messages:?}");
        assert!(after.get("initContainers").is_none());
        assert_eq!(after["containers"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn a_pod_without_docker_is_left_alone() {
        let (_, messages) = repair(json!({"containers": [{"name": "web", "image": "nginx"}],
            "volumes": [{"name": "run", "hostPath": {"path": "/var/run"}}]}));
        assert!(messages.is_empty(), "{messages:?}");
    }

    #[test]
    fn a_dockerd_command_marks_a_daemon_whatever_the_image() {
        let cases: [(Value, bool); 7] = [
            (json!({"command": ["dockerd"]}), true),
            (
                json!({"command": ["/usr/local/bin/dockerd-entrypoint.sh"], "args": ["--tls=false"]}),
                true,
            ),
            (
                json!({"args": ["dockerd", "--host=unix:///var/run/docker.sock"]}),
                true,
            ),
            (
                json!({"command": ["dockerd --host=tcp://0.0.0.0:2375"]}),
                true,
            ),
            (json!({"command": ["docker", "ps"]}), false),
            (json!({"command": ["sleep"], "args": ["dockerd"]}), false),
            (json!({"args": ["--debug"]}), false),
        ];
        for (daemon, expected) in cases {
            let mut container = json!({"name": "daemon", "image": "example.com/ci/engine:1"});
            for (key, value) in daemon.as_object().expect("object") {
                container[key] = value.clone();
            }
            let spec = json!({"containers": [
                {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}]},
                container
            ]});
            let (_, messages) = repair(spec);
            assert_eq!(!messages.is_empty(), expected, "{daemon}: {messages:?}");
        }
    }

    #[test]
    fn a_native_sidecar_daemon_is_recognised_among_init_containers() {
        let (after, _) = repair(json!({
            "volumes": [{"name": "sock", "emptyDir": {}}],
            "initContainers": [{"name": "dind", "image": "docker:dind", "restartPolicy": "Always",
                "volumeMounts": [{"name": "sock", "mountPath": "/var/run"}]}],
            "containers": [{"name": "runner", "image": "runner",
                "volumeMounts": [{"name": "sock", "mountPath": "/var/run"}]}]
        }));
        assert_eq!(after["initContainers"][0]["name"], GUARD_CONTAINER);
        assert_eq!(after["initContainers"][1]["name"], "dind");
        assert!(env(&after["initContainers"][1], "DOCKER_HOST").is_none());
        assert_eq!(upstream(&after), "unix:///var/run/docker.sock");
    }

    #[test]
    fn a_host_path_docker_socket_makes_a_pod_dind() {
        for path in [
            "/var/run/docker.sock",
            "/run/docker.sock",
            "/var/run/docker.sock/",
        ] {
            let mut spec = host_socket();
            spec["volumes"][0]["hostPath"]["path"] = json!(path);
            let (_, messages) = repair(spec);
            assert!(!messages.is_empty(), "{path}");
        }
        let mut directory = host_socket();
        directory["volumes"][0]["hostPath"]["path"] = json!("/var/run");
        let (_, messages) = repair(directory);
        assert!(messages.is_empty(), "{messages:?}");
    }

    #[test]
    fn a_shared_var_run_gives_the_cli_default_socket_and_the_guard_mounts_that_volume() {
        let (after, messages) = repair(shared_var_run());
        assert_eq!(upstream(&after), "unix:///var/run/docker.sock");
        assert_eq!(
            mounts(guard(&after)),
            vec![
                mount("podmend-docker", SOCKET_DIR),
                mount("docker-socket", "/var/run")
            ]
        );
        let client = &after["containers"][0];
        assert_eq!(
            env(client, "DOCKER_HOST"),
            Some(json!({"name": "DOCKER_HOST", "value": GUARD_DOCKER_HOST}))
        );
        assert_eq!(
            mounts(client),
            vec![
                mount("docker-socket", "/var/run"),
                mount("podmend-docker", SOCKET_DIR)
            ]
        );
        let daemon = &after["containers"][1];
        assert!(daemon.get("env").is_none());
        assert_eq!(mounts(daemon), vec![mount("docker-socket", "/var/run")]);
        assert_eq!(
            messages,
            vec![
                "injected podmend-guard (policy rm) between docker client docker and unix:///var/run/docker.sock"
            ]
        );
    }

    #[test]
    fn a_unix_docker_host_gets_the_guard_the_volume_holding_that_socket() {
        let (after, _) = repair(json!({
            "volumes": [{"name": "var-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1M"}}],
            "containers": [
                {"name": "runner", "image": "summerwind/actions-runner:latest",
                 "env": [{"name": "DOCKER_HOST", "value": "unix:///run/docker.sock"}],
                 "volumeMounts": [{"name": "var-run", "mountPath": "/run"}]},
                {"name": "docker", "image": "docker:dind", "args": ["dockerd", "--host=unix:///run/docker.sock"],
                 "volumeMounts": [{"name": "var-run", "mountPath": "/run"}]}
            ]
        }));
        assert_eq!(upstream(&after), "unix:///run/docker.sock");
        // /run first, so it cannot hide /run/podmend.
        assert_eq!(
            mounts(guard(&after)),
            vec![
                mount("var-run", "/run"),
                mount("podmend-docker", SOCKET_DIR)
            ]
        );
    }

    #[test]
    fn a_unix_docker_host_in_no_volume_is_not_guarded_and_says_why() {
        let (after, messages) = repair(json!({"containers": [
            {"name": "runner", "image": "runner", "env": [{"name": "DOCKER_HOST", "value": "unix:///tmp/docker.sock"}]},
            {"name": "docker", "image": "docker:dind"}
        ]}));
        assert!(after["initContainers"].is_null());
        assert_eq!(messages.len(), 1);
        assert!(messages[0].contains("not injected"), "{messages:?}");
    }

    #[test]
    fn a_plain_tcp_daemon_becomes_the_upstream_without_mounts() {
        let (after, messages) = repair(json!({"containers": [
            {"name": "build", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://docker:2375"}]},
            {"name": "docker", "image": "docker:24-dind", "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}
        ]}));
        assert_eq!(upstream(&after), "tcp://docker:2375");
        assert_eq!(
            mounts(guard(&after)),
            vec![mount("podmend-docker", SOCKET_DIR)]
        );
        assert!(
            !guard(&after)["args"]
                .as_array()
                .expect("args")
                .contains(&json!("--tls-verify"))
        );
        assert_eq!(
            env(&after["containers"][1], "DOCKER_TLS_CERTDIR"),
            Some(json!({"name": "DOCKER_TLS_CERTDIR", "value": ""}))
        );
        assert!(!messages[0].contains("TLS"), "{messages:?}");
    }

    #[test]
    fn a_tls_daemon_gives_the_guard_the_clients_certificates_read_only() {
        let (after, messages) = repair(json!({
            "volumes": [{"name": "certs", "emptyDir": {}}],
            "containers": [
                {"name": "build", "image": "docker:24", "env": [
                    {"name": "DOCKER_TLS_VERIFY", "value": "1"},
                    {"name": "DOCKER_HOST", "value": "tcp://localhost:2376"},
                    {"name": "DOCKER_CERT_PATH", "value": "/certs/client"},
                    {"name": "KEEP", "value": "x"}
                 ],
                 "volumeMounts": [{"name": "certs", "mountPath": "/certs"}]},
                {"name": "test", "image": "docker:24", "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2376"}]},
                {"name": "dind", "image": "docker:dind", "env": [{"name": "DOCKER_TLS_CERTDIR", "value": "/certs"}],
                 "volumeMounts": [{"name": "certs", "mountPath": "/certs"}]}
            ]
        }));
        let guard = guard(&after);
        assert_eq!(arg_after(guard, "--upstream"), "tcp://localhost:2376");
        assert_eq!(arg_after(guard, "--cert-path"), "/certs/client");
        assert!(
            guard["args"]
                .as_array()
                .expect("args")
                .contains(&json!("--tls-verify"))
        );
        assert!(
            guard["volumeMounts"]
                .as_array()
                .expect("mounts")
                .contains(&json!({"name": "certs", "mountPath": "/certs", "readOnly": true}))
        );
        assert_eq!(
            after["containers"][0]["env"],
            json!([{"name": "DOCKER_HOST", "value": GUARD_DOCKER_HOST}, {"name": "KEEP", "value": "x"}])
        );
        assert_eq!(
            messages,
            vec![
                "injected podmend-guard (policy rm) between 2 docker clients and tcp://localhost:2376 (TLS)"
            ]
        );
    }

    #[test]
    fn certificates_baked_into_the_image_are_reported() {
        let (after, messages) = repair(json!({"containers": [
            {"name": "build", "image": "docker:24", "env": [
                {"name": "DOCKER_HOST", "value": "tcp://localhost:2376"},
                {"name": "DOCKER_TLS_VERIFY", "value": "1"},
                {"name": "DOCKER_CERT_PATH", "value": "/certs/client"}]},
            {"name": "dind", "image": "docker:dind"}
        ]}));
        assert_eq!(arg_after(guard(&after), "--cert-path"), "/certs/client");
        assert!(
            messages
                .iter()
                .any(|m| m.contains("cannot read the certificates")),
            "{messages:?}"
        );
    }

    #[test]
    fn the_host_socket_moves_from_the_clients_to_the_guard() {
        let (after, messages) = repair(host_socket());
        assert_eq!(upstream(&after), "unix:///var/run/docker.sock");
        assert_eq!(
            mounts(guard(&after)),
            vec![
                mount("podmend-docker", SOCKET_DIR),
                mount("dockersock", "/var/run/docker.sock")
            ]
        );
        assert_eq!(
            mounts(&after["containers"][0]),
            vec![mount("podmend-docker", SOCKET_DIR)]
        );
        assert_eq!(
            after["volumes"][0]["hostPath"]["path"],
            "/var/run/docker.sock"
        );
        assert_eq!(
            messages,
            vec![
                "injected podmend-guard (policy rm) between docker client build and unix:///var/run/docker.sock",
                "moved the host Docker socket mount from build to podmend-guard",
            ]
        );
    }

    #[test]
    fn a_host_socket_mounted_elsewhere_is_the_upstream_where_the_client_had_it() {
        let mut spec = host_socket();
        spec["containers"][0]["volumeMounts"][0]["mountPath"] = json!("/tmp/host-docker.sock");
        spec["volumes"][0]["hostPath"] = json!({"path": "/run/docker.sock", "type": "Socket"});
        let (after, _) = repair(spec);
        assert_eq!(upstream(&after), "unix:///tmp/host-docker.sock");
        assert!(mounts(guard(&after)).contains(&mount("dockersock", "/tmp/host-docker.sock")));
    }

    #[test]
    fn a_docker_host_from_value_from_is_not_guessed() {
        let mut spec = shared_var_run();
        spec["containers"][0]["env"] = json!([{"name": "DOCKER_HOST", "valueFrom": {"configMapKeyRef": {"name": "ci", "key": "docker"}}}]);
        let (after, messages) = repair(spec);
        assert!(after["initContainers"].is_null());
        assert!(messages[0].contains("valueFrom"), "{messages:?}");
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
        // It starts after the guard: a client too.
        assert_eq!(
            env(&init[1], "DOCKER_HOST").expect("env")["value"],
            GUARD_DOCKER_HOST
        );
        assert_eq!(after["containers"].as_array().expect("containers").len(), 2);
    }

    #[test]
    fn in_container_mode_the_guard_is_the_last_container_and_init_containers_keep_their_daemon() {
        let mut spec = shared_var_run();
        spec["initContainers"] = json!([{"name": "checkout", "image": "alpine/git"}]);
        let (after, messages) = run_with(container_mode(), spec, &[]);
        let containers = after["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 3);
        assert_eq!(containers[2]["name"], GUARD_CONTAINER);
        assert!(containers[2].get("restartPolicy").is_none());
        assert_eq!(
            after["initContainers"],
            json!([{"name": "checkout", "image": "alpine/git"}])
        );
        assert_eq!(messages.len(), 1, "{messages:?}");
    }

    #[test]
    fn the_guard_has_the_owner_uid_small_resources_and_no_privileges() {
        let (after, _) = repair(shared_var_run());
        let guard = guard(&after);
        assert_eq!(
            guard["image"],
            concat!("ghcr.io/podmend/podmend:", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(
            guard["args"],
            json!([
                "guard",
                "--listen",
                GUARD_DOCKER_HOST,
                "--upstream",
                "unix:///var/run/docker.sock",
                "--policy",
                "rm"
            ])
        );
        assert_eq!(
            guard["env"],
            json!([{"name": "PODMEND_OWNER_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}])
        );
        assert_eq!(
            guard["resources"],
            json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}})
        );
        assert_eq!(
            guard["securityContext"],
            json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}})
        );
        assert_eq!(
            after["volumes"].as_array().expect("volumes").last(),
            Some(&json!({"name": SOCKET_VOLUME, "emptyDir": {}}))
        );
    }

    #[test]
    fn with_pod_level_resources_the_guard_has_none_and_shares_the_pod_budget() {
        let mut spec = shared_var_run();
        spec["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
        let (after, _) = repair(spec);
        assert!(guard(&after).get("resources").is_none(), "{after:#}");
        assert_eq!(
            after["resources"],
            json!({"requests": {"cpu": "1", "memory": "1Gi"}})
        );
    }

    #[test]
    fn the_guard_resources_meet_the_namespace_limit_range() {
        let items: Vec<LimitRangeItem> = serde_json::from_value(json!([
            {"type": "Container", "min": {"cpu": "100m", "memory": "64Mi"}, "max": {"memory": "100Mi"}},
            {"type": "Container", "maxLimitRequestRatio": {"cpu": "4"}}
        ]))
        .expect("items");
        let resources = serde_json::to_value(guard_resources(&items)).expect("serializes");
        assert_eq!(
            resources,
            json!({"requests": {"cpu": "100m", "memory": "67108864"},
                "limits": {"cpu": "400m", "memory": "104857600"}})
        );
        let unchanged = serde_json::to_value(guard_resources(&[])).expect("serializes");
        assert_eq!(
            unchanged,
            json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}})
        );
    }

    #[test]
    fn the_policy_comes_from_the_config_or_the_pod_annotation() {
        let reap = DindRmConfig {
            policy: Policy::Reap,
            ..DindRmConfig::default()
        };
        type Annotations<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Annotations<'_>, &str, Option<&str>); 4] = [
            (&[], "reap", None),
            (&[(POLICY_ANNOTATION, "deny")], "deny", None),
            (&[(POLICY_ANNOTATION, " Audit ")], "audit", None),
            (
                &[(POLICY_ANNOTATION, "strict")],
                "reap",
                Some("\"strict\" is not collect, rm, deny, reap, audit or off: using policy reap"),
            ),
        ];
        for (annotations, expected, note) in cases {
            let (after, messages) = run_with(reap.clone(), shared_var_run(), annotations);
            assert_eq!(
                arg_after(guard(&after), "--policy"),
                expected,
                "{annotations:?}"
            );
            assert!(
                messages[0].contains(&format!("(policy {expected})")),
                "{messages:?}"
            );
            match note {
                Some(note) => assert!(messages.iter().any(|m| m.contains(note)), "{messages:?}"),
                None => assert_eq!(messages.len(), 1, "{messages:?}"),
            }
        }
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
            (DindRmConfig::default(), host_socket()),
            (container_mode(), host_socket()),
        ] {
            let (after, messages) = run_with(config.clone(), spec, &[]);
            assert!(!messages.is_empty());
            let (again, messages) = run_with(config, after.clone(), &[]);
            assert!(messages.is_empty(), "{messages:?}");
            assert_eq!(again, after);
        }
    }

    #[test]
    fn an_existing_docker_host_is_replaced_in_place_and_duplicates_dropped() {
        let (after, _) = repair(json!({"containers": [
            {"name": "build", "image": "docker:24", "env": [
                {"name": "A", "value": "1"},
                {"name": "DOCKER_HOST", "value": "tcp://localhost:2375"},
                {"name": "B", "value": "$(DOCKER_HOST)"},
                {"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}],
             "volumeMounts": [{"name": "mine", "mountPath": "/run/podmend/"}]},
            {"name": "dind", "image": "docker:dind"}
        ], "volumes": [{"name": "mine", "emptyDir": {}}]}));
        let client = &after["containers"][0];
        assert_eq!(
            client["env"],
            json!([{"name": "A", "value": "1"}, {"name": "DOCKER_HOST", "value": GUARD_DOCKER_HOST}, {"name": "B", "value": "$(DOCKER_HOST)"}])
        );
        assert_eq!(mounts(client), vec![mount("mine", "/run/podmend/")]);
    }

    #[test]
    fn a_pod_whose_only_container_is_the_daemon_has_nothing_to_guard() {
        let (_, messages) =
            repair(json!({"containers": [{"name": "dind", "image": "docker:dind"}]}));
        assert!(messages.is_empty(), "{messages:?}");
    }

    #[test]
    fn may_apply_skips_guarded_pods_pods_turned_off_and_pods_without_docker() {
        let rule = DindRm::new(DindRmConfig::default());
        let meta = |policy: Option<&str>| PodMeta {
            labels: BTreeMap::new(),
            annotations: policy
                .map(|p| (POLICY_ANNOTATION.to_string(), p.to_string()))
                .into_iter()
                .collect(),
        };
        let (guarded, _) = repair(shared_var_run());
        assert!(rule.may_apply(&shared_var_run(), &meta(None)));
        assert!(rule.may_apply(&host_socket(), &meta(Some("deny"))));
        assert!(!rule.may_apply(&guarded, &meta(None)));
        assert!(!rule.may_apply(&shared_var_run(), &meta(Some("off"))));
        assert!(!rule.may_apply(
            &json!({"containers": [{"name": "a", "image": "docker:24"}]}),
            &meta(None)
        ));
        assert!(!rule.may_apply(&json!({"containers": "not a list"}), &meta(None)));
    }

    #[test]
    fn long_client_lists_are_shortened() {
        let list: Vec<String> = ["a", "b", "c", "d", "e"].map(str::to_string).to_vec();
        assert_eq!(names(&list[..3]), "a, b, c");
        assert_eq!(names(&list), "a, b and 3 more");
        let long = truncate("x".repeat(200));
        assert_eq!(long.chars().count(), MAX_MESSAGE);
    }
}
