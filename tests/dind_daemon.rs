//! The daemon rewrite against the real dockerd and the real `podmend guard`. For the ARC,
//! Argo, GitLab and Tekton pods, the daemon argv `dind-rm` wrote is run as the container
//! would run it (the dind entrypoint, given `dockerd ...`, hands the rest to dockerd), with
//! the container's environment after the rewrite and the paths of `/podmend` and the pod's
//! volumes moved into a temporary root; the private-daemon flags of `tests/common/dockerd.rs`
//! keep it off the host's networking. It must answer on the private socket only: no TCP
//! listener, no socket where it used to listen. Then `podmend guard` runs with the rule's
//! own arguments (remapped the same way, TCP ports to free loopback ones), and a docker CLI
//! using the client's old address reaches the daemon through it, and only through it: what
//! it creates carries the owner label, and once the guard stops the old address is dead.
//! GitLab's and Tekton's clients speak TLS to 2376: the guard stands there with the
//! certificate tree it wrote in `/certs`, and lets through only a client with `client/`'s.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::dind::{all_containers, argv, container, fixture_pod, guard, under};
use common::dockerd::{INSTALL_HINT, docker_cli, find_program, run, text};
use common::net::{free_port, http_get};
use common::server::BIN;
use podmend::cluster::StaticCluster;
use podmend::config::Config;
use podmend::dind::{DAEMON_SOCKET, GUARD_CONTAINER};
use podmend::engine::{Engine, Operation, Subject};
use serde_json::Value;

/// The flags of a private test daemon (`tests/common/dockerd.rs`, TEST-ENV.md), minus its
/// `-H`: the rule's host is the only one.
fn private_flags(root: &Path) -> Vec<String> {
    std::fs::write(root.join("daemon.json"), "{}").expect("write daemon.json");
    vec![
        format!("--data-root={}", root.join("data").display()),
        format!("--exec-root={}", root.join("exec").display()),
        format!("--pidfile={}", root.join("dockerd.pid").display()),
        format!("--config-file={}", root.join("daemon.json").display()),
        "--storage-driver=overlay2".to_string(),
        "--iptables=false".to_string(),
        "--ip6tables=false".to_string(),
        "--ip-masq=false".to_string(),
        "--bridge=none".to_string(),
        "--userland-proxy=false".to_string(),
    ]
}

/// A fixture pod after `dind-rm`.
fn repaired(file: &str) -> Value {
    repaired_pod(&fixture_pod(file, "pod"), file)
}

/// A pod (named `what` in failures) after `dind-rm`, which must have injected the guard.
fn repaired_pod(pod: &Value, file: &str) -> Value {
    let pod = pod.clone();
    let engine = Engine::new(&Config::default());
    let subject = Subject {
        operation: Operation::Create,
        group: "",
        kind: "Pod",
        sub_resource: "",
        namespace: "ci",
        object: Some(&pod),
        old_object: None,
    };
    let outcome = engine.review(&subject, &StaticCluster::empty());
    let mut object = pod.clone();
    json_patch::patch(&mut object, &outcome.patch).expect("the patch applies");
    assert!(
        all_containers(&object["spec"])
            .iter()
            .any(|c| c["name"] == GUARD_CONTAINER),
        "{file}: no guard"
    );
    object["spec"].clone()
}

/// The container's env as Kubernetes gives it to the process (plain values only).
fn env_of(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// `$(NAME)` references expanded from `env`, as the kubelet expands command and args.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = arg.to_string();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    out
}

/// A path of the pod's filesystem (`/podmend/...`, a volume's `/var/run`, `/certs`) moved
/// into `root`; a `unix://` address likewise; anything else as it is.
fn remap_value(value: &str, root: &Path) -> String {
    if let Some(path) = value.strip_prefix("unix://") {
        return format!("unix://{}", under(root, path).display());
    }
    if value.starts_with('/') {
        return under(root, value).display().to_string();
    }
    value.to_string()
}

fn remap(arg: &str, root: &Path) -> String {
    match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with('-') => {
            format!("{flag}={}", remap_value(value, root))
        }
        _ => remap_value(arg, root),
    }
}

