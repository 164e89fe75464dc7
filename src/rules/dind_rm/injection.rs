//! Injection: carries out a placement on the pod spec. Builds the guard container from a
//! [`GuardCommand`] (its args are `GuardCommand::to_args()`), moves the daemon or the node's
//! socket, adds podmend's volumes, and says what it did. Everything podmend adds is under
//! `/podmend`, never under `/run` or `/var/run`, which pods mount emptyDirs over. It decides
//! nothing: what goes where is [`super::placement`]'s, the guard's resources
//! [`super::resources`]'.

use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PodSpec, Probe, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::daemon::MovedDaemon;
use super::detection::{Slot, all_slots};
use super::mounts::{depth, mount_at, same_path};
use super::names;
use super::placement::{
    DOCKER_CERT_PATH, DOCKER_HOST, DOCKER_TLS_VERIFY, DaemonsPlace, FallbackPlace,
    NodeSocketClient, NodeSocketPlace, OwnSocket, Placement, node_socket_in_guard,
};
use crate::config::{DindRmConfig, SidecarMode};
use crate::dind::{
    Address, BYPASSABLE, DAEMON_SOCKET, DAEMON_SOCKET_DIR, DAEMON_SOCKET_VOLUME, GUARD_CONTAINER,
    GUARD_SOCKET, GUARD_SOCKET_DIR, GUARD_SOCKET_VOLUME, GuardCommand, OWNER_UID_ENV, Policy,
};

/// The emptyDir the guard writes its TLS tree in when the daemon's certificate directory is
/// only partly shared (`ca/` and `server/` stay private, as they were in the daemon).
pub const CERTS_VOLUME: &str = "podmend-certs";
/// The emptyDir over a daemon's own run directory, when its socket was there and in no
/// volume: the guard's socket takes the daemon's place in it.
pub const RUN_VOLUME: &str = "podmend-run";
/// Where the guard mounts [`RUN_VOLUME`].
const GUARD_RUN_DIR: &str = "/podmend/run";
/// The guard's port for `/healthz`, `/readyz` and `/metrics`, unless a container of the pod
/// declares it (then the next free one); a `hostNetwork` pod's guard draws one from
/// [`HOST_NETWORK_PORTS`].
pub const HEALTH_PORT: u16 = 9797;
/// The ports a `hostNetwork` pod's guard draws its health port from: above the usual
/// service ports, below the NodePort range (30000-32767) and the ephemeral ports.
pub const HOST_NETWORK_PORTS: (u16, u16) = (20000, 29999);
/// The name of the guard's health port where it is declared (`hostNetwork`).
pub const HEALTH_PORT_NAME: &str = "podmend-health";
/// The downward-API variable the guard's `--tls-san=$(POD_IP)` refers to.
pub const POD_IP_ENV: &str = "POD_IP";

/// What the guard is made of besides the plan.
pub(super) struct GuardSettings<'a> {
    pub config: &'a DindRmConfig,
    pub policy: Policy,
    /// `None` when the pod has pod-level `spec.resources` (see [`super::resources`]).
    pub resources: Option<ResourceRequirements>,
}

/// Carries out `placement`; `Err` when podmend's own names are taken (nothing changed then).
pub(super) fn inject(
    spec: &mut PodSpec,
    placement: Placement,
    settings: &GuardSettings<'_>,
) -> Result<Vec<String>, String> {
    check_names_free(spec)?;
    match placement {
        Placement::DaemonsPlace(place) => in_daemons_place(spec, place, settings),
        Placement::NodeSocket(place) => in_front_of_node_socket(spec, place, settings),
        Placement::Fallback(place) => between_clients_and_daemon(spec, place, settings),
        Placement::Nothing => Ok(Vec::new()),
        Placement::LeaveAlone(message) => Ok(vec![message]),
    }
}

/// The volume names podmend adds must be free: a pod's own volume of that name could be
/// anything (a hostPath).
fn check_names_free(spec: &PodSpec) -> Result<(), String> {
    for name in [
        DAEMON_SOCKET_VOLUME,
        GUARD_SOCKET_VOLUME,
        CERTS_VOLUME,
        RUN_VOLUME,
    ] {
        if spec.volumes.iter().flatten().any(|v| v.name == name) {
            return Err(format!(
                "{GUARD_CONTAINER} not injected: the pod already has a volume named {name}"
            ));
        }
    }
    Ok(())
}

