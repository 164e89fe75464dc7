//! The webhook's TLS security against the real `podmend serve`: only TLS 1.3 and 1.2, only
//! ECDHE key exchange with AEAD ciphers, ALPN h2/http1.1 or nothing, and with `--client-ca`
//! only clients holding a certificate from that CA. rustls cannot speak TLS 1.0 or offer
//! weak suites, so those ClientHellos are built by hand here and the server's alert record
//! is read back. Also: the info-level log never carries an object's contents.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::net::free_port;
use common::server::{Options, Server, create_review, fixture, serve_command_in, write_certs};
use common::tls::{self, Identity};
use podmend::server::tls::{CIPHER_SUITES, is_accepted_suite};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::{AlertDescription, ProtocolVersion};
use rustls_pki_types::PrivateKeyDer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

fn handshake_failures(reason: &str) -> String {
    format!("podmend_tls_handshake_failures_total{{reason=\"{reason}\"}}")
}

/// A plain-HTTP client for the metrics port (reqwest wants a TLS setup even so).
fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls::client_config(tls::roots([]), &[]))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// The value of one series on a metrics port (0 when absent).
/// The series once it reads `expected`, or what it reads after 5 s: the server counts a
/// failed handshake after it has sent the alert the client reads, so a count read right after
/// the client's last alert may not include it yet.
async fn metric_once(metrics: SocketAddr, series: &str, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let value = metric(metrics, series).await;
        if value == expected || Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metric(metrics: SocketAddr, series: &str) -> u64 {
    let text = plain_client()
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .expect("metrics answered")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

// ------------------------------------------------------------------------------------------------
// Hand-made ClientHellos
// ------------------------------------------------------------------------------------------------

const TLS10: u16 = 0x0301;
const TLS11: u16 = 0x0302;
const TLS12: u16 = 0x0303;
/// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: what a good TLS 1.2 client offers (the dev
/// certificate's key is ECDSA P-256).
const ECDHE_ECDSA_AES128_GCM: u16 = 0xc02b;

/// What a ClientHello says about itself.
struct Hello<'a> {
    /// The record layer's version (old clients put their own version here).
    record_version: u16,
    /// `legacy_version`, the only version a pre-TLS-1.3 client sends.
    client_version: u16,
    cipher_suites: &'a [u16],
    /// The `supported_versions` extension, when sent.
    supported_versions: Option<&'a [u16]>,
    /// Whether `signature_algorithms` is sent (it came with TLS 1.2; older clients omit it).
    signature_algorithms: bool,
    alpn: &'a [&'a [u8]],
}

impl Default for Hello<'_> {
    fn default() -> Self {
        Hello {
            record_version: TLS10,
            client_version: TLS12,
            cipher_suites: &[ECDHE_ECDSA_AES128_GCM],
            supported_versions: None,
            signature_algorithms: true,
            alpn: &[],
        }
    }
}

fn u16_len_prefixed(out: &mut Vec<u8>, content: &[u8]) {
    out.extend_from_slice(&(content.len() as u16).to_be_bytes());
    out.extend_from_slice(content);
}

fn extension(out: &mut Vec<u8>, kind: u16, content: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    u16_len_prefixed(out, content);
}

