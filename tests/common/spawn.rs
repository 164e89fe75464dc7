//! The `podmend certs` and `podmend serve` command lines as the tests and the benches run
//! them: one place that knows the flags. Standard library only, so that the benches can
//! include this file with `#[path]`; the caller adds flags, environment and stdio.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

/// `podmend certs` writing a development PKI for `localhost` and `127.0.0.1` into `out`
/// (`ca.crt`, `tls.crt`, `tls.key`).
pub fn certs_command(bin: &Path, out: &Path) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["certs", "--dns", "localhost", "--dns", "127.0.0.1", "--out"])
        .arg(out);
    command
}

/// `podmend serve` on `webhook` and `metrics`, serving `tls_dir`'s `tls.crt` and `tls.key`,
/// with its cluster look-ups from `kubeconfig` (a missing file turns them off).
pub fn serve_command(
    bin: &Path,
    webhook: SocketAddr,
    metrics: SocketAddr,
    tls_dir: &Path,
    kubeconfig: &Path,
) -> Command {
    let mut command = Command::new(bin);
    command
        .arg("serve")
        .arg("--listen")
        .arg(webhook.to_string())
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        .arg("--tls-cert")
        .arg(tls_dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(tls_dir.join("tls.key"))
        .arg("--kubeconfig")
        .arg(kubeconfig);
    command
}