/// The daemon moves to the private socket; the guard takes its addresses (and its TLS tree).
fn in_daemons_place(
    spec: &mut PodSpec,
    place: DaemonsPlace,
    settings: &GuardSettings<'_>,
) -> Result<Vec<String>, String> {
    let daemon_name = place
        .daemon
        .get(spec)
        .map(|c| c.name.clone())
        .unwrap_or_default();
    if let Some(daemon) = place.daemon.get(spec)
        && let Some(taken) = mount_at(daemon, DAEMON_SOCKET_DIR)
    {
        return Err(format!(
            "{GUARD_CONTAINER} not injected: daemon {daemon_name} already mounts {} at {DAEMON_SOCKET_DIR}",
            taken.name
        ));
    }
    let mut mounts = vec![mount(DAEMON_SOCKET_VOLUME, DAEMON_SOCKET_DIR)];
    mounts.extend(place.mounts.iter().cloned());
    let mut volumes = vec![empty_dir(DAEMON_SOCKET_VOLUME)];
    let mut command = GuardCommand::new(
        place.listen.clone(),
        Address::Unix(DAEMON_SOCKET.into()),
        settings.policy,
    );
    // Moved to a socket only the guard reaches: whatever other owners left on it, pods that
    // ran on the same storage before left.
    command.daemon_in_pod = true;
    // Its private socket is nobody's to bind into a container: that would go around the
    // guard. (Its old path, which clients bind, leads to the guard now.)
    command.daemon_socket_paths = vec![DAEMON_SOCKET.to_string()];
    if let Some(tls) = &place.tls {
        command.tls_certdir = Some(PathBuf::from(&tls.certdir));
        command.tls_san = tls.sans.clone();
        if tls.private_dir {
            mounts.push(mount(CERTS_VOLUME, &tls.certdir));
            volumes.push(empty_dir(CERTS_VOLUME));
        }
    }
    if let Some(daemon) = place.daemon.get_mut(spec) {
        move_daemon(daemon, &place.moved);
        if let Some(own) = &place.own_socket {
            keep_own_socket(daemon, own, &mut command, &mut mounts, &mut volumes);
        }
    }
    spec.volumes.get_or_insert_with(Vec::new).extend(volumes);
    let daemon_slot = place.daemon;
    add_guard(spec, command, mounts, settings);
    stop_guard_before_daemon(spec, daemon_slot);
    Ok(daemons_place_messages(&daemon_name, place, settings.policy))
}

/// A daemon that is a native sidecar is stopped after the guard when the guard comes after
/// it among the init containers: the kubelet terminates each sidecar only once every later
/// one has terminated (`newTerminationOrdering`, pkg/kubelet/kuberuntime/
/// kuberuntime_termination_order.go), so the guard's clean-up at SIGTERM still reaches the
/// daemon. The guard goes right after the daemon (which [`add_guard`] put it before, at the
/// front), still before every container that comes after the daemon, so none of them starts
/// before the guard does. Not when the daemon has a startup probe or a postStart hook: a later
/// sidecar starts only once those passed, and they reach the daemon through its old address,
/// which is the guard's now; the guard stays first, and the next guard on the daemon's
/// storage cleans up (`--daemon-in-pod`). A daemon that is a regular container is stopped with
/// the other main containers, before any sidecar: the same holds there.
fn stop_guard_before_daemon(spec: &mut PodSpec, daemon: Slot) {
    let Slot::Init(index) = daemon else {
        return;
    };
    let Some(inits) = spec.init_containers.as_mut() else {
        return;
    };
    // The guard is at 0, so the daemon moved to index + 1.
    let daemon_is_sidecar = inits.get(index + 1).is_some_and(|c| {
        c.restart_policy.as_deref() == Some("Always")
            && c.startup_probe.is_none()
            && c.lifecycle
                .as_ref()
                .and_then(|l| l.post_start.as_ref())
                .is_none()
    });
    let guard_first = inits.first().is_some_and(|c| c.name == GUARD_CONTAINER);
    if daemon_is_sidecar && guard_first {
        let guard = inits.remove(0);
        inits.insert(index + 1, guard);
    }
}

