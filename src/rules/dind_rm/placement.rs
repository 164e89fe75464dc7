//! Where the guard stands: which daemon the pod's Docker clients reach, at which addresses,
//! and so where the guard must stand to be between them. Three placements, best first: in the
//! in-pod daemon's place (the daemon moved to the private socket, the guard at its
//! addresses); in front of the node's socket (the guard's socket appears where the clients
//! mounted the node's); or, where neither can be done safely, the fallback: clients pointed
//! at the guard's own socket (which they can go around). A placement that could not work is
//! not made: the pod is left alone and the message says why. It decides only:
//! [`super::injection`] carries the placement out, and the guard's own connection to the
//! daemon is `crate::guard::upstream`.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, VolumeMount};

use super::daemon::{self, MovedDaemon, ServedAddress};
use super::detection::{DEFAULT_SOCKETS, Slot, Survey};
use super::mounts::{holds, locate, mount_at, same_path};
use crate::config::{DindRmConfig, SidecarMode};
use crate::dind::{Address, GUARD_CONTAINER, GUARD_SOCKET, HOST_SOCKET_DIR};

pub(super) const DOCKER_HOST: &str = "DOCKER_HOST";
pub(super) const DOCKER_TLS_VERIFY: &str = "DOCKER_TLS_VERIFY";
pub(super) const DOCKER_CERT_PATH: &str = "DOCKER_CERT_PATH";
const DOCKER_TLS: &str = "DOCKER_TLS";
/// The guard's name for the pod's IP in its own args (a downward-API env var).
pub(super) const POD_IP_SAN: &str = "$(POD_IP)";

/// Where the guard stands in the pod, or why it does not.
#[derive(Debug)]
pub(super) enum Placement {
    /// Nothing in the pod talks to Docker.
    Nothing,
    /// A guard could not work here: the message says why.
    LeaveAlone(String),
    DaemonsPlace(DaemonsPlace),
    NodeSocket(NodeSocketPlace),
    Fallback(FallbackPlace),
}

impl Placement {
    /// Whether the guard goes into the pod.
    pub(super) fn injects(&self) -> bool {
        matches!(
            self,
            Placement::DaemonsPlace(_) | Placement::NodeSocket(_) | Placement::Fallback(_)
        )
    }
}

/// The in-pod daemon moves to the private socket; the guard listens where it listened.
#[derive(Debug)]
pub(super) struct DaemonsPlace {
    pub daemon: Slot,
    pub moved: MovedDaemon,
    /// The daemon's addresses that clients can reach, for the guard's `--listen`.
    pub listen: Vec<Address>,
    /// The daemon's mounts the guard copies: the shared socket's volume, the client
    /// certificates' volume.
    pub mounts: Vec<VolumeMount>,
    pub tls: Option<TlsTakeover>,
    /// The daemon's own socket, kept in its container and leading to the guard.
    pub own_socket: Option<OwnSocket>,
    /// Things the daemon served that the guard does not take over, and why.
    pub notes: Vec<String>,
}

/// The socket the daemon served in its own container, which no client shares: what is
/// started there with `-v /var/run/docker.sock:/var/run/docker.sock` (Testcontainers' Ryuk
/// when `DOCKER_HOST` is TCP) is bound by the daemon from its own filesystem, and `kubectl
/// exec -c <daemon> docker ps` dials it. The guard listens there too.
#[derive(Debug)]
pub(super) enum OwnSocket {
    /// In a volume the daemon mounts: the guard mounts it too and listens at the same path.
    InVolume {
        mount: Box<VolumeMount>,
        path: String,
    },
    /// In the container's own `/var/run` (or `/run`): podmend's run volume goes over that
    /// directory, and the guard listens on `name` in it.
    InRunDir { dir: String, name: String },
}

