//! Upstream discovery: which daemon the pod's Docker clients reach, at which addresses, and
//! so where the guard must stand. Three plans, best first: the in-pod daemon moved to the
//! private socket with the guard at its addresses; the node's socket behind the guard, whose
//! socket appears where the clients mounted the node's; or, where neither can be done safely,
//! clients pointed at the guard's own socket (which they can go around). A plan that could
//! not work is not made: the pod is left alone and the message says why.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, VolumeMount};

use super::daemon::{self, MovedDaemon};
use super::detection::{DEFAULT_SOCKETS, Slot, Survey};
use crate::config::{DindRmConfig, SidecarMode};
use crate::dind::{Address, GUARD_CONTAINER, GUARD_SOCKET, HOST_SOCKET_DIR};

pub(super) const DOCKER_HOST: &str = "DOCKER_HOST";
pub(super) const DOCKER_TLS_VERIFY: &str = "DOCKER_TLS_VERIFY";
pub(super) const DOCKER_CERT_PATH: &str = "DOCKER_CERT_PATH";
const DOCKER_TLS: &str = "DOCKER_TLS";
/// The guard's name for the pod's IP in its own args (a downward-API env var).
pub(super) const POD_IP_SAN: &str = "$(POD_IP)";

/// What the rule does with the pod.
#[derive(Debug)]
pub(super) enum Plan {
    /// Nothing in the pod talks to Docker.
    Nothing,
    /// A guard could not work here: the message says why.
    LeaveAlone(String),
    Rewrite(RewritePlan),
    Host(HostPlan),
    Fallback(FallbackPlan),
}

/// The in-pod daemon moves to the private socket; the guard listens where it listened.
#[derive(Debug)]
pub(super) struct RewritePlan {
    pub daemon: Slot,
    pub moved: MovedDaemon,
    /// The daemon's addresses that clients can reach, for the guard's `--listen`.
    pub listen: Vec<Address>,
    /// The daemon's mounts the guard copies: the shared socket's volume, the client
    /// certificates' volume.
    pub mounts: Vec<VolumeMount>,
    pub tls: Option<TlsPlan>,
    /// Things the daemon served that the guard does not take over, and why.
    pub notes: Vec<String>,
}

/// The TLS listener the guard takes over.
#[derive(Debug)]
pub(super) struct TlsPlan {
    /// The daemon's `DOCKER_TLS_CERTDIR`: the guard writes the tree there.
    pub certdir: String,
    /// The shared volume holds only `client/`: the guard needs a private directory for the
    /// rest (`ca/`, `server/`), as the daemon had in its own filesystem.
    pub private_dir: bool,
    pub sans: Vec<String>,
}

/// The node's socket moves to the guard; its socket appears in each client's socket
/// directory.
#[derive(Debug)]
pub(super) struct HostPlan {
    /// The hostPath volume of the node's socket.
    pub volume: String,
    pub clients: Vec<HostClient>,
}

/// One client's mount of the node's socket, and where the guard's socket goes instead.
#[derive(Debug, Clone)]
pub(super) struct HostClient {
    pub slot: Slot,
    /// The client's mount of the node's socket (its path is the socket's).
    pub mount: VolumeMount,
    /// The socket's directory, where the client mounts the guard's directory.
    pub dir: String,
    /// The guard's directory for this socket directory, in its socket volume.
    pub sub_path: String,
    /// The socket's file name.
    pub socket_name: String,
}

/// Clients pointed at the guard's own socket: what they had is the guard's upstream.
#[derive(Debug)]
pub(super) struct FallbackPlan {
    pub upstream: Address,
    /// What the guard mounts to reach the upstream (its socket's volume, the certificates).
    pub mounts: Vec<VolumeMount>,
    pub cert_path: Option<String>,
    /// The clients, which get `DOCKER_HOST` and the guard's socket.
    pub clients: Vec<Slot>,
    /// The node's socket volume, moved from the clients to the guard.
    pub host_volume: Option<String>,
    /// Why the guard could not stand where the daemon stood.
    pub reason: String,
    pub notes: Vec<String>,
}

