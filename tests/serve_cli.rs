//! The binary's own surfaces: `podmend config`, `podmend certs`, and `podmend serve`
//! reloading a certificate that a Secret volume replaces by swapping its `..data` symlink.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::netns::{self, NetNs};
use common::server::{BIN, Options, Server, create_review, publish_version, write_certs};
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

/// The chart's certManager mode mounts the Secret volume `optional`, so the pod starts before
/// cert-manager has issued the certificate: the kubelet mounts the volume empty while the
/// Secret does not exist and writes its keys once it does (kubernetes
/// `pkg/volume/secret/secret.go`, `secretVolumeMounter.SetUpAt`: an optional Secret that is
/// not found gives an empty payload; the atomic writer then swaps `..data` in). The test lays
/// the volume out as that writer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_not_ready_for_certificate_files_that_appear_later_and_then_serves_them() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let secret = scratch.path().join("secret");
    std::fs::create_dir_all(&secret).expect("dir");
    let server = Server::start_async(Options {
        tls_dir: Some(secret.clone()),
        args: vec!["--tls-wait-for-files".into()],
        ..Options::default()
    })
    .await;
    let (status, body) = server.metrics_get("/readyz").expect("readyz");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("waiting for the serving certificate")
            && body.contains(&secret.join("tls.crt").display().to_string())
            && body.contains(&secret.join("tls.key").display().to_string()),
        "{body}"
    );
    let log = server.log_once(|log| log.contains("waiting for the serving certificate"));
    assert!(log.contains("kubectl describe certificate"), "{log}");

    publish(&secret, "v1");
    let deadline = Instant::now() + Duration::from_secs(15);
    while server.metrics_get("/readyz").map(|(status, _)| status) != Ok(200) {
        assert!(
            Instant::now() < deadline,
            "not ready once the files are there:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::os::unix::fs::symlink(&secret, server.dir.path().join("secret")).expect("link secret dir");
    assert_eq!(
        served_certificate(&server).await,
        tls::leaf_der_of_file(&secret.join("..v1/tls.crt"))
    );
}

/// A child process killed and reaped when the test ends, passed or not.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `curl` inside `netns` (`-g`: a bracketed IPv6 address is not a glob): status and body.
fn curl_in(netns: &NetNs, args: &[&str]) -> (bool, String) {
    let output = netns
        .command("curl")
        .args(["-sS", "-g", "--max-time", "5"])
        .args(args)
        .output()
        .expect("run curl (scripts/setup installs it)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

/// `podmend serve` with its default addresses inside `netns`, with certificates for
/// localhost, 127.0.0.1, ::1 and the namespace's IPv6 address, ready at `ready_host` (a
/// host of a URL); the process, and the directory holding `certs/` and `serve.log`.
fn serve_in(netns: &NetNs, ready_host: &str) -> (Reaped, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let status = Command::new(BIN)
        .args(["certs", "--dns", "localhost", "--dns", "127.0.0.1"])
        .args(["--dns", "::1", "--dns", netns::IPV6, "--out"])
        .arg(&certs)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run podmend certs");
    assert!(status.success());
    let log = dir.path().join("serve.log");
    let serve = Reaped(
        netns
            .command(BIN)
            .arg("serve")
            .arg("--tls-cert")
            .arg(certs.join("tls.crt"))
            .arg("--tls-key")
            .arg(certs.join("tls.key"))
            .arg("--kubeconfig")
            .arg(dir.path().join("no-kubeconfig"))
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start podmend serve in the namespace"),
    );
    let readyz = format!("http://{ready_host}:9090/readyz");
    let deadline = Instant::now() + Duration::from_secs(20);
    while curl_in(netns, &["-f", &readyz]).1 != "ok\n" {
        assert!(
            Instant::now() < deadline,
            "not ready at {readyz} within 20 s: {:?}\nlog:\n{}",
            curl_in(netns, &["-f", &readyz]),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (serve, dir)
}

/// A review sent to `/mutate` at `host` (of a URL) is answered, allowed, and the metrics port
/// answers there too.
fn answers_at(netns: &NetNs, dir: &Path, host: &str) {
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    let review = dir.join("review.json");
    std::fs::write(
        &review,
        create_review("ip-uid", &pod, "default").to_string(),
    )
    .expect("write review");
    let ca = dir.join("certs/ca.crt");
    let data = format!("@{}", review.display());
    let (ok, body) = curl_in(
        netns,
        &[
            "--cacert",
            ca.to_str().expect("utf-8 path"),
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &data,
            &format!("https://{host}:8443/mutate"),
        ],
    );
    assert!(ok, "{host}: {body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON answer");
    assert_eq!(answer["response"]["uid"], "ip-uid", "{host}: {body}");
    assert_eq!(answer["response"]["allowed"], true, "{host}: {body}");
    let (ok, health) = curl_in(netns, &["-f", &format!("http://{host}:9090/healthz")]);
    assert!(ok, "{host} metrics port: {health}");
}

/// On IPv6-only and IPv6-first clusters the pod IP the probes and the API server dial is an
/// IPv6 one; on IPv4 ones an IPv4 one. `serve` with no `--listen` flags listens on `[::]`
/// dual-stack, so both reach it, also where the node's `net.ipv6.bindv6only=1` would make a
/// plain `[::]` socket IPv6-only. Run in a network namespace the test creates, with an IPv6
/// unique-local address and `::1` besides `127.0.0.1`.
#[test]
fn serve_on_its_default_addresses_answers_over_ipv6_and_ipv4_even_where_ipv6_sockets_are_ipv6_only()
{
    let netns = NetNs::create();
    netns.sysctl("net.ipv6.bindv6only=1");
    let ipv6 = format!("[{}]", netns::IPV6);
    let (_serve, dir) = serve_in(&netns, &ipv6);
    for host in [ipv6.as_str(), "[::1]", "127.0.0.1"] {
        answers_at(&netns, dir.path(), host);
    }
}

/// A node with IPv6 turned off by sysctl (`disable_ipv6` on every interface) still lets
/// `[::]` bind, and serves IPv4 there: the default needs no flag on IPv4-only nodes.
#[test]
fn serve_on_its_default_addresses_answers_over_ipv4_where_ipv6_is_turned_off() {
    let netns = NetNs::create();
    netns.sysctl("net.ipv6.conf.all.disable_ipv6=1");
    netns.sysctl("net.ipv6.conf.default.disable_ipv6=1");
    netns.sysctl("net.ipv6.conf.lo.disable_ipv6=1");
    let (_serve, dir) = serve_in(&netns, "127.0.0.1");
    answers_at(&netns, dir.path(), "127.0.0.1");
}
