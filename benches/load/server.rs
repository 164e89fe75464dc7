//! The `podmend serve` under load: started with a fresh dev PKI and free loopback ports,
//! timed to its first ready answer, and read from `/proc` (RSS, CPU time). Killed on drop,
//! so no error path leaves it running.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
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
        crate::serve::write_certs(bin, &pki)?;
        let ca_path = pki.join("ca.crt");
        let ca_pem =
            std::fs::read(&ca_path).with_context(|| format!("read {}", ca_path.display()))?;

        let webhook = crate::serve::free_port()?;
        let metrics = crate::serve::free_port()?;
        let log = dir.path().join("serve.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut command = crate::spawn::serve_command(
            bin,
            webhook,
            metrics,
            &pki,
            &dir.path().join("no-kubeconfig"),
        );
        command
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
            if let Ok(200) = crate::serve::http_status(server.metrics, "/readyz") {
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
        crate::proc::log_tail(&self.log, LOG_TAIL_LINES)
    }

    /// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, key: &str) -> anyhow::Result<u64> {
        crate::proc::status_kib(&self.pid.to_string(), key)
    }

    /// The server's CPU time so far (user + system, all threads).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        crate::proc::cpu_time(&self.pid.to_string())
    }
}
