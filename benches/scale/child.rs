//! The processes under test: spawned with their output in files, read from `/proc` while
//! they run (RSS, VmHWM, CPU time), reaped with `wait4` so a finished one still tells its
//! peak RSS and CPU time (`ru_maxrss`, `ru_utime`, `ru_stime`). Killed on drop.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Lines of a log shown when something goes wrong.
const TAIL_LINES: usize = 30;

/// How a reaped process ended and what it used.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    /// The exit code, or `None` when a signal ended it.
    pub code: Option<i32>,
    pub wall: Duration,
    /// Peak resident set (KiB).
    pub max_rss_kib: u64,
    pub user: Duration,
    pub system: Duration,
}

pub struct Child {
    child: std::process::Child,
    reaped: bool,
    pub pid: u32,
    pub spawned: Instant,
    pub log: PathBuf,
}

impl Child {
    /// Starts `command` with stdin closed, stdout to `stdout` (or discarded), stderr to `log`.
    pub fn spawn(mut command: Command, stdout: Option<&Path>, log: &Path) -> anyhow::Result<Child> {
        let err =
            std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let out = match stdout {
            Some(path) => Stdio::from(
                std::fs::File::create(path)
                    .with_context(|| format!("create {}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let spawned = Instant::now();
        let child = command
            .spawn()
            .with_context(|| format!("start {:?}", command.get_program()))?;
        Ok(Child {
            pid: child.id(),
            child,
            reaped: false,
            spawned,
            log: log.to_path_buf(),
        })
    }

    /// Reaps the process if it has ended (`wait4` with `WNOHANG`).
    pub fn try_end(&mut self) -> anyhow::Result<Option<Ended>> {
        if self.reaped {
            bail!("process {} was already reaped", self.pid);
        }
        let mut status = 0;
        // SAFETY: rusage is plain data that wait4 fills; zeroed is a valid value for it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child's pid, with valid pointers to locals.
        let pid = unsafe {
            libc::wait4(
                self.pid as libc::pid_t,
                &mut status,
                libc::WNOHANG,
                &mut usage,
            )
        };
        let wall = self.spawned.elapsed();
        match pid {
            0 => Ok(None),
            -1 => Err(std::io::Error::last_os_error()).context("wait4"),
            _ => {
                self.reaped = true;
                let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
                let time = |t: libc::timeval| {
                    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
                };
                Ok(Some(Ended {
                    code,
                    wall,
                    max_rss_kib: usage.ru_maxrss as u64,
                    user: time(usage.ru_utime),
                    system: time(usage.ru_stime),
                }))
            }
        }
    }

    /// Waits for the end (polling every millisecond), killing the process after `timeout`.
    pub fn wait_end(&mut self, timeout: Duration) -> anyhow::Result<Ended> {
        loop {
            if let Some(ended) = self.try_end()? {
                return Ok(ended);
            }
            if self.spawned.elapsed() > timeout {
                bail!(
                    "still running after {timeout:?}; killed. Its log ends with:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Fails, with the end of the log, when the process has ended.
    pub fn check_alive(&mut self, what: &str) -> anyhow::Result<()> {
        if let Some(ended) = self.try_end()? {
            bail!(
                "{what} exited ({:?}); its log ends with:\n{}",
                ended.code,
                self.log_tail()
            );
        }
        Ok(())
    }

    /// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`, `RssAnon`).
    pub fn status_kib(&self, key: &str) -> anyhow::Result<u64> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        text.lines()
            .find_map(|line| {
                let rest = line.strip_prefix(key)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .with_context(|| format!("no {key} in {path}"))
    }

    /// User + system CPU time so far, all threads (`/proc/PID/stat` fields 14 and 15).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        let path = format!("/proc/{}/stat", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        let after = text
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .with_context(|| format!("{path}: unexpected format"))?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        // `after` starts at field 3, so field N is at index N - 3.
        let field = |n: usize| -> anyhow::Result<u64> {
            fields
                .get(n - 3)
                .and_then(|f| f.parse().ok())
                .with_context(|| format!("{path}: no field {n}"))
        };
        // SAFETY: sysconf only reads a configuration value.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let per_second = if ticks > 0 { ticks as f64 } else { 100.0 };
        Ok(Duration::from_secs_f64(
            (field(14)? + field(15)?) as f64 / per_second,
        ))
    }

    /// The last lines of the process's stderr.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
            if tail.is_empty() {
                "  (empty)".to_string()
            } else {
                tail.iter()
                    .map(|l| format!("  {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
        Err(e) => format!("  (cannot read {}: {e})", path.display()),
    }
}

/// A plain-HTTP GET; the status code.
pub fn http_status(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
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

/// A free loopback port.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind an ephemeral port")?;
    listener
        .local_addr()
        .context("local address of an ephemeral port")
}

/// `/proc/loadavg`'s three load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".to_string())
}
