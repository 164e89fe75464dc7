//! The guard standing where the daemon stood: it listens on every `--listen` address, serves
//! TLS on TCP ones with a certificate tree laid out as docker:dind's (clients without a
//! certificate from `client/` refused, as `dockerd --tlsverify` refuses them), and it waits
//! instead of exiting or failing: for upstream TLS files written after it started, and for
//! a daemon that starts after it. `/healthz` and `/readyz` say where it is. The real docker
//! CLI (28.x and Debian's 20.10) and a real dockerd throughout.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dockerd::{self, Dockerd, docker_cli, text, wait_with_timeout};
use common::guard::{
    DEBIAN_CLI, Guard, Pki, RUN, TIMEOUT, free_port, http_get, ok, output, uid, wait_until,
};
use x509_parser::extensions::GeneralName;

fn address(port: u16) -> SocketAddr {
    format!("127.0.0.1:{port}").parse().expect("address")
}

/// The docker CLI (28.x) speaking TLS to `tcp://localhost:<port>` with `cert_path`, as
/// GitLab's and docker:dind's clients are set up.
fn tls_docker(port: u16, cert_path: &Path, config: &Path) -> Command {
    let mut command = docker_cli(&format!("tcp://localhost:{port}"), config);
    command
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", cert_path);
    command
}

/// A guard with `listen` flags and `extra` in `dir`, not waited for.
fn spawn_guard(upstream: &str, uid: &str, listen: &[&str], extra: &[&str]) -> Guard {
    let dir = tempfile::Builder::new()
        .prefix("podmend-guard-")
        .tempdir()
        .expect("tempdir");
    let socket = dir.path().join("guard.sock");
    Guard::spawn(dir, socket, listen, upstream, uid, extra)
}

