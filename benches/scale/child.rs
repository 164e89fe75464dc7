//! The processes under test: spawned with their output in files, read from `/proc` while
//! they run (RSS, VmHWM, CPU time), reaped with `wait4` so a finished one still tells its
//! peak RSS and CPU time (`ru_maxrss`, `ru_utime`, `ru_stime`). Killed on drop.

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
        crate::proc::status_kib(&self.pid.to_string(), key)
    }

    /// User + system CPU time so far, all threads.
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        crate::proc::cpu_time(&self.pid.to_string())
    }

    /// The last lines of the process's stderr.
    pub fn log_tail(&self) -> String {
        crate::proc::log_tail(&self.log, TAIL_LINES)
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

/// `/proc/loadavg`'s three load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".to_string())
}