/// A ClientHello in one handshake record (RFC 5246 §7.4.1.2, RFC 8446 §4.1.2).
fn client_hello(hello: &Hello) -> Vec<u8> {
    let mut body = Vec::new();
    // client_version (legacy_version in TLS 1.3)
    body.extend_from_slice(&hello.client_version.to_be_bytes());
    // random: 32 bytes
    body.extend_from_slice(&[0x5a; 32]);
    // session_id: empty
    body.push(0);
    // cipher_suites: u16 length, then two bytes per suite
    let suites: Vec<u8> = hello
        .cipher_suites
        .iter()
        .flat_map(|s| s.to_be_bytes())
        .collect();
    u16_len_prefixed(&mut body, &suites);
    // compression_methods: one, null
    body.extend_from_slice(&[1, 0]);

    let mut extensions = Vec::new();
    // server_name: a list holding one host_name (type 0)
    let name = b"localhost";
    let mut server_name = vec![0];
    u16_len_prefixed(&mut server_name, name);
    let mut list = Vec::new();
    u16_len_prefixed(&mut list, &server_name);
    extension(&mut extensions, 0x0000, &list);
    // supported_groups: x25519, secp256r1, secp384r1
    let mut groups = Vec::new();
    u16_len_prefixed(&mut groups, &[0x00, 0x1d, 0x00, 0x17, 0x00, 0x18]);
    extension(&mut extensions, 0x000a, &groups);
    // ec_point_formats: uncompressed
    extension(&mut extensions, 0x000b, &[1, 0]);
    // signature_algorithms: ecdsa_secp256r1_sha256, ecdsa_secp384r1_sha384,
    // rsa_pss_rsae_sha256, rsa_pkcs1_sha256
    if hello.signature_algorithms {
        let mut schemes = Vec::new();
        u16_len_prefixed(
            &mut schemes,
            &[0x04, 0x03, 0x05, 0x03, 0x08, 0x04, 0x04, 0x01],
        );
        extension(&mut extensions, 0x000d, &schemes);
    }
    // extended_master_secret: empty
    extension(&mut extensions, 0x0017, &[]);
    // renegotiation_info: an empty renegotiated_connection
    extension(&mut extensions, 0xff01, &[0]);
    // application_layer_protocol_negotiation: u16 list length, u8-prefixed names
    if !hello.alpn.is_empty() {
        let mut names = Vec::new();
        for protocol in hello.alpn {
            names.push(protocol.len() as u8);
            names.extend_from_slice(protocol);
        }
        let mut alpn = Vec::new();
        u16_len_prefixed(&mut alpn, &names);
        extension(&mut extensions, 0x0010, &alpn);
    }
    // supported_versions: u8 length, two bytes per version
    if let Some(versions) = hello.supported_versions {
        let mut list = vec![(versions.len() * 2) as u8];
        list.extend(versions.iter().flat_map(|v| v.to_be_bytes()));
        extension(&mut extensions, 0x002b, &list);
    }
    u16_len_prefixed(&mut body, &extensions);

    // Handshake header: type 1 (client_hello), u24 length.
    let mut handshake = vec![1];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    // Record header: type 22 (handshake), version, u16 length.
    let mut record = vec![0x16];
    record.extend_from_slice(&hello.record_version.to_be_bytes());
    u16_len_prefixed(&mut record, &handshake);
    record
}

/// The first thing the server answers to a ClientHello.
#[derive(Debug, PartialEq)]
enum Reply {
    /// A fatal alert: its description code.
    FatalAlert(AlertDescription),
    /// A ServerHello: the version and cipher suite it chose.
    ServerHello { version: u16, suite: u16 },
}

async fn send_hello(server: SocketAddr, hello: &Hello<'_>) -> Reply {
    let mut tcp = TcpStream::connect(server).await.expect("connect");
    tcp.write_all(&client_hello(hello))
        .await
        .expect("send ClientHello");
    let mut header = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut header))
        .await
        .expect("the server answers within 5 s")
        .expect("a record header");
    let length = u16::from_be_bytes([header[3], header[4]]) as usize;
    let mut payload = vec![0u8; length];
    tcp.read_exact(&mut payload).await.expect("the record");
    match header[0] {
        0x15 => {
            assert_eq!(payload.len(), 2, "alert record {payload:?}");
            assert_eq!(payload[0], 2, "alert level is fatal: {payload:?}");
            Reply::FatalAlert(AlertDescription::from(payload[1]))
        }
        0x16 => {
            assert_eq!(payload[0], 2, "handshake type is ServerHello: {payload:?}");
            let version = u16::from_be_bytes([payload[4], payload[5]]);
            let session_id = payload[38] as usize;
            let at = 39 + session_id;
            let suite = u16::from_be_bytes([payload[at], payload[at + 1]]);
            Reply::ServerHello { version, suite }
        }
        other => panic!("unexpected record type {other:#x}"),
    }
}