/// The guard listens where the daemon's own socket was: in the volume that holds it, or in
/// podmend's run volume, mounted over the daemon's run directory.
fn keep_own_socket(
    daemon: &mut Container,
    own: &OwnSocket,
    command: &mut GuardCommand,
    mounts: &mut Vec<VolumeMount>,
    volumes: &mut Vec<Volume>,
) {
    match own {
        OwnSocket::InVolume { mount: held, path } => {
            if !mounts
                .iter()
                .any(|m| same_path(&m.mount_path, &held.mount_path))
            {
                mounts.push(VolumeMount {
                    name: held.name.clone(),
                    mount_path: held.mount_path.clone(),
                    sub_path: held.sub_path.clone(),
                    sub_path_expr: held.sub_path_expr.clone(),
                    ..VolumeMount::default()
                });
            }
            command.listen.push(Address::Unix(path.into()));
        }
        OwnSocket::InRunDir { dir, name } => {
            volumes.push(empty_dir(RUN_VOLUME));
            daemon
                .volume_mounts
                .get_or_insert_with(Vec::new)
                .push(mount(RUN_VOLUME, dir));
            mounts.push(mount(RUN_VOLUME, GUARD_RUN_DIR));
            command
                .listen
                .push(Address::Unix(format!("{GUARD_RUN_DIR}/{name}").into()));
        }
    }
}

/// The daemon: the private socket only, every other flag kept; its TLS env blanked.
fn move_daemon(daemon: &mut Container, moved: &MovedDaemon) {
    daemon.command = moved.command.clone();
    daemon.args = moved.args.clone();
    for entry in daemon.env.iter_mut().flatten() {
        if moved.blank_env.contains(&entry.name) {
            entry.value = Some(String::new());
            entry.value_from = None;
        }
    }
    daemon
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount(DAEMON_SOCKET_VOLUME, DAEMON_SOCKET_DIR));
}

fn daemons_place_messages(daemon_name: &str, place: DaemonsPlace, policy: Policy) -> Vec<String> {
    let tls = place.tls.as_ref().map_or(String::new(), |tls| {
        format!(" (TLS, certificates in {})", tls.certdir)
    });
    let listen: Vec<String> = place.listen.iter().map(Address::to_string).collect();
    let mut messages = vec![
        format!(
            "injected {GUARD_CONTAINER} (policy {policy}) in daemon {daemon_name}'s place: {}{tls}",
            names(&listen)
        ),
        format!(
            "daemon {daemon_name} now listens only on unix://{DAEMON_SOCKET}, which only {GUARD_CONTAINER} mounts"
        ),
    ];
    if !place.moved.blank_env.is_empty() {
        messages.push(format!(
            "set {} of {daemon_name} to \"\": dockerd turns TLS on from them",
            place.moved.blank_env.join(", ")
        ));
    }
    match &place.own_socket {
        Some(OwnSocket::InVolume { path, .. }) => messages.push(format!(
            "{daemon_name}'s own unix://{path} now leads to {GUARD_CONTAINER}"
        )),
        Some(OwnSocket::InRunDir { dir, name }) => messages.push(format!(
            "{daemon_name}'s own unix://{dir}/{name} now leads to {GUARD_CONTAINER} (an emptyDir over {dir})"
        )),
        None => {}
    }
    messages.extend(place.notes);
    messages
}

/// The node's socket moves to the guard; each client finds the guard's socket where the
/// node's was.
fn in_front_of_node_socket(
    spec: &mut PodSpec,
    place: NodeSocketPlace,
    settings: &GuardSettings<'_>,
) -> Result<Vec<String>, String> {
    let mut listen: Vec<Address> = Vec::new();
    let mut client_names: Vec<String> = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    for client in &place.clients {
        let Some(container) = client.slot.get_mut(spec) else {
            continue;
        };
        if !swap_node_socket_mount(container, client) {
            continue;
        }
        let socket = Address::Unix(
            format!(
                "{GUARD_SOCKET_DIR}/{}/{}",
                client.sub_path, client.socket_name
            )
            .into(),
        );
        push_new(&mut listen, socket);
        push_new(&mut client_names, container.name.clone());
        push_new(
            &mut paths,
            client.mount.mount_path.trim_end_matches('/').to_string(),
        );
    }
    let upstream = node_socket_in_guard();
    let mounts = vec![
        mount(GUARD_SOCKET_VOLUME, GUARD_SOCKET_DIR),
        mount(&place.volume, &upstream),
    ];
    spec.volumes
        .get_or_insert_with(Vec::new)
        .push(empty_dir(GUARD_SOCKET_VOLUME));
    let mut command = GuardCommand::new(listen, Address::Unix(upstream.into()), settings.policy);
    if let Some(client) = place.clients.first() {
        command.daemon_socket_paths = node_socket_paths(spec, &place.volume, client);
        command.guard_socket_for_daemon = Some(guard_socket_on_node(settings, client));
    }
    add_guard(spec, command, mounts, settings);
    Ok(vec![
        format!(
            "injected {GUARD_CONTAINER} (policy {}) in front of the node's Docker socket, at {} of {}",
            settings.policy,
            names(&paths),
            names(&client_names)
        ),
        format!(
            "moved the node's Docker socket from {} to {GUARD_CONTAINER}, whose socket is at the same path",
            names(&client_names)
        ),
    ])
}

