//! The Docker-in-Docker contract, defined once: what the `dind-rm` rule injects into a pod and
//! what `podmend guard` runs with. The policy names, the paths and volumes the two share, how
//! a Docker address is read (as the docker CLI reads `DOCKER_HOST`), which images are Docker's,
//! and the guard's command line: the rule builds a [`GuardCommand`] and writes it with
//! [`GuardCommand::to_args`]; the CLI parses those arguments back into the same value
//! (`tests/dind_contract.rs` runs every command line the rule can write through the real
//! parser).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The injected guard container.
pub const GUARD_CONTAINER: &str = "podmend-guard";
/// The first words of a finding whose guard clients can go around: the pod is changed but
/// not repaired, and the audit counts it so.
pub const BYPASSABLE: &str = "podmend-guard can be bypassed";
/// Per pod: `off`, or a policy name that replaces the configured one.
pub const POLICY_ANNOTATION: &str = "podmend.io/dind-policy";
/// Every container, network and image the guard creates for a pod carries
/// `podmend.io/owner-pod=<pod uid>`.
pub const OWNER_LABEL: &str = "podmend.io/owner-pod";
/// Images a pod builds or commits through the guard (policy `collect`) carry
/// `podmend.io/built-by-pod=<pod uid>`: not [`OWNER_LABEL`], because a container created
/// from an image inherits the image's labels, and one created outside any guard must never
/// look like a container of the pod.
pub const IMAGE_OWNER_LABEL: &str = "podmend.io/built-by-pod";
/// The environment variable the guard reads its pod's UID from (downward API `metadata.uid`).
pub const OWNER_UID_ENV: &str = "PODMEND_OWNER_POD_UID";

/// Where podmend mounts what it adds to a pod: outside `/run` and `/var/run`, which pods
/// mount emptyDirs over (ARC, Jenkins) and which is a symlink to `/run` in most images, so no
/// mount of the pod's can hide these.
pub const MOUNT_ROOT: &str = "/podmend";
/// The volume holding the daemon's private socket, mounted by the daemon and the guard only.
pub const DAEMON_SOCKET_VOLUME: &str = "podmend-daemon";
/// Where [`DAEMON_SOCKET_VOLUME`] is mounted.
pub const DAEMON_SOCKET_DIR: &str = "/podmend/daemon";
/// The only address a rewritten daemon listens on.
pub const DAEMON_SOCKET: &str = "/podmend/daemon/docker.sock";
/// The volume holding the guard's own socket, for clients whose daemon could not be moved;
/// and, one subdirectory per socket directory, the sockets that stand where clients mounted
/// the node's Docker socket (each client mounts its subdirectory there).
pub const GUARD_SOCKET_VOLUME: &str = "podmend-docker";
/// Where [`GUARD_SOCKET_VOLUME`] is mounted.
pub const GUARD_SOCKET_DIR: &str = "/podmend/guard";
/// The guard's own socket.
pub const GUARD_SOCKET: &str = "/podmend/guard/docker.sock";
/// Where the guard mounts the node's Docker socket.
pub const HOST_SOCKET_DIR: &str = "/podmend/host";

/// The node's Docker socket, as pods mount it from the host.
pub const HOST_DOCKER_SOCKETS: &[&str] = &["/var/run/docker.sock", "/run/docker.sock"];
/// The docker CLI's and dockerd's default socket.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// dockerd's plain TCP port.
pub const DOCKER_PORT: u16 = 2375;
/// dockerd's TLS port.
pub const DOCKER_TLS_PORT: u16 = 2376;