/// The TCP ports the process `pid` listens on (its socket inodes among /proc/net/tcp{,6}'s
/// LISTEN entries).
fn tcp_listeners(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.display().to_string();
                    Some(
                        link.strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 9
                && fields[3] == "0A"
                && inodes.iter().any(|i| i == fields[9])
                && let Some(port) = fields[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports
}

fn ping_unix(socket: &Path) -> bool {
    let Ok(mut stream) = UnixStream::connect(socket) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// A process of this test, stopped (SIGTERM, then SIGKILL) when dropped.
struct Process {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Process {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until `ready` holds, or fails with the log.
    fn wait_until(&mut self, what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            assert!(
                self.running() && Instant::now() < deadline,
                "{} did not {what}; its log:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.running() {
            self.stop();
        }
    }
}

/// One fixture's daemon, rewritten and running.
struct Moved {
    root: tempfile::TempDir,
    spec: Value,
    daemon: Process,
    private: PathBuf,
}

/// Runs the rewritten daemon of `file` and checks it answers on the private socket only.
fn start_moved_daemon(file: &str, daemon_name: &str) -> Moved {
    start_moved(repaired(file), file, daemon_name)
}

/// [`start_moved_daemon`] for a repaired pod spec (named `file` in failures).
fn start_moved(spec: Value, file: &str, daemon_name: &str) -> Moved {
    let dockerd = find_program("dockerd")
        .unwrap_or_else(|| panic!("dockerd is not installed: {INSTALL_HINT}"));
    let daemon = container(&spec, daemon_name);
    let argv = argv(daemon);
    let env = env_of(daemon);
    // The entrypoint (after any wrapper) hands `dockerd <flags>` to dockerd.
    let at = argv
        .iter()
        .position(|a| a.rsplit('/').next() == Some("dockerd"))
        .unwrap_or_else(|| panic!("{file}: no dockerd in {argv:?}"));
    let root = tempfile::Builder::new()
        .prefix("pm-")
        .tempdir()
        .expect("tempdir");
    // The kubelet and the runtime make each mount's directory (an emptyDir starts empty). A
    // volume the guard mounts at another path is one directory: the daemon's path links to
    // the guard's.
    let guard_mounts = common::dind::mounts(guard(&spec));
    // Parents first, as the runtime mounts them.
    let mut daemon_mounts = common::dind::mounts(daemon);
    daemon_mounts.sort_by_key(|(_, path)| path.matches('/').count());
    for (volume, path) in daemon_mounts {
        let at = under(root.path(), &path);
        match guard_mounts
            .iter()
            .find(|(v, p)| *v == volume && *p != path)
        {
            Some((_, guard_path)) => {
                let target = under(root.path(), guard_path);
                std::fs::create_dir_all(&target).expect("mount directory");
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent).expect("mount's parent directory");
                }
                std::os::unix::fs::symlink(&target, &at).expect("link the shared volume");
            }
            None => std::fs::create_dir_all(&at).expect("mount directory"),
        }
    }
    let mut args = private_flags(root.path());
    args.extend(
        argv[at + 1..]
            .iter()
            .map(|a| remap(&expand(a, &env), root.path())),
    );
    let log = root.path().join("dockerd.log");
    let child = Command::new(&dockerd)
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start dockerd");
    let mut daemon = Process {
        child,
        name: "dockerd",
        log,
    };
    let private = under(root.path(), DAEMON_SOCKET);
    daemon.wait_until("answer on the private socket", || ping_unix(&private));

    // The private socket only: no TCP listener, nothing at its old addresses.
    let pid = daemon.child.id();
    assert_eq!(tcp_listeners(pid), Vec::<u16>::new(), "{file}: {args:?}");
    for old in ["/var/run/docker.sock", "/run/docker.sock"] {
        let path = under(root.path(), old);
        assert!(!path.exists(), "{file}: dockerd made {}", path.display());
    }
    for address in podmend_listen(&spec) {
        if let Some(path) = address.strip_prefix("unix://") {
            assert!(!under(root.path(), path).exists(), "{file}: {address}");
        }
    }
    Moved {
        root,
        spec,
        daemon,
        private,
    }
}

/// The guard's `--listen` values.
fn podmend_listen(spec: &Value) -> Vec<String> {
    common::dind::args(guard(spec))
        .iter()
        .filter_map(|a| a.strip_prefix("--listen=").map(str::to_string))
        .collect()
}

/// Starts the real guard with the rule's arguments: paths moved into the root, TCP listeners
/// and the health port on free loopback ports. Returns it and each TCP port's new number. A
/// port picked free can be taken by another test's process before the guard binds it; the
/// guard then exits saying so, and it is started again on other ports, as the test server is.
fn start_guard(moved: &Moved, owner: &str) -> (Process, Vec<(u16, u16)>) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (mut guard, ports, health) = spawn_guard(moved, owner);
        let Some(health) = health else {
            return (guard, ports);
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while guard.running() && Instant::now() < deadline {
            let answer = http_get(
                health,
                "/healthz",
                Duration::from_secs(1),
                Duration::from_secs(2),
            );
            if answer.is_ok_and(|(status, _)| status == 200) && guard.running() {
                return (guard, ports);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = guard.log();
        assert!(
            log.contains("Address already in use") && attempts < 5,
            "podmend guard did not bind its listeners; its log:\n{log}"
        );
    }
}

/// [`start_guard`]'s one attempt: the guard, each TCP port's new number, and its health
/// port (`None` when the rule gives it none).
fn spawn_guard(moved: &Moved, owner: &str) -> (Process, Vec<(u16, u16)>, Option<SocketAddr>) {
    let root = moved.root.path();
    let mut ports = Vec::new();
    let mut health = None;
    let args: Vec<String> = common::dind::args(guard(&moved.spec))
        .into_iter()
        .map(|arg| {
            if let Some(tcp) = arg.strip_prefix("--listen=tcp://") {
                let old: u16 = tcp
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("port");
                let new = free_port().port();
                ports.push((old, new));
                format!("--listen=tcp://127.0.0.1:{new}")
            } else if arg.starts_with("--metrics-listen=") {
                let address = free_port();
                health = Some(address);
                format!("--metrics-listen={address}")
            } else {
                remap(&arg, root)
            }
        })
        .collect();
    let log = root.join("guard.log");
    let child = Command::new(BIN)
        .args(&args)
        .env("PODMEND_OWNER_POD_UID", owner)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start podmend guard");
    let guard = Process {
        child,
        name: "podmend guard",
        log,
    };
    (guard, ports, health)
}

/// A one-file image, imported straight into the daemon (create needs an image, not a
/// runnable one).
fn import_probe_image(moved: &Moved) {
    let dir = moved.root.path().join("image");
    std::fs::create_dir_all(&dir).expect("image dir");
    std::fs::write(dir.join("probe"), "").expect("probe file");
    let tar = moved.root.path().join("image.tar");
    let packed = run(
        Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
        None,
        Duration::from_secs(30),
    );
    assert!(packed.status.success(), "tar: {}", text(&packed.stderr));
    let imported = run(
        private_cli(moved).arg("import").arg(&tar).arg("probe:1"),
        None,
        Duration::from_secs(60),
    );
    assert!(
        imported.status.success(),
        "import: {}",
        text(&imported.stderr)
    );
}

fn private_cli(moved: &Moved) -> Command {
    docker_cli(
        &format!("unix://{}", moved.private.display()),
        &moved.root.path().join("cli-private"),
    )
}

/// Through the old address: a create reaches the daemon and is labelled with the owner;
/// with the guard stopped, the old address answers nothing.
fn check_old_address_goes_through_the_guard(
    moved: &Moved,
    mut guard: Process,
    owner: &str,
    old_host: &str,
) {
    check_old_address_goes_through_the_guard_with(moved, &mut guard, owner, old_host, None);
}

/// The same, for a client that speaks TLS with the certificates in `tls_cert_path` (the
/// `client/` directory the guard wrote), as GitLab's and Tekton's clients do.
fn check_old_address_goes_through_the_guard_with(
    moved: &Moved,
    guard: &mut Process,
    owner: &str,
    old_host: &str,
    tls_cert_path: Option<&Path>,
) {
    let cli = || {
        let mut command = docker_cli(old_host, &moved.root.path().join("cli-client"));
        if let Some(dir) = tls_cert_path {
            command
                .env("DOCKER_TLS_VERIFY", "1")
                .env("DOCKER_CERT_PATH", dir);
        }
        command
    };
    guard.wait_until("let a client through the old address", || {
        run(cli().arg("version"), None, Duration::from_secs(20))
            .status
            .success()
    });
    let created = run(
        cli().args(["create", "--name", "probe", "probe:1", "/probe"]),
        None,
        Duration::from_secs(60),
    );
    assert!(
        created.status.success(),
        "create through {old_host}: {}\nguard log:\n{}",
        text(&created.stderr),
        guard.log()
    );
    let label = run(
        private_cli(moved).args([
            "inspect",
            "-f",
            "{{index .Config.Labels \"podmend.io/owner-pod\"}}",
            "probe",
        ]),
        None,
        Duration::from_secs(30),
    );
    assert_eq!(text(&label.stdout).trim(), owner, "{}", text(&label.stderr));
    guard.stop();
    let after = run(cli().arg("version"), None, Duration::from_secs(30));
    assert!(
        !after.status.success(),
        "{old_host} still reaches a daemon without the guard"
    );
    assert!(
        ping_unix(&moved.private),
        "the daemon stopped with the guard"
    );
}

#[test]
fn the_tcp_listener_check_sees_a_listener() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    assert!(tcp_listeners(std::process::id()).contains(&port));
}

#[test]
fn arc_s_moved_daemon_answers_only_privately_and_its_old_socket_is_the_guard_s() {
    let file = "arc-gha-runner-scale-set-values-0041559-dind-native-sidecar-template.yaml";
    let mut moved = start_moved_daemon(file, "dind");
    import_probe_image(&moved);
    let owner = "3c1e-arc";
    let (guard, _) = start_guard(&moved, owner);
    // The runner's DOCKER_HOST, in the shared /var/run.
    let runner = container(&moved.spec, "runner");
    let host = common::dind::env_value(runner, "DOCKER_HOST")
        .and_then(Value::as_str)
        .expect("DOCKER_HOST")
        .to_string();
    let old_host = remap_value(&host, moved.root.path());
    check_old_address_goes_through_the_guard(&moved, guard, owner, &old_host);
    moved.daemon.stop();
}

#[test]
fn argo_s_moved_daemon_answers_only_privately_and_2375_is_the_guard_s() {
    let file = "argo-workflows-sidecar-dind-pod-reconstructed.yaml";
    let mut moved = start_moved_daemon(file, "dind");
    import_probe_image(&moved);
    let owner = "3c1e-argo";
    let (guard, ports) = start_guard(&moved, owner);
    assert_eq!(
        ports.iter().map(|(old, _)| *old).collect::<Vec<_>>(),
        [2375]
    );
    // The main container's bare DOCKER_HOST=127.0.0.1 is 2375 to the CLI: here, its new port.
    let main = container(&moved.spec, "main");
    assert_eq!(
        common::dind::env_value(main, "DOCKER_HOST").and_then(Value::as_str),
        Some("127.0.0.1")
    );
    let old_host = format!("127.0.0.1:{}", ports[0].1);
    check_old_address_goes_through_the_guard(&moved, guard, owner, &old_host);
    moved.daemon.stop();
}

#[test]
fn gitlab_s_moved_daemon_starts_without_tls_and_answers_only_privately() {
    // The service's env (every job variable) reaches dockerd as the rewrite left it:
    // DOCKER_TLS_CERTDIR=/certs and DOCKER_HOST=tcp://docker:2376 still there (dockerd reads
    // neither), DOCKER_TLS_VERIFY and DOCKER_CERT_PATH blanked (dockerd turns TLS on from
    // them, and newer releases then refuse to start without the certificate files).
    let file = "gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml";
    let mut moved = start_moved_daemon(file, "svc-0");
    let env = env_of(container(&moved.spec, "svc-0"));
    for (name, value) in [
        ("DOCKER_TLS_VERIFY", ""),
        ("DOCKER_CERT_PATH", ""),
        ("DOCKER_TLS_CERTDIR", "/certs"),
    ] {
        assert!(
            env.contains(&(name.to_string(), value.to_string())),
            "{env:?}"
        );
    }
    // No certificates generated: that is the guard's job now.
    assert!(!under(moved.root.path(), "/certs/client/ca.pem").exists());
    moved.daemon.stop();
}

/// GitLab's and Tekton's clients speak TLS to `docker:2376`/`localhost:2376` with the
/// certificates in the shared `/certs/client`: the guard, standing at 2376 with the tree it
/// wrote, lets them through (and refuses a client without a certificate).
fn check_tls_clients_reach_the_moved_daemon_through_the_guard(file: &str, daemon: &str) {
    let mut moved = start_moved_daemon(file, daemon);
    import_probe_image(&moved);
    let owner = format!("3c1e-{daemon}");
    let (mut guard, ports) = start_guard(&moved, &owner);
    assert_eq!(
        ports.iter().map(|(old, _)| *old).collect::<Vec<_>>(),
        [2376],
        "the guard stands at the daemon's TLS port"
    );
    let client_dir = under(moved.root.path(), "/certs/client");
    guard.wait_until("write the client certificates", || {
        ["ca.pem", "cert.pem", "key.pem"]
            .iter()
            .all(|name| client_dir.join(name).is_file())
    });
    let old_host = format!("tcp://localhost:{}", ports[0].1);
    let without_certificate = run(
        docker_cli(&old_host, &moved.root.path().join("cli-plain")).arg("version"),
        None,
        Duration::from_secs(20),
    );
    assert!(
        !without_certificate.status.success(),
        "a client without the certificate got through"
    );
    check_old_address_goes_through_the_guard_with(
        &moved,
        &mut guard,
        &owner,
        &old_host,
        Some(&client_dir),
    );
    moved.daemon.stop();
}

#[test]
fn gitlab_s_tls_client_reaches_the_moved_daemon_through_the_guard_on_2376() {
    check_tls_clients_reach_the_moved_daemon_through_the_guard(
        "gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml",
        "svc-0",
    );
}

#[test]
fn tekton_s_tls_client_reaches_the_moved_daemon_through_the_guard_on_2376() {
    check_tls_clients_reach_the_moved_daemon_through_the_guard(
        "tekton-dind-sidecar-taskrun-digest-pinned-pod-reconstructed.yaml",
        "sidecar-server",
    );
}

#[test]
fn tekton_s_moved_daemon_keeps_its_flags_and_answers_only_privately() {
    let file = "tekton-dind-sidecar-taskrun-digest-pinned-pod-reconstructed.yaml";
    let mut moved = start_moved_daemon(file, "sidecar-server");
    let info = run(
        private_cli(&moved).args(["info", "-f", "{{.Driver}} {{.Debug}}"]),
        None,
        Duration::from_secs(30),
    );
    // --storage-driver=vfs and --debug came through.
    assert_eq!(
        text(&info.stdout).trim(),
        "vfs true",
        "{}",
        text(&info.stderr)
    );
    moved.daemon.stop();
}

/// GitLab's TCP-only DinD service as Testcontainers' GitLab recipe runs it: the service
/// `docker:dind` with `command: ["--tls=false"]` (the kubernetes executor makes a service's
/// command the container's args, the image's entrypoint kept), `DOCKER_TLS_CERTDIR=""`, the
/// job's `DOCKER_HOST=tcp://docker:2375` in both containers (the executor's host alias makes
/// `docker` this pod), and a registry CA mounted under `/etc/docker/certs.d`.
fn gitlab_tls_off_pod() -> Value {
    let job_env = serde_json::json!([
        {"name": "DOCKER_HOST", "value": "tcp://docker:2375"},
        {"name": "DOCKER_TLS_CERTDIR", "value": ""}
    ]);
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "runner-tls-off", "namespace": "ci"},
        "spec": {
            "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["docker"]}],
            "volumes": [{"name": "registry-ca", "configMap": {"name": "registry-ca"}}],
            "containers": [
                {"name": "build", "image": "docker:24.0.5-cli", "command": ["sh", "-c", "exec sh"],
                 "env": job_env},
                {"name": "svc-0", "image": "docker:24.0.5-dind", "args": ["--tls=false"],
                 "env": job_env, "securityContext": {"privileged": true},
                 "volumeMounts": [{"name": "registry-ca",
                                   "mountPath": "/etc/docker/certs.d/registry.example:5000"}]}
            ]
        }
    })
}

