//! The daemon rewrite: which addresses a Docker daemon container serves (read as the
//! `docker:dind` entrypoint and dockerd read its command, args and environment), and the
//! command that makes it listen only on the private socket, every other flag kept; or why it
//! cannot be rewritten safely. It reads one container: which clients reach those addresses,
//! and so where the guard stands, is [`super::placement`]'s.
//!
//! The `docker:dind` entrypoint (`dockerd-entrypoint.sh`) with no arguments, or arguments
//! that start with `-`, adds `--host=unix:///var/run/docker.sock` (or its `DOCKER_HOST`'s
//! socket) and a TCP listener: `0.0.0.0:2376` with TLS and a certificate tree it generates
//! in `DOCKER_TLS_CERTDIR`, or `0.0.0.0:2375` without. Given `dockerd ...` it adds neither.
//! So the rewrite hands it `dockerd --host=unix:///podmend/daemon/docker.sock <the flags>`;
//! the guard takes over every address the daemon had.

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSecurityContext};

use super::detection::{basename, program_index};
use crate::dind::{
    Address, DAEMON_SOCKET, DEFAULT_SOCKET, DOCKER_PORT, DOCKER_TLS_PORT, is_docker_image,
};

const ENTRYPOINT: &str = "dockerd-entrypoint.sh";
/// Where dockerd reads registry CAs (`<registry>/ca.crt`); nothing of its own listeners.
const REGISTRY_CERTS_DIR: &str = "/etc/docker/certs.d";
const DOCKERD: &str = "dockerd";
/// The environment dockerd reads its TLS defaults from (`--tlsverify` is on when
/// `DOCKER_TLS_VERIFY` is non-empty, the files come from `DOCKER_CERT_PATH`). Blanked in a
/// rewritten daemon: without the entrypoint's explicit flags it would turn TLS on with
/// default files nobody wrote, which newer dockerd releases refuse to start with (GitLab puts
/// every job variable into its services' env).
pub(super) const DAEMON_TLS_ENV: &[&str] = &["DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"];

/// An address the daemon served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ServedAddress {
    pub address: Address,
    /// For a TCP listener with the entrypoint's TLS: its `DOCKER_TLS_CERTDIR`.
    pub tls_certdir: Option<String>,
}

/// A daemon that can be moved to the private socket, and what it served before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MovedDaemon {
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    /// Environment variables set to "" (see [`DAEMON_TLS_ENV`]).
    pub blank_env: Vec<String>,
    pub served: Vec<ServedAddress>,
    /// The entrypoint's `DOCKER_TLS_SAN` names, for the guard's certificate.
    pub tls_sans: Vec<String>,
}

/// How the container starts dockerd.
enum Form {
    /// Through the dind entrypoint's default branch (at this index of the effective argv):
    /// it adds the socket and a TCP listener.
    Entrypoint(usize),
    /// `dockerd` itself at this index, with its flags after it.
    Dockerd(usize),
}

impl Form {
    /// Where the program that starts dockerd stands in the effective argv; its flags follow.
    fn program(&self) -> usize {
        match *self {
            Form::Entrypoint(at) | Form::Dockerd(at) => at,
        }
    }
}

/// What an environment variable of the container is.
enum EnvState<'a> {
    Unset,
    Value(&'a str),
    /// `valueFrom`: known only when the pod starts.
    Reference,
}

/// Reads the daemon container; `Err` says why it cannot be rewritten safely (the guard then
/// falls back to pointing clients at itself).
pub(super) fn analyse(
    container: &Container,
    pod_security: Option<&PodSecurityContext>,
) -> Result<MovedDaemon, String> {
    check_readable(container, pod_security)?;
    let argv = effective_argv(container)?;
    let start = container.command.as_deref().map_or(0, program_index);
    let form = form(&argv, start)?;
    let flags = DockerdFlags::parse(&argv[form.program() + 1..])?;
    let (mut served, tls_sans) = match form {
        Form::Entrypoint(_) => served_by_entrypoint(container, &flags)?,
        Form::Dockerd(_) => (served_by_dockerd(container, &flags)?, Vec::new()),
    };
    served.dedup_by(|a, b| a.address == b.address);
    let (command, args) = rewritten_command(container, &argv, &form, flags.kept);
    Ok(MovedDaemon {
        command,
        args,
        blank_env: tls_env_to_blank(container),
        served,
        tls_sans,
    })
}