/// The names and addresses of a PEM certificate's subjectAltName.
fn subject_alt_names(pem: &[u8]) -> Vec<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).expect("PEM");
    let cert = pem.parse_x509().expect("certificate");
    let san = cert
        .subject_alternative_name()
        .expect("extensions")
        .expect("a subjectAltName");
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => Some(IpAddr::from(<[u8; 4]>::try_from(*bytes).ok()?).to_string()),
                16 => Some(IpAddr::from(<[u8; 16]>::try_from(*bytes).ok()?).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn every_listen_address_serves_and_tcp_ones_speak_mutual_tls_with_a_docker_dind_tree() {
    let daemon = dockerd::shared();
    let uid = uid("tls-listen");
    let certs = tempfile::tempdir().expect("tempdir");
    let certdir = certs.path().join("certs");
    let (tls_port, metrics_port) = (free_port(), free_port());
    let sockets = tempfile::tempdir().expect("tempdir");
    let second_socket = sockets.path().join("var-run/docker.sock");
    let listen = [
        format!(
            "--listen=unix://{}",
            sockets.path().join("guard.sock").display()
        ),
        format!("--listen=unix://{}", second_socket.display()),
        format!("--listen=tcp://127.0.0.1:{tls_port}"),
    ];
    let listen: Vec<&str> = listen.iter().map(String::as_str).collect();
    let mut guard = spawn_guard(
        &daemon.host(),
        &uid,
        &listen,
        &[
            "--tls-certdir",
            &certdir.display().to_string(),
            "--tls-san",
            "ci.example",
            "--tls-san",
            "10.9.8.7",
            "--metrics-listen",
            &address(metrics_port).to_string(),
        ],
    );
    guard.socket = sockets.path().join("guard.sock");
    guard.wait_for_socket();
    guard.wait_until_listening(|| TcpStream::connect(address(tls_port)).is_ok());
    guard.wait_until_started(address(metrics_port));
    assert_eq!(
        http_get(address(metrics_port), "/readyz").map(|r| r.0),
        Some(200)
    );

    // The tree, file for file, as dockerd-entrypoint.sh writes DOCKER_TLS_CERTDIR.
    let mode = |file: &str| {
        std::fs::metadata(certdir.join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    for (file, expected) in [
        ("ca/cert.pem", 0o644),
        ("ca/key.pem", 0o600),
        ("server/ca.pem", 0o644),
        ("server/cert.pem", 0o644),
        ("server/key.pem", 0o600),
        ("client/ca.pem", 0o644),
        ("client/cert.pem", 0o644),
        ("client/key.pem", 0o644),
    ] {
        assert_eq!(mode(file), expected, "{file}");
    }
    let names = subject_alt_names(&std::fs::read(certdir.join("server/cert.pem")).unwrap());
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    for name in [
        "docker",
        "localhost",
        "127.0.0.1",
        "::1",
        hostname.trim(),
        "ci.example",
        "10.9.8.7",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }

    // The docker CLI with the client directory, as GitLab's documented TLS setup.
    let config = certs.path().join("cli");
    let out = ok(tls_docker(tls_port, &certdir.join("client"), &config)
        .args(RUN)
        .args(["--rm", "busybox", "echo", "over mutual tls"]));
    assert_eq!(out, "over mutual tls\n");
    let debian = ok(Command::new(DEBIAN_CLI)
        .env("DOCKER_HOST", format!("tcp://localhost:{tls_port}"))
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", certdir.join("client"))
        .env("DOCKER_CONFIG", certs.path().join("cli-2010"))
        .args(["version", "--format", "{{.Server.APIVersion}}"]));
    assert_eq!(debian.trim(), "1.41");

    // Without a client certificate: refused, as by dockerd --tlsverify.
    let anonymous = certs.path().join("anonymous");
    std::fs::create_dir(&anonymous).unwrap();
    std::fs::copy(certdir.join("client/ca.pem"), anonymous.join("ca.pem")).unwrap();
    let out = output(tls_docker(tls_port, &anonymous, &config).args(["ps"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("certificate"),
        "{}",
        text(&out.stderr)
    );
    // Plain HTTP on the TLS port gets no Docker answer.
    let out = output(docker_cli(&format!("tcp://127.0.0.1:{tls_port}"), &config).args(["ps"]));
    assert!(!out.status.success(), "{}", text(&out.stdout));

    // The Unix sockets stay plain, as dockerd's do; every one of them serves.
    for socket in [sockets.path().join("guard.sock"), second_socket.clone()] {
        let host = format!("unix://{}", socket.display());
        assert_eq!(
            ok(docker_cli(&host, &config)
                .args(RUN)
                .args(["--rm", "busybox", "echo", "plain"])),
            "plain\n"
        );
    }
    assert!(guard.signal("-TERM").success(), "{}", guard.log());
    assert!(!second_socket.exists(), "sockets are removed at exit");
}

#[test]
fn a_restarted_guard_keeps_the_keys_so_clients_holding_the_old_client_files_still_work() {
    let daemon = dockerd::shared();
    let uid = uid("tls-restart");
    let certs = tempfile::tempdir().expect("tempdir");
    let certdir = certs.path().join("certs");
    let port = free_port();
    let listen = format!("--listen=tcp://127.0.0.1:{port}");
    let certdir_flag = format!("--tls-certdir={}", certdir.display());
    let start = || {
        let guard = spawn_guard(&daemon.host(), &uid, &[&listen], &[&certdir_flag]);
        guard.wait_until_listening(|| TcpStream::connect(address(port)).is_ok());
        guard
    };
    let mut first = start();
    let old_client = certs.path().join("old-client");
    std::fs::create_dir(&old_client).unwrap();
    for file in ["ca.pem", "cert.pem", "key.pem"] {
        std::fs::copy(certdir.join("client").join(file), old_client.join(file)).unwrap();
    }
    let keys = |dir: &Path| {
        ["ca/key.pem", "server/key.pem", "client/key.pem"]
            .map(|f| std::fs::read_to_string(dir.join(f)).expect("key"))
    };
    let before = keys(&certdir);
    assert!(first.signal("-TERM").success(), "{}", first.log());

    let second = start();
    assert_eq!(keys(&certdir), before, "every key is kept");
    let config = certs.path().join("cli");
    assert_eq!(
        ok(tls_docker(port, &old_client, &config).args(RUN).args([
            "--rm",
            "busybox",
            "echo",
            "still trusted"
        ])),
        "still trusted\n"
    );
    assert_eq!(
        ok(tls_docker(port, &certdir.join("client"), &config).args([
            "version",
            "--format",
            "{{.Server.APIVersion}}"
        ]))
        .trim(),
        "1.41"
    );
    drop(second);
}

#[test]
fn a_guard_started_before_the_upstream_certificates_exist_waits_for_them_and_docker_then_works() {
    let pki = Pki::new();
    let work = tempfile::tempdir().expect("tempdir");
    let daemon_port = free_port();
    let daemon = pki.dockerd(work.path(), daemon_port);
    let uid = uid("tls-later");
    let client_dir = work.path().join("certs/client");
    let metrics = address(free_port());
    let upstream = format!("tcp://127.0.0.1:{daemon_port}");
    let guard = Guard::start(
        &upstream,
        &uid,
        &[
            "--tls-verify",
            "--cert-path",
            &client_dir.display().to_string(),
            "--metrics-listen",
            &metrics.to_string(),
        ],
    );
    // Started and serving, but not ready: the daemon cannot be spoken to yet.
    guard.wait_until_started(metrics);
    let (status, body) = http_get(metrics, "/readyz").expect("readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("ca.pem"), "{body}");

    // A client call made now waits, then succeeds once the files appear.
    let waiting = guard
        .docker()
        .args(RUN)
        .args(["--rm", "busybox", "echo", "waited for the certificates"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker run");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(http_get(metrics, "/readyz").map(|r| r.0), Some(503));
    pki.write_client(&client_dir);
    let done = waiting
        .wait_with_output()
        .expect("docker run ends once the certificates are there");
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert_eq!(text(&done.stdout), "waited for the certificates\n");
    wait_until("the guard is ready", Duration::from_secs(10), || {
        http_get(metrics, "/readyz").map(|r| r.0) == Some(200)
    });
    assert_eq!(
        ok(guard
            .docker()
            .args(RUN)
            .args(["--rm", "busybox", "echo", "ok"])),
        "ok\n"
    );
    let log = guard.log();
    assert_eq!(
        log.matches("not readable yet").count(),
        1,
        "logged once: {log}"
    );
    drop(guard);
    drop(daemon);
}

#[test]
fn a_client_call_made_before_the_daemon_starts_succeeds_once_it_does() {
    let work = tempfile::tempdir().expect("tempdir");
    let later = work.path().join("later.sock");
    let uid = uid("daemon-later");
    let metrics = address(free_port());
    let guard = Guard::start(
        &format!("unix://{}", later.display()),
        &uid,
        &["--metrics-listen", &metrics.to_string()],
    );
    guard.wait_until_started(metrics);
    assert_eq!(http_get(metrics, "/readyz").map(|r| r.0), Some(503));

    // A raw request, the docker CLI 28.x and Debian's 20.10, all before the daemon exists.
    let socket = guard.socket.clone();
    let raw = std::thread::spawn(move || {
        let mut stream = UnixStream::connect(&socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
            .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    });
    let modern = guard
        .docker()
        .args(RUN)
        .args(["--rm", "busybox", "echo", "late daemon"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker run");
    let mut debian = guard
        .docker_2010()
        .args(["version", "--format", "{{.Server.APIVersion}}"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker version");
    std::thread::sleep(Duration::from_secs(3));

    // The daemon comes up, at the address the guard was given.
    let started = Instant::now();
    let daemon = Dockerd::start_with(&[]);
    std::os::unix::fs::symlink(daemon.socket(), &later).expect("link the daemon's socket");
    eprintln!("the daemon came up after {:?}", started.elapsed());

    let answer = raw.join().expect("raw client");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let done = modern.wait_with_output().expect("docker run");
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert_eq!(text(&done.stdout), "late daemon\n");
    let status = wait_with_timeout(&mut debian, TIMEOUT).expect("docker version ends");
    let mut version = String::new();
    debian
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut version)
        .unwrap();
    assert!(status.success(), "docker 20.10 version: {status}");
    assert_eq!(version.trim(), "1.41");
    assert_eq!(http_get(metrics, "/readyz").map(|r| r.0), Some(200));
    assert!(
        guard.log().contains("the Docker daemon answers now"),
        "{}",
        guard.log()
    );
    drop(guard);
    drop(daemon);
}

#[test]
fn a_daemon_that_never_comes_fails_every_cli_once_the_upstream_wait_is_over() {
    let work = tempfile::tempdir().expect("tempdir");
    let missing = format!("unix://{}/never.sock", work.path().display());
    let guard = Guard::start(&missing, &uid("never"), &["--upstream-wait", "2s"]);
    let started = Instant::now();
    let out = output(guard.docker().args(["ps"]));
    let waited = started.elapsed();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(30),
        "waited {waited:?}"
    );
    // From then on the guard refuses connections, as a daemon that is not running does.
    let out = output(
        guard
            .docker()
            .args(["info", "--format", "{{.ServerVersion}}"]),
    );
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("Cannot connect to the Docker daemon"),
        "{}",
        text(&out.stderr)
    );
}

/// The docker CLI (28.x) aimed at `host`, run as the user `nobody` with `groups` as its only
/// supplementary groups (none when empty), and a config directory that user can write.
fn docker_as_nobody(host: &str, config: &Path, groups: &[u32]) -> Command {
    let setpriv = dockerd::find_program("setpriv")
        .expect("`setpriv` is missing: install util-linux (scripts/setup does)");
    let mut command = Command::new(setpriv);
    command.args(["--reuid=65534", "--regid=65534"]);
    if groups.is_empty() {
        command.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        command.arg(format!("--groups={}", list.join(",")));
    }
    command
        .arg("docker")
        .env("DOCKER_HOST", host)
        .env("DOCKER_CONFIG", config)
        .env("HOME", config)
        .env("DOCKER_CLI_HINTS", "false")
        .env_remove("DOCKER_CONTEXT")
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("DOCKER_CERT_PATH");
    command
}

#[test]
fn a_user_who_cannot_reach_the_daemons_socket_cannot_reach_it_through_the_guard_either() {
    use std::os::unix::fs::MetadataExt as _;
    let daemon = dockerd::shared();
    let guard = Guard::start(&daemon.host(), &uid("socket-access"), &[]);
    let of = |path: &Path| {
        let meta = std::fs::metadata(path).expect("stat the socket");
        (meta.uid(), meta.gid(), meta.mode() & 0o777)
    };
    let (_, daemon_group, daemon_mode) = of(daemon.socket());
    assert_eq!(
        daemon_mode, 0o660,
        "dockerd makes its socket root:docker 0660"
    );
    assert_eq!(of(&guard.socket), of(daemon.socket()), "owner, group, mode");

    // Only the sockets' own access stands in the way: their directories can be traversed.
    let traversable = |dir: &Path| {
        let mode = std::fs::metadata(dir).expect("stat").permissions().mode();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o711))
            .expect("chmod");
        mode
    };
    let daemon_dir = daemon.socket().parent().expect("a directory").to_path_buf();
    let daemon_dir_mode = traversable(&daemon_dir);
    traversable(guard.dir.path());
    let config = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(config.path(), std::fs::Permissions::from_mode(0o777)).unwrap();

    let outside: Vec<_> = [daemon.host(), guard.host()]
        .iter()
        .map(|host| output(docker_as_nobody(host, config.path(), &[]).args(["ps", "-q"])))
        .collect();
    let inside =
        output(docker_as_nobody(&guard.host(), config.path(), &[daemon_group]).args(["ps", "-q"]));
    std::fs::set_permissions(
        &daemon_dir,
        std::fs::Permissions::from_mode(daemon_dir_mode),
    )
    .expect("chmod back");
    for (who, out) in ["dockerd", "guard"].iter().zip(&outside) {
        assert!(!out.status.success(), "{who}: {}", text(&out.stdout));
        assert!(
            text(&out.stderr).contains("permission denied"),
            "{who}: {}",
            text(&out.stderr)
        );
    }
    // A member of the socket's group reaches the daemon through the guard.
    assert!(inside.status.success(), "{}", text(&inside.stderr));
}