/// dind-rm's findings for `pod`, as the webhook would warn them.
fn findings(pod: &Value) -> Vec<String> {
    let engine = Engine::new(&Config::default());
    let subject = Subject {
        operation: Operation::Create,
        group: "",
        kind: "Pod",
        sub_resource: "",
        namespace: "ci",
        object: Some(pod),
        old_object: None,
    };
    engine
        .review(&subject, &StaticCluster::empty())
        .findings
        .into_iter()
        .flat_map(|f| f.messages)
        .collect()
}

#[test]
fn gitlab_s_tls_off_service_with_a_registry_ca_is_moved_and_its_client_goes_through_the_guard() {
    let pod = gitlab_tls_off_pod();
    let messages = findings(&pod);
    assert!(
        messages[0].starts_with("injected podmend-guard (policy collect) in daemon svc-0's place"),
        "{messages:?}"
    );
    let spec = repaired_pod(&pod, "gitlab-tls-off");
    // The entrypoint's plain branch: --tls=false is not handed to the moved daemon, which
    // listens on its private socket only (checked by start_moved).
    assert!(!argv(container(&spec, "svc-0")).contains(&"--tls=false".to_string()));
    let moved = start_moved(spec, "gitlab-tls-off", "svc-0");
    import_probe_image(&moved);
    let owner = "3c1e-tls-off";
    let (guard, ports) = start_guard(&moved, owner);
    let new_2375 = ports
        .iter()
        .find(|(old, _)| *old == 2375)
        .map(|(_, new)| *new)
        .expect("the guard stands at 2375");
    let old_host = format!("tcp://127.0.0.1:{new_2375}");
    check_old_address_goes_through_the_guard(&moved, guard, owner, &old_host);
}