/// Decides where the guard stands, from who is who.
pub(super) fn plan(config: &DindRmConfig, spec: &PodSpec, survey: &Survey) -> Plan {
    if !survey.daemons.is_empty() {
        if !survey.host_mounts.is_empty() {
            let users = names_of(spec, survey.host_mounts.iter().map(|m| m.slot));
            return Plan::LeaveAlone(format!(
                "{GUARD_CONTAINER} not injected: {users} use the node's Docker socket beside the pod's own daemon; one guard fronts one daemon"
            ));
        }
        if survey.clients.is_empty() {
            return Plan::Nothing;
        }
        if survey.daemons.len() > 1 {
            let daemons = names_of(spec, survey.daemons.iter().copied());
            return fallback(
                spec,
                survey,
                format!(
                    "the pod runs {} Docker daemons ({daemons})",
                    survey.daemons.len()
                ),
            );
        }
        let slot = survey.daemons[0];
        let Some(daemon) = slot.get(spec) else {
            return Plan::Nothing;
        };
        if matches!(slot, Slot::Init(_)) && config.sidecar_mode == SidecarMode::Container {
            return fallback(
                spec,
                survey,
                format!(
                    "daemon {} is an init container, which starts before a plain {GUARD_CONTAINER} container",
                    daemon.name
                ),
            );
        }
        return match daemon::analyse(daemon, spec.security_context.as_ref()) {
            Ok(moved) => rewrite(spec, survey, slot, daemon, moved),
            Err(reason) => fallback(
                spec,
                survey,
                format!("daemon {} cannot be moved: {reason}", daemon.name),
            ),
        };
    }
    if !survey.host_mounts.is_empty() {
        return match host(spec, survey) {
            Ok(plan) => Plan::Host(plan),
            Err(reason) => fallback(spec, survey, reason),
        };
    }
    Plan::Nothing
}

/// The guard takes over every address of the daemon that a client can reach.
fn rewrite(
    spec: &PodSpec,
    survey: &Survey,
    slot: Slot,
    daemon: &Container,
    moved: MovedDaemon,
) -> Plan {
    let clients: Vec<&Container> = survey.clients.iter().filter_map(|s| s.get(spec)).collect();
    let shared = |mount: &VolumeMount| {
        clients.iter().any(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == mount.name)
        })
    };
    let mut listen = Vec::new();
    let mut mounts: Vec<VolumeMount> = Vec::new();
    let mut tls: Option<TlsPlan> = None;
    let mut notes = Vec::new();
    let keep_mount = |mount: &VolumeMount, mounts: &mut Vec<VolumeMount>| {
        if !mounts
            .iter()
            .any(|m| same_path(&m.mount_path, &mount.mount_path))
        {
            mounts.push(VolumeMount {
                name: mount.name.clone(),
                mount_path: mount.mount_path.clone(),
                sub_path: mount.sub_path.clone(),
                sub_path_expr: mount.sub_path_expr.clone(),
                ..VolumeMount::default()
            });
        }
    };
    for served in &moved.served {
        match (&served.address, &served.tls_certdir) {
            (Address::Unix(path), _) => {
                let path = path.display().to_string();
                match locate(daemon, &path) {
                    Some(found) if shared(found.mount) => {
                        listen.push(Address::Unix(found.path.into()));
                        keep_mount(found.mount, &mut mounts);
                    }
                    // In no volume a client mounts: no client could reach it.
                    _ => {}
                }
            }
            (address, None) => listen.push(address.clone()),
            (address, Some(certdir)) => {
                let client_dir = format!("{}/client", certdir.trim_end_matches('/'));
                match locate(daemon, &client_dir) {
                    Some(found) if shared(found.mount) => {
                        listen.push(address.clone());
                        keep_mount(found.mount, &mut mounts);
                        let private_dir = !holds(&found.mount.mount_path, certdir);
                        tls = Some(TlsPlan {
                            certdir: certdir.clone(),
                            private_dir,
                            sans: Vec::new(),
                        });
                    }
                    _ => notes.push(format!(
                        "{address} of {} not kept: no client mounts its client certificates ({client_dir})",
                        daemon.name
                    )),
                }
            }
        }
    }
    // Every client that used this daemon must find it at an address the guard takes over;
    // one that does not means podmend misread the daemon, and moving it would break that
    // client.
    for client in &clients {
        if let Some(address) = misses(spec, daemon, client, &listen) {
            return fallback(
                spec,
                survey,
                format!(
                    "{} uses {address}, which daemon {} does not serve as podmend reads it",
                    client.name, daemon.name
                ),
            );
        }
    }
    if listen.is_empty() {
        return Plan::LeaveAlone(format!(
            "{GUARD_CONTAINER} not injected: no client can reach daemon {} (its socket and certificates are in no shared volume)",
            daemon.name
        ));
    }
    if let Some(tls) = tls.as_mut() {
        let mut sans = vec![POD_IP_SAN.to_string()];
        sans.extend(moved.tls_sans.iter().cloned());
        for client in &clients {
            if let ClientHost::Known(Address::Tcp { host, .. }) = client_host(client)
                && !is_loopback(spec, &host)
                && host.parse::<std::net::IpAddr>().is_err()
            {
                sans.push(host);
            }
        }
        let mut seen = BTreeSet::new();
        sans.retain(|san| seen.insert(san.clone()));
        tls.sans = sans;
    }
    Plan::Rewrite(RewritePlan {
        daemon: slot,
        moved,
        listen,
        mounts,
        tls,
        notes,
    })
}