/// Whether the pod spec alone says what the daemon serves: not rootless (rootlesskit
/// forwards its ports), no `envFrom`, no `daemon.json` mounted.
fn check_readable(
    container: &Container,
    pod_security: Option<&PodSecurityContext>,
) -> Result<(), String> {
    let image = container.image.as_deref().unwrap_or("");
    if image.to_ascii_lowercase().contains("rootless") || runs_as_non_root(container, pod_security)
    {
        return Err("it runs rootless (rootlesskit forwards its ports)".to_string());
    }
    if container.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err("its envFrom may set DOCKER_TLS_VERIFY or DOCKER_TLS_CERTDIR".to_string());
    }
    // `/etc/docker/certs.d` holds registry CAs (dockerd reads no hosts or TLS of its own
    // there): a mount at or below it hides no daemon.json.
    if let Some(mount) = container.volume_mounts.iter().flatten().find(|m| {
        let path = m.mount_path.trim_end_matches('/');
        let registry_cas = path == REGISTRY_CERTS_DIR
            || path
                .strip_prefix(REGISTRY_CERTS_DIR)
                .is_some_and(|rest| rest.starts_with('/'));
        path == "/etc"
            || path == "/etc/docker"
            || (path.starts_with("/etc/docker/") && !registry_cas)
    }) {
        return Err(format!(
            "it mounts {}, where a daemon.json may set hosts or TLS",
            mount.mount_path
        ));
    }
    Ok(())
}

/// The argv as the container runs it; without a command, the image's entrypoint first (known
/// only for the docker image).
fn effective_argv(container: &Container) -> Result<Vec<String>, String> {
    let image = container.image.as_deref().unwrap_or("");
    let implicit = container.command.is_none();
    if implicit && !is_docker_image(image) {
        return Err(format!(
            "{image} is not the docker image: its entrypoint is unknown"
        ));
    }
    let mut argv: Vec<String> = Vec::new();
    if implicit {
        argv.push(ENTRYPOINT.to_string());
    }
    argv.extend(container.command.iter().flatten().cloned());
    argv.extend(container.args.iter().flatten().cloned());
    Ok(argv)
}

/// What the entrypoint's default branch serves: its socket, its TCP listener (TLS on 2376 with
/// a `DOCKER_TLS_CERTDIR`, plain 2375 with an empty one) and the `--host`s it is given; and the
/// names its `DOCKER_TLS_SAN` adds to the certificate.
fn served_by_entrypoint(
    container: &Container,
    flags: &DockerdFlags,
) -> Result<(Vec<ServedAddress>, Vec<String>), String> {
    // `--tls=false` or `--tlsverify=false` (GitLab's and Testcontainers' TLS-off services)
    // leave the entrypoint's branch to `DOCKER_TLS_CERTDIR`; TLS turned on, or files of its
    // own, would change what its TCP listener serves.
    if flags.tls == Some(true) || flags.tls_files {
        return Err("it adds --tls flags after the entrypoint's".to_string());
    }
    if flags.tlsverify_given && entrypoint_certdir(container)?.is_some() {
        // With the entrypoint's `--tlsverify` before it, dockerd serves TLS without checking
        // client certificates; the guard would check them.
        return Err(
            "it turns the entrypoint's client verification off with --tlsverify=false".to_string(),
        );
    }
    let socket = entrypoint_socket(container)?;
    let tls = entrypoint_certdir(container)?;
    let port = if tls.is_some() {
        DOCKER_TLS_PORT
    } else {
        DOCKER_PORT
    };
    let mut served = vec![
        ServedAddress {
            address: socket,
            tls_certdir: None,
        },
        ServedAddress {
            address: Address::Tcp {
                host: "0.0.0.0".to_string(),
                port,
            },
            tls_certdir: tls.clone(),
        },
    ];
    for host in &flags.hosts {
        let address = parse_daemon_host(host)?;
        let tls_certdir = matches!(address, Address::Tcp { .. })
            .then(|| tls.clone())
            .flatten();
        served.push(ServedAddress {
            address,
            tls_certdir,
        });
    }
    let tls_sans = match (&tls, env_state(container, "DOCKER_TLS_SAN")) {
        (Some(_), EnvState::Value(sans)) => parse_tls_sans(sans),
        _ => Vec::new(),
    };
    Ok((served, tls_sans))
}