/// The TLS listener the guard takes over.
#[derive(Debug)]
pub(super) struct TlsTakeover {
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
pub(super) struct NodeSocketPlace {
    /// The hostPath volume of the node's socket.
    pub volume: String,
    pub clients: Vec<NodeSocketClient>,
}

/// One client's mount of the node's socket, and where the guard's socket goes instead.
#[derive(Debug, Clone)]
pub(super) struct NodeSocketClient {
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
pub(super) struct FallbackPlace {
    pub upstream: Address,
    /// What the guard mounts to reach the upstream (its socket's volume, the certificates).
    pub mounts: Vec<VolumeMount>,
    pub cert_path: Option<String>,
    /// The clients, which get `DOCKER_HOST` and the guard's socket.
    pub clients: Vec<Slot>,
    /// The node's socket volume, moved from the clients to the guard.
    pub node_socket_volume: Option<String>,
    /// Why the guard could not stand where the daemon stood.
    pub reason: String,
    pub notes: Vec<String>,
}

/// Decides where the guard stands, from who is who.
pub(super) fn decide(config: &DindRmConfig, spec: &PodSpec, survey: &Survey) -> Placement {
    if !survey.daemons.is_empty() {
        return with_daemons(config, spec, survey);
    }
    if !survey.node_socket_mounts.is_empty() {
        return match node_socket(spec, survey) {
            Ok(place) => Placement::NodeSocket(place),
            Err(reason) => fallback(spec, survey, reason),
        };
    }
    Placement::Nothing
}

/// A pod with daemons of its own: the guard in the daemon's place when there is one and it
/// can be moved, else the fallback.
fn with_daemons(config: &DindRmConfig, spec: &PodSpec, survey: &Survey) -> Placement {
    if !survey.node_socket_mounts.is_empty() {
        let users = names_of(spec, survey.node_socket_mounts.iter().map(|m| m.slot));
        return Placement::LeaveAlone(format!(
            "{GUARD_CONTAINER} not injected: {users} use the node's Docker socket beside the pod's own daemon; one guard fronts one daemon"
        ));
    }
    if survey.daemons.len() > 1 {
        if survey.clients.is_empty() {
            let daemons = names_of(spec, survey.daemons.iter().copied());
            return Placement::LeaveAlone(format!(
                "{GUARD_CONTAINER} not injected: {daemons} run Docker daemons no container of the pod is known to use; one guard fronts one daemon"
            ));
        }
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
        return Placement::Nothing;
    };
    if matches!(slot, Slot::Init(_)) && config.sidecar_mode == SidecarMode::Container {
        if survey.clients.is_empty() {
            return Placement::LeaveAlone(format!(
                "{GUARD_CONTAINER} not injected: daemon {} is an init container, which starts before a plain {GUARD_CONTAINER} container",
                daemon.name
            ));
        }
        return fallback(
            spec,
            survey,
            format!(
                "daemon {} is an init container, which starts before a plain {GUARD_CONTAINER} container",
                daemon.name
            ),
        );
    }
    match daemon::analyse(daemon, spec.security_context.as_ref()) {
        Ok(moved) => daemons_place(spec, survey, slot, daemon, moved),
        Err(reason) if survey.clients.is_empty() => Placement::LeaveAlone(format!(
            "{GUARD_CONTAINER} not injected: daemon {} cannot be moved ({reason}), and no container of the pod is known to use it",
            daemon.name
        )),
        Err(reason) => fallback(
            spec,
            survey,
            format!("daemon {} cannot be moved: {reason}", daemon.name),
        ),
    }
}

/// The guard takes over every address of the daemon that a client can reach.
fn daemons_place(
    spec: &PodSpec,
    survey: &Survey,
    slot: Slot,
    daemon: &Container,
    moved: MovedDaemon,
) -> Placement {
    let clients: Vec<&Container> = survey.clients.iter().filter_map(|s| s.get(spec)).collect();
    let Takeover {
        listen,
        mounts,
        mut tls,
        notes,
    } = Takeover::of(daemon, &moved.served, &clients);
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
    let own_socket = own_socket(spec, daemon, &moved.served, &listen);
    if listen.is_empty() && own_socket.is_none() {
        return Placement::LeaveAlone(format!(
            "{GUARD_CONTAINER} not injected: no client can reach daemon {} (its socket and certificates are in no shared volume)",
            daemon.name
        ));
    }
    if let Some(tls) = tls.as_mut() {
        tls.sans = tls_sans(spec, &moved, &clients);
    }
    Placement::DaemonsPlace(DaemonsPlace {
        daemon: slot,
        moved,
        listen,
        mounts,
        tls,
        own_socket,
        notes,
    })
}

/// The daemon's first socket that the guard does not already take over for the clients, as
/// the guard keeps it in the daemon's container: in the volume that holds it, or in the
/// container's own run directory. `None` when every socket is taken over, or one is
/// elsewhere in the container's own filesystem (podmend mounts nothing over other
/// directories of an image), or in a hostPath volume (the node's, never the guard's to serve).
fn own_socket(
    spec: &PodSpec,
    daemon: &Container,
    served: &[ServedAddress],
    listen: &[Address],
) -> Option<OwnSocket> {
    let taken = |path: &str| {
        listen.iter().any(|a| match a {
            Address::Unix(socket) => {
                let socket = socket.display().to_string();
                same_path(&socket, path)
                    || locate(daemon, &socket)
                        .zip(locate(daemon, path))
                        .is_some_and(|(a, b)| a.location == b.location)
            }
            Address::Tcp { .. } => false,
        })
    };
    served.iter().find_map(|served| {
        let Address::Unix(path) = &served.address else {
            return None;
        };
        let path = path.display().to_string();
        if taken(&path) {
            return None;
        }
        if let Some(found) = locate(daemon, &path) {
            let host_path = spec
                .volumes
                .iter()
                .flatten()
                .any(|v| v.name == found.mount.name && v.host_path.is_some());
            if host_path {
                return None;
            }
            return Some(OwnSocket::InVolume {
                mount: Box::new(found.mount.clone()),
                path: found.path,
            });
        }
        let (dir, name) = path.rsplit_once('/')?;
        (RUN_DIRS.contains(&dir) && !name.is_empty()).then(|| OwnSocket::InRunDir {
            dir: dir.to_string(),
            name: name.to_string(),
        })
    })
}

/// The run directories podmend may mount its run volume over in a daemon's container: where
/// dockerd and the dind entrypoint put the socket (`/var/run` links to `/run` in the docker
/// image; its `/run` holds nothing of the image).
const RUN_DIRS: &[&str] = &["/var/run", "/run"];

/// What the guard takes over of the daemon's addresses: those a client can reach.
#[derive(Default)]
struct Takeover {
    listen: Vec<Address>,
    mounts: Vec<VolumeMount>,
    tls: Option<TlsTakeover>,
    notes: Vec<String>,
}

impl Takeover {
    fn of(daemon: &Container, served: &[ServedAddress], clients: &[&Container]) -> Self {
        let shared = |mount: &VolumeMount| {
            clients.iter().any(|c| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == mount.name)
            })
        };
        let mut takeover = Takeover::default();
        for served in served {
            match (&served.address, &served.tls_certdir) {
                (Address::Unix(path), _) => {
                    // A socket in no volume a client mounts: no client could reach it.
                    if let Some(found) =
                        locate(daemon, &path.display().to_string()).filter(|f| shared(f.mount))
                    {
                        takeover.listen.push(Address::Unix(found.path.into()));
                        takeover.copy_mount(found.mount);
                    }
                }
                (address, None) => takeover.listen.push(address.clone()),
                (address, Some(certdir)) => {
                    takeover.take_tls_listener(daemon, address, certdir, shared);
                }
            }
        }
        takeover
    }

