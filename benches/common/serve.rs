//! `podmend certs` and `podmend serve` for the load and scale benches, on the command lines
//! the tests use (`tests/common/spawn.rs` and `tests/common/net.rs`, included beside this
//! file with `#[path]`), with errors the benches report instead of panics.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::net::{http_get, try_free_port};
use crate::spawn::certs_command;

/// A free loopback port.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    try_free_port().context("bind an ephemeral port on 127.0.0.1")
}

/// Writes a development PKI for `localhost` and `127.0.0.1` into `out` with `bin certs`.
pub fn write_certs(bin: &Path, out: &Path) -> anyhow::Result<()> {
    let output = certs_command(bin, out)
        .stdin(std::process::Stdio::null())
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
    Ok(())
}

/// A plain-HTTP GET on a metrics port, as the benches poll it (every millisecond while
/// timing readiness): the status code.
pub fn http_status(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let (status, _) = http_get(
        addr,
        path,
        Duration::from_millis(200),
        Duration::from_secs(2),
    )?;
    Ok(status)
}
