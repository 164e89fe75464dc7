//! Faults under load against the real `podmend serve` binary: a certificate rotated by a
//! Secret-volume symlink swap, an invalid config written over the good one, SIGTERM, and a
//! Node/LimitRange watch that is cut or keeps failing. The test plays the API server: it
//! keeps sending reviews while the fault happens and counts every answer that is not a 200.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::api_stub::ApiStub;
use common::server::{
    Options, Server, create_review, fixture, publish_version, start_knowing_nodes, write_certs,
};
use common::tls;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Concurrent senders of the load.
const SENDERS: usize = 4;

/// A TLS client that trusts every CA in `ca_pems`; `fresh_connections` makes it open a new
/// connection (a new TLS handshake) for every request.
fn client(ca_pems: &[Vec<u8>], alpn: &[u8], fresh_connections: bool) -> reqwest::Client {
    let tls = tls::client_config(tls::roots(ca_pems.iter().map(Vec::as_slice)), &[alpn]);
    let mut builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(Duration::from_secs(10));
    if fresh_connections {
        builder = builder.pool_max_idle_per_host(0);
    }
    builder.build().expect("client")
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failures: std::sync::Mutex<Vec<String>>,
    /// Set to stop sending: the test has seen what it waited for.
    stop: AtomicBool,
}

