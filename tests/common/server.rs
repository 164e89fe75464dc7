//! Runs the real `podmend serve` binary on loopback with certificates from `podmend certs`,
//! and a TLS client that trusts only that CA: the test plays the API server.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use podmend::server::ServeOptions;
use serde_json::{Value, json};

use super::api_stub::ApiStub;
use super::net::{free_port, http_get};
use super::spawn::{certs_command, serve_command};
use super::tls::{Identity, client_config_with, roots};

pub const BIN: &str = env!("CARGO_BIN_EXE_podmend");

/// Options for `server::serve` run inside the test process: the serving pair `tls.crt` and
/// `tls.key` in `tls_dir`, free ports, look-ups through `kubeconfig`, short timers, the rest as
/// `podmend serve` defaults them. Tests change what they are about.
pub fn in_process_options(tls_dir: &Path, kubeconfig: &Path) -> ServeOptions {
    ServeOptions {
        listen: free_port(),
        metrics_listen: free_port(),
        tls_cert: tls_dir.join("tls.crt"),
        tls_key: tls_dir.join("tls.key"),
        config: None,
        kubeconfig: Some(kubeconfig.to_path_buf()),
        reload_interval: Duration::from_secs(1),
        shutdown_timeout: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
        cache_stale_after: Duration::from_secs(30),
        self_tls: None,
        tls_wait_for_files: false,
        benchmark_null_route: false,
        client_ca: None,
        after_cache_list: || {},
    }
}

/// Installs the process-wide rustls crypto provider, as `podmend`'s `main` does before it
/// serves: a server run inside the test process needs it.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A running `podmend serve`; killed when dropped.
pub struct Server {
    child: Child,
    pub webhook: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    /// The arguments it was started with, for [`Server::restart`].
    args: Vec<OsString>,
}

/// How to start the server.
#[derive(Default)]
pub struct Options {
    /// Config file contents; built-in defaults when `None`.
    pub config: Option<String>,
    /// Kubeconfig for look-ups; a missing file (look-ups off) when `None`.
    pub kubeconfig: Option<PathBuf>,
    /// Wait for /readyz before returning.
    pub wait_ready: bool,
    /// Directory holding `tls.crt` and `tls.key`; fresh `podmend certs` output when `None`.
    pub tls_dir: Option<PathBuf>,
    /// `--shutdown-delay-seconds` (0 unless a test is about the delay).
    pub shutdown_delay_seconds: u64,
    /// `--cache-stale-seconds`; 30 (the default) when `None`.
    pub cache_stale_seconds: Option<u64>,
    /// More flags (`--client-ca FILE`, `--log-format json`, …).
    pub args: Vec<OsString>,
}

/// Writes a development PKI with the real `podmend certs` command.
pub fn write_certs(dir: &Path) {
    let status = certs_command(Path::new(BIN), dir)
        .stdout(Stdio::null())
        .status()
        .expect("run podmend certs");
    assert!(status.success(), "podmend certs failed");
}