/// The entrypoint's socket: the container's `DOCKER_HOST` when it is a unix one (a tcp one,
/// GitLab's, is the clients' and ignored), else the default.
fn entrypoint_socket(container: &Container) -> Result<Address, String> {
    match env_state(container, "DOCKER_HOST") {
        EnvState::Value(host) if host.trim().starts_with("unix://") => parse_daemon_host(host),
        EnvState::Reference => Err("its DOCKER_HOST comes from valueFrom".to_string()),
        _ => Ok(Address::Unix(DEFAULT_SOCKET.into())),
    }
}

/// The entrypoint's `DOCKER_TLS_CERTDIR` (the image's default when unset); `None` when it is
/// empty: no TLS.
fn entrypoint_certdir(container: &Container) -> Result<Option<String>, String> {
    let certdir = match env_state(container, "DOCKER_TLS_CERTDIR") {
        EnvState::Value(dir) => dir.trim().to_string(),
        EnvState::Unset => default_certdir(container.image.as_deref().unwrap_or("")).to_string(),
        EnvState::Reference => {
            return Err("its DOCKER_TLS_CERTDIR comes from valueFrom".to_string());
        }
    };
    Ok((!certdir.is_empty()).then_some(certdir))
}

/// `DOCKER_TLS_SAN` as the entrypoint reads it: names separated by commas or spaces, each
/// perhaps with its `DNS:` or `IP:` prefix.
fn parse_tls_sans(sans: &str) -> Vec<String> {
    sans.split([',', ' '])
        .map(str::trim)
        .map(|san| {
            san.strip_prefix("DNS:")
                .or_else(|| san.strip_prefix("IP:"))
                .unwrap_or(san)
        })
        .filter(|san| !san.is_empty())
        .map(str::to_string)
        .collect()
}

/// What dockerd started directly serves: its `--host`s, or without one its default (the
/// socket, or `localhost:2376` with TLS on). A TCP listener with TLS uses files of its own,
/// which the guard does not have.
fn served_by_dockerd(
    container: &Container,
    flags: &DockerdFlags,
) -> Result<Vec<ServedAddress>, String> {
    let tls = dockerd_tls(container, flags);
    let mut served = Vec::new();
    if flags.hosts.is_empty() {
        served.push(ServedAddress {
            address: match tls {
                Some(true) => Address::Tcp {
                    host: "localhost".to_string(),
                    port: DOCKER_TLS_PORT,
                },
                _ => Address::Unix(DEFAULT_SOCKET.into()),
            },
            tls_certdir: None,
        });
    }
    for host in &flags.hosts {
        served.push(ServedAddress {
            address: parse_daemon_host(host)?,
            tls_certdir: None,
        });
    }
    if let Some(tcp) = served
        .iter()
        .find(|s| matches!(s.address, Address::Tcp { .. }))
        && tls != Some(false)
    {
        return Err(format!(
            "it serves {} with TLS files of its own",
            tcp.address
        ));
    }
    Ok(served)
}