/// The paths at which the node's daemon finds its own socket when it resolves a container's
/// bind: the hostPath the pod mounts it from, and Docker's default paths.
fn node_socket_paths(spec: &PodSpec, volume: &str, client: &NodeSocketClient) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    let host_path = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume)
        .and_then(|v| v.host_path.as_ref())
        .map(|h| h.path.trim_end_matches('/').to_string());
    if let Some(path) = host_path {
        if path.ends_with(&format!("/{}", client.socket_name)) {
            push_new(&mut paths, path);
        } else {
            push_new(&mut paths, format!("{path}/{}", client.socket_name));
        }
    }
    for default in ["/var/run/docker.sock", "/run/docker.sock"] {
        push_new(&mut paths, default.to_string());
    }
    paths
}

/// Where the node's daemon finds the guard's socket for `client`: the pod's emptyDir on the
/// node, `<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<volume>` (the kubelet's
/// `getPodVolumeDir`, pkg/kubelet/kubelet_getters.go, with the plugin name
/// `kubernetes.io/empty-dir` escaped as `kubernetes.io~empty-dir`). The pod's UID is known
/// only once it runs: the kubelet expands `$(PODMEND_OWNER_POD_UID)` in the guard's args from
/// its downward-API environment variable.
fn guard_socket_on_node(settings: &GuardSettings<'_>, client: &NodeSocketClient) -> String {
    format!(
        "{}/pods/$({OWNER_UID_ENV})/volumes/kubernetes.io~empty-dir/{GUARD_SOCKET_VOLUME}/{}/{}",
        settings.config.kubelet_root_dir.trim_end_matches('/'),
        client.sub_path,
        client.socket_name
    )
}

/// In place of the client's mount of the node's socket, the guard's socket directory where
/// the socket's directory was (once for each directory): the socket in it is the guard's, at
/// the path the client used. `false` when the client has no such mount.
fn swap_node_socket_mount(container: &mut Container, client: &NodeSocketClient) -> bool {
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    let Some(at) = mounts
        .iter()
        .position(|m| m.name == client.mount.name && m.mount_path == client.mount.mount_path)
    else {
        return false;
    };
    let already = mounts
        .iter()
        .any(|m| m.name == GUARD_SOCKET_VOLUME && same_path(&m.mount_path, &client.dir));
    if already {
        mounts.remove(at);
    } else {
        mounts[at] = VolumeMount {
            name: GUARD_SOCKET_VOLUME.to_string(),
            mount_path: client.dir.clone(),
            sub_path: Some(client.sub_path.clone()),
            read_only: client.mount.read_only,
            ..VolumeMount::default()
        };
    }
    true
}

/// Pushes `item` unless the list has it already.
fn push_new<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// The fallback: clients pointed at the guard's own socket, the guard at what they used (the
/// node's socket moving from them to it).
fn between_clients_and_daemon(
    spec: &mut PodSpec,
    place: FallbackPlace,
    settings: &GuardSettings<'_>,
) -> Result<Vec<String>, String> {
    check_guard_dir_free(spec, &place.clients)?;
    let guard_host = format!("unix://{GUARD_SOCKET}");
    let mut client_names = Vec::new();
    let mut unplugged = Vec::new();
    for slot in &place.clients {
        let Some(client) = slot.get_mut(spec) else {
            continue;
        };
        point_at_guard(client, &guard_host);
        if let Some(volume) = &place.node_socket_volume {
            let mounts = client.volume_mounts.get_or_insert_with(Vec::new);
            let before = mounts.len();
            mounts.retain(|m| m.name != *volume);
            if mounts.len() != before {
                unplugged.push(client.name.clone());
            }
        }
        client_names.push(client.name.clone());
    }
    let mut mounts = vec![mount(GUARD_SOCKET_VOLUME, GUARD_SOCKET_DIR)];
    mounts.extend(place.mounts.iter().cloned());
    if let Some(volume) = &place.node_socket_volume {
        mounts.push(mount(volume, &node_socket_in_guard()));
    }
    spec.volumes
        .get_or_insert_with(Vec::new)
        .push(empty_dir(GUARD_SOCKET_VOLUME));
    let mut command = GuardCommand::new(
        vec![Address::Unix(GUARD_SOCKET.into())],
        place.upstream.clone(),
        settings.policy,
    );
    command.upstream_cert_path = place.cert_path.as_ref().map(PathBuf::from);
    add_guard(spec, command, mounts, settings);
    Ok(fallback_messages(
        place,
        &client_names,
        &unplugged,
        settings.policy,
    ))
}

