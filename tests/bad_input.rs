//! The bad-input catalog, against the real `podmend serve` over real TLS: each input an API
//! server never sends gets a clear answer (a 4xx whose one line says what was wrong and what
//! to do, or a closed connection where HTTP says so), is counted by a metric, and leaves the
//! server healthy (`/healthz` and a good review still answered). TLS-level cases (old
//! versions, cipher suites, ALPN, client certificates) are in `tls_security.rs`.

mod common;

use std::time::{Duration, Instant};

use common::k8s_rules;
use common::server::{Options, Server, fixture};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const H1: &[&[u8]] = &[b"http/1.1"];
const H2: &[&[u8]] = &[b"h2"];
const MIB: usize = 1024 * 1024;
/// `MAX_BODY_BYTES` of the server.
const LIMIT: usize = 8 * MIB;
/// The server's header, handshake and body read timeouts.
const TIMEOUT: Duration = Duration::from_secs(10);

fn good_review() -> Value {
    fixture("admissionreview-v1-pod-create-gke-kube-rs.json")
}

/// The sum of every series whose line starts with `series` (a name, or a name and labels).
fn metric(server: &Server, series: &str) -> u64 {
    let (status, text) = server.metrics_get("/metrics").expect("metrics answered");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

/// Asserts that `series` reaches exactly `expected`, waiting up to 5 s for it: a connection's
/// own counters (its errors, its handshake's failure) are recorded as the server finishes with
/// it, which can be just after the client has seen it closed.
async fn assert_counted(server: &Server, series: &str, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut value = metric(server, series);
    while value < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        value = metric(server, series);
    }
    assert_eq!(value, expected, "{series}");
}

fn bad_requests(reason: &str) -> String {
    format!("podmend_bad_requests_total{{reason=\"{reason}\"}}")
}

/// `/healthz` answers and a good review gets a verified 200: the server survived.
async fn assert_healthy(server: &Server, alpn: &[&[u8]], after: &str) {
    let (status, _) = server.metrics_get("/healthz").expect("healthz answered");
    assert_eq!(status, 200, "/healthz after {after}");
    let review = good_review();
    let response = server
        .client(alpn)
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .json(&review)
        .send()
        .await
        .unwrap_or_else(|e| panic!("a good review after {after} is not answered: {e}"));
    assert_eq!(response.status().as_u16(), 200, "good review after {after}");
    let body: Value = response.json().await.expect("JSON answer");
    let uid = review["request"]["uid"].as_str().expect("uid");
    k8s_rules::verify_admission_response(uid, &body, true)
        .unwrap_or_else(|e| panic!("good review after {after}: {e}: {body}"));
}

/// One catalog entry sent with an ordinary HTTP client.
struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    /// A fragment of the one-line answer (the whole body for 4xx answers).
    fragment: &'static str,
    /// The series counted once per request.
    metric: String,
}

fn review_bytes(review: &Value) -> Vec<u8> {
    serde_json::to_vec(review).expect("json")
}

/// The GKE pod review with `edit` applied to it.
fn edited(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut review = good_review();
    edit(&mut review);
    review_bytes(&review)
}

fn nested_arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A review whose object nests `depth` arrays: valid JSON, too deep to build.
fn deep_object_review(depth: usize) -> Vec<u8> {
    let envelope = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","#;
    let request = r#""request":{"uid":"u","operation":"CREATE","object":{"x":"#;
    format!("{envelope}{request}{}}}}}}}", nested_arrays(depth)).into_bytes()
}

/// The typical review, its object's `metadata.managedFields` nesting `depth` arrays.
fn deep_managed_fields_review(depth: usize) -> Vec<u8> {
    let body = String::from_utf8(review_bytes(&good_review())).expect("a review is UTF-8");
    let metadata = r#""metadata":{"#;
    let at = body.find(metadata).expect("the object has metadata") + metadata.len();
    let (before, after) = body.split_at(at);
    format!(
        r#"{before}"managedFields":{},{after}"#,
        nested_arrays(depth)
    )
    .into_bytes()
}