impl Tally {
    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn failures(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Sends `review` to `/mutate` from [`SENDERS`] tasks until `tally.stop`: half over HTTP/2
/// keep-alive, half over HTTP/1.1 with a new connection per request. Each answer must be a
/// 200 whose `response.patch` presence equals `patched`.
fn start_load(
    url: String,
    ca_pems: Vec<Vec<u8>>,
    review: Value,
    patched: bool,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let body = serde_json::to_vec(&review).expect("review JSON");
    (0..SENDERS)
        .map(|i| {
            let client = if i % 2 == 0 {
                client(&ca_pems, b"h2", false)
            } else {
                client(&ca_pems, b"http/1.1", true)
            };
            let (url, body, tally) = (url.clone(), body.clone(), tally.clone());
            tokio::spawn(async move {
                while !tally.stop.load(Ordering::Relaxed) {
                    let answer = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    let failure = match answer {
                        Err(error) => Some(format!("no answer: {error:?}")),
                        Ok(response) if response.status() != 200 => {
                            Some(format!("status {}", response.status()))
                        }
                        Ok(response) => match response.json::<Value>().await {
                            Err(error) => Some(format!("unreadable answer: {error}")),
                            Ok(answer) if answer["response"]["patch"].is_string() != patched => {
                                Some(format!("unexpected answer: {answer}"))
                            }
                            Ok(_) => None,
                        },
                    };
                    match failure {
                        None => {
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(failure) => tally
                            .failures
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(failure),
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect()
}

async fn stop_load(tally: &Tally, senders: Vec<tokio::task::JoinHandle<()>>) {
    tally.stop.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.await.expect("sender task");
    }
}

/// Polls the metrics port (off the async threads) until `condition` holds on `/metrics`.
async fn wait_for_metrics(server: &Server, what: &str, condition: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let metrics = server
            .metrics_get("/metrics")
            .map(|(_, m)| m)
            .unwrap_or_default();
        if condition(&metrics) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not within 15 s: {what}\n{metrics}\nlog:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A pod podmend repairs (its nodeName becomes required node affinity) once it knows the
/// node: start the server with [`start_knowing_nodes`] and [`PINNED_TO`].
fn pinned_pod_review() -> Value {
    let mut review = fixture("admissionreview-v1-pod-create-gke-kube-rs.json");
    review["request"]["object"]["spec"]["nodeName"] = json!(PINNED_TO);
    review
}

/// The node [`pinned_pod_review`] names.
const PINNED_TO: &str = "node-1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_swapped_by_symlink_under_load_fails_no_request() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let secret = scratch.path().join("secret");
    write_certs(&secret.join("..v1"));
    write_certs(&secret.join("..v2"));
    publish_version(&secret, "v1");
    let (_stub, server) = start_knowing_nodes(
        &[PINNED_TO],
        Options {
            tls_dir: Some(secret.clone()),
            ..Options::default()
        },
    )
    .await;
    // A client that trusts both CAs, as the API server does while a caBundle rotates.
    let cas: Vec<Vec<u8>> = ["..v1", "..v2"]
        .iter()
        .map(|v| std::fs::read(secret.join(v).join("ca.crt")).expect("ca.crt"))
        .collect();
    let tally = Arc::new(Tally::default());
    let senders = start_load(
        server.url("/mutate"),
        cas,
        pinned_pod_review(),
        true,
        tally.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish_version(&secret, "v2");
    wait_for_metrics(&server, "the new certificate loaded", |m| {
        m.contains("podmend_tls_reloads_total{result=\"success\"} 1")
    })
    .await;
    // Long enough for new connections to be handshaken with the new certificate.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_load(&tally, senders).await;

    assert_eq!(tally.failures(), Vec::<String>::new());
    assert!(tally.ok() > 50, "too little load: {} answers", tally.ok());
    let served = served_leaf(
        &server,
        &std::fs::read(secret.join("..v2/ca.crt")).expect("ca"),
    )
    .await;
    assert_eq!(served, tls::leaf_der_of_file(&secret.join("..v2/tls.crt")));
}

/// The leaf certificate a new TLS connection is served, verified against `ca_pem`.
async fn served_leaf(server: &Server, ca_pem: &[u8]) -> Vec<u8> {
    let config = tls::client_config(tls::roots([ca_pem]), &[b"http/1.1"]);
    let connection = tls::connect(server.webhook, config)
        .await
        .expect("handshake");
    tls::presented_leaf(&connection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_written_under_load_is_refused_and_the_old_one_keeps_serving() {
    // templates: enforce makes a Deployment's pod template repairable; the broken
    // replacement would otherwise not be noticed in the answers.
    let (_stub, server) = start_knowing_nodes(
        &["minikube"],
        Options {
            config: Some("rules:\n  node-affinity: {templates: enforce}\n".to_string()),
            ..Options::default()
        },
    )
    .await;
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let review = create_review("config", &deployment, "pinniped-concierge");
    let tally = Arc::new(Tally::default());
    let senders = start_load(
        server.url("/mutate"),
        vec![server.ca_pem()],
        review,
        true,
        tally.clone(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(
        server.config_path(),
        "rules:\n  node-affinity: {templates: sometimes}\n",
    )
    .expect("write the broken config");
    wait_for_metrics(&server, "the broken config refused", |m| {
        m.contains("podmend_config_reloads_total{result=\"error\"} 1")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_load(&tally, senders).await;

    assert_eq!(tally.failures(), Vec::<String>::new());
    assert!(tally.ok() > 50, "too little load: {} answers", tally.ok());
    let log = server.log_once(|log| log.contains("configuration not reloaded"));
    assert!(
        log.contains("configuration not reloaded, keeping the old one")
            && log.contains("templates"),
        "{log}"
    );
}

/// Sends one review over its own HTTP/1.1 connection, its body trickled in `pieces` over
/// `spread`: a request still in flight while the server shuts down. Returns the status line.
async fn trickled_request(
    addr: std::net::SocketAddr,
    ca_pem: &[u8],
    review: &Value,
    pieces: usize,
    spread: Duration,
) -> String {
    let body = serde_json::to_vec(review).expect("json");
    let config = tls::client_config(tls::roots([ca_pem]), &[b"http/1.1"]);
    let mut tls = tls::connect(addr, config).await.expect("handshake");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("send head");
    for piece in body.chunks(body.len().div_ceil(pieces)) {
        tls.write_all(piece)
            .await
            .expect("send a piece of the body");
        tls.flush().await.expect("flush");
        tokio::time::sleep(spread / pieces as u32).await;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drops_readiness_first_and_loses_no_request() {
    let (_stub, mut server) = start_knowing_nodes(
        &[PINNED_TO],
        Options {
            shutdown_delay_seconds: 2,
            ..Options::default()
        },
    )
    .await;
    let review = pinned_pod_review();
    let tally = Arc::new(Tally::default());
    let senders = start_load(
        server.url("/mutate"),
        vec![server.ca_pem()],
        review.clone(),
        true,
        tally.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // In flight across the whole shutdown: its body arrives over 3 s, longer than the delay.
    let in_flight = {
        let (addr, ca, review) = (server.webhook, server.ca_pem(), review.clone());
        tokio::spawn(async move {
            trickled_request(addr, &ca, &review, 30, Duration::from_secs(3)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let signalled = Instant::now();
    server.send_sigterm();

    // The API server keeps using the pod until the endpoints drop it; here: until /readyz
    // says no. Requests sent meanwhile must all be answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = server.metrics_get("/readyz").unwrap_or((0, String::new()));
        if status == 503 {
            assert!(body.contains("shutting down"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readiness never dropped: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let readiness_dropped = signalled.elapsed();
    stop_load(&tally, senders).await;
    // Readiness dropped first: the webhook still accepts a new connection.
    let late = client(&[server.ca_pem()], b"http/1.1", true)
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .json(&review)
        .send()
        .await
        .expect("a new connection during the shutdown delay is still served");
    assert_eq!(late.status(), 200);

    let status_line = in_flight.await.expect("in-flight task");
    assert!(
        status_line.starts_with("HTTP/1.1 200"),
        "the in-flight request got {status_line:?}\nlog:\n{}",
        server.log_text()
    );
    assert_eq!(tally.failures(), Vec::<String>::new());
    assert!(tally.ok() > 20, "too little load: {} answers", tally.ok());
    assert_eq!(
        tokio::task::spawn_blocking(move || {
            let clean = server.wait_exit(Duration::from_secs(15));
            (clean, server.log_text())
        })
        .await
        .map(|(clean, log)| {
            assert!(
                log.contains("readiness off")
                    && log.contains("no longer accepting")
                    && log.contains("stopped"),
                "{log}"
            );
            clean
        })
        .expect("wait"),
        Some(true),
        "podmend did not exit cleanly after SIGTERM"
    );
    assert!(
        readiness_dropped < Duration::from_secs(1),
        "{readiness_dropped:?}"
    );
}

/// Whether the webhook's answer for a pod pinned to `node` tolerates a taint with `key`:
/// proof that the Node cache knows the node.
async fn tolerates(server: &Server, node: &str, key: &str) -> bool {
    let mut review = fixture("admissionreview-v1-pod-create-gke-kube-rs.json");
    review["request"]["object"]["spec"]["nodeName"] = json!(node);
    let response = client(&[server.ca_pem()], b"h2", false)
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .json(&review)
        .send()
        .await
        .expect("answered");
    let status = response.status();
    let text = response.text().await.expect("the answer's body");
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not a JSON answer ({e}): HTTP {status} {text}\nlog:\n{}",
            server.log_text()
        )
    });
    let uid = review["request"]["uid"].as_str().expect("uid");
    let patch = common::k8s_rules::verify_admission_response(uid, &answer, true)
        .unwrap_or_else(|e| panic!("{e}: {answer}"));
    patch.is_some_and(|p| String::from_utf8_lossy(&p).contains(key))
}

fn tainted_node(name: &str, key: &str) -> Value {
    let mut node = fixture("cluster/node-cordoned-worker.json");
    node["metadata"]["name"] = json!(name);
    node["spec"] = json!({"taints": [{"key": key, "value": "ci", "effect": "NoSchedule"}]});
    node
}

async fn wait_for_readyz(server: &Server, status: u16, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (now, body) = server.metrics_get("/readyz").unwrap_or((0, String::new()));
        if now == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "not within 20 s: {what} (/readyz: {now} {body})\nlog:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_watch_reconnects_and_a_failing_one_turns_readiness_off_until_it_recovers() {
    let stub = ApiStub::start(
        vec![fixture("cluster/node-kubeadm-control-plane.json")],
        vec![fixture(
            "cluster/limitrange-ci-agents-container-defaults.json",
        )],
    )
    .await;
    let kubeconfig = stub.kubeconfig_path().to_path_buf();
    let server = Server::start_async(Options {
        kubeconfig: Some(kubeconfig),
        wait_ready: true,
        cache_stale_seconds: Some(1),
        ..Options::default()
    })
    .await;

    // A cut with a healthy API server: the watch resumes, readiness never drops.
    stub.cut_watches();
    stub.push_node_event(
        "ADDED",
        tainted_node("worker-after-cut", "example.com/after-cut"),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while !tolerates(&server, "worker-after-cut", "example.com/after-cut").await {
        assert_eq!(server.metrics_get("/readyz").expect("readyz").0, 200);
        assert!(
            Instant::now() < deadline,
            "the node added after the cut never reached the cache\nlog:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.metrics_get("/readyz").expect("readyz").0, 200);

    // A cut while the API server fails: not ready once the watch has failed for 1 s.
    stub.set_failing(true);
    stub.cut_watches();
    let reason = wait_for_readyz(&server, 503, "readiness off while the watch fails").await;
    assert!(reason.contains("watch has been failing"), "{reason}");
    // Reviews are still answered meanwhile, from the cache as it was.
    assert!(tolerates(&server, "worker-after-cut", "example.com/after-cut").await);

    stub.set_failing(false);
    wait_for_readyz(&server, 200, "readiness back once the API server answers").await;
    stub.push_node_event(
        "ADDED",
        tainted_node("worker-after-outage", "example.com/after-outage"),
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    while !tolerates(&server, "worker-after-outage", "example.com/after-outage").await {
        assert!(
            Instant::now() < deadline,
            "the node added after the outage never reached the cache\nlog:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = server.log_once(|log| log.contains("watch of the cluster failed"));
    assert!(log.contains("watch of the cluster failed"), "{log}");
}