/// The static docker CLI to run inside a container (busybox has no libc for a dynamic one):
/// the docker CLI first on PATH when it is statically linked, as the docker.com builds are.
fn static_docker_cli() -> PathBuf {
    let cli = find_program("docker").unwrap_or_else(|| panic!("no docker CLI: {INSTALL_HINT}"));
    let bytes = std::fs::read(&cli).expect("read the docker CLI");
    // A dynamically linked ELF names its loader (PT_INTERP, "/lib64/ld-linux…").
    let dynamic = bytes.windows(12).any(|w| w == b"/lib64/ld-li")
        || bytes.windows(9).any(|w| w == b"/lib/ld-l");
    assert!(
        !dynamic,
        "{} is dynamically linked; this test runs it inside a busybox container and needs the \
         statically linked docker CLI (docker.com's static build) first on PATH",
        cli.display()
    );
    cli
}

#[test]
fn a_container_started_with_the_daemon_s_own_socket_bound_reaches_the_guard() {
    // Testcontainers' Ryuk, started with `-v /var/run/docker.sock:/var/run/docker.sock`
    // whenever DOCKER_HOST is TCP: dockerd resolves a bind's source in its own mount
    // namespace (the daemon container's filesystem), so the source must be a socket there.
    // Here dockerd runs on this machine with the daemon container's paths moved into a
    // temporary root, so the bind names the daemon container's /var/run/docker.sock by its
    // place in that root.
    let cli = static_docker_cli();
    let spec = repaired_pod(&gitlab_tls_off_pod(), "gitlab-tls-off");
    let moved = start_moved(spec, "gitlab-tls-off", "svc-0");
    common::dockerd::import_busybox(moved.root.path(), || private_cli(&moved));
    let owner = "3c1e-own-socket";
    let (guard, ports) = start_guard(&moved, owner);
    let new_2375 = ports
        .iter()
        .find(|(old, _)| *old == 2375)
        .map(|(_, new)| *new)
        .expect("the guard stands at 2375");
    let client = || {
        docker_cli(
            &format!("tcp://127.0.0.1:{new_2375}"),
            &moved.root.path().join("cli-client"),
        )
    };
    let own_socket = under(moved.root.path(), "/var/run/docker.sock");
    // Detached, its answer in a file: what is checked is the socket, not the attach stream.
    let out = moved.root.path().join("ryuk-out");
    std::fs::create_dir_all(&out).expect("output directory");
    let started = run(
        client()
            .args(["run", "-d", "--pull=never", "--network", "none", "--name", "ryuk-like"])
            .arg("-v")
            .arg(format!("{}:/var/run/docker.sock", own_socket.display()))
            .arg("-v")
            .arg(format!("{}:/usr/local/bin/docker:ro", cli.display()))
            .arg("-v")
            .arg(format!("{}:/out", out.display()))
            .args(["-e", "DOCKER_CLI_HINTS=false", "-e", "HOME=/tmp"])
            .args([
                "busybox",
                "sh",
                "-c",
                "/usr/local/bin/docker ps -a --format '{{.Names}} {{.Label \"podmend.io/owner-pod\"}}' \
                 >/out/ps 2>&1; echo $? >/out/rc",
            ]),
        None,
        Duration::from_secs(60),
    );
    assert!(
        started.status.success(),
        "start a container bound to the daemon's own socket: {}\nguard log:\n{}",
        text(&started.stderr),
        guard.log()
    );
    let waited = run(
        client().args(["wait", "ryuk-like"]),
        None,
        Duration::from_secs(60),
    );
    assert!(waited.status.success(), "{}", text(&waited.stderr));
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    assert_eq!(
        read("rc").trim(),
        "0",
        "docker ps inside a container bound to the daemon's own socket:\n{}\nguard log:\n{}",
        read("ps"),
        guard.log()
    );
    // It listed itself (`-a`: dockerd marks it running only once its process has started),
    // created through the guard and so labelled with the owner.
    assert!(
        read("ps")
            .lines()
            .any(|l| l.trim() == format!("ryuk-like {owner}")),
        "{}",
        read("ps")
    );
    // `kubectl exec -c svc-0 docker ps`: the CLI's default socket in the daemon's container.
    let exec = run(
        docker_cli(
            &format!("unix://{}", own_socket.display()),
            &moved.root.path().join("cli-exec"),
        )
        .args(["ps", "-a"]),
        None,
        Duration::from_secs(30),
    );
    assert!(exec.status.success(), "{}", text(&exec.stderr));
    drop(guard);
}