fn huge_container_name() -> Vec<u8> {
    edited(|r| r["request"]["object"]["spec"]["containers"][0]["name"] = json!("c".repeat(2 * MIB)))
}

fn huge_annotation() -> Vec<u8> {
    edited(|r| {
        r["request"]["object"]["metadata"]["annotations"] =
            json!({"example.com/blob": "a".repeat(2 * MIB)})
    })
}

fn catalog() -> Vec<Case> {
    let post = |name, content_type, body, status, fragment, metric| Case {
        name,
        method: "POST",
        path: "/mutate",
        content_type,
        body,
        status,
        fragment,
        metric,
    };
    let json = Some("application/json");
    let admitted = "podmend_admission_requests_total{webhook=\"mutate\"".to_string();
    vec![
        post(
            "malformed JSON",
            json,
            b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": ".to_vec(),
            400,
            "body is not valid JSON",
            bad_requests("not-json"),
        ),
        post(
            "JSON that is not an object",
            json,
            b"[1, 2, 3]".to_vec(),
            400,
            "body is not an AdmissionReview",
            bad_requests("not-a-review"),
        ),
        post(
            "an object that is not an AdmissionReview",
            json,
            br#"{"hello": "world"}"#.to_vec(),
            400,
            "body is not an AdmissionReview: it has no apiVersion",
            bad_requests("not-a-review"),
        ),
        post(
            "another kind in the admission API group",
            json,
            br#"{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}"#.to_vec(),
            400,
            "kind \"Pod\" is not AdmissionReview; send an admission.k8s.io/v1 AdmissionReview",
            bad_requests("not-a-review"),
        ),
        post(
            "a v1beta1 review",
            json,
            edited(|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            400,
            "set admissionReviewVersions: [v1]",
            bad_requests("unsupported-version"),
        ),
        post(
            "a review without request",
            json,
            br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#.to_vec(),
            400,
            "AdmissionReview has no request",
            bad_requests("missing-request"),
        ),
        post(
            "a review whose request has no uid",
            json,
            edited(|r| {
                r["request"].as_object_mut().expect("request").remove("uid");
            }),
            400,
            "request has no uid",
            bad_requests("missing-uid"),
        ),
        post(
            "a review with an unknown operation",
            json,
            edited(|r| r["request"]["operation"] = json!("PATCH")),
            400,
            "is not one of CREATE, UPDATE, DELETE, CONNECT",
            bad_requests("unknown-operation"),
        ),
        // Decodable: answered in-band, allowed without a patch (the engine skips it as
        // `no-object`); refusing would only block an API server that cannot send it anyway.
        post(
            "object: null on CREATE",
            json,
            edited(|r| r["request"]["object"] = Value::Null),
            200,
            "\"allowed\":true",
            admitted.clone(),
        ),
        post(
            "a wrong content type",
            Some("text/plain"),
            review_bytes(&good_review()),
            415,
            "content type must be application/json",
            bad_requests("content-type"),
        ),
        post(
            "a JSON-patch content type",
            Some("application/json-patch+json"),
            review_bytes(&good_review()),
            415,
            "content type must be application/json",
            bad_requests("content-type"),
        ),
        post(
            "no content type",
            None,
            review_bytes(&good_review()),
            415,
            "content type must be application/json",
            bad_requests("content-type"),
        ),
        post(
            "a wrong content type on a body over the limit (refused before it is read)",
            Some("text/plain"),
            vec![b' '; LIMIT + MIB],
            415,
            "content type must be application/json",
            bad_requests("content-type"),
        ),
        post(
            "a body over the limit",
            json,
            vec![b' '; LIMIT + 1],
            413,
            "body is larger than 8388608 bytes",
            bad_requests("too-large"),
        ),
        post(
            "deeply nested JSON (100,000 arrays)",
            json,
            nested_arrays(100_000).into_bytes(),
            400,
            "body is not an AdmissionReview",
            bad_requests("not-a-review"),
        ),
        // Skipped without being built (serde_json skips iteratively), so not refused.
        post(
            "deeply nested JSON in a field podmend does not read",
            json,
            {
                let mut body = review_bytes(&good_review());
                assert_eq!(body.pop(), Some(b'}'));
                body.extend_from_slice(format!(r#","x":{}}}"#, nested_arrays(100_000)).as_bytes());
                body
            },
            200,
            "\"allowed\":true",
            admitted.clone(),
        ),
        // No path builds managedFields (the whole parse drops it unread), so not refused.
        post(
            "deeply nested JSON in the object's managedFields",
            json,
            deep_managed_fields_review(100_000),
            200,
            "\"allowed\":true",
            admitted.clone(),
        ),
        post(
            "deeply nested JSON inside the object",
            json,
            deep_object_review(10_000),
            400,
            "body nests JSON deeper than 128 levels",
            bad_requests("too-deep"),
        ),
        post(
            "a 2 MiB container name",
            json,
            huge_container_name(),
            200,
            "\"allowed\":true",
            admitted.clone(),
        ),
        post(
            "a 2 MiB annotation value",
            json,
            huge_annotation(),
            200,
            "\"allowed\":true",
            admitted.clone(),
        ),
        Case {
            name: "GET instead of POST",
            method: "GET",
            path: "/mutate",
            content_type: None,
            body: Vec::new(),
            status: 405,
            fragment: "the webhook takes POST with an admission.k8s.io/v1 AdmissionReview",
            metric: bad_requests("method"),
        },
        Case {
            name: "PUT instead of POST",
            method: "PUT",
            path: "/validate",
            content_type: json,
            body: review_bytes(&good_review()),
            status: 405,
            fragment: "the webhook takes POST",
            metric: bad_requests("method"),
        },
        Case {
            name: "an unknown path",
            method: "POST",
            path: "/admit",
            content_type: json,
            body: review_bytes(&good_review()),
            status: 404,
            fragment: "no such path: the webhook serves POST /mutate and POST /validate",
            metric: bad_requests("unknown-path"),
        },
        Case {
            name: "a probe path on the webhook port",
            method: "GET",
            path: "/healthz",
            content_type: None,
            body: Vec::new(),
            status: 404,
            fragment: "are served on the metrics port",
            metric: bad_requests("unknown-path"),
        },
    ]
}

#[tokio::test]
async fn every_catalog_request_gets_its_answer_and_metric_and_leaves_the_server_healthy() {
    let server = Server::start(Options::default());
    for (protocol, alpn) in [("HTTP/1.1", H1), ("HTTP/2", H2)] {
        let client = server.client(alpn);
        for case in catalog() {
            let label = format!("{} over {protocol}", case.name);
            let before = metric(&server, &case.metric);
            let method = reqwest::Method::from_bytes(case.method.as_bytes()).expect("method");
            let mut request = client
                .request(method, server.url(case.path))
                .body(case.body.clone());
            if let Some(content_type) = case.content_type {
                request = request.header("content-type", content_type);
            }
            let response = request
                .send()
                .await
                .unwrap_or_else(|e| panic!("{label}: no answer: {e:?}"));
            let status = response.status().as_u16();
            let allow = response.headers().get("allow").cloned();
            let text = response.text().await.expect("answer body");
            assert_eq!(status, case.status, "{label}: {text}");
            assert!(text.contains(case.fragment), "{label}: {text}");
            if status >= 400 {
                assert_eq!(text.lines().count(), 1, "{label}: one line: {text}");
                assert!(text.len() < 300, "{label}: short: {text}");
            }
            if status == 405 {
                assert_eq!(allow.as_ref().map(|v| v.as_bytes()), Some(&b"POST"[..]));
            }
            assert_eq!(
                metric(&server, &case.metric),
                before + 1,
                "{label}: {} counts it",
                case.metric
            );
            assert_healthy(&server, alpn, &label).await;
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Raw connections: what an HTTP client library would not send
// ------------------------------------------------------------------------------------------------

/// A TLS connection that trusts only the server's CA, offering `alpn`.
async fn tls(server: &Server, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    server.connect_tls(alpn).await
}

/// How a read of everything the server sent ended.
#[derive(Debug, PartialEq)]
enum End {
    /// The server closed the connection (with or without a TLS close_notify).
    Closed,
    /// Still open when the time was up.
    StillOpen,
}

/// Reads until the server closes or `within` passes.
async fn read_all<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> (Vec<u8>, End) {
    let mut received = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return (received, End::StillOpen),
            Ok(Ok(0)) => return (received, End::Closed),
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
            // rustls reports a TCP close without close_notify as an error.
            Ok(Err(_)) => return (received, End::Closed),
        }
    }
}

/// The status and body of the first HTTP/1.1 response in `bytes`.
fn parse_response(bytes: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(bytes);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP/1.1 response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

fn head(content_length: usize, extra: &str) -> String {
    format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {content_length}\r\n{extra}\r\n"
    )
}

#[tokio::test]
async fn plain_http_to_the_tls_port_gets_a_plain_http_400_saying_so_and_is_counted() {
    let server = Server::start(Options::default());
    let counted = "podmend_tls_handshake_failures_total{reason=\"plain-http\"}";
    let body = review_bytes(&good_review());
    for request in [
        format!("{}{}", head(body.len(), ""), String::from_utf8_lossy(&body)),
        "GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n".to_string(),
    ] {
        let before = metric(&server, counted);
        let mut tcp = TcpStream::connect(server.webhook).await.expect("connect");
        tcp.write_all(request.as_bytes()).await.expect("send");
        let (answer, end) = read_all(&mut tcp, Duration::from_secs(5)).await;
        assert_eq!(end, End::Closed, "the server closes after answering");
        let (status, text) = parse_response(&answer);
        assert_eq!(status, 400, "{text}");
        assert!(
            text.contains("this port speaks HTTPS (TLS), not plain HTTP: use an https:// URL"),
            "{text}"
        );
        assert_counted(&server, counted, before + 1).await;
    }
    assert_healthy(&server, H1, "plain HTTP").await;
}

#[tokio::test]
async fn headers_sent_slower_than_the_timeout_are_cut_off_without_an_answer_and_counted() {
    let server = Server::start(Options::default());
    let counted = "podmend_connection_errors_total{reason=\"header-timeout\"}";
    let before = metric(&server, counted);

    // In time: the whole head byte by byte over about 2 s, then the body.
    let body = review_bytes(&good_review());
    let request_head = head(body.len(), "");
    let mut stream = tls(&server, H1).await;
    let pause = Duration::from_secs(2) / request_head.len() as u32;
    for byte in request_head.bytes() {
        stream.write_all(&[byte]).await.expect("send a byte");
        stream.flush().await.expect("flush");
        tokio::time::sleep(pause).await;
    }
    stream.write_all(&body).await.expect("send body");
    let mut answer = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    assert_eq!(parse_response(&answer[..n]).0, 200);

    // Too slow: one byte every 500 ms; the head is not complete after the 10 s timeout.
    let mut stream = tls(&server, H1).await;
    let started = Instant::now();
    let slow = request_head.clone();
    let writer = async {
        for byte in slow.bytes() {
            if stream.write_all(&[byte]).await.is_err() || stream.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            if started.elapsed() > TIMEOUT + Duration::from_secs(5) {
                break;
            }
        }
        stream
    };
    let mut stream = writer.await;
    let (received, end) = read_all(&mut stream, Duration::from_secs(1)).await;
    let elapsed = started.elapsed();
    assert_eq!(end, End::Closed, "cut off after {elapsed:?}");
    assert!(
        received.is_empty(),
        "hyper closes without an answer: {:?}",
        String::from_utf8_lossy(&received)
    );
    assert!(
        elapsed >= TIMEOUT && elapsed < TIMEOUT + Duration::from_secs(4),
        "cut off after {elapsed:?}"
    );
    assert_counted(&server, counted, before + 1).await;
    assert_healthy(&server, H1, "a slow header").await;
}

#[tokio::test]
async fn silent_connections_are_dropped_after_the_timeouts_and_counted() {
    let server = Server::start(Options::default());
    let handshake = "podmend_tls_handshake_failures_total{reason=\"timeout\"}";
    let header = "podmend_connection_errors_total{reason=\"header-timeout\"}";
    let (handshakes, headers) = (metric(&server, handshake), metric(&server, header));
    let started = Instant::now();
    // TCP only, never a ClientHello; TLS done, never a request, over HTTP/1.1 and HTTP/2
    // (where the server speaks first: its SETTINGS frame).
    let mut tcp = TcpStream::connect(server.webhook).await.expect("connect");
    let mut h1 = tls(&server, H1).await;
    let mut h2 = tls(&server, H2).await;
    let within = TIMEOUT + Duration::from_secs(4);
    let ((tcp_bytes, tcp_end), (h1_bytes, h1_end), (_, h2_end)) = tokio::join!(
        read_all(&mut tcp, within),
        read_all(&mut h1, within),
        read_all(&mut h2, within),
    );
    let elapsed = started.elapsed();
    assert_eq!(
        [tcp_end, h1_end, h2_end],
        [End::Closed, End::Closed, End::Closed]
    );
    assert!(tcp_bytes.is_empty() && h1_bytes.is_empty());
    assert!(elapsed >= TIMEOUT, "{elapsed:?}");
    assert_counted(&server, handshake, handshakes + 1).await;
    assert_counted(&server, header, headers + 2).await;
    assert_healthy(&server, H2, "silent connections").await;
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_gets_400_or_408_and_is_counted() {
    let server = Server::start(Options::default());

    // Shut after 20 bytes: the server reads the end of the stream and says what was missing.
    let unreadable = bad_requests("unreadable");
    let before = metric(&server, &unreadable);
    let mut stream = tls(&server, H1).await;
    stream
        .write_all(format!("{}{{\"apiVersion\": \"adm", head(1000, "")).as_bytes())
        .await
        .expect("send");
    stream.shutdown().await.expect("close the sending side");
    let (answer, end) = read_all(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(end, End::Closed);
    let (status, text) = parse_response(&answer);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("cannot read the body"), "{text}");
    assert!(
        text.contains("as long as its Content-Length says"),
        "{text}"
    );
    assert_eq!(metric(&server, &unreadable), before + 1);

    // Stall after 20 bytes: 408 once the body read timeout is up.
    let timeout = bad_requests("body-timeout");
    let before = metric(&server, &timeout);
    let mut stream = tls(&server, H1).await;
    let started = Instant::now();
    stream
        .write_all(format!("{}{{\"apiVersion\": \"adm", head(1000, "")).as_bytes())
        .await
        .expect("send");
    let (answer, _) = read_all(&mut stream, TIMEOUT + Duration::from_secs(4)).await;
    let elapsed = started.elapsed();
    let (status, text) = parse_response(&answer);
    assert_eq!(status, 408, "{text}");
    assert!(
        text.contains("the body did not arrive within 10 s"),
        "{text}"
    );
    assert!(elapsed >= TIMEOUT, "{elapsed:?}");
    assert_eq!(metric(&server, &timeout), before + 1);
    assert_healthy(&server, H1, "short bodies").await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_whether_announced_chunked_or_expecting_continue()
{
    let server = Server::start(Options::default());
    let too_large = bad_requests("too-large");

    // Chunked, no length announced: refused once 8 MiB have arrived; the client still
    // sends its last chunks and then reads the answer (the server reads and drops them).
    let before = metric(&server, &too_large);
    let mut stream = tls(&server, H1).await;
    stream
        .write_all(
            b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
              transfer-encoding: chunked\r\n\r\n",
        )
        .await
        .expect("send head");
    let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, " ".repeat(64 * 1024));
    for _ in 0..(LIMIT + MIB) / (64 * 1024) {
        stream
            .write_all(chunk.as_bytes())
            .await
            .expect("send a chunk");
    }
    stream.write_all(b"0\r\n\r\n").await.expect("last chunk");
    let (answer, _) = read_all(&mut stream, Duration::from_secs(3)).await;
    let (status, text) = parse_response(&answer);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("body is larger than 8388608 bytes"), "{text}");
    assert_eq!(metric(&server, &too_large), before + 1);

    // Announced with `Expect: 100-continue`: refused at once, the body never sent.
    let before = metric(&server, &too_large);
    let mut stream = tls(&server, H1).await;
    stream
        .write_all(head(LIMIT + 1, "expect: 100-continue\r\n").as_bytes())
        .await
        .expect("send head");
    let (answer, end) = read_all(&mut stream, Duration::from_secs(3)).await;
    assert_eq!(end, End::Closed);
    let (status, text) = parse_response(&answer);
    assert_eq!(status, 413, "{text}");
    assert_eq!(metric(&server, &too_large), before + 1);
    assert_healthy(&server, H1, "bodies over the limit").await;
}

#[tokio::test]
async fn a_malformed_request_head_gets_hypers_400_and_is_counted() {
    let server = Server::start(Options::default());
    let counted = "podmend_connection_errors_total{reason=\"malformed-http\"}";
    let before = metric(&server, counted);
    let mut stream = tls(&server, H1).await;
    stream
        .write_all(b"POST /mutate HTTP/1.1\r\nhost localhost\r\n\r\n")
        .await
        .expect("send");
    let (answer, end) = read_all(&mut stream, Duration::from_secs(3)).await;
    assert_eq!(end, End::Closed);
    // hyper answers a head it cannot parse itself, with an empty body.
    assert_eq!(parse_response(&answer).0, 400);
    assert_counted(&server, counted, before + 1).await;
    assert_healthy(&server, H1, "a malformed head").await;
}

// ------------------------------------------------------------------------------------------------
// Memory
// ------------------------------------------------------------------------------------------------

/// The server's pid: the process whose command line names this server's own temporary
/// directory.
fn pid_of(server: &Server) -> u32 {
    let marker = server.dir.path().to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.get(1).is_some_and(|a| a == "serve") && args.iter().any(|a| a.contains(&marker))
        })
        .expect("the podmend serve process")
}

/// (VmRSS, VmHWM) in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {status}"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test]
async fn memory_stays_bounded_over_repeated_huge_and_deep_requests() {
    let server = Server::start(Options::default());
    let pid = pid_of(&server);
    assert_healthy(&server, H1, "start").await;
    let (rss_start, _) = memory_kib(pid);
    let huge: Vec<Vec<u8>> = vec![
        huge_container_name(),
        huge_annotation(),
        nested_arrays(100_000).into_bytes(),
        vec![b' '; LIMIT + 1],
        {
            // Just under the limit: a valid review padded with whitespace.
            let mut body = review_bytes(&good_review());
            body.resize(LIMIT - 16, b' ');
            body
        },
    ];
    let client = server.client(H2);
    let mut peaks = Vec::new();
    for round in 0..5 {
        // Four at a time, as several API server connections would.
        let sends = huge.iter().cycle().skip(round).take(4).map(|body| {
            client
                .post(server.url("/mutate"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
        });
        for response in futures::future::join_all(sends).await {
            let status = response.expect("answered").status().as_u16();
            assert!([200, 400, 413].contains(&status), "{status}");
        }
        peaks.push(memory_kib(pid));
    }
    assert_healthy(&server, H1, "huge requests").await;
    let (rss_end, hwm) = memory_kib(pid);
    eprintln!(
        "RSS at start {rss_start} KiB, after each round {peaks:?} (RSS, peak), \
         at end {rss_end} KiB, peak {hwm} KiB"
    );
    // Four 8 MiB bodies in flight, each with its parsed tree: under 128 MiB at peak (about
    // 60 MiB measured), and what stays afterwards is allocator caching, not growth per request.
    assert!(hwm < 128 * 1024, "peak RSS {hwm} KiB");
    let (rss_round_one, _) = peaks[0];
    assert!(
        rss_end < rss_round_one + 64 * 1024,
        "RSS grew from {rss_round_one} KiB after the first round to {rss_end} KiB"
    );
}