/// Whether dockerd serves TLS: `--tls` or `--tlsverify` on; else, unless `--tlsverify` was
/// given off, `DOCKER_TLS_VERIFY` non-empty (`None` when that comes from `valueFrom`).
fn dockerd_tls(container: &Container, flags: &DockerdFlags) -> Option<bool> {
    let verify_env = match env_state(container, "DOCKER_TLS_VERIFY") {
        EnvState::Value(value) => Some(!value.is_empty()),
        EnvState::Unset => Some(false),
        EnvState::Reference => None,
    };
    // `--tlsverify` defaults to DOCKER_TLS_VERIFY being non-empty; `--tls` to off.
    match flags.tls {
        Some(true) => Some(true),
        _ if flags.tlsverify_given => Some(false),
        _ => verify_env,
    }
}

/// The container's command and args after the rewrite: what ran the program, then dockerd on
/// the private socket, then the kept flags; split between command and args as they were.
fn rewritten_command(
    container: &Container,
    argv: &[String],
    form: &Form,
    kept: Vec<String>,
) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let program_end = form.program();
    let mut new_argv: Vec<String> = argv[..=program_end].to_vec();
    if matches!(form, Form::Entrypoint(_)) {
        new_argv.push(DOCKERD.to_string());
    }
    new_argv.push(format!("--host=unix://{DAEMON_SOCKET}"));
    new_argv.extend(kept);
    let Some(command) = &container.command else {
        // The image's entrypoint stays implicit: the rest is args.
        return (None, Some(new_argv[1..].to_vec()));
    };
    if program_end + 1 >= command.len() {
        // The command ends with the program: it stays, the rest is args.
        let args = new_argv.split_off(command.len());
        (Some(new_argv), Some(args))
    } else {
        (Some(new_argv), None)
    }
}

/// The [`DAEMON_TLS_ENV`] variables the container sets (to a value, or from `valueFrom`).
fn tls_env_to_blank(container: &Container) -> Vec<String> {
    DAEMON_TLS_ENV
        .iter()
        .filter(|name| match env_state(container, name) {
            EnvState::Value(value) => !value.is_empty(),
            EnvState::Reference => true,
            EnvState::Unset => false,
        })
        .map(|name| name.to_string())
        .collect()
}

/// Where dockerd starts in `argv` (the effective argv, the image's entrypoint first when the
/// container has no command), and through which branch of the entrypoint.
fn form(argv: &[String], start: usize) -> Result<Form, String> {
    let Some(word) = argv.get(start) else {
        return Err("it has no command podmend can read".to_string());
    };
    match basename(word) {
        ENTRYPOINT => match argv.get(start + 1) {
            None => Ok(Form::Entrypoint(start)),
            Some(next) if next.starts_with('-') => Ok(Form::Entrypoint(start)),
            Some(next) if basename(next) == DOCKERD => Ok(Form::Dockerd(start + 1)),
            Some(next) => Err(format!("its entrypoint runs {next:?}, not dockerd")),
        },
        DOCKERD => Ok(Form::Dockerd(start)),
        _ => Err(format!(
            "its command {word:?} is not dockerd or {ENTRYPOINT}"
        )),
    }
}

/// dockerd's flags, split into the `--host` values and the rest.
#[derive(Debug, Default)]
struct DockerdFlags {
    hosts: Vec<String>,
    kept: Vec<String>,
    /// `--tls` or `--tlsverify` given: whether it turns TLS on.
    tls: Option<bool>,
    /// `--tlsverify` given (its value, true or false, overrides DOCKER_TLS_VERIFY).
    tlsverify_given: bool,
    /// `--tlscacert`, `--tlscert` or `--tlskey` given.
    tls_files: bool,
}