#[test]
fn a_daemon_no_container_is_known_to_use_is_reached_only_through_the_guard() {
    // Jenkins: DOCKER_HOST is set in the Jenkinsfile, so podmend knows no client; every
    // container of the pod reaches the daemon's 0.0.0.0:2375.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "jenkins-agent", "namespace": "ci"},
        "spec": {"containers": [
            {"name": "jnlp", "image": "jenkins/inbound-agent:3309.v27b_9314fd1a_4-1"},
            {"name": "dind", "image": "docker:27-dind", "securityContext": {"privileged": true},
             "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}
        ]}
    });
    let spec = repaired_pod(&pod, "jenkins-dind");
    let moved = start_moved(spec, "jenkins-dind", "dind");
    import_probe_image(&moved);
    let owner = "3c1e-jenkins";
    let (guard, ports) = start_guard(&moved, owner);
    let new_2375 = ports
        .iter()
        .find(|(old, _)| *old == 2375)
        .map(|(_, new)| *new)
        .expect("the guard stands at 2375");
    check_old_address_goes_through_the_guard(
        &moved,
        guard,
        owner,
        &format!("tcp://127.0.0.1:{new_2375}"),
    );
}

/// Argo's plain-TCP DinD pod on the node's network.
fn host_network_pod(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": format!("{name}-"), "namespace": "ci"},
        "spec": {"hostNetwork": true, "containers": [
            {"name": "main", "image": "docker:19.03.13", "command": ["sh", "-c"],
             "args": ["docker ps"], "env": [{"name": "DOCKER_HOST", "value": "127.0.0.1"}]},
            {"name": "dind", "image": "docker:19.03.13-dind", "command": ["dockerd-entrypoint.sh"],
             "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}],
             "securityContext": {"privileged": true}}
        ]}
    })
}