/// No client may have a mount of its own where the guard's socket directory goes.
fn check_guard_dir_free(spec: &PodSpec, clients: &[Slot]) -> Result<(), String> {
    for slot in clients {
        let Some(client) = slot.get(spec) else {
            continue;
        };
        if let Some(taken) =
            client.volume_mounts.iter().flatten().find(|m| {
                m.name != GUARD_SOCKET_VOLUME && same_path(&m.mount_path, GUARD_SOCKET_DIR)
            })
        {
            return Err(format!(
                "{GUARD_CONTAINER} not injected: {} already mounts {} at {GUARD_SOCKET_DIR}",
                client.name, taken.name
            ));
        }
    }
    Ok(())
}

/// What the fallback did, and how the guard can be gone around, first (or, with the node's
/// socket moved to it, that clients reach it only by `DOCKER_HOST`).
fn fallback_messages(
    place: FallbackPlace,
    client_names: &[String],
    unplugged: &[String],
    policy: Policy,
) -> Vec<String> {
    let tls = if place.cert_path.is_some() {
        " (TLS)"
    } else {
        ""
    };
    let clients = if client_names.len() == 1 {
        format!("docker client {}", client_names[0])
    } else {
        format!("{} docker clients", client_names.len())
    };
    let injected = format!(
        "injected {GUARD_CONTAINER} (policy {policy}) between {clients} and {}{tls}",
        place.upstream
    );
    let mut messages = Vec::new();
    if unplugged.is_empty() {
        // First: a reader (and the audit's count) must not take this for a repair.
        messages.push(format!("{BYPASSABLE}, because {}", place.reason));
        messages.push(injected);
    } else {
        messages.push(injected);
        messages.push(format!(
            "moved the node's Docker socket from {} to {GUARD_CONTAINER}",
            names(unplugged)
        ));
        messages.push(format!(
            "clients reach {GUARD_CONTAINER} only by DOCKER_HOST, because {}",
            place.reason
        ));
    }
    messages.extend(place.notes);
    messages
}

/// Sets `DOCKER_HOST` to the guard (in place of the one the container had) and drops the TLS
/// settings, which were for the daemon; mounts the guard's socket.
fn point_at_guard(container: &mut Container, guard_host: &str) {
    let env = container.env.get_or_insert_with(Vec::new);
    let docker_host = EnvVar {
        name: DOCKER_HOST.to_string(),
        value: Some(guard_host.to_string()),
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
    if !mounts
        .iter()
        .any(|m| same_path(&m.mount_path, GUARD_SOCKET_DIR))
    {
        mounts.push(mount(GUARD_SOCKET_VOLUME, GUARD_SOCKET_DIR));
    }
}

/// Builds the guard and puts it first among the init containers (a native sidecar: every
/// later container starts once its startup probe passed) or last among the containers.
fn add_guard(
    spec: &mut PodSpec,
    mut command: GuardCommand,
    mut mounts: Vec<VolumeMount>,
    settings: &GuardSettings<'_>,
) {
    let config = settings.config;
    let host_network = spec.host_network == Some(true);
    let (port, token) = if host_network {
        host_network_health(spec, &command.listen)
    } else {
        (health_port(spec, &command.listen), None)
    };
    command.min_age = config.min_age;
    command.max_exited = config.max_exited;
    // `[::]`, dual-stack: the kubelet probes the pod IP, an IPv6 one on IPv6 clusters.
    command.health_listen = Some(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)));
    command.health_token = token.clone();
    // Parents before children: a mount at /certs must not hide the one at /certs/client.
    mounts.sort_by_key(|m| depth(&m.mount_path));
    let probe = |path: &str, period: i32, failures: i32| {
        health_probe(path, token.as_deref(), port, period, failures)
    };
    let native = config.sidecar_mode == SidecarMode::Native;
    let guard = Container {
        name: GUARD_CONTAINER.to_string(),
        image: Some(config.guard_image.clone()),
        args: Some(command.to_args()),
        env: Some(vec![
            downward(OWNER_UID_ENV, "metadata.uid"),
            downward(POD_IP_ENV, "status.podIP"),
        ]),
        volume_mounts: Some(mounts),
        resources: settings.resources.clone(),
        // Listeners bound and the TLS tree written: later containers may start.
        startup_probe: Some(probe("/healthz", 1, 60)),
        // The daemon answers.
        readiness_probe: Some(probe("/readyz", 5, 3)),
        // On the node's network the port is the node's: declared, so that the API server
        // makes it a hostPort (`pkg/apis/core/v1/defaults.go`, `defaultHostNetworkPorts`) and
        // the scheduler never puts two pods needing it on one node (`pkg/scheduler/util/
        // utils.go`, `GetHostPorts`, which counts native sidecars' ports).
        ports: host_network.then(|| {
            vec![ContainerPort {
                name: Some(HEALTH_PORT_NAME.to_string()),
                container_port: i32::from(port),
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            }]
        }),
        security_context: Some(security_context()),
        restart_policy: native.then(|| "Always".to_string()),
        ..Container::default()
    };
    match config.sidecar_mode {
        SidecarMode::Native => spec
            .init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, guard),
        SidecarMode::Container => spec.containers.push(guard),
    }
}