impl DockerdFlags {
    /// Every spelling of the host flag: `--host=X`, `--host X`, `-H X`, `-HX`, `-H=X`.
    fn parse(flags: &[String]) -> Result<Self, String> {
        let mut parsed = DockerdFlags::default();
        let mut i = 0;
        while i < flags.len() {
            let flag = flags[i].as_str();
            i += 1;
            let host = if flag == "--host" || flag == "-H" {
                let value = flags
                    .get(i)
                    .ok_or_else(|| format!("its flag {flag} has no value"))?;
                i += 1;
                Some(value.as_str())
            } else if let Some(value) = flag.strip_prefix("--host=") {
                Some(value)
            } else if let Some(value) = flag.strip_prefix("-H") {
                Some(value.strip_prefix('=').unwrap_or(value))
            } else {
                None
            };
            if let Some(host) = host {
                if host.contains("$(") {
                    return Err(format!(
                        "its --host {host} is a variable until the pod starts"
                    ));
                }
                parsed.hosts.push(host.to_string());
                continue;
            }
            let name = flag.split('=').next().unwrap_or(flag);
            let value = flag.split_once('=').map(|(_, v)| v);
            match name {
                "--config-file" => {
                    return Err(format!(
                        "it reads {flag}, whose hosts or TLS podmend cannot see"
                    ));
                }
                "--tls" | "--tlsverify" => {
                    let on = !matches!(value, Some("false" | "0" | "f" | "F" | "FALSE" | "False"));
                    parsed.tls = Some(parsed.tls.unwrap_or(false) || on);
                    parsed.tlsverify_given |= name == "--tlsverify";
                    if !on {
                        // Not kept: the moved daemon serves only its private socket, and a
                        // `--tlsverify` given at all, even false, turns TLS on in dockerd
                        // (`cmd/dockerd/daemon.go`, `loadDaemonCliConfig`), which then wants
                        // certificate files nobody wrote.
                        continue;
                    }
                }
                "--tlscacert" | "--tlscert" | "--tlskey" => parsed.tls_files = true,
                _ => {}
            }
            parsed.kept.push(flag.to_string());
        }
        Ok(parsed)
    }
}

/// A `--host` value (or the entrypoint's unix `DOCKER_HOST`) as dockerd takes it.
fn parse_daemon_host(host: &str) -> Result<Address, String> {
    Address::parse_docker_host(host, false)
        .map_err(|_| format!("its listener {host} is not a unix:// or tcp:// address"))
}

/// The last entry of `name` in the container's env (the one that wins).
fn env_state<'a>(container: &'a Container, name: &str) -> EnvState<'a> {
    match container.env.iter().flatten().rfind(|e| e.name == name) {
        None => EnvState::Unset,
        Some(EnvVar {
            value_from: Some(_),
            ..
        }) => EnvState::Reference,
        Some(EnvVar { value, .. }) => EnvState::Value(value.as_deref().unwrap_or("")),
    }
}