#[tokio::test]
async fn tls_1_0_and_1_1_hellos_get_a_protocol_version_or_handshake_failure_alert_and_are_counted()
{
    let server = Server::start(Options::default());
    let counted = handshake_failures("protocol-version");
    let before = metric(server.metrics, &counted).await;
    // With signature_algorithms (which came with TLS 1.2), the version is what rustls
    // refuses: protocol_version.
    let old = [
        ("TLS 1.0", TLS10, TLS10, None),
        ("TLS 1.1", TLS11, TLS11, None),
        ("SSL 3.0", 0x0300, 0x0300, None),
        (
            "TLS 1.1 and 1.0 in supported_versions",
            TLS10,
            TLS12,
            Some(&[TLS11, TLS10][..]),
        ),
    ];
    for (name, record_version, client_version, supported_versions) in old {
        let hello = Hello {
            record_version,
            client_version,
            supported_versions,
            ..Hello::default()
        };
        assert_eq!(
            send_hello(server.webhook, &hello).await,
            Reply::FatalAlert(AlertDescription::ProtocolVersion),
            "{name}"
        );
    }
    // As real TLS 1.0/1.1 clients send them (OpenSSL's `s_client -tls1_1`), without
    // signature_algorithms: rustls refuses that first, with handshake_failure.
    for version in [TLS10, TLS11] {
        let hello = Hello {
            client_version: version,
            signature_algorithms: false,
            cipher_suites: &[0xc009, 0xc013, 0x002f, 0x0035],
            ..Hello::default()
        };
        assert_eq!(
            send_hello(server.webhook, &hello).await,
            Reply::FatalAlert(AlertDescription::HandshakeFailure),
            "{version:#x}"
        );
    }
    // The same builder with TLS 1.2 is answered: the alerts are about the version.
    assert_eq!(
        send_hello(server.webhook, &Hello::default()).await,
        Reply::ServerHello {
            version: TLS12,
            suite: ECDHE_ECDSA_AES128_GCM
        }
    );
    let expected = before + old.len() as u64 + 2;
    assert_eq!(
        metric_once(server.metrics, &counted, expected).await,
        expected
    );
    assert_eq!(server.metrics_get("/healthz").expect("healthz").0, 200);
}

#[tokio::test]
async fn tls12_suites_without_ecdhe_or_aead_get_a_handshake_failure_alert_and_are_counted() {
    let server = Server::start(Options::default());
    let counted = handshake_failures("cipher-suite");
    let before = metric(server.metrics, &counted).await;
    let weak: [(&str, &[u16]); 6] = [
        (
            "static RSA key exchange, even with GCM",
            &[0x009c, 0x009d, 0x002f, 0x0035],
        ),
        ("ECDHE with CBC", &[0xc009, 0xc00a, 0xc023, 0xc013, 0xc027]),
        ("finite-field DHE with GCM", &[0x009e, 0x009f]),
        ("RC4 and 3DES", &[0xc007, 0xc011, 0x000a, 0xc008]),
        ("NULL ciphers", &[0x0000, 0xc006, 0x003b]),
        ("export and anonymous", &[0x0003, 0x0018, 0xc018]),
    ];
    for (name, suites) in weak {
        let hello = Hello {
            cipher_suites: suites,
            ..Hello::default()
        };
        assert_eq!(
            send_hello(server.webhook, &hello).await,
            Reply::FatalAlert(AlertDescription::HandshakeFailure),
            "{name}"
        );
    }
    // Offered last, after weak ones, an ECDHE AEAD suite is the one chosen.
    for good in [ECDHE_ECDSA_AES128_GCM, 0xc02c, 0xcca9] {
        let hello = Hello {
            cipher_suites: &[0x002f, 0xc013, 0x009e, good],
            ..Hello::default()
        };
        assert_eq!(
            send_hello(server.webhook, &hello).await,
            Reply::ServerHello {
                version: TLS12,
                suite: good
            }
        );
    }
    let expected = before + weak.len() as u64;
    assert_eq!(
        metric_once(server.metrics, &counted, expected).await,
        expected
    );
}