/// The address `client` used that the guard will not stand at, when that address can only
/// have been this daemon's: a TCP port on the pod's loopback, or a socket in a volume the
/// daemon mounts.
fn misses(
    spec: &PodSpec,
    daemon: &Container,
    client: &Container,
    listen: &[Address],
) -> Option<Address> {
    let ClientHost::Known(address) = client_host(client) else {
        return None;
    };
    match &address {
        Address::Tcp { host, port } => {
            let served = listen
                .iter()
                .any(|a| matches!(a, Address::Tcp { port: p, .. } if p == port));
            (!served && is_loopback(spec, host)).then_some(address)
        }
        Address::Unix(path) => {
            let path = path.display().to_string();
            let found = locate(client, &path)?;
            let served = listen.iter().any(|a| match a {
                Address::Unix(socket) => locate(daemon, &socket.display().to_string())
                    .is_some_and(|d| d.location == found.location),
                Address::Tcp { .. } => false,
            });
            let daemon_volume = daemon
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == found.mount.name);
            (!served && daemon_volume).then_some(address)
        }
    }
}

/// The node's socket behind the guard: each client mounts the guard's socket directory where
/// its socket's directory is.
fn host(spec: &PodSpec, survey: &Survey) -> Result<HostPlan, String> {
    let mut clients: Vec<HostClient> = Vec::new();
    let mut dirs: Vec<(String, String)> = Vec::new();
    for socket in &survey.host_mounts {
        let Some(container) = socket.slot.get(spec) else {
            continue;
        };
        let path = socket.mount.mount_path.trim_end_matches('/');
        if socket.mount.sub_path.is_some() || socket.mount.sub_path_expr.is_some() {
            return Err(format!(
                "{} mounts the node's socket with a subPath",
                container.name
            ));
        }
        let (dir, socket_name) = match path.rsplit_once('/') {
            Some((dir, name)) if !dir.is_empty() && !name.is_empty() => (dir, name),
            _ => {
                return Err(format!(
                    "{} mounts the node's socket at {path}, in /",
                    container.name
                ));
            }
        };
        if let Some(other) = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| same_path(&m.mount_path, dir))
        {
            return Err(format!(
                "{} mounts {} at {dir}, where the guard's socket would go",
                container.name, other.name
            ));
        }
        let sub_path = match dirs.iter().find(|(d, _)| d == dir) {
            Some((_, sub)) => sub.clone(),
            None => {
                let base = dir.trim_matches('/').replace('/', "-");
                let mut sub = base.clone();
                let mut n = 1;
                while dirs.iter().any(|(_, s)| *s == sub) {
                    n += 1;
                    sub = format!("{base}-{n}");
                }
                dirs.push((dir.to_string(), sub.clone()));
                sub
            }
        };
        clients.push(HostClient {
            slot: socket.slot,
            mount: socket.mount.clone(),
            dir: dir.to_string(),
            sub_path,
            socket_name: socket_name.to_string(),
        });
    }
    let volume = clients
        .first()
        .map(|c| c.mount.name.clone())
        .ok_or_else(|| "no client mounts the node's Docker socket".to_string())?;
    Ok(HostPlan { volume, clients })
}

