//! A running `podmend guard` for the guard's test files (collect, listeners, reap), and the
//! docker CLI calls they share. The guard's own socket lives in its own directory; its log
//! is printed when a test fails.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::dockerd::{Dockerd, docker_cli, run, text, wait_with_timeout};
use serde_json::{Value, json};

pub const PODMEND: &str = env!("CARGO_BIN_EXE_podmend");
pub const TIMEOUT: Duration = Duration::from_secs(90);
pub const OWNER: &str = "podmend.io/owner-pod";
pub const BUILT_BY: &str = "podmend.io/built-by-pod";
/// Every `docker run` of these tests: never a registry, never a network.
pub const RUN: [&str; 3] = ["run", "--pull=never", "--network=none"];
/// Debian's docker CLI 20.10: its `docker build` is the classic builder (`POST /build`).
pub const DEBIAN_CLI: &str = "/usr/bin/docker";

/// A pod UID unique to this test and run.
pub fn uid(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// A running `podmend guard`.
pub struct Guard {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub uid: String,
    /// Where leftovers of this guard's pod are removed from when the test ends.
    cleanup_host: Option<String>,
}

impl Guard {
    /// A guard on a Unix socket in its own directory in front of `upstream`, with `extra`
    /// flags (`--policy` is left to them: the default policy is what most tests check).
    pub fn start(upstream: &str, uid: &str, extra: &[&str]) -> Guard {
        let dir = tempfile::Builder::new()
            .prefix("podmend-guard-")
            .tempdir()
            .expect("tempdir");
        let socket = dir.path().join("guard.sock");
        let listen = format!("unix://{}", socket.display());
        let guard = Guard::spawn(dir, socket, &["--listen", &listen], upstream, uid, extra);
        guard.wait_for_socket();
        guard
    }

    /// A guard with its own `--listen` flags in `listen`; waits for nothing.
    pub fn spawn(
        dir: tempfile::TempDir,
        socket: PathBuf,
        listen: &[&str],
        upstream: &str,
        uid: &str,
        extra: &[&str],
    ) -> Guard {
        let log = std::fs::File::create(dir.path().join("guard.log")).expect("log file");
        let child = Command::new(PODMEND)
            .arg("guard")
            .args(listen)
            .args(["--upstream", upstream, "--owner-pod-uid", uid])
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("DOCKER_CERT_PATH")
            .env_remove("PODMEND_OWNER_POD_UID")
            .env_remove("PODMEND_GUARD_POLICY")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start podmend guard");
        Guard {
            child: Some(child),
            dir,
            socket,
            uid: uid.to_string(),
            cleanup_host: upstream
                .starts_with("unix://")
                .then(|| upstream.to_string()),
        }
    }

    /// Waits until the guard's Unix socket accepts connections.
    pub fn wait_for_socket(&self) {
        self.wait_until_listening(|| UnixStream::connect(&self.socket).is_ok());
    }

    /// Waits until the metrics port at `metrics` answers `/healthz` with 200. The guard binds
    /// its sockets before its metrics port, so a socket that accepts says nothing of the port.
    pub fn wait_until_started(&self, metrics: SocketAddr) {
        self.wait_until_listening(|| http_get(metrics, "/healthz").map(|r| r.0) == Some(200));
    }

    /// Waits until `listening` says so, failing if the guard exits first.
    pub fn wait_until_listening(&self, mut listening: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !listening() {
            assert!(
                self.child
                    .as_ref()
                    .is_some_and(|c| { std::fs::metadata(format!("/proc/{}", c.id())).is_ok() }),
                "podmend guard exited: {}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "guard did not listen: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The docker CLI first on PATH (28.x), aimed at this guard.
    pub fn docker(&self) -> Command {
        docker_cli(&self.host(), &self.dir.path().join("cli-config"))
    }

    /// Debian's docker CLI 20.10 (the classic builder), aimed at this guard.
    pub fn docker_2010(&self) -> Command {
        debian_cli(&self.host(), &self.dir.path().join("cli-2010"))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("guard.log")).unwrap_or_default()
    }

    /// Whether the guard still runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` (`-TERM` as the kubelet does when the pod ends, `-KILL`) and waits for
    /// the exit.
    pub fn signal(&mut self, signal: &str) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let sent = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("kill");
        assert!(sent.success());
        wait_with_timeout(&mut child, Duration::from_secs(40)).expect("the guard exits")
    }

    /// Leave whatever the pod left on the daemon (the test checks it).
    pub fn keep_leftovers(&mut self) {
        self.cleanup_host = None;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- podmend guard log ---\n{}", self.log());
        }
        if let Some(host) = &self.cleanup_host {
            // Best effort: the daemon may be unreachable (that may be the test).
            let config = self.dir.path().join("cleanup-cli");
            let listed = list_labelled(host, &config, &format!("{OWNER}={}", self.uid));
            let ids: Vec<String> = text(&listed.stdout).lines().map(str::to_string).collect();
            if listed.status.success() && !ids.is_empty() {
                let _ = run(
                    docker_cli(host, &config)
                        .args(["rm", "-f", "-v"])
                        .args(&ids),
                    None,
                    TIMEOUT,
                );
            }
        }
    }
}

/// A CI runner pod as the API server lists it to `guard reap`: `name` in namespace `ci`, with
/// `uid`, on `node`, in `phase` (none: no status yet).
pub fn runner_pod(name: &str, uid: &str, node: &str, phase: Option<&str>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ci", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "job", "image": "docker:27-dind"}]},
    });
    if let Some(phase) = phase {
        pod["status"] = json!({"phase": phase});
    }
    pod
}

