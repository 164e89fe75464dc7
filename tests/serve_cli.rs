//! The binary's own surfaces: `podmend config`, `podmend certs`, and `podmend serve`
//! reloading a certificate that a Secret volume replaces by swapping its `..data` symlink.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{BIN, Options, Server, write_certs};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};

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

/// Lays out `dir` as the kubelet lays out a Secret volume: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<version>`, and swaps `..data` atomically to a new version.
fn publish(dir: &Path, version: &str) {
    let versioned = dir.join(format!("..{version}"));
    write_certs(&versioned);
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        let link = dir.join(file);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{file}"), &link).expect("symlink");
        }
    }
}

/// The certificate the server presents on a new TLS connection (no verification: we only
/// compare which certificate is served).
async fn served_certificate(server: &Server) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    let dir = server.dir.path().join("secret");
    for version in ["..v1", "..v2"] {
        if let Ok(pem) = std::fs::read(dir.join(version).join("ca.crt")) {
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots.add(cert.expect("pem")).expect("add");
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(server.webhook)
        .await
        .expect("connect");
    let tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake");
    tls.get_ref().1.peer_certificates().expect("certificate")[0].to_vec()
}

fn leaf_der(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).expect("read");
    CertificateDer::pem_slice_iter(&pem)
        .next()
        .expect("a cert")
        .expect("pem")
        .to_vec()
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
        leaf_der(&secret.join("..v1/tls.crt"))
    );
    publish(&secret, "v2");
    let expected = leaf_der(&secret.join("..v2/tls.crt"));
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