/// The guard's probe (its port and path) in a repaired pod spec.
fn probe_of(spec: &Value, probe: &str) -> (u16, String) {
    let get = &guard(spec)[probe]["httpGet"];
    let port = get["port"].as_u64().expect("a numeric probe port") as u16;
    (
        port,
        get["path"].as_str().expect("a probe path").to_string(),
    )
}

/// One guard with `spec`'s arguments, its listeners moved into `dir` and onto a free
/// loopback port, its health port the rule's own, on loopback.
fn spawn_host_network_guard(spec: &Value, dir: &Path, name: &'static str) -> Process {
    spawn_host_network_guard_on(spec, None, dir, name)
}

/// [`spawn_host_network_guard`], on `health_port` instead of the rule's when given.
fn spawn_host_network_guard_on(
    spec: &Value,
    health_port: Option<u16>,
    dir: &Path,
    name: &'static str,
) -> Process {
    std::fs::create_dir_all(dir).expect("guard directory");
    // The kubelet makes each mount's directory.
    for (_, path) in common::dind::mounts(guard(spec)) {
        std::fs::create_dir_all(under(dir, &path)).expect("mount directory");
    }
    let args: Vec<String> = common::dind::args(guard(spec))
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--listen=tcp://") {
                format!("--listen=tcp://127.0.0.1:{}", free_port().port())
            } else if let Some(address) = arg.strip_prefix("--metrics-listen=") {
                let port = address.rsplit(':').next().expect("a port");
                match health_port {
                    Some(port) => format!("--metrics-listen=127.0.0.1:{port}"),
                    None => format!("--metrics-listen=127.0.0.1:{port}"),
                }
            } else {
                remap(&arg, dir)
            }
        })
        .collect();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(BIN)
        .args(&args)
        .env("PODMEND_OWNER_POD_UID", name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start podmend guard");
    Process { child, name, log }
}