/// Clients pointed at the guard's own socket, the guard forwarding to what they used.
fn fallback(spec: &PodSpec, survey: &Survey, reason: String) -> Plan {
    let clients: Vec<&Container> = survey.clients.iter().filter_map(|s| s.get(spec)).collect();
    let daemons: Vec<&Container> = survey.daemons.iter().filter_map(|s| s.get(spec)).collect();
    let guard_host = format!("unix://{GUARD_SOCKET}");
    let mut hosts = Vec::new();
    for client in &clients {
        match client_host(client) {
            ClientHost::Unknown(why) => {
                return Plan::LeaveAlone(format!(
                    "{GUARD_CONTAINER} not injected: DOCKER_HOST of {} {why}, so the daemon is unknown",
                    client.name
                ));
            }
            ClientHost::Invalid(error) => {
                return Plan::LeaveAlone(format!("{GUARD_CONTAINER} not injected: {error}"));
            }
            ClientHost::Known(address)
                if env_value(client, DOCKER_HOST).is_some_and(|v| !v.trim().is_empty()) =>
            {
                if address.url() != guard_host {
                    hosts.push((*client, address));
                }
            }
            ClientHost::Known(_) => {}
        }
    }
    let base = FallbackPlan {
        upstream: Address::Unix(GUARD_SOCKET.into()),
        mounts: Vec::new(),
        cert_path: None,
        clients: survey.clients.clone(),
        host_volume: None,
        reason,
        notes: Vec::new(),
    };
    if let Some((client, address)) = hosts.first().cloned() {
        let mut plan = FallbackPlan {
            upstream: address.clone(),
            ..base
        };
        if hosts.iter().any(|(_, other)| *other != address) {
            plan.notes.push(format!(
                "docker clients had different DOCKER_HOSTs; all now reach {address} through {GUARD_CONTAINER}"
            ));
        }
        match &address {
            Address::Unix(path) => {
                let path = path.display().to_string();
                let mount =
                    locate(client, &path).or_else(|| daemons.iter().find_map(|d| locate(d, &path)));
                match mount {
                    // The node's socket: it moves from the clients to the guard.
                    Some(found) if survey.host_sockets.contains(&found.mount.name) => {
                        plan.upstream = host_upstream();
                        plan.host_volume = Some(found.mount.name.clone());
                    }
                    Some(found) => plan.mounts.push(found.mount.clone()),
                    None => {
                        return Plan::LeaveAlone(format!(
                            "{GUARD_CONTAINER} not injected: DOCKER_HOST {address} of {} is in no volume it could share",
                            client.name
                        ));
                    }
                }
            }
            Address::Tcp { .. } if is_tls_client(client) => {
                // The guard speaks TLS to the daemon with the client's certificates; without
                // them it could not reach the daemon at all.
                let Some(path) = env_value(client, DOCKER_CERT_PATH).filter(|p| !p.is_empty())
                else {
                    return Plan::LeaveAlone(format!(
                        "{GUARD_CONTAINER} not injected: {} verifies TLS without DOCKER_CERT_PATH, so the guard has no certificates",
                        client.name
                    ));
                };
                let Some(found) = locate(client, path) else {
                    return Plan::LeaveAlone(format!(
                        "{GUARD_CONTAINER} not injected: DOCKER_CERT_PATH {path} of {} is in no volume the guard could mount",
                        client.name
                    ));
                };
                plan.mounts.push(VolumeMount {
                    read_only: Some(true),
                    ..found.mount.clone()
                });
                plan.cert_path = Some(path.to_string());
            }
            Address::Tcp { .. } => {}
        }
        return Plan::Fallback(plan);
    }
    if let Some(socket) = survey.host_mounts.first() {
        return Plan::Fallback(FallbackPlan {
            upstream: host_upstream(),
            host_volume: Some(socket.mount.name.clone()),
            ..base
        });
    }
    for path in DEFAULT_SOCKETS {
        if let Some(found) = clients.iter().find_map(|c| locate(c, path)) {
            return Plan::Fallback(FallbackPlan {
                upstream: Address::Unix(path.into()),
                mounts: vec![found.mount.clone()],
                ..base
            });
        }
    }
    for path in DEFAULT_SOCKETS {
        if let Some(found) = daemons.iter().find_map(|d| locate(d, path)) {
            return Plan::Fallback(FallbackPlan {
                upstream: Address::Unix(path.into()),
                mounts: vec![found.mount.clone()],
                ..base
            });
        }
    }
    Plan::LeaveAlone(format!(
        "{GUARD_CONTAINER} not injected: {}, and no client names the daemon in DOCKER_HOST or shares its socket",
        base.reason
    ))
}

/// Where the guard reaches the node's socket.
fn host_upstream() -> Address {
    Address::Unix(format!("{HOST_SOCKET_DIR}/docker.sock").into())
}