    /// A TLS listener is taken over when a client mounts the daemon's client certificates
    /// (`<certdir>/client`): the guard writes its tree in `certdir`.
    fn take_tls_listener(
        &mut self,
        daemon: &Container,
        address: &Address,
        certdir: &str,
        shared: impl Fn(&VolumeMount) -> bool,
    ) {
        let client_dir = format!("{}/client", certdir.trim_end_matches('/'));
        match locate(daemon, &client_dir) {
            Some(found) if shared(found.mount) => {
                self.listen.push(address.clone());
                self.copy_mount(found.mount);
                self.tls = Some(TlsTakeover {
                    certdir: certdir.to_string(),
                    private_dir: !holds(&found.mount.mount_path, certdir),
                    sans: Vec::new(),
                });
            }
            _ => self.notes.push(format!(
                "{address} of {} not kept: no client mounts its client certificates ({client_dir})",
                daemon.name
            )),
        }
    }

    /// The daemon's mount, copied for the guard (once for each path).
    fn copy_mount(&mut self, mount: &VolumeMount) {
        if !self
            .mounts
            .iter()
            .any(|m| same_path(&m.mount_path, &mount.mount_path))
        {
            self.mounts.push(VolumeMount {
                name: mount.name.clone(),
                mount_path: mount.mount_path.clone(),
                sub_path: mount.sub_path.clone(),
                sub_path_expr: mount.sub_path_expr.clone(),
                ..VolumeMount::default()
            });
        }
    }
}

