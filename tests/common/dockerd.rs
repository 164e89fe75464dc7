//! A private, real Docker daemon for tests, started as TEST-ENV.md says: its own data-root,
//! exec-root, pidfile and socket in a temporary directory, no iptables, no bridge, an empty
//! daemon.json. [`shared`] starts one per test binary; an owned [`Dockerd`] stops its daemon
//! (by pid) when dropped. Each daemon gets a `busybox:latest` image imported from Debian's
//! static busybox, so `docker run --pull=never busybox ...` works with no registry.
//!
//! A static is never dropped, so every daemon runs under a small watchdog shell that holds
//! a pipe from the test process: when the test process ends, however it ends, the pipe
//! closes and the watchdog stops the daemon by its pid and removes its directory.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What to do when a peer is missing. Never skip: the test command installs them.
pub const INSTALL_HINT: &str = "run scripts/setup (scripts/test does): as root on Debian it installs docker.io and busybox-static";

/// How long a daemon may take to answer `/_ping` after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Stops the daemon and cleans up once the test process closes the watchdog's stdin.
const WATCHDOG: &str = r#"
dir="$1"; shift
"$@" >>"$dir/dockerd.log" 2>&1 &
pid=$!
echo "$pid" >"$dir/dockerd.child"
cat >/dev/null
kill -TERM "$pid" 2>/dev/null
i=0
while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$dir"
"#;

/// A running private dockerd.
pub struct Dockerd {
    dir: PathBuf,
    socket: PathBuf,
    pid: u32,
    watchdog: Mutex<Option<Child>>,
    /// The dockerd binary and its arguments, to start it again after [`Dockerd::stop`].
    program: PathBuf,
    args: Vec<String>,
}

/// The daemon of this test binary, started (and busybox imported) on first use.
pub fn shared() -> &'static Dockerd {
    static SHARED: OnceLock<Dockerd> = OnceLock::new();
    SHARED.get_or_init(|| Dockerd::start_with(&[]))
}

/// The path of `program` on PATH (or in the sbin directories, where Debian puts dockerd).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn require(program: &str) -> PathBuf {
    find_program(program).unwrap_or_else(|| panic!("`{program}` is not installed: {INSTALL_HINT}"))
}