/// What a client's `DOCKER_HOST` says, read as the docker CLI reads it.
#[derive(Debug)]
pub(super) enum ClientHost {
    Known(Address),
    /// Known only when the pod starts (`valueFrom`, a `$(VAR)` reference): the reason.
    Unknown(&'static str),
    /// Not an address the guard can use: the error.
    Invalid(String),
}

pub(super) fn client_host(client: &Container) -> ClientHost {
    let tls = is_tls_client(client);
    match env_var(client, DOCKER_HOST) {
        Some(EnvVar {
            value_from: Some(_),
            ..
        }) => ClientHost::Unknown("comes from valueFrom"),
        Some(EnvVar {
            value: Some(value), ..
        }) if value.contains("$(") => ClientHost::Unknown("refers to a variable"),
        other => {
            let value = other.and_then(|e| e.value.as_deref()).unwrap_or("");
            match Address::parse_docker_host(value, tls) {
                Ok(address) => ClientHost::Known(address),
                Err(error) => ClientHost::Invalid(error.to_string()),
            }
        }
    }
}

/// The docker CLI speaks TLS when `DOCKER_TLS_VERIFY` or `DOCKER_TLS` is non-empty (even "0").
fn is_tls_client(client: &Container) -> bool {
    [DOCKER_TLS_VERIFY, DOCKER_TLS]
        .iter()
        .any(|name| env_value(client, name).is_some_and(|v| !v.is_empty()))
}

/// A host that can only be this pod: loopback, or a `hostAliases` name for it.
fn is_loopback(spec: &PodSpec, host: &str) -> bool {
    let loopback_ip = |ip: &str| {
        ip.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
    };
    host.eq_ignore_ascii_case("localhost")
        || loopback_ip(host)
        || spec.host_aliases.iter().flatten().any(|alias| {
            loopback_ip(&alias.ip)
                && alias
                    .hostnames
                    .iter()
                    .flatten()
                    .any(|name| name.eq_ignore_ascii_case(host))
        })
}

/// The container's last `name` entry (the one that wins).
pub(super) fn env_var<'a>(container: &'a Container, name: &str) -> Option<&'a EnvVar> {
    container.env.iter().flatten().rfind(|e| e.name == name)
}

pub(super) fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    env_var(container, name).and_then(|e| e.value.as_deref())
}

/// Where a path of a container is: the mount holding it, the path as that mount resolves it,
/// and its place in the volume.
pub(super) struct Found<'a> {
    pub mount: &'a VolumeMount,
    pub path: String,
    pub location: (String, String),
}

/// The container's mount holding `path` (the deepest one). `/var/run` links to `/run` in most
/// images, so a path under one is also looked for under the other.
pub(super) fn locate<'a>(container: &'a Container, path: &str) -> Option<Found<'a>> {
    let path = path.trim_end_matches('/');
    let aliased = if let Some(rest) = path.strip_prefix("/var/run/") {
        Some(format!("/run/{rest}"))
    } else {
        path.strip_prefix("/run/")
            .map(|rest| format!("/var/run/{rest}"))
    };
    std::iter::once(path.to_string())
        .chain(aliased)
        .find_map(|path| {
            let mount = mount_holding(container, &path)?;
            let rest = path[mount.mount_path.trim_end_matches('/').len()..].trim_start_matches('/');
            let within = match mount.sub_path.as_deref().or(mount.sub_path_expr.as_deref()) {
                Some(sub) if !sub.is_empty() && !rest.is_empty() => format!("{sub}/{rest}"),
                Some(sub) if !sub.is_empty() => sub.to_string(),
                _ => rest.to_string(),
            };
            Some(Found {
                mount,
                location: (mount.name.clone(), within),
                path,
            })
        })
}

/// The container's mount whose path holds `path` (the deepest one).
fn mount_holding<'a>(container: &'a Container, path: &str) -> Option<&'a VolumeMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| holds(&m.mount_path, path))
        .max_by_key(|m| depth(&m.mount_path))
}

/// Whether `dir` is `path` or one of its parents.
pub(super) fn holds(dir: &str, path: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    let path = path.trim_end_matches('/');
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

pub(super) fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

pub(super) fn depth(path: &str) -> usize {
    path.split('/').filter(|part| !part.is_empty()).count()
}

/// The names of the containers in `slots`, for messages.
fn names_of(spec: &PodSpec, slots: impl Iterator<Item = Slot>) -> String {
    let mut names: Vec<String> = Vec::new();
    for slot in slots {
        if let Some(container) = slot.get(spec)
            && !names.contains(&container.name)
        {
            names.push(container.name.clone());
        }
    }
    super::names(&names)
}
