//! The `podmend serve` under load: started with a fresh dev PKI and free loopback ports,
//! timed to its first ready answer, and read from `/proc` (RSS, CPU time). Killed on drop,
//! so no error path leaves it running.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// How long the server may take to answer 200 on /readyz.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of the server's log shown when something goes wrong.
const LOG_TAIL_LINES: usize = 40;

/// A child process killed (and reaped) when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `podmend serve`.
pub struct Server {
    // Declared first so it is dropped (killed) before the directory holding its log is removed.
    child: ChildGuard,
    pub pid: u32,
    pub bin: PathBuf,
    pub webhook: SocketAddr,
    pub metrics: SocketAddr,
    pub ca_pem: Vec<u8>,
    pub log: PathBuf,
    /// From spawn to the first 200 on /readyz.
    pub ready_after: Duration,
    /// VmRSS right after it was ready.
    pub idle_rss_kib: u64,
    _dir: tempfile::TempDir,
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind an ephemeral port")?;
    listener
        .local_addr()
        .context("local address of an ephemeral port")
}

impl Server {
    pub fn start(bin: &Path) -> anyhow::Result<Server> {
        if !bin.is_file() {
            bail!("server binary {} does not exist", bin.display());
        }
        let dir = tempfile::Builder::new()
            .prefix("podmend-load-")
            .tempdir()
            .context("create a temporary directory")?;
        let pki = dir.path().join("pki");
        let output = Command::new(bin)
            .args(["certs", "--dns", "localhost", "--dns", "127.0.0.1", "--out"])
            .arg(&pki)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {} certs", bin.display()))?;
        if !output.status.success() {
            bail!(
                "{} certs failed ({}): {}",
                bin.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let ca_path = pki.join("ca.crt");
        let ca_pem =
            std::fs::read(&ca_path).with_context(|| format!("read {}", ca_path.display()))?;

        let webhook = free_port()?;
        let metrics = free_port()?;
        let log = dir.path().join("serve.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut command = Command::new(bin);
        command
            .arg("serve")
            .arg("--listen")
            .arg(webhook.to_string())
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--tls-cert")
            .arg(pki.join("tls.crt"))
            .arg("--tls-key")
            .arg(pki.join("tls.key"))
            .arg("--kubeconfig")
            .arg(dir.path().join("no-kubeconfig"))
            .arg("--benchmark-null-route")
            // Production logging: the default level (info), one line per admission.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let spawned = Instant::now();
        let child = ChildGuard(
            command
                .spawn()
                .with_context(|| format!("start {} serve", bin.display()))?,
        );
        let mut server = Server {
            pid: child.0.id(),
            child,
            bin: bin.to_path_buf(),
            webhook,
            metrics,
            ca_pem,
            log,
            ready_after: Duration::ZERO,
            idle_rss_kib: 0,
            _dir: dir,
        };
        loop {
            if let Ok(200) = server.probe("/readyz") {
                server.ready_after = spawned.elapsed();
                break;
            }
            if let Some(status) = server.exit_status() {
                bail!(
                    "podmend serve exited ({status}) before it was ready; its log ends with:\n{}",
                    server.log_tail()
                );
            }
            if spawned.elapsed() > READY_TIMEOUT {
                bail!(
                    "podmend serve did not answer 200 on /readyz within {READY_TIMEOUT:?}; its log ends with:\n{}",
                    server.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        server.idle_rss_kib = server.status_kib("VmRSS")?;
        Ok(server)
    }

    /// A plain-HTTP GET on the metrics port; the status code.
    fn probe(&self, path: &str) -> std::io::Result<u16> {
        let mut stream = TcpStream::connect_timeout(&self.metrics, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_nodelay(true)?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let head = String::from_utf8_lossy(&response[..response.len().min(32)]).to_string();
        head.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))
    }

    /// The exit status, once the process has ended.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.0.try_wait().ok().flatten()
    }

    /// Fails, with the end of the log, when the server is no longer running.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => bail!(
                "podmend serve exited ({status}) during the run; its log ends with:\n{}",
                self.log_tail()
            ),
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        match std::fs::read(&self.log) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
                if tail.is_empty() {
                    "  (empty)".to_string()
                } else {
                    tail.iter()
                        .map(|l| format!("  {l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            }
            Err(e) => format!("  (cannot read {}: {e})", self.log.display()),
        }
    }

    /// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, key: &str) -> anyhow::Result<u64> {
        status_kib(&format!("/proc/{}/status", self.pid), key)
    }

    /// The server's CPU time so far (user + system, all threads).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        cpu_time(&format!("/proc/{}/stat", self.pid))
    }
}

/// This process's CPU time so far (user + system, all threads).
pub fn own_cpu_time() -> anyhow::Result<Duration> {
    cpu_time("/proc/self/stat")
}

fn status_kib(path: &str, key: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .with_context(|| format!("no {key} in {path}"))
}

/// utime + stime (fields 14 and 15 of `/proc/PID/stat`, in clock ticks).
fn cpu_time(path: &str) -> anyhow::Result<Duration> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    // The command name (field 2) is in parentheses and may contain spaces: count from after it.
    let after = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path}: unexpected format"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so field N is at index N - 3.
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("{path}: no field {n}"))
    };
    let ticks = field(14)? + field(15)?;
    Ok(Duration::from_secs_f64(
        ticks as f64 / clock_ticks_per_second(),
    ))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}