#[tokio::test]
async fn an_offer_of_only_unknown_alpn_protocols_gets_a_no_application_protocol_alert() {
    let server = Server::start(Options::default());
    let counted = handshake_failures("alpn");
    let before = metric(server.metrics, &counted).await;
    let hello = Hello {
        alpn: &[b"spdy/3.1", b"h3"],
        ..Hello::default()
    };
    assert_eq!(
        send_hello(server.webhook, &hello).await,
        Reply::FatalAlert(AlertDescription::NoApplicationProtocol)
    );
    // A TLS 1.3 client reads the same alert.
    let error = rustls_connect(&server, &[b"spdy/3.1"], None, None)
        .await
        .expect_err("refused");
    assert!(
        alert_in(&error) == Some(AlertDescription::NoApplicationProtocol),
        "{error}"
    );
    assert_eq!(
        metric_once(server.metrics, &counted, before + 2).await,
        before + 2
    );
    // No ALPN at all is HTTP/1.1; a known protocol among unknown ones is chosen.
    for (alpn, chosen) in [
        (&[][..], None),
        (&[&b"spdy/3.1"[..], b"http/1.1"][..], Some(&b"http/1.1"[..])),
    ] {
        let tls = rustls_connect(&server, alpn, None, None)
            .await
            .expect("connected");
        assert_eq!(tls.get_ref().1.alpn_protocol(), chosen);
    }
    let response = server
        .client(&[])
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .json(&fixture("admissionreview-v1-pod-create-gke-kube-rs.json"))
        .send()
        .await
        .expect("answered without ALPN");
    assert_eq!(response.status().as_u16(), 200);
}

/// A rustls client trusting the server's CA; TLS 1.3 and 1.2 unless `versions` says, with a
/// client certificate when `identity` is given.
async fn rustls_connect(
    server: &Server,
    alpn: &[&[u8]],
    versions: Option<&[&'static rustls::SupportedProtocolVersion]>,
    identity: Option<&Identity>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    rustls_connect_to(server.webhook, &server.ca_pem(), alpn, versions, identity).await
}

async fn rustls_connect_to(
    address: SocketAddr,
    ca_pem: &[u8],
    alpn: &[&[u8]],
    versions: Option<&[&'static rustls::SupportedProtocolVersion]>,
    identity: Option<&Identity>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = tls::client_config_with(tls::roots([ca_pem]), versions, identity, alpn);
    tls::connect(address, config).await
}

/// The alert the server sent, if that is why `error` happened.
fn alert_in(error: &std::io::Error) -> Option<AlertDescription> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(alert) => Some(*alert),
        _ => None,
    }
}

#[tokio::test]
async fn tls13_and_tls12_clients_get_an_ecdhe_aead_suite() {
    let server = Server::start(Options::default());
    for (versions, expected) in [
        (&[&rustls::version::TLS13][..], ProtocolVersion::TLSv1_3),
        (&[&rustls::version::TLS12][..], ProtocolVersion::TLSv1_2),
    ] {
        let tls = rustls_connect(&server, &[b"h2"], Some(versions), None)
            .await
            .expect("connected");
        let connection = tls.get_ref().1;
        assert_eq!(connection.protocol_version(), Some(expected));
        let suite = connection.negotiated_cipher_suite().expect("suite").suite();
        assert!(is_accepted_suite(suite), "{suite:?}");
        let name = format!("{suite:?}");
        assert!(
            name.starts_with("TLS13_") || name.starts_with("TLS_ECDHE_"),
            "{name}"
        );
        assert!(
            name.contains("_GCM_") || name.contains("CHACHA20_POLY1305"),
            "{name}"
        );
    }
    assert_eq!(CIPHER_SUITES.len(), 9);
}