/// What the guard does about the containers, networks and images a pod leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Label what the pod creates (containers, networks, volumes; committed and classically
    /// built images, so a classic build has one more step, a LABEL, and another image ID;
    /// classic builds also get rm=1&forcerm=1); remove exited containers the client did not
    /// remove once exited longer than --min-age or beyond --max-exited per pod (docker logs
    /// or docker cp of one then fails, with a message naming this policy), and everything
    /// the pod created when it ends, as the kubelet collects dead containers.
    #[default]
    Collect,
    /// Set HostConfig.AutoRemove, as docker run --rm does; containers with a restart policy
    /// or from docker compose are labelled and removed when the pod ends instead.
    Rm,
    /// Refuse a create without --rm with 403 and a message the docker CLI prints.
    Deny,
    /// Label what the pod creates (classic builds also get rm=1&forcerm=1); remove it only
    /// when the pod ends.
    Reap,
    /// Label the containers, networks and volumes the pod creates, change nothing else and
    /// remove nothing; count what would have been removed.
    Audit,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::Collect,
        Policy::Rm,
        Policy::Deny,
        Policy::Reap,
        Policy::Audit,
    ];

    /// The name in config, the annotation, the guard's `--policy` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Collect => "collect",
            Policy::Rm => "rm",
            Policy::Deny => "deny",
            Policy::Reap => "reap",
            Policy::Audit => "audit",
        }
    }

    /// The policy named `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|policy| policy.as_str() == text)
    }

    /// Every policy name, for messages: `collect, rm, deny, reap, audit`.
    pub fn names() -> String {
        Self::ALL.map(Policy::as_str).join(", ")
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Docker Engine API address: a unix socket or a TCP host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

/// Why a Docker address cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error(
        "invalid Docker address {0:?}: expected unix:///path/to/docker.sock, tcp://HOST:PORT or HOST[:PORT]"
    )]
    Invalid(String),
    #[error("Docker address {0:?}: a socket path must be absolute")]
    RelativeSocket(String),
    #[error("Docker address {0:?}: a path after the port is not supported")]
    TcpPath(String),
    #[error(
        "Docker address {address:?}: {scheme}:// is not supported (only unix:// and tcp://); podmend cannot stand between the client and this daemon"
    )]
    Unsupported { address: String, scheme: String },
}

impl Address {
    /// Reads a `DOCKER_HOST` value as the docker CLI does (docker/cli `opts/hosts.go`,
    /// `ParseHost`): empty is the default socket, or `tcp://localhost:2376` when the client
    /// speaks TLS; without a scheme, a path is a unix socket and anything else a TCP host; a
    /// TCP address without a port gets 2375 (even with TLS: only an empty `DOCKER_HOST` gets
    /// 2376) and without a host `localhost`. `ssh://`, `fd://` and `npipe://` are refused: the
    /// guard can stand in for neither.
    pub fn parse_docker_host(value: &str, tls: bool) -> Result<Self, AddressError> {
        let text = value.trim();
        if text.is_empty() {
            return Ok(if tls {
                Address::Tcp {
                    host: "localhost".to_string(),
                    port: DOCKER_TLS_PORT,
                }
            } else {
                Address::Unix(PathBuf::from(DEFAULT_SOCKET))
            });
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None if text.starts_with('/') || text.starts_with("./") => ("unix".to_string(), text),
            None => ("tcp".to_string(), text),
        };
        match scheme.as_str() {
            "unix" => {
                if rest.is_empty() {
                    Ok(Address::Unix(PathBuf::from(DEFAULT_SOCKET)))
                } else if rest.starts_with('/') {
                    Ok(Address::Unix(PathBuf::from(rest)))
                } else {
                    Err(AddressError::RelativeSocket(value.to_string()))
                }
            }
            "tcp" => parse_tcp(value, rest),
            "ssh" | "fd" | "npipe" => Err(AddressError::Unsupported {
                address: value.to_string(),
                scheme,
            }),
            _ => Err(AddressError::Invalid(value.to_string())),
        }
    }

    /// The same address as a URL the guard's flags and `DOCKER_HOST` take.
    pub fn url(&self) -> String {
        self.to_string()
    }
}

/// `HOST[:PORT]` after `tcp://` (docker/cli `ParseTCPAddr` with default `tcp://localhost:2375`).
fn parse_tcp(original: &str, rest: &str) -> Result<Address, AddressError> {
    let invalid = || AddressError::Invalid(original.to_string());
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(AddressError::TcpPath(original.to_string()));
    }
    if rest.contains(['@', '?', '#']) {
        return Err(invalid());
    }
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or_else(invalid)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(invalid)?)),
        }
    } else if rest.matches(':').count() > 1 {
        // An IPv6 address must be bracketed to carry a port.
        (rest, None)
    } else {
        match rest.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    let port = match port {
        None | Some("") => DOCKER_PORT,
        Some(port) => port.parse::<u16>().map_err(|_| invalid())?,
    };
    if port == 0 {
        return Err(invalid());
    }
    let host = if host.is_empty() { "localhost" } else { host };
    Ok(Address::Tcp {
        host: host.to_string(),
        port,
    })
}