/// Lays `dir` out as the kubelet lays out a Secret volume (`tls.crt -> ..data/tls.crt`,
/// `..data -> ..<version>`) and points `..data` at `..<version>` with one atomic rename.
pub fn publish_version(dir: &Path, version: &str) {
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

/// `podmend serve` on `webhook` and `metrics` with the PKI `write_certs` wrote under
/// `dir/certs`, look-ups off: for a test that runs the command itself (and expects it to
/// fail).
pub fn serve_command_in(dir: &Path, webhook: SocketAddr, metrics: SocketAddr) -> Command {
    let mut command = serve_command(
        Path::new(BIN),
        webhook,
        metrics,
        &dir.join("certs"),
        &dir.join("no-kubeconfig"),
    );
    command.env("RUST_LOG", "info").stdout(Stdio::null());
    command
}

impl Server {
    /// Starts `podmend serve` on two free ports. A port picked free can be taken by another
    /// process before podmend binds it; then podmend exits saying so, and it is started again
    /// on other ports.
    pub fn start(options: Options) -> Server {
        let mut dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        write_certs(&certs);
        let tls_dir = options.tls_dir.clone().unwrap_or_else(|| certs.clone());
        if let Some(config) = &options.config {
            std::fs::write(dir.path().join("config.yaml"), config).expect("write config");
        }
        let log = dir.path().join("serve.log");
        let mut attempts = 0;
        loop {
            attempts += 1;
            let webhook = free_port();
            let metrics = free_port();
            let kubeconfig = options
                .kubeconfig
                .clone()
                .unwrap_or_else(|| dir.path().join("no-kubeconfig"));
            let mut command =
                serve_command(Path::new(BIN), webhook, metrics, &tls_dir, &kubeconfig);
            command
                .args(["--reload-seconds", "1", "--shutdown-seconds", "5"])
                .args([
                    "--shutdown-delay-seconds",
                    &options.shutdown_delay_seconds.to_string(),
                ])
                .args([
                    "--cache-stale-seconds",
                    &options.cache_stale_seconds.unwrap_or(30).to_string(),
                ])
                .args(&options.args)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"));
            if options.config.is_some() {
                command.arg("--config").arg(dir.path().join("config.yaml"));
            }
            let args = command.get_args().map(OsString::from).collect();
            let child = command.spawn().expect("start podmend serve");
            let mut server = Server {
                child,
                webhook,
                metrics,
                dir,
                log: log.clone(),
                args,
            };
            let path = if options.wait_ready {
                "/readyz"
            } else {
                "/healthz"
            };
            match server.wait_for(path) {
                Ok(()) => return server,
                Err(log_text) if log_text.contains("Address already in use") && attempts < 5 => {
                    let _ = server.child.wait();
                    dir = std::mem::replace(&mut server.dir, tempfile::tempdir().expect("tempdir"));
                }
                Err(log_text) => {
                    panic!("podmend did not answer {path} within 20 s; log:\n{log_text}")
                }
            }
        }
    }

    /// [`Server::start`] on a blocking thread, for async tests: the runtime's threads (an API
    /// stub's among them) keep running while it waits for the server.
    pub async fn start_async(options: Options) -> Server {
        tokio::task::spawn_blocking(move || Server::start(options))
            .await
            .expect("server starts")
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("certs/ca.crt")).expect("ca.crt")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once `done` holds for it, or as it is after 10 s (the caller's assertion then
    /// says what is missing): `serve` writes its log lines out every 20 ms, not as they come.
    pub fn log_once(&self, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log_text();
            if done(&log) || Instant::now() >= deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `path` answers 200 on the metrics port; Err with the log when podmend
    /// exited or 20 s passed.
    fn wait_for(&mut self, path: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((200, _)) = self.metrics_get(path) {
                return Ok(());
            }
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() >= deadline {
                return Err(self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A plain-HTTP GET on the metrics port: (status, body).
    pub fn metrics_get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(
            self.metrics,
            path,
            Duration::from_secs(2),
            Duration::from_secs(5),
        )
        .map_err(|e| e.to_string())
    }

    /// A client that verifies the server against the dev CA, offering `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> reqwest::Client {
        self.client_with(alpn, None)
    }

    /// [`Server::client`] presenting `identity` as its client certificate, when given.
    pub fn client_with(&self, alpn: &[&[u8]], identity: Option<&Identity>) -> reqwest::Client {
        let ca = self.ca_pem();
        let tls = client_config_with(roots([ca.as_slice()]), None, identity, alpn);
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(Duration::from_secs(10))
            .build()
            .expect("client")
    }

    /// A TLS connection to the webhook port that trusts only the dev CA, offering `alpn`.
    pub async fn connect_tls(
        &self,
        alpn: &[&[u8]],
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let ca = self.ca_pem();
        super::tls::connect(
            self.webhook,
            client_config_with(roots([ca.as_slice()]), None, None, alpn),
        )
        .await
        .expect("TLS handshake")
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.webhook.port())
    }

    /// The process id of `podmend serve`, for a test that signals it (SIGSTOP, SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills `podmend serve` (SIGKILL) and waits until it is gone: its ports refuse
    /// connections until [`Server::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts `podmend serve` again with the command line it was started with (the same
    /// ports, certificates, config and kubeconfig), its log appended to the same file, and
    /// waits until /readyz answers; a process still running is killed first. Err with the log
    /// when it does not serve: never panics, so a guard may call it while unwinding.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        self.child = Command::new(BIN)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start podmend serve again: {e}"))?;
        self.wait_for("/readyz").map_err(|log| {
            format!("podmend did not answer /readyz within 20 s after a restart; log:\n{log}")
        })
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        self.send_sigterm();
        self.wait_exit(Duration::from_secs(15)) == Some(true)
    }

    /// Sends SIGTERM without waiting.
    pub fn send_sigterm(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Waits up to `timeout` for the process to exit: `Some(clean)`, or `None` if it runs on.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.success());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A schedulable Node named `name` without taints, as `kubectl get node NAME -o json` shows
/// it: the cordoned worker of `tests/fixtures/cluster/` renamed and uncordoned.
pub fn untainted_node(name: &str) -> Value {
    let mut node = fixture("cluster/node-cordoned-worker.json");
    node["metadata"]["name"] = json!(name);
    node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
    let spec = node["spec"].as_object_mut().expect("the node's spec");
    spec.remove("taints");
    spec.remove("unschedulable");
    for address in node["status"]["addresses"]
        .as_array_mut()
        .expect("the node's addresses")
    {
        if address["type"] == "Hostname" {
            address["address"] = json!(name);
        }
    }
    node
}

/// `podmend serve` started with `options`, its cluster look-ups on and answered by an API
/// stub that serves the untainted nodes `nodes` (see [`untainted_node`]) and no LimitRanges,
/// as a real cluster tells it the node a pod's `spec.nodeName` names; returned once /readyz
/// says its caches are filled. Keep the stub as long as the server.
pub async fn start_knowing_nodes(nodes: &[&str], options: Options) -> (ApiStub, Server) {
    let stub = ApiStub::start(
        nodes.iter().map(|n| untainted_node(n)).collect(),
        Vec::new(),
    )
    .await;
    let server = Server::start_async(Options {
        kubeconfig: Some(stub.kubeconfig_path().to_path_buf()),
        wait_ready: true,
        ..options
    })
    .await;
    (stub, server)
}

/// Wraps an `AdmissionRequest` (the `.request` member) in an AdmissionReview.
pub fn review_of(request: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// A CREATE AdmissionReview for a bare object, as the API server builds it: the object in
/// `namespace`, a Pod's resource lists defaulted as the API server defaults them before
/// admission (`k8s_rules::apply_pod_defaults`), and no `name` while the object has only a
/// `generateName`. The e2e test `the_reviews_the_fast_tier_builds_are_the_reviews_the_api_server_sends`
/// compares it with what kube-apiserver sends, and names what it leaves out.
pub fn create_review(uid: &str, object: &Value, namespace: &str) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("namespace".into(), json!(namespace));
    }
    super::k8s_rules::apply_pod_defaults(&mut object);
    let kind = object["kind"].as_str().unwrap_or_default();
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = format!("{}s", kind.to_lowercase());
    let mut request = json!({
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": object["metadata"]["name"],
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
        "object": object,
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    });
    if let Some(request) = request.as_object_mut()
        && request["name"].is_null()
    {
        request.remove("name");
    }
    review_of(request)
}

/// An `UPDATE pods/status` review as the API server sends it for a kubelet's status write
/// (virtual-kubelet's `UpdateStatus`) from `node`: the envelope of a captured kubelet status
/// write, with these objects.
pub fn status_update_review(uid: &str, pod: &Value, old: &Value, node: &str) -> Value {
    let mut request =
        fixture("admissionrequest-pod-status-subresource-update-by-kubelet-kyverno.json");
    request["uid"] = json!(uid);
    request["name"] = pod["metadata"]["name"].clone();
    request["namespace"] = pod["metadata"]["namespace"].clone();
    request["userInfo"] = json!({"username": format!("system:node:{node}"), "groups": ["system:nodes", "system:authenticated"]});
    request["object"] = pod.clone();
    request["oldObject"] = old.clone();
    review_of(request)
}

/// What the API server makes of a `/mutate` answer: the decoded patch (if any), the
/// warnings, and the whole body.
pub struct MutateAnswer {
    pub patch: Option<Vec<u8>>,
    pub warnings: Vec<String>,
    pub body: Value,
}

/// Posts `review` to `/mutate` over HTTP/2 and checks the answer as the API server does.
pub async fn mutate_h2(server: &Server, review: &Value) -> MutateAnswer {
    let response = server
        .client(&[b"h2"])
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .json(review)
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.expect("json");
    let uid = review["request"]["uid"].as_str().expect("uid");
    let patch = super::k8s_rules::verify_admission_response(uid, &body, true)
        .unwrap_or_else(|e| panic!("{e}: {body}"));
    MutateAnswer {
        patch,
        warnings: warnings_of(&body),
        body,
    }
}

/// The `warnings` of an AdmissionReview answer.
pub fn warnings_of(body: &Value) -> Vec<String> {
    body["response"]["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a fixture: JSON as is, YAML converted to JSON (first document).
pub fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if name.ends_with(".json") {
        serde_json::from_str(&text).expect("fixture JSON")
    } else {
        serde_yaml_ng::from_str(&text).expect("fixture YAML")
    }
}