impl Dockerd {
    /// Starts a daemon as TEST-ENV.md says, plus `extra` dockerd arguments (another `-H`, TLS
    /// flags), waits until it answers, and imports `busybox:latest`.
    pub fn start_with(extra: &[&str]) -> Dockerd {
        let dockerd = require("dockerd");
        require("docker");
        require("busybox");
        let dir = tempfile::Builder::new()
            .prefix("podmend-dockerd-")
            .tempdir()
            .expect("tempdir")
            .keep();
        std::fs::write(dir.join("daemon.json"), "{}").expect("write daemon.json");
        let socket = dir.join("docker.sock");
        let mut args: Vec<String> = vec![
            "--data-root".into(),
            dir.join("data").display().to_string(),
            "--exec-root".into(),
            dir.join("exec").display().to_string(),
            "--pidfile".into(),
            dir.join("dockerd.pid").display().to_string(),
            "-H".into(),
            format!("unix://{}", socket.display()),
            "--config-file".into(),
            dir.join("daemon.json").display().to_string(),
            "--storage-driver".into(),
            "overlay2".into(),
            "--iptables=false".into(),
            "--ip6tables=false".into(),
            "--ip-masq=false".into(),
            "--bridge=none".into(),
            "--userland-proxy=false".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut daemon = Dockerd {
            dir,
            socket,
            pid: 0,
            watchdog: Mutex::new(None),
            program: dockerd,
            args,
        };
        daemon.launch();
        daemon.import_busybox();
        daemon
    }

    /// Starts dockerd under a new watchdog and waits until it answers `/_ping`.
    fn launch(&mut self) {
        let child_file = self.dir.join("dockerd.child");
        let _ = std::fs::remove_file(&child_file);
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("podmend-dockerd-watchdog")
            .arg(&self.dir)
            .arg(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the dockerd watchdog (sh)");
        *self.watchdog.lock().unwrap_or_else(|e| e.into_inner()) = Some(watchdog);

        let started = Instant::now();
        self.pid = loop {
            if let Some(pid) = std::fs::read_to_string(&child_file)
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
            {
                break pid;
            }
            assert!(started.elapsed() < READY_TIMEOUT, "dockerd did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        let pid = self.pid;
        while !self.answers_ping() {
            if started.elapsed() > READY_TIMEOUT || !Path::new(&format!("/proc/{pid}")).exists() {
                panic!(
                    "dockerd did not answer /_ping within {READY_TIMEOUT:?}; its log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the daemon as `systemctl restart docker` or a restarting DinD sidecar does:
    /// SIGTERM, then waits until it has exited (its containers stop with it). Its data and
    /// socket path stay for [`Dockerd::start_again`]; until then nothing runs in its place.
    pub fn stop(&mut self) {
        let pid = self.pid;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        // The watchdog shell is its parent and does not reap it: exited shows as a zombie.
        let exited = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|stat| {
                    stat.rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
                })
                .unwrap_or(true)
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !exited() {
            assert!(
                Instant::now() < deadline,
                "dockerd {pid} did not exit within 60 s of SIGTERM; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Retire its watchdog without its clean-up (which would remove the data directory);
        // the zombie is then reaped by init.
        let watchdog = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut watchdog) = watchdog {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }

    /// Starts the daemon again after [`Dockerd::stop`], on the same socket and data (images
    /// and stopped containers are still there), and waits until it answers.
    pub fn start_again(&mut self) {
        self.launch();
    }

    /// `unix:///.../docker.sock`, for DOCKER_HOST or `--upstream`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's own directory (data-root, exec-root, socket, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    /// The docker CLI (the first on PATH) talking straight to this daemon.
    pub fn docker(&self) -> Command {
        docker_cli(&self.host(), &self.dir.join("cli-config"))
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = UnixStream::connect(&self.socket) else {
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
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("OK")
    }

    /// `busybox:latest` from Debian's static busybox (see [`import_busybox`]).
    fn import_busybox(&self) {
        import_busybox(&self.dir, || self.docker());
    }
}

/// Imports `busybox:latest` from Debian's static busybox (the binary, one symlink per
/// applet) with the docker CLI `docker` makes, building the image in `dir`.
pub fn import_busybox(dir: &Path, docker: impl Fn() -> Command) {
    let busybox = require("busybox");
    let rootfs = dir.join("busybox-rootfs");
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir rootfs/bin");
    std::fs::copy(&busybox, bin.join("busybox")).expect("copy busybox");
    let list = run(
        Command::new(&busybox).arg("--list"),
        None,
        Duration::from_secs(10),
    );
    assert!(
        list.status.success(),
        "busybox --list failed: {}",
        text(&list.stderr)
    );
    for applet in text(&list.stdout).lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
    let tar = dir.join("busybox-rootfs.tar");
    let packed = run(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
        None,
        Duration::from_secs(30),
    );
    assert!(
        packed.status.success(),
        "tar failed: {}",
        text(&packed.stderr)
    );
    let imported = run(
        docker()
            .args(["import", "--change", r#"CMD ["/bin/sh"]"#])
            .arg(&tar)
            .arg("busybox:latest"),
        None,
        Duration::from_secs(60),
    );
    assert!(
        imported.status.success(),
        "docker import failed: {}",
        text(&imported.stderr)
    );
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let watchdog = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut watchdog) = watchdog {
            // Only while a watchdog runs is the pid still the daemon's (not after `stop`).
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.pid.to_string())
                .status();
            // Closing its stdin lets the watchdog wait for the daemon and clean up.
            drop(watchdog.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(40);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = watchdog.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = watchdog.kill();
        } else {
            // Stopped and not started again: nothing runs, only the directory is left.
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The docker CLI first on PATH, aimed at `host`, with its own config directory and none of
/// the caller's Docker environment.
pub fn docker_cli(host: &str, config_dir: &Path) -> Command {
    let mut command = Command::new("docker");
    command
        .env("DOCKER_HOST", host)
        .env("DOCKER_CONFIG", config_dir)
        .env("DOCKER_CLI_HINTS", "false")
        .env_remove("DOCKER_CONTEXT")
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("DOCKER_CERT_PATH")
        .env_remove("DOCKER_API_VERSION");
    command
}

/// Runs `command` to completion with `stdin` as its input, killing it after `timeout`.
pub fn run(command: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let writer = stdin.map(|input| {
        let mut pipe = child.stdin.take().expect("stdin pipe");
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        })
    });
    let mut stdout = child.stdout.take().expect("stdout pipe");
    let mut stderr = child.stderr.take().expect("stderr pipe");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let status = wait_with_timeout(&mut child, timeout)
        .unwrap_or_else(|| panic!("{command:?} did not finish within {timeout:?}"));
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Waits for `child` up to `timeout`; kills it and returns `None` if it is still running.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Lossy UTF-8, for messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
