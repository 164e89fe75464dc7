//! What the benches read of a process while it runs: `/proc/PID/status` figures, CPU time
//! from `/proc/PID/stat`, and the end of its log. Included by the load and scale benches
//! with `#[path = "common/proc.rs"] mod proc;`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

/// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`, `RssAnon`).
pub fn status_kib(pid: &str, key: &str) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .with_context(|| format!("no {key} in {path}"))
}

/// User + system CPU time so far, all threads: utime + stime, fields 14 and 15 of
/// `/proc/PID/stat` (`pid` may be `self`), in clock ticks.
pub fn cpu_time(pid: &str) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
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

/// The last `lines` lines of a log, indented; says so when it is empty or unreadable.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
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