// ------------------------------------------------------------------------------------------------
// `serve` with extra flags
// ------------------------------------------------------------------------------------------------

/// `podmend serve` with `args` added (`--client-ca`, `--log-format`).
fn serve_with(args: &[&std::ffi::OsStr]) -> Server {
    Server::start(Options {
        args: args.iter().map(|a| a.to_os_string()).collect(),
        ..Options::default()
    })
}

/// A CA (its PEM) and a client certificate it signed, as for the API server's kubeconfig.
fn client_pki(name: &str) -> (String, Identity) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} client CA"));
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("CA");
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca).expect("client certificate");
    let key = PrivateKeyDer::try_from(key.serialize_der()).expect("key DER");
    (
        ca.pem(),
        Identity {
            cert: cert.der().clone(),
            key,
        },
    )
}

fn write(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write");
    path
}

/// Sends a request on `tls` and returns what came back, or the error that ended it.
async fn request_on(
    mut tls: tokio_rustls::client::TlsStream<TcpStream>,
) -> std::io::Result<Vec<u8>> {
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await?;
    let mut answer = vec![0u8; 4096];
    let n = tls.read(&mut answer).await?;
    answer.truncate(n);
    Ok(answer)
}

#[tokio::test]
async fn with_client_ca_only_clients_with_a_certificate_from_that_ca_are_served() {
    let pki = tempfile::tempdir().expect("tempdir");
    let (ca_pem, api_server) = client_pki("cluster");
    let (_, stranger) = client_pki("other");
    let ca = write(pki.path(), "client-ca.crt", ca_pem.as_bytes());
    let serve = serve_with(&["--client-ca".as_ref(), ca.as_os_str()]);
    let counted = handshake_failures("client-certificate");

    // The API server's certificate: reviews answered over both protocols.
    let review = fixture("admissionreview-v1-pod-create-gke-kube-rs.json");
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let response = serve
            .client_with(&[alpn], Some(&api_server))
            .post(serve.url("/mutate"))
            .json(&review)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}\n{}", serve.log_text()));
        assert_eq!(response.status().as_u16(), 200);
    }

    // No certificate, or one from another CA: refused with the alert that says so, over
    // TLS 1.3 (after the client's Finished: on the first read) and TLS 1.2 (in the handshake).
    let refusals = [
        (None, AlertDescription::CertificateRequired),
        (Some(&stranger), AlertDescription::UnknownCA),
    ];
    let before = metric(serve.metrics, &counted).await;
    for (identity, alert) in refusals {
        for versions in [&[&rustls::version::TLS13][..], &[&rustls::version::TLS12]] {
            let attempt = async {
                let tls = rustls_connect_to(
                    serve.webhook,
                    &serve.ca_pem(),
                    &[b"http/1.1"],
                    Some(versions),
                    identity,
                )
                .await?;
                request_on(tls).await
            };
            let error = attempt.await.expect_err("refused");
            assert_eq!(alert_in(&error), Some(alert), "{versions:?}: {error}");
        }
    }
    assert_eq!(
        metric_once(serve.metrics, &counted, before + 4).await,
        before + 4
    );

    // The metrics port is plain HTTP, no certificate asked.
    let health = plain_client()
        .get(format!("http://{}/healthz", serve.metrics))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status().as_u16(), 200);
}

#[test]
fn serve_refuses_to_start_with_a_client_ca_file_that_holds_no_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_certs(&dir.path().join("certs"));
    let bad = write(
        dir.path(),
        "client-ca.crt",
        b"the API server's CA goes here\n",
    );
    let output = serve_command_in(dir.path(), free_port(), free_port())
        .arg("--client-ca")
        .arg(&bad)
        .stderr(Stdio::piped())
        .output()
        .expect("run serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--client-ca"), "{stderr}");
    assert!(stderr.contains(&*bad.to_string_lossy()), "{stderr}");
    assert!(
        stderr.contains("no \"BEGIN CERTIFICATE\" PEM block"),
        "{stderr}"
    );
}