/// `DOCKER_TLS_CERTDIR` of the official image: `/certs` since 19.03 (the image sets it),
/// unset before.
fn default_certdir(image: &str) -> &'static str {
    let reference = image.split('@').next().unwrap_or(image);
    let last = reference.rsplit('/').next().unwrap_or(reference);
    let major = last.split_once(':').map(|(_, tag)| tag).and_then(|tag| {
        let digits: String = tag.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    match major {
        Some(major) if major < 19 => "",
        _ => "/certs",
    }
}

/// The container (or, without its own, the pod) runs as a user other than root.
fn runs_as_non_root(container: &Container, pod: Option<&PodSecurityContext>) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| pod.and_then(|p| p.run_as_user))
        .is_some_and(|uid| uid != 0)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const PRIVATE: &str = "--host=unix:///podmend/daemon/docker.sock";

    fn daemon(value: Value) -> Container {
        let mut value = value;
        value["name"] = json!("dind");
        if value.get("image").is_none() {
            value["image"] = json!("docker:dind");
        }
        serde_json::from_value(value).expect("container")
    }

    fn moved(value: Value) -> MovedDaemon {
        analyse(&daemon(value.clone()), None).unwrap_or_else(|e| panic!("{value}: {e}"))
    }

    fn refused(value: Value) -> String {
        analyse(&daemon(value.clone()), None).expect_err(&value.to_string())
    }

    fn tcp(host: &str, port: u16) -> Address {
        Address::Tcp {
            host: host.to_string(),
            port,
        }
    }

    fn unix(path: &str) -> Address {
        Address::Unix(path.into())
    }

    fn strings(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|s| s.to_string()).collect())
    }

    fn addresses(m: &MovedDaemon) -> Vec<(Address, Option<String>)> {
        m.served
            .iter()
            .map(|s| (s.address.clone(), s.tls_certdir.clone()))
            .collect()
    }

    /// What the `docker:dind` entrypoint serves by default: its socket, and TLS on 2376 with
    /// the certificates in `/certs`.
    fn entrypoint_addresses() -> Vec<(Address, Option<String>)> {
        vec![
            (unix("/var/run/docker.sock"), None),
            (tcp("0.0.0.0", 2376), Some("/certs".to_string())),
        ]
    }

    #[test]
    fn the_entrypoint_with_no_arguments_serves_its_socket_and_tls_port_and_becomes_dockerd() {
        let m = moved(json!({}));
        assert_eq!(m.command, None);
        assert_eq!(m.args, strings(&["dockerd", PRIVATE]));
        assert_eq!(addresses(&m), entrypoint_addresses());
    }

    #[test]
    fn flags_after_the_entrypoint_are_kept_behind_the_private_socket() {
        let m = moved(
            json!({"args": ["--storage-driver=vfs", "--userland-proxy=false", "--debug"],
            "env": [{"name": "DOCKER_TLS_CERTDIR", "value": "/certs"}]}),
        );
        assert_eq!(
            m.args,
            strings(&[
                "dockerd",
                PRIVATE,
                "--storage-driver=vfs",
                "--userland-proxy=false",
                "--debug"
            ])
        );
    }

    #[test]
    fn an_empty_certdir_means_plain_tcp_on_2375() {
        let m = moved(json!({"command": ["dockerd-entrypoint.sh"],
            "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}));
        assert_eq!(m.command, strings(&["dockerd-entrypoint.sh"]));
        assert_eq!(m.args, strings(&["dockerd", PRIVATE]));
        assert_eq!(
            addresses(&m),
            vec![
                (unix("/var/run/docker.sock"), None),
                (tcp("0.0.0.0", 2375), None)
            ]
        );
    }

    #[test]
    fn images_before_19_03_have_no_tls_by_default() {
        let m = moved(json!({"image": "docker:18.09-dind"}));
        assert_eq!(m.served[1].address, tcp("0.0.0.0", 2375));
        let m = moved(json!({"image": "docker:19.03.1-dind"}));
        assert_eq!(m.served[1].address, tcp("0.0.0.0", 2376));
    }

    #[test]
    fn argo_s_wrapper_is_kept_and_the_daemon_rewritten_after_its_double_dash() {
        let command = [
            "/var/run/argo/argoexec",
            "emissary",
            "--loglevel",
            "info",
            "--",
            "dockerd-entrypoint.sh",
        ];
        let m = moved(json!({"image": "docker:19.03.13-dind", "command": command,
            "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}));
        assert_eq!(m.command, strings(&command));
        assert_eq!(m.args, strings(&["dockerd", PRIVATE]));
        assert_eq!(m.served[1].address, tcp("0.0.0.0", 2375));
    }

    #[test]
    fn a_unix_docker_host_moves_the_entrypoint_s_socket() {
        let m = moved(
            json!({"env": [{"name": "DOCKER_HOST", "value": "unix:///run/docker/docker.sock"},
            {"name": "DOCKER_TLS_CERTDIR", "value": ""}]}),
        );
        assert_eq!(m.served[0].address, unix("/run/docker/docker.sock"));
        // A tcp DOCKER_HOST (GitLab's, in the service's env too) is ignored by the entrypoint.
        let m = moved(json!({"env": [{"name": "DOCKER_HOST", "value": "tcp://docker:2376"}]}));
        assert_eq!(m.served[0].address, unix("/var/run/docker.sock"));
    }

    #[test]
    fn every_spelling_of_the_host_flag_is_replaced_and_other_flags_kept() {
        let m = moved(
            json!({"args": ["dockerd", "--host=unix:///var/run/docker.sock",
            "--group=$(DOCKER_GROUP_GID)", "-H", "tcp://0.0.0.0:2375", "-Htcp://127.0.0.1:2377",
            "-H=unix:///run/b.sock", "--host", "tcp://:2378", "--mtu=1400"]}),
        );
        assert_eq!(
            m.args,
            strings(&[
                "dockerd",
                PRIVATE,
                "--group=$(DOCKER_GROUP_GID)",
                "--mtu=1400"
            ])
        );
        assert_eq!(
            addresses(&m)
                .into_iter()
                .map(|(a, _)| a)
                .collect::<Vec<_>>(),
            vec![
                unix("/var/run/docker.sock"),
                tcp("0.0.0.0", 2375),
                tcp("127.0.0.1", 2377),
                unix("/run/b.sock"),
                tcp("localhost", 2378)
            ]
        );
    }

    #[test]
    fn a_dockerd_command_keeps_its_shape() {
        let m = moved(json!({"command": ["dockerd", "--host=tcp://0.0.0.0:2375", "--debug"]}));
        assert_eq!(m.command, strings(&["dockerd", PRIVATE, "--debug"]));
        assert_eq!(m.args, None);
        let m = moved(json!({"command": ["dockerd"], "args": ["-H", "unix:///x/docker.sock"]}));
        assert_eq!(m.command, strings(&["dockerd"]));
        assert_eq!(m.args, strings(&[PRIVATE]));
        let m =
            moved(json!({"command": ["dockerd-entrypoint.sh"], "args": ["dockerd", "--debug"]}));
        assert_eq!(m.args, strings(&["dockerd", PRIVATE, "--debug"]));
        assert_eq!(
            m.served,
            vec![ServedAddress {
                address: unix("/var/run/docker.sock"),
                tls_certdir: None
            }]
        );
    }

    #[test]
    fn dockerd_tls_env_is_blanked_where_present() {
        let m = moved(json!({"env": [
            {"name": "DOCKER_TLS_VERIFY", "value": "1"},
            {"name": "DOCKER_CERT_PATH", "value": "/certs/client"},
            {"name": "DOCKER_TLS_CERTDIR", "value": "/certs"}]}));
        assert_eq!(m.blank_env, vec!["DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"]);
        assert!(moved(json!({})).blank_env.is_empty());
    }

    #[test]
    fn tls_sans_of_the_entrypoint_are_read() {
        let m = moved(
            json!({"env": [{"name": "DOCKER_TLS_SAN", "value": "DNS:dind.ci, IP:10.0.0.1"}]}),
        );
        assert_eq!(m.tls_sans, vec!["dind.ci", "10.0.0.1"]);
    }

    #[test]
    fn daemons_that_cannot_be_moved_safely_say_why() {
        for (spec, reason) in [
            (json!({"image": "docker:dind-rootless"}), "rootless"),
            (json!({"securityContext": {"runAsUser": 1000}}), "rootless"),
            (json!({"command": ["sh", "-c", "dockerd &"]}), "not dockerd"),
            (
                json!({"command": ["dockerd --host=tcp://0.0.0.0:2375"]}),
                "not dockerd",
            ),
            (json!({"image": "ci/dind:1"}), "entrypoint is unknown"),
            (
                json!({"args": ["dockerd", "--config-file=/etc/d.json"]}),
                "--config-file",
            ),
            (
                json!({"volumeMounts": [{"name": "c", "mountPath": "/etc/docker"}]}),
                "daemon.json",
            ),
            (json!({"args": ["dockerd", "-H", "fd://"]}), "fd://"),
            (json!({"args": ["dockerd", "--host"]}), "no value"),
            (json!({"args": ["dockerd", "--host=$(HOST)"]}), "variable"),
            (json!({"args": ["--tls"]}), "--tls flags"),
            (
                json!({"args": ["--tlsverify=false"]}),
                "client verification",
            ),
            (
                json!({"args": ["dockerd", "--tlsverify", "--tlscert=/c.pem", "-H", "tcp://0.0.0.0:2376"]}),
                "TLS files",
            ),
            (
                json!({"args": ["dockerd", "-H", "tcp://0.0.0.0:2376"], "env": [{"name": "DOCKER_TLS_VERIFY", "value": "1"}]}),
                "TLS files",
            ),
            (
                json!({"envFrom": [{"configMapRef": {"name": "ci"}}]}),
                "envFrom",
            ),
            (
                json!({"env": [{"name": "DOCKER_TLS_CERTDIR", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}),
                "valueFrom",
            ),
            (
                json!({"command": ["dockerd-entrypoint.sh", "sh"]}),
                "not dockerd",
            ),
        ] {
            let error = refused(spec.clone());
            assert!(error.contains(reason), "{spec}: {error}");
        }
    }

    #[test]
    fn gitlab_s_tls_off_flags_are_the_entrypoint_s_plain_branch_and_are_not_kept() {
        for flag in ["--tls=false", "--tlsverify=false"] {
            let m = moved(json!({"args": [flag, "--mtu=1400"],
                "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}));
            assert_eq!(
                m.args,
                strings(&["dockerd", PRIVATE, "--mtu=1400"]),
                "{flag}"
            );
            assert_eq!(
                addresses(&m),
                vec![
                    (unix("/var/run/docker.sock"), None),
                    (tcp("0.0.0.0", 2375), None)
                ],
                "{flag}"
            );
        }
        // dockerd itself given TLS off on plain TCP: served as before, the flag not kept.
        let m = moved(json!({"command": ["dockerd", "-H", "tcp://0.0.0.0:2375", "--tls=false"]}));
        assert_eq!(m.command, strings(&["dockerd", PRIVATE]));
    }

    #[test]
    fn tls_off_after_the_entrypoint_s_tls_branch_leaves_its_tls_listener() {
        // The entrypoint puts --tlsverify before it: TLS stays on.
        let m = moved(json!({"args": ["--tls=false"]}));
        assert_eq!(addresses(&m), entrypoint_addresses());
    }

    #[test]
    fn registry_cas_under_certs_d_do_not_stop_the_rewrite() {
        for path in [
            "/etc/docker/certs.d",
            "/etc/docker/certs.d/registry.example:5000/",
        ] {
            let m = moved(json!({"env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}],
                "volumeMounts": [{"name": "registry-ca", "mountPath": path}]}));
            assert_eq!(m.args, strings(&["dockerd", PRIVATE]), "{path}");
        }
        let error =
            refused(json!({"volumeMounts": [{"name": "c", "mountPath": "/etc/docker/certs.dx"}]}));
        assert!(error.contains("daemon.json"), "{error}");
    }

    #[test]
    fn a_unix_only_daemon_keeps_its_tls_flags() {
        let m = moved(
            json!({"args": ["dockerd", "--tlsverify", "--tlscert=/c.pem", "-H", "unix:///var/run/docker.sock"]}),
        );
        assert_eq!(
            m.args,
            strings(&["dockerd", PRIVATE, "--tlsverify", "--tlscert=/c.pem"])
        );
    }
}