/// The names of the guard's TLS certificate: the pod's IP, the daemon's `DOCKER_TLS_SAN`, and
/// each name clients reach it by (not loopback, not an IP), once each.
fn tls_sans(spec: &PodSpec, moved: &MovedDaemon, clients: &[&Container]) -> Vec<String> {
    let mut sans = vec![POD_IP_SAN.to_string()];
    sans.extend(moved.tls_sans.iter().cloned());
    for client in clients {
        if let ClientHost::Known(Address::Tcp { host, .. }) = client_host(client)
            && !is_loopback(spec, &host)
            && host.parse::<std::net::IpAddr>().is_err()
        {
            sans.push(host);
        }
    }
    let mut seen = BTreeSet::new();
    sans.retain(|san| seen.insert(san.clone()));
    sans
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
fn node_socket(spec: &PodSpec, survey: &Survey) -> Result<NodeSocketPlace, String> {
    let mut clients: Vec<NodeSocketClient> = Vec::new();
    let mut guard_dirs = GuardDirs::default();
    for socket in &survey.node_socket_mounts {
        let Some(container) = socket.slot.get(spec) else {
            continue;
        };
        let (dir, socket_name) = socket_dir(container, &socket.mount)?;
        clients.push(NodeSocketClient {
            slot: socket.slot,
            mount: socket.mount.clone(),
            dir: dir.to_string(),
            sub_path: guard_dirs.for_dir(dir),
            socket_name: socket_name.to_string(),
        });
    }
    let volume = clients
        .first()
        .map(|c| c.mount.name.clone())
        .ok_or_else(|| "no client mounts the node's Docker socket".to_string())?;
    Ok(NodeSocketPlace { volume, clients })
}

/// The directory and file name of a client's mount of the node's socket; `Err` when the
/// guard's socket directory cannot take that directory's place.
fn socket_dir<'a>(
    container: &Container,
    mount: &'a VolumeMount,
) -> Result<(&'a str, &'a str), String> {
    let path = mount.mount_path.trim_end_matches('/');
    if mount.sub_path.is_some() || mount.sub_path_expr.is_some() {
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
    if let Some(other) = mount_at(container, dir) {
        return Err(format!(
            "{} mounts {} at {dir}, where the guard's socket would go",
            container.name, other.name
        ));
    }
    Ok((dir, socket_name))
}

/// The guard's directories in its socket volume: one for each socket directory of the
/// clients, named after its path.
#[derive(Default)]
struct GuardDirs {
    /// (socket directory, the guard's directory for it)
    dirs: Vec<(String, String)>,
}

impl GuardDirs {
    fn for_dir(&mut self, dir: &str) -> String {
        if let Some((_, sub)) = self.dirs.iter().find(|(d, _)| d == dir) {
            return sub.clone();
        }
        let base = dir.trim_matches('/').replace('/', "-");
        let mut sub = base.clone();
        let mut n = 1;
        while self.dirs.iter().any(|(_, s)| *s == sub) {
            n += 1;
            sub = format!("{base}-{n}");
        }
        self.dirs.push((dir.to_string(), sub.clone()));
        sub
    }
}

/// Clients pointed at the guard's own socket, the guard forwarding to what they used: the
/// daemon a client names in `DOCKER_HOST`, else a socket they (or the daemons) mount.
fn fallback(spec: &PodSpec, survey: &Survey, reason: String) -> Placement {
    let clients: Vec<&Container> = survey.clients.iter().filter_map(|s| s.get(spec)).collect();
    let daemons: Vec<&Container> = survey.daemons.iter().filter_map(|s| s.get(spec)).collect();
    let named = match named_daemons(&clients) {
        Ok(named) => named,
        Err(message) => return Placement::LeaveAlone(message),
    };
    let base = FallbackPlace {
        upstream: Address::Unix(GUARD_SOCKET.into()),
        mounts: Vec::new(),
        cert_path: None,
        clients: survey.clients.clone(),
        node_socket_volume: None,
        reason,
        notes: Vec::new(),
    };
    let Some((client, address)) = named.first().cloned() else {
        return to_a_mounted_socket(base, survey, &clients, &daemons);
    };
    let mut place = FallbackPlace {
        upstream: address.clone(),
        ..base
    };
    if named.iter().any(|(_, other)| *other != address) {
        place.notes.push(format!(
            "docker clients had different DOCKER_HOSTs; all now reach {address} through {GUARD_CONTAINER}"
        ));
    }
    match to_the_named_daemon(place, client, survey, &daemons) {
        Ok(place) => Placement::Fallback(place),
        Err(message) => Placement::LeaveAlone(message),
    }
}

/// The daemons the clients name in a non-empty `DOCKER_HOST` (the guard's own socket
/// excepted), each with its client; `Err` (the message) when a `DOCKER_HOST` is known only
/// once the pod starts, or is no address.
fn named_daemons<'a>(clients: &[&'a Container]) -> Result<Vec<(&'a Container, Address)>, String> {
    let guard_host = format!("unix://{GUARD_SOCKET}");
    let mut named = Vec::new();
    for client in clients {
        match client_host(client) {
            ClientHost::Unknown(why) => {
                return Err(format!(
                    "{GUARD_CONTAINER} not injected: DOCKER_HOST of {} {why}, so the daemon is unknown",
                    client.name
                ));
            }
            ClientHost::Invalid(error) => {
                return Err(format!("{GUARD_CONTAINER} not injected: {error}"));
            }
            ClientHost::Known(address)
                if env_value(client, DOCKER_HOST).is_some_and(|v| !v.trim().is_empty()) =>
            {
                if address.url() != guard_host {
                    named.push((*client, address));
                }
            }
            ClientHost::Known(_) => {}
        }
    }
    Ok(named)
}