/// The status `GET path` on loopback `port` answers, once something answers there.
fn probe_status(process: &mut Process, port: u16, path: &str) -> u16 {
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut status = 0;
    process.wait_until("answer its health port", || {
        match http_get(
            address,
            path,
            Duration::from_secs(1),
            Duration::from_secs(2),
        ) {
            Ok((answer, _)) => {
                status = answer;
                answer != 503
            }
            Err(_) => false,
        }
    });
    status
}

#[test]
fn two_host_network_guards_on_one_network_namespace_each_answer_only_their_own_probes() {
    // With hostNetwork every pod's guard shares the node's ports. Two pods of one template
    // (as a Job's are) get a health port each, declared so that the API server makes it a
    // hostPort the scheduler keeps apart, and a token in their probes' paths that only
    // their own guard answers.
    let pod = host_network_pod("job");
    let first = repaired_pod(&pod, "host-network");
    let (port_1, startup_1) = probe_of(&first, "startupProbe");
    // The port is drawn at random from 10,000: the same draw twice (1 in 10,000) is two pods
    // the scheduler keeps off one node by their hostPort, which this test does not run; it
    // draws again then. Ten draws that all collide mean the draw is not random.
    let (second, port_2, startup_2) = (0..10)
        .map(|_| {
            let second = repaired_pod(&pod, "host-network");
            let (port, startup) = probe_of(&second, "startupProbe");
            (second, port, startup)
        })
        .find(|(_, port, _)| *port != port_1)
        .expect("ten pods on the node's network all drew the first pod's health port");
    let (ready_port_1, ready_1) = probe_of(&first, "readinessProbe");
    assert_eq!(ready_port_1, port_1);
    assert_ne!(startup_1, startup_2, "two pods' probes use the same path");
    assert!(startup_1.starts_with("/healthz/") && ready_1.starts_with("/readyz/"));
    assert_eq!(
        guard(&first)["ports"],
        serde_json::json!([{"name": "podmend-health", "containerPort": port_1, "protocol": "TCP"}])
    );

    // Both on this test's network namespace, as on one node.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut guard_1 = spawn_host_network_guard(&first, &dir.path().join("1"), "guard-1");
    let mut guard_2 = spawn_host_network_guard(&second, &dir.path().join("2"), "guard-2");
    assert_eq!(
        probe_status(&mut guard_1, port_1, &startup_1),
        200,
        "{}",
        guard_1.log()
    );
    assert_eq!(
        probe_status(&mut guard_2, port_2, &startup_2),
        200,
        "{}",
        guard_2.log()
    );
    // A probe reaching the other pod's guard fails.
    assert_eq!(probe_status(&mut guard_1, port_1, &startup_2), 404);
    let other_ready = ready_1.replace(
        startup_1.trim_start_matches("/healthz/"),
        startup_2.trim_start_matches("/healthz/"),
    );
    assert_eq!(probe_status(&mut guard_1, port_1, &other_ready), 404);

    // Were the second pod's port the first's (a node that ignored the hostPort), its guard
    // could not bind it, and its startup probe, reaching the first pod's guard, fails
    // instead of passing.
    let mut guard_3 =
        spawn_host_network_guard_on(&second, Some(port_1), &dir.path().join("3"), "guard-3");
    let deadline = Instant::now() + Duration::from_secs(20);
    while guard_3.running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !guard_3.running() && guard_3.log().contains("Address already in use"),
        "{}",
        guard_3.log()
    );
    assert_eq!(probe_status(&mut guard_1, port_1, &startup_2), 404);
    guard_1.stop();
    guard_2.stop();
}
