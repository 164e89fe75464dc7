//! The binary's own surfaces: `podmend config`, `podmend certs`, and `podmend serve`
//! reloading a certificate that a Secret volume replaces by swapping its `..data` symlink.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::server::{BIN, Options, Server, publish_version, write_certs};
use common::tls;

#[test]
fn podmend_config_prints_defaults_that_check_as_valid() {
    let output = Command::new(BIN).arg("config").output().expect("run");
    assert!(output.status.success());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &output.stdout).expect("write");
    let check = Command::new(BIN)
        .args(["config", "--check"])
        .arg(&path)
        .output()
        .expect("run");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("node-affinity:") && text.contains("agent-requests:"),
        "{text}"
    );
}

#[test]
fn podmend_config_check_names_the_bad_key_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "rules:\n  agent-requests:\n    presets: [jenkins]\n").expect("write");
    let check = Command::new(BIN)
        .args(["config", "--check"])
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(check.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(stderr.contains("rules.agent-requests.presets"), "{stderr}");
    assert!(stderr.contains("jenkins-agent"), "{stderr}");
}

/// `podmend serve` on ports the kernel picks; the caller adds the rest.
fn serve_on_ephemeral_ports() -> Command {
    let mut command = Command::new(BIN);
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    command
}

#[test]
fn serve_refuses_to_start_on_an_invalid_config_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_certs(&dir.path().join("certs"));
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "rules:\n  node-affinity:\n    mode: always\n").expect("write");
    let output = serve_on_ephemeral_ports()
        .arg("--tls-cert")
        .arg(dir.path().join("certs/tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("certs/tls.key"))
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("rules.node-affinity.mode"), "{stderr}");
}

#[test]
fn serve_refuses_to_start_without_a_certificate_and_says_which_flag() {
    let output = serve_on_ephemeral_ports()
        .args([
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--tls-key",
            "/nonexistent/tls.key",
        ])
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent/tls.crt") && stderr.contains("--tls-cert"),
        "{stderr}"
    );
}

/// Writes a new PKI into `dir/..<version>` and swaps the Secret volume's `..data` to it.
fn publish(dir: &Path, version: &str) {
    write_certs(&dir.join(format!("..{version}")));
    publish_version(dir, version);
}

/// The certificate the server presents on a new TLS connection, trusting the CAs of both
/// versions (only which certificate is served is compared).
async fn served_certificate(server: &Server) -> Vec<u8> {
    let dir = server.dir.path().join("secret");
    let cas: Vec<Vec<u8>> = ["..v1", "..v2"]
        .iter()
        .filter_map(|version| std::fs::read(dir.join(version).join("ca.crt")).ok())
        .collect();
    let config = tls::client_config(tls::roots(cas.iter().map(Vec::as_slice)), &[]);
    let connection = tls::connect(server.webhook, config)
        .await
        .expect("handshake");
    tls::presented_leaf(&connection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_picks_up_a_certificate_swapped_in_by_a_secret_volume_symlink() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let secret = scratch.path().join("secret");
    std::fs::create_dir_all(&secret).expect("dir");
    publish(&secret, "v1");
    let server = Server::start(Options {
        tls_dir: Some(secret.clone()),
        ..Options::default()
    });
    // The server helper keeps its own tempdir; point served_certificate at this secret dir.
    std::os::unix::fs::symlink(&secret, server.dir.path().join("secret")).expect("link secret dir");

    assert_eq!(
        served_certificate(&server).await,
        tls::leaf_der_of_file(&secret.join("..v1/tls.crt"))
    );
    publish(&secret, "v2");
    let expected = tls::leaf_der_of_file(&secret.join("..v2/tls.crt"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while served_certificate(&server).await != expected {
        assert!(
            Instant::now() < deadline,
            "new certificate not served:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, metrics) = server.metrics_get("/metrics").expect("metrics");
    assert!(
        metrics.contains("podmend_tls_reloads_total{result=\"success\"} 1"),
        "{metrics}"
    );
}