impl FromStr for Address {
    type Err = AddressError;

    /// An address as flags take it: `DOCKER_HOST` syntax, but never empty.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Err(AddressError::Invalid(text.to_string()));
        }
        Address::parse_docker_host(text, false)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
        }
    }
}

/// Whether `image` is the official `docker` image, whatever its registry, tag or digest
/// (`docker:24-dind`, `docker.io/library/docker@sha256:…`, `mirror.example:5000/docker:cli`):
/// the last component of its repository is `docker`.
/// Read byte by byte: `str`'s searchers cost most of a typical pod's `may_apply`.
pub fn is_docker_image(image: &str) -> bool {
    let without_digest = up_to(image.as_bytes(), b'@');
    // A tag follows the first `:` after the last `/` (a `:` before it is a registry's port).
    let last_component = without_digest
        .rsplit(|&b| b == b'/')
        .next()
        .unwrap_or(without_digest);
    up_to(last_component, b':') == b"docker"
}

/// `bytes` up to the first `byte`, or all of them.
fn up_to(bytes: &[u8], byte: u8) -> &[u8] {
    bytes.split(|&b| b == byte).next().unwrap_or(bytes)
}

/// A duration as flags and config write it: `90s`, `5m`, `2h`, `1h30m`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}: expected e.g. 90s, 5m, 2h, 1h30m, 7d");
    let mut total: u64 = 0;
    let mut number = String::new();
    let mut any = false;
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(invalid()),
        };
        let value: u64 = number.parse().map_err(|_| invalid())?;
        total = value
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
        number.clear();
        any = true;
    }
    if !number.is_empty() || !any {
        return Err(invalid());
    }
    Ok(Duration::from_secs(total))
}

/// A duration written back the way [`parse_duration`] reads it, in its largest whole unit.
pub fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if seconds > 0 && seconds.is_multiple_of(size) {
            return format!("{}{unit}", seconds / size);
        }
    }
    format!("{seconds}s")
}

/// Defaults of the guard's garbage collection, as the rule and the CLI both use them.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(5 * 60);
/// How many exited containers a pod keeps before the oldest are removed.
pub const DEFAULT_MAX_EXITED: u32 = 20;
/// How long a client request waits for a daemon the guard has not reached yet (the DinD
/// sidecar still starting, its TLS material not written yet) before its connection is
/// closed unanswered.
pub const DEFAULT_UPSTREAM_WAIT: Duration = Duration::from_secs(2 * 60);

/// The guard's command line (`podmend guard ...`), as the rule writes it and the CLI reads it.
/// The owner pod's UID comes from [`OWNER_UID_ENV`], not from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardCommand {
    /// Where the guard listens for clients: every address the daemon served them on.
    pub listen: Vec<Address>,
    /// Serve TLS on the TCP listeners, with a certificate tree the guard writes in this
    /// directory the way the docker:dind entrypoint does in `DOCKER_TLS_CERTDIR` (`ca/`,
    /// `server/`, `client/`); clients must present a certificate from `client/`.
    pub tls_certdir: Option<PathBuf>,
    /// More names (or IP addresses) for the generated server certificate.
    pub tls_san: Vec<String>,
    /// The daemon.
    pub upstream: Address,
    /// Speak TLS to the daemon with `ca.pem`, `cert.pem` and `key.pem` from this directory.
    pub upstream_cert_path: Option<PathBuf>,
    pub policy: Policy,
    /// Exited containers older than this are removed (policy collect).
    pub min_age: Duration,
    /// Exited containers beyond this many per pod are removed, oldest first (policy collect).
    pub max_exited: u32,
    /// A plain-HTTP port for `/healthz`, `/readyz` and `/metrics` (the pod's probes).
    pub health_listen: Option<SocketAddr>,
    /// The pod's own word in its probes' paths (`/healthz/<token>`, `/readyz/<token>`), which
    /// only this guard answers: on a network namespace shared by several pods
    /// (`hostNetwork`), a probe that reaches another pod's guard fails.
    pub health_token: Option<String>,
    /// How long a client request waits for a daemon that has not answered yet since the
    /// guard started (socket missing, port closed, TLS files not written yet).
    pub upstream_wait: Duration,
    /// The daemon runs in the guard's own pod, reached by nothing but the guard: what other
    /// owners left on it was left by pods that are gone (its storage outlived them), and the
    /// guard removes it when it starts.
    pub daemon_in_pod: bool,
    /// Paths at which the daemon finds its own socket when it resolves a container's bind:
    /// such binds are rewritten to `guard_socket_for_daemon`, or refused without it.
    pub daemon_socket_paths: Vec<String>,
    /// The path at which the daemon finds this guard's socket.
    pub guard_socket_for_daemon: Option<String>,
}