// ------------------------------------------------------------------------------------------------
// Logs
// ------------------------------------------------------------------------------------------------

/// Values that must never reach the log: they stand for credentials in a pod spec.
const SECRETS: [&str; 6] = [
    "env-hunter2-Zq8x",
    "annotation-s3cr3t-Kp4w",
    "data-token-Xr7v",
    "arg-password-Mn2b",
    "label-private-Lt5c",
    "command-apikey-Wd9e",
];

/// A pod CREATE review carrying each of [`SECRETS`]; a nodeName makes podmend patch it.
fn review_with_secrets(uid: &str, name: &str) -> Value {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "payments",
            "labels": {"app": "ledger", "note": SECRETS[4]},
            "annotations": {"example.com/token": SECRETS[1]},
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{
                "name": "ledger",
                "image": "registry.example/ledger:1.2",
                "command": ["/bin/ledger", SECRETS[5]],
                "args": ["--db-password", SECRETS[3]],
                "env": [{"name": "DB_PASSWORD", "value": SECRETS[0]}],
            }],
            "x-unknown": {"data": {"token": SECRETS[2]}},
        },
    });
    create_review(uid, &pod, "payments")
}

/// Sends good and bad reviews carrying [`SECRETS`] and checks the log line by line.
async fn assert_log_has_no_object_contents(
    client: &reqwest::Client,
    url: impl Fn(&str) -> String,
    log: impl Fn() -> String,
) {
    let uid = "6a1c0f4e-secret-test";
    for path in ["/mutate", "/validate"] {
        let response = client
            .post(url(path))
            .json(&review_with_secrets(uid, "ledger-0"))
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status().as_u16(), 200);
    }
    // Refused ones: a secret in a field of the wrong type, and in an unknown operation.
    let mut wrong_type = review_with_secrets("u2", "ledger-1");
    wrong_type["request"]["name"] = json!({"token": SECRETS[2]});
    let mut wrong_operation = review_with_secrets("u3", "ledger-2");
    wrong_operation["request"]["operation"] = json!(SECRETS[0]);
    for review in [wrong_type, wrong_operation] {
        let response = client
            .post(url("/mutate"))
            .json(&review)
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status().as_u16(), 400);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = log();
        if text.matches(uid).count() >= 2 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(uid)).collect();
    assert_eq!(lines.len(), 2, "one line per review:\n{text}");
    for line in &lines {
        for expected in ["Pod", "ledger-0", "payments", "CREATE"] {
            assert!(line.contains(expected), "{expected} in {line}");
        }
    }
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret} in the log:\n{text}");
    }
}

#[tokio::test]
async fn the_info_log_names_the_review_but_never_the_objects_contents_in_text_format() {
    let server = Server::start(Options::default());
    assert_log_has_no_object_contents(
        &server.client(&[b"h2"]),
        |path| server.url(path),
        || server.log_text(),
    )
    .await;
}

#[tokio::test]
async fn the_info_log_names_the_review_but_never_the_objects_contents_in_json_format() {
    let serve = serve_with(&["--log-format".as_ref(), "json".as_ref()]);
    assert_log_has_no_object_contents(
        &serve.client(&[b"http/1.1"]),
        |path| serve.url(path),
        || serve.log_text(),
    )
    .await;
    let log = serve.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("6a1c0f4e-secret-test"))
        .expect("admission line");
    let record: Value = serde_json::from_str(line).expect("a JSON log line");
    assert_eq!(record["uid"], "6a1c0f4e-secret-test", "{record}");
    assert_eq!(record["kind"], "Pod", "{record}");
    assert_eq!(record["name"], "ledger-0", "{record}");
}
