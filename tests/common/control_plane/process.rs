//! A control-plane component run as a child process that cannot outlive the test binary.
//!
//! Each component runs under a small watchdog shell, in a process group of its own, with the
//! watchdog's stdin a pipe from the test process. Dropping a [`Process`] stops it (SIGTERM,
//! then SIGKILL after a grace period); when the test process ends without dropping it (libtest
//! never drops statics, a panic with `panic = "abort"`, SIGKILL, Ctrl-C), the pipe closes and
//! the watchdog stops the component itself. Either way nothing is left running.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `"$@"` with its output appended to `$1` (its pid in `$1.pid`), waits for its stdin to close, then stops
/// what it started: SIGTERM to the component, SIGKILL after 10 s.
const WATCHDOG: &str = r#"
log="$1"; shift
"$@" </dev/null >>"$log" 2>&1 &
pid=$!
echo "$pid" >"$log.pid"
cat >/dev/null
kill -TERM "$pid" 2>/dev/null
i=0
while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
"#;

/// A running component.
pub struct Process {
    pub name: String,
    /// The command line, for the failure message of a component that did not start.
    pub command_line: String,
    pub log: PathBuf,
    watchdog: Child,
    stdin: Option<ChildStdin>,
}

impl Process {
    /// Starts `program args…` as `name`, its output going to `dir/<name>.log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
    ) -> Result<Process, String> {
        use std::os::unix::process::CommandExt as _;
        let log = dir.join(format!("{name}.log"));
        std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let command_line = std::iter::once(program.display().to_string())
            .chain(args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(&log)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // The components dial only loopback; a proxy from the environment must not take the
        // API server's webhook calls or the clients' requests elsewhere.
        for var in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            command.env_remove(var);
        }
        let mut watchdog = command
            .spawn()
            .map_err(|e| format!("cannot start {name} ({command_line}): {e}"))?;
        let stdin = watchdog.stdin.take();
        Ok(Process {
            name: name.to_string(),
            command_line,
            log,
            watchdog,
            stdin,
        })
    }

    /// Whether the component (its watchdog) still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.watchdog.try_wait(), Ok(None))
            && std::fs::read_to_string(&self.log).is_ok()
            && !self.component_exited()
    }

    /// The last `lines` lines of the component's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// What to print when the component failed: its command line and last log lines.
    pub fn report(&self) -> String {
        format!(
            "--- {} ---\ncommand: {}\nlog ({}), last lines:\n{}\n",
            self.name,
            self.command_line,
            self.log.display(),
            self.log_tail(30)
        )
    }

    /// Stops the component and waits for it: the watchdog's stdin closes, it sends SIGTERM
    /// and after 10 s SIGKILL.
    pub fn stop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(self.watchdog.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The watchdog is the group leader: its group is the component's.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.watchdog.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.watchdog.wait();
    }

    /// The component's process is gone (or a zombie its watchdog has not reaped yet).
    fn component_exited(&self) -> bool {
        let pid_file = format!("{}.pid", self.log.display());
        let Ok(pid) = std::fs::read_to_string(pid_file) else {
            // The watchdog has not started it yet.
            return false;
        };
        match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
            // The state follows the parenthesised command name.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => true,
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The processes whose command line mentions `marker` (a directory only one suite uses),
/// as `pid: command line`: what a suite left running.
pub fn processes_mentioning(marker: &Path) -> Vec<String> {
    let marker = marker.display().to_string();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    let own = std::process::id().to_string();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == own {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let command_line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if command_line.contains(&marker) {
            found.push(format!("{name}: {}", command_line.trim()));
        }
    }
    found
}