/// What the guard mounts to reach the daemon `client` names (`place.upstream`): the socket's
/// volume (the node's socket moves from the clients to the guard), or for TLS the client's
/// certificates; `Err` (the message) when the guard could not reach it.
fn to_the_named_daemon(
    mut place: FallbackPlace,
    client: &Container,
    survey: &Survey,
    daemons: &[&Container],
) -> Result<FallbackPlace, String> {
    match &place.upstream {
        Address::Unix(path) => {
            let path = path.display().to_string();
            let mount =
                locate(client, &path).or_else(|| daemons.iter().find_map(|d| locate(d, &path)));
            match mount {
                // The node's socket: it moves from the clients to the guard.
                Some(found) if survey.node_socket_volumes.contains(&found.mount.name) => {
                    place.node_socket_volume = Some(found.mount.name.clone());
                    place.upstream = node_socket_upstream();
                }
                Some(found) => place.mounts.push(found.mount.clone()),
                None => {
                    return Err(format!(
                        "{GUARD_CONTAINER} not injected: DOCKER_HOST {} of {} is in no volume it could share",
                        place.upstream, client.name
                    ));
                }
            }
        }
        Address::Tcp { .. } if is_tls_client(client) => {
            // The guard speaks TLS to the daemon with the client's certificates; without
            // them it could not reach the daemon at all.
            let Some(path) = env_value(client, DOCKER_CERT_PATH).filter(|p| !p.is_empty()) else {
                return Err(format!(
                    "{GUARD_CONTAINER} not injected: {} verifies TLS without DOCKER_CERT_PATH, so the guard has no certificates",
                    client.name
                ));
            };
            let Some(found) = locate(client, path) else {
                return Err(format!(
                    "{GUARD_CONTAINER} not injected: DOCKER_CERT_PATH {path} of {} is in no volume the guard could mount",
                    client.name
                ));
            };
            place.mounts.push(VolumeMount {
                read_only: Some(true),
                ..found.mount.clone()
            });
            place.cert_path = Some(path.to_string());
        }
        Address::Tcp { .. } => {}
    }
    Ok(place)
}

/// With no daemon named: the node's socket a client mounts, else a default socket path the
/// clients, then the daemons, mount.
fn to_a_mounted_socket(
    base: FallbackPlace,
    survey: &Survey,
    clients: &[&Container],
    daemons: &[&Container],
) -> Placement {
    if let Some(socket) = survey.node_socket_mounts.first() {
        return Placement::Fallback(FallbackPlace {
            upstream: node_socket_upstream(),
            node_socket_volume: Some(socket.mount.name.clone()),
            ..base
        });
    }
    for holders in [clients, daemons] {
        for path in DEFAULT_SOCKETS {
            if let Some(found) = holders.iter().find_map(|c| locate(c, path)) {
                return Placement::Fallback(FallbackPlace {
                    upstream: Address::Unix(path.into()),
                    mounts: vec![found.mount.clone()],
                    ..base
                });
            }
        }
    }
    Placement::LeaveAlone(format!(
        "{GUARD_CONTAINER} not injected: {}, and no client names the daemon in DOCKER_HOST or shares its socket",
        base.reason
    ))
}

/// Where the guard mounts the node's socket.
pub(super) fn node_socket_in_guard() -> String {
    format!("{HOST_SOCKET_DIR}/docker.sock")
}

/// Where the guard reaches the node's socket.
fn node_socket_upstream() -> Address {
    Address::Unix(node_socket_in_guard().into())
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