/// `podmend guard reap --upstream host`, without the caller's kubeconfig or Docker
/// certificates: the arguments of the mode under test are the caller's to add.
pub fn reap_command(host: &str) -> Command {
    let mut command = Command::new(PODMEND);
    command
        .args(["guard", "reap", "--upstream", host])
        .env_remove("KUBECONFIG")
        .env_remove("DOCKER_CERT_PATH");
    command
}

/// Debian's docker CLI 20.10 aimed at `host`, with its own config and none of the caller's
/// Docker environment.
pub fn debian_cli(host: &str, config_dir: &Path) -> Command {
    assert!(
        Path::new(DEBIAN_CLI).is_file(),
        "{DEBIAN_CLI} is missing: {}",
        super::dockerd::INSTALL_HINT
    );
    let mut command = Command::new(DEBIAN_CLI);
    command
        .env("DOCKER_HOST", host)
        .env("DOCKER_CONFIG", config_dir)
        .env("DOCKER_BUILDKIT", "0")
        .env_remove("DOCKER_CONTEXT")
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("DOCKER_CERT_PATH")
        .env_remove("DOCKER_API_VERSION");
    command
}

/// Ids of every container (running or not) carrying `label`, asking `host` directly; a
/// daemon that cannot answer fails the test (an empty list must mean none are left).
pub fn labelled(host: &str, config: &Path, label: &str) -> Vec<String> {
    let out = list_labelled(host, config, label);
    assert!(out.status.success(), "docker ps: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

/// `docker ps -aq` for `label`, whatever its outcome.
fn list_labelled(host: &str, config: &Path, label: &str) -> Output {
    run(
        docker_cli(host, config)
            .args(["ps", "-aq", "--no-trunc", "--filter"])
            .arg(format!("label={label}")),
        None,
        TIMEOUT,
    )
}

pub fn daemon_labelled(daemon: &Dockerd, label: &str) -> Vec<String> {
    labelled(&daemon.host(), &daemon.dir().join("cli-config"), label)
}

/// Runs a command, asserting success; returns its stdout.
pub fn ok(command: &mut Command) -> String {
    let out = run(command, None, TIMEOUT);
    assert!(
        out.status.success(),
        "{command:?} failed ({}): {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a command; its output whatever the outcome.
pub fn output(command: &mut Command) -> Output {
    run(command, None, TIMEOUT)
}

pub fn inspect(daemon: &Dockerd, id: &str, format: &str) -> String {
    ok(daemon.docker().args(["inspect", "-f", format, id]))
        .trim()
        .to_string()
}

pub fn exists(daemon: &Dockerd, id: &str) -> bool {
    run(
        daemon.docker().args(["inspect", "--type", "container", id]),
        None,
        TIMEOUT,
    )
    .status
    .success()
}

pub fn image_exists(daemon: &Dockerd, name: &str) -> bool {
    run(
        daemon.docker().args(["image", "inspect", name]),
        None,
        TIMEOUT,
    )
    .status
    .success()
}

pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A free loopback port (see `net::free_port`).
pub fn free_port() -> u16 {
    super::net::free_port().port()
}

/// `GET path` over plain HTTP: (status, body), or `None` when nothing answers.
pub fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let timeout = Duration::from_secs(10);
    super::net::http_get(address, path, timeout, timeout).ok()
}

/// The value of the metric line starting with `name` (with its labels), from `/metrics`.
pub fn metric(address: SocketAddr, name: &str) -> Option<u64> {
    let (_, body) = http_get(address, "/metrics")?;
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A CA with a server certificate (127.0.0.1, localhost) and a client certificate, PEM: what
/// a TLS dockerd and its clients use.
pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA");
        let ca = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(names).expect("params");
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca).expect("leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".to_string(), "localhost".to_string()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            vec!["client".to_string()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Pki {
            ca: ca_cert.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }

    /// Writes `ca.pem`, `cert.pem` and `key.pem` of the client into `dir` (a
    /// `DOCKER_CERT_PATH`), creating it.
    pub fn write_client(&self, dir: &Path) {
        std::fs::create_dir_all(dir).expect("client dir");
        std::fs::write(dir.join("ca.pem"), &self.ca).expect("ca.pem");
        std::fs::write(dir.join("cert.pem"), &self.client_cert).expect("cert.pem");
        std::fs::write(dir.join("key.pem"), &self.client_key).expect("key.pem");
    }

    /// A private dockerd that also listens on `tcp://127.0.0.1:<port>` with `--tlsverify`
    /// and this PKI's server files (written into `dir`).
    pub fn dockerd(&self, dir: &Path, port: u16) -> Dockerd {
        let write = |name: &str, content: &str| {
            let path = dir.join(name);
            std::fs::write(&path, content).expect("write pem");
            path.display().to_string()
        };
        let ca = write("daemon-ca.pem", &self.ca);
        let cert = write("daemon-cert.pem", &self.server_cert);
        let key = write("daemon-key.pem", &self.server_key);
        let tcp = format!("tcp://127.0.0.1:{port}");
        Dockerd::start_with(&[
            "-H",
            &tcp,
            "--tlsverify",
            "--tlscacert",
            &ca,
            "--tlscert",
            &cert,
            "--tlskey",
            &key,
        ])
    }
}

/// The docker CLI plugin `docker-buildx` that scripts/setup builds from its Go module into the
/// cache (since docker CLI 23 it is what `docker build` runs), made a plugin of the docker CLI
/// whose config directory is `config_dir`.
pub fn install_buildx(config_dir: &Path) {
    use super::control_plane::binaries::{cache_dir, pinned_version};
    let version = pinned_version("buildx").unwrap_or_else(|e| panic!("{e}"));
    let plugin = cache_dir()
        .join("bin")
        .join(format!("buildx-{version}"))
        .join("docker-buildx");
    assert!(
        plugin.is_file(),
        "{} is missing: run scripts/setup (scripts/test does; scripts/build-control-plane builds it from the Go module proxy)",
        plugin.display()
    );
    let plugins = config_dir.join("cli-plugins");
    std::fs::create_dir_all(&plugins).expect("cli-plugins directory");
    let link = plugins.join("docker-buildx");
    if !link.exists() {
        std::os::unix::fs::symlink(&plugin, &link).expect("link docker-buildx");
    }
}

/// Each of `commands`, run with both CLIs through `guard` and straight to `direct_host` (where
/// no daemon answers), fails, and fails alike (the message naming each its own address); then
/// `docker ps` through the guard says it cannot connect to the guard's address.
pub fn assert_every_cli_fails_as_straight(
    guard: &Guard,
    direct_host: &str,
    commands: &[&[&str]],
    configs: &Path,
) {
    for args in commands {
        for which in ["28.x", "20.10"] {
            let direct = run(cli(which, direct_host, configs).args(*args), None, TIMEOUT);
            let through = run(
                cli(which, &guard.host(), configs).args(*args),
                None,
                TIMEOUT,
            );
            assert_ne!(direct.status.code(), Some(0), "{which} {args:?}");
            assert_eq!(
                outcome(&through, &guard.host()),
                outcome(&direct, direct_host),
                "{which} {args:?}: through the guard, then straight"
            );
        }
    }
    let ps = run(guard.docker().arg("ps"), None, TIMEOUT);
    assert!(
        text(&ps.stderr).contains(&format!(
            "Cannot connect to the Docker daemon at {}",
            guard.host()
        )),
        "{}",
        text(&ps.stderr)
    );
}

/// What a docker CLI run says, comparable across daemons: its exit code and its stderr with
/// `host` (the address it was aimed at) written as `HOST`.
pub fn outcome(out: &Output, host: &str) -> (Option<i32>, String) {
    (out.status.code(), text(&out.stderr).replace(host, "HOST"))
}

/// The docker CLI `which` ("28.x", first on PATH, or "20.10", Debian's) aimed at `host`, with
/// a config directory under `configs`.
pub fn cli(which: &str, host: &str, configs: &Path) -> Command {
    match which {
        "20.10" => debian_cli(host, &configs.join("cli-2010")),
        _ => docker_cli(host, &configs.join("cli-28")),
    }
}