/// An HTTP probe of the guard's health `port` at `path`, followed by `/<token>` when the pod
/// has one.
fn health_probe(path: &str, token: Option<&str>, port: u16, period: i32, failures: i32) -> Probe {
    let path = match token {
        Some(token) => format!("{path}/{token}"),
        None => path.to_string(),
    };
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// Root, with every capability dropped but `CHOWN`: dockerd creates its socket root-owned
/// with mode 0660 (group `docker`, which docker:dind images lack, or ARC's `--group`), and the
/// node's socket is root's with the node's docker group; as their owner, uid 0 opens both
/// without any capability, whatever the group. The guard gives its own socket the owner,
/// group and mode of the one it stands in for, so that a non-root client in the node's docker
/// group keeps its access: giving a file a group the process is not in takes `CAP_CHOWN`.
/// No privilege escalation, a read-only root filesystem.
fn security_context() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(0),
        run_as_group: Some(0),
        run_as_non_root: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: Some(vec!["CHOWN".to_string()]),
            drop: Some(vec!["ALL".to_string()]),
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// [`HEALTH_PORT`], or the next port no container of the pod declares and the guard does not
/// listen on.
fn health_port(spec: &PodSpec, listen: &[Address]) -> u16 {
    (HEALTH_PORT..u16::MAX)
        .find(|&port| !port_taken(spec, listen, port))
        .unwrap_or(HEALTH_PORT)
}

/// A container of the pod declares `port`, or the guard listens on it.
fn port_taken(spec: &PodSpec, listen: &[Address], port: u16) -> bool {
    all_slots(spec).iter().any(|(_, c)| {
        c.ports
            .iter()
            .flatten()
            .any(|p| p.container_port == i32::from(port))
    }) || listen
        .iter()
        .any(|a| matches!(a, Address::Tcp { port: p, .. } if *p == port))
}

/// With `hostNetwork` the pod shares the node's network with every other such pod: a port of
/// its own, drawn from [`HOST_NETWORK_PORTS`] (one no container of the pod declares and the
/// guard does not listen on), and a token for its probes' paths, both random, as nothing of
/// a pod being created (no uid, often no name) tells it from its siblings.
fn host_network_health(spec: &PodSpec, listen: &[Address]) -> (u16, Option<String>) {
    let (first, last) = HOST_NETWORK_PORTS;
    let span = u64::from(last - first) + 1;
    let start = random_u64() % span;
    let port = (0..span)
        .map(|offset| first + ((start + offset) % span) as u16)
        .find(|&port| !port_taken(spec, listen, port))
        .unwrap_or(first);
    let token = format!("{:016x}", random_u64());
    (port, Some(token))
}

/// 64 random bits: the standard library's hasher keys, drawn from the operating system's
/// randomness for each `RandomState`.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

fn downward(name: &str, field: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: field.to_string(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}