impl GuardCommand {
    /// A guard on `listen` in front of `upstream` with `policy` and the default collection.
    pub fn new(listen: Vec<Address>, upstream: Address, policy: Policy) -> Self {
        Self {
            listen,
            tls_certdir: None,
            tls_san: Vec::new(),
            upstream,
            upstream_cert_path: None,
            policy,
            min_age: DEFAULT_MIN_AGE,
            max_exited: DEFAULT_MAX_EXITED,
            health_listen: None,
            health_token: None,
            upstream_wait: DEFAULT_UPSTREAM_WAIT,
            daemon_in_pod: false,
            daemon_socket_paths: Vec::new(),
            guard_socket_for_daemon: None,
        }
    }

    /// The container's `args` (the image's entrypoint is `podmend`): `guard`, then one flag
    /// per setting, each `--flag=value` so that no value can be read as a flag.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec!["guard".to_string()];
        for address in &self.listen {
            args.push(format!("--listen={address}"));
        }
        if let Some(dir) = &self.tls_certdir {
            args.push(format!("--tls-certdir={}", dir.display()));
        }
        for name in &self.tls_san {
            args.push(format!("--tls-san={name}"));
        }
        args.push(format!("--upstream={}", self.upstream));
        if let Some(dir) = &self.upstream_cert_path {
            args.push("--tls-verify".to_string());
            args.push(format!("--cert-path={}", dir.display()));
        }
        args.push(format!("--policy={}", self.policy));
        if self.min_age != DEFAULT_MIN_AGE {
            args.push(format!("--min-age={}", format_duration(self.min_age)));
        }
        if self.max_exited != DEFAULT_MAX_EXITED {
            args.push(format!("--max-exited={}", self.max_exited));
        }
        if let Some(address) = self.health_listen {
            args.push(format!("--metrics-listen={address}"));
        }
        if let Some(token) = &self.health_token {
            args.push(format!("--health-token={token}"));
        }
        if self.upstream_wait != DEFAULT_UPSTREAM_WAIT {
            args.push(format!(
                "--upstream-wait={}",
                format_duration(self.upstream_wait)
            ));
        }
        if self.daemon_in_pod {
            args.push("--daemon-in-pod".to_string());
        }
        for path in &self.daemon_socket_paths {
            args.push(format!("--daemon-socket-path={path}"));
        }
        if let Some(path) = &self.guard_socket_for_daemon {
            args.push(format!("--guard-socket-for-daemon={path}"));
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Address {
        Address::Tcp {
            host: host.to_string(),
            port,
        }
    }

    fn unix(path: &str) -> Address {
        Address::Unix(PathBuf::from(path))
    }

    proptest::proptest! {
        #[test]
        fn the_docker_image_is_told_as_its_repositorys_last_component_names_it(
            image in "([a-z0-9.:@]{0,6}/){0,2}(docker|dockerd|dock|docker/x)(:[a-z0-9:/@]{0,5})?(@[a-z0-9:/@]{0,5})?"
        ) {
            // The definition, written with `str`'s own splits.
            let without_digest = image.split('@').next().unwrap_or(&image);
            let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
            let repository = match without_digest[last_slash..].find(':') {
                Some(colon) => &without_digest[..last_slash + colon],
                None => without_digest,
            };
            let expected = repository.rsplit('/').next() == Some("docker");
            proptest::prop_assert_eq!(is_docker_image(&image), expected, "{}", image);
        }
    }

    #[test]
    fn docker_host_values_are_read_as_the_docker_cli_reads_them() {
        let cases = [
            ("", false, Ok(unix("/var/run/docker.sock"))),
            ("  ", true, Ok(tcp("localhost", 2376))),
            ("127.0.0.1", false, Ok(tcp("127.0.0.1", 2375))),
            // A bare host is :2375 even with TLS: only an empty DOCKER_HOST defaults to 2376.
            ("127.0.0.1", true, Ok(tcp("127.0.0.1", 2375))),
            ("docker:2376", true, Ok(tcp("docker", 2376))),
            ("tcp://docker", false, Ok(tcp("docker", 2375))),
            ("tcp://docker:2376/", false, Ok(tcp("docker", 2376))),
            (":2376", false, Ok(tcp("localhost", 2376))),
            ("tcp://", false, Ok(tcp("localhost", 2375))),
            ("tcp://[::1]:2375", false, Ok(tcp("::1", 2375))),
            ("TCP://Docker:2375", false, Ok(tcp("Docker", 2375))),
            (
                "unix:///run/docker.sock",
                false,
                Ok(unix("/run/docker.sock")),
            ),
            ("unix://", false, Ok(unix("/var/run/docker.sock"))),
            (
                "/var/run/docker.sock",
                false,
                Ok(unix("/var/run/docker.sock")),
            ),
        ];
        for (value, tls, expected) in cases {
            assert_eq!(
                Address::parse_docker_host(value, tls),
                expected,
                "{value:?} tls={tls}"
            );
        }
    }

    #[test]
    fn addresses_the_guard_cannot_stand_in_for_are_refused_with_a_reason() {
        for (value, reason) in [
            ("ssh://me@builder", "ssh:// is not supported"),
            ("fd://", "fd:// is not supported"),
            (
                "npipe:////./pipe/docker_engine",
                "npipe:// is not supported",
            ),
            ("unix://run/docker.sock", "must be absolute"),
            ("./docker.sock", "must be absolute"),
            ("tcp://docker:2375/v1.41", "path after the port"),
            ("tcp://docker:port", "invalid Docker address"),
            ("tcp://docker:0", "invalid Docker address"),
            ("http://docker:2375", "invalid Docker address"),
        ] {
            let error = Address::parse_docker_host(value, false)
                .expect_err(value)
                .to_string();
            assert!(error.contains(reason), "{value}: {error}");
        }
    }

    #[test]
    fn flags_never_take_an_empty_address() {
        assert!("".parse::<Address>().is_err());
        assert_eq!("docker".parse::<Address>(), Ok(tcp("docker", 2375)));
    }

    #[test]
    fn addresses_print_as_urls_that_parse_back_to_themselves() {
        for address in [
            tcp("docker", 2375),
            tcp("::1", 2376),
            unix("/podmend/daemon/docker.sock"),
        ] {
            assert_eq!(address.to_string().parse::<Address>(), Ok(address.clone()));
        }
    }

    #[test]
    fn the_docker_image_is_known_by_its_repository_whatever_the_registry_tag_or_digest() {
        for image in [
            "docker",
            "docker:24-dind",
            "docker:dind-rootless",
            "docker.io/library/docker:27.3.1-dind",
            "docker@sha256:18ff92d3d31725b53fa6633d60bed323effb6d5d4588be7b547078d384e0d4bf",
            "docker.io/library/docker:stable@sha256:18ff92d3d31725b53fa6633d60bed323effb6d5d4588be7b547078d384e0d4bf",
            "mirror.example:5000/library/docker:cli",
            "mirror.example:5000/docker",
        ] {
            assert!(is_docker_image(image), "{image}");
        }
        for image in [
            "docker/compose:1.29.2",
            "jenkins/inbound-agent",
            "docker.example:5000/busybox",
            "mydocker:1",
            "docker-x",
            "docker.io/x/dockerd",
            "",
            "gcr.io/kaniko-project/executor",
        ] {
            assert!(!is_docker_image(image), "{image}");
        }
    }

    #[test]
    fn durations_round_trip_through_their_written_form() {
        for (text, seconds) in [
            ("90s", 90),
            ("5m", 300),
            ("2h", 7200),
            ("1h30m", 5400),
            ("7d", 604_800),
        ] {
            assert_eq!(parse_duration(text), Ok(Duration::from_secs(seconds)));
            let written = format_duration(Duration::from_secs(seconds));
            assert_eq!(parse_duration(&written), Ok(Duration::from_secs(seconds)));
        }
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5w").is_err());
    }

    #[test]
    fn policies_have_one_name_each() {
        for policy in Policy::ALL {
            assert_eq!(Policy::parse(policy.as_str()), Some(policy));
        }
        assert_eq!(Policy::names(), "collect, rm, deny, reap, audit");
    }
}
