//! `serve --tls-self-manage` against the local API stub with the real kube client:
//! generation, reuse, renewal, CA rollover, caBundle patching, racing replicas, and the
//! running server answering every request while its certificate is replaced.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::api_stub::ApiStub;
use common::tls;
use podmend::server::selftls::{self, Material, SelfTls, SelfTlsOptions, parse_certs};
use podmend::server::{self, ServeOptions};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{ServerName, UnixTime};
use serde_json::{Value, json};

const NS: &str = "podmend-system";
const SECRET: &str = "podmend-tls";
const MUTATING: &str = "podmend-mutating";
const VALIDATING: &str = "podmend-validating";
const DAY: u64 = 86_400;

fn webhook_config(kind: &str, name: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": { "name": name },
        "webhooks": [
            { "name": "pods.podmend.io", "clientConfig": { "service": { "name": "podmend", "namespace": NS, "path": "/mutate" } } },
            { "name": "workloads.podmend.io", "clientConfig": { "service": { "name": "podmend", "namespace": NS, "path": "/mutate" }, "caBundle": "b2xk" } }
        ]
    })
}

async fn stub() -> ApiStub {
    let stub = ApiStub::start(vec![], vec![]).await;
    stub.serve_resource("secrets", "v1", "Secret", true);
    stub.serve_resource(
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        false,
    );
    stub.serve_resource(
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        false,
    );
    stub.set_objects(
        "mutatingwebhookconfigurations",
        vec![webhook_config("MutatingWebhookConfiguration", MUTATING)],
    );
    stub.set_objects(
        "validatingwebhookconfigurations",
        vec![webhook_config("ValidatingWebhookConfiguration", VALIDATING)],
    );
    stub
}

fn options(dir: &Path, validity_days: u64, renew_before_days: u64) -> SelfTlsOptions {
    SelfTlsOptions {
        namespace: NS.to_string(),
        secret: SECRET.to_string(),
        webhook_configurations: vec![MUTATING.to_string(), VALIDATING.to_string()],
        dns_names: selftls::dns_names(&[], Some("podmend"), NS).expect("names"),
        renew_before: Duration::from_secs(renew_before_days * DAY),
        validity: Duration::from_secs(validity_days * DAY),
        check_interval: Duration::from_secs(1),
        ca_settle: Duration::ZERO,
        cert_path: dir.join("tls.crt"),
        key_path: dir.join("tls.key"),
    }
}

fn secret_object(stub: &ApiStub) -> Option<Value> {
    stub.objects("secrets").into_iter().next()
}

fn secret_material(stub: &ApiStub) -> Material {
    let object = secret_object(stub).expect("the Secret exists");
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(object).expect("a Secret");
    Material::from_secret(&secret).expect("all four keys")
}

fn secret_rv(stub: &ApiStub) -> String {
    secret_object(stub).expect("Secret")["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string()
}

/// The decoded caBundle of every webhook of both configurations.
fn ca_bundles(stub: &ApiStub) -> Vec<String> {
    let mut out = Vec::new();
    for resource in [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ] {
        for config in stub.objects(resource) {
            for webhook in config["webhooks"].as_array().expect("webhooks") {
                let encoded = webhook["clientConfig"]["caBundle"].as_str().unwrap_or("");
                let pem = BASE64.decode(encoded).expect("base64 caBundle");
                out.push(String::from_utf8(pem).expect("PEM"));
            }
        }
    }
    out
}

/// Whether `cert_pem` verifies for `name` against the CAs in `bundle`.
fn verifies(bundle: &str, cert_pem: &str, name: &str) -> bool {
    let roots = tls::roots([bundle.as_bytes()]);
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), tls::provider())
        .build()
        .expect("verifier");
    verifier
        .verify_server_cert(
            &tls::leaf_der(cert_pem.as_bytes()),
            &[],
            &ServerName::try_from(name.to_string()).expect("name"),
            &[],
            UnixTime::now(),
        )
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generates_secret_files_and_ca_bundles_when_missing() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = SelfTls::new(stub.client().await, options(dir.path(), 365, 30));
    assert!(tls.reconcile().await.expect("reconcile"), "files written");

    let material = secret_material(&stub);
    let object = secret_object(&stub).expect("Secret");
    assert_eq!(object["metadata"]["namespace"], NS);
    assert_eq!(object["type"], "kubernetes.io/tls");
    assert_eq!(parse_certs(&material.ca_bundle).len(), 1);
    let leaf = &parse_certs(&material.cert)[0];
    let mut names = leaf.dns_names.clone();
    names.sort();
    assert_eq!(
        names,
        [
            format!("podmend.{NS}.svc"),
            format!("podmend.{NS}.svc.cluster.local")
        ]
    );
    for name in &names {
        assert!(verifies(&material.ca_bundle, &material.cert, name));
    }
    assert!(!verifies(&material.ca_bundle, &material.cert, "other.svc"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("tls.crt")).unwrap(),
        material.cert
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("tls.key")).unwrap(),
        material.key
    );
    let bundles = ca_bundles(&stub);
    assert_eq!(bundles.len(), 4, "two webhooks in each configuration");
    assert!(bundles.iter().all(|b| *b == material.ca_bundle));
    // The webhooks' other fields are untouched.
    let mutating = &stub.objects("mutatingwebhookconfigurations")[0];
    assert_eq!(mutating["webhooks"][1]["name"], "workloads.podmend.io");
    assert_eq!(
        mutating["webhooks"][0]["clientConfig"]["service"]["path"],
        "/mutate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reuses_a_valid_secret() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let first = tempfile::tempdir().expect("tempdir");
    SelfTls::new(stub.client().await, options(first.path(), 365, 30))
        .reconcile()
        .await
        .expect("first");
    let before = secret_material(&stub);
    let rv = secret_rv(&stub);

    let second = tempfile::tempdir().expect("tempdir");
    let tls = SelfTls::new(stub.client().await, options(second.path(), 365, 30));
    assert!(tls.reconcile().await.expect("second"), "files written");
    assert_eq!(secret_material(&stub), before, "no new certificate");
    assert_eq!(secret_rv(&stub), rv, "the Secret was not written");
    assert_eq!(
        std::fs::read_to_string(second.path().join("tls.crt")).unwrap(),
        before.cert
    );
    // Nothing to do a second time: files unchanged.
    assert!(!tls.reconcile().await.expect("third"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renews_a_soon_expiring_certificate_keeping_the_ca() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // CA 200 days, leaf 100 days.
    SelfTls::new(stub.client().await, options(dir.path(), 100, 30))
        .reconcile()
        .await
        .expect("first");
    let before = secret_material(&stub);
    // Renewing 150 days ahead: the leaf is due, the CA is not.
    let tls = SelfTls::new(stub.client().await, options(dir.path(), 100, 150));
    assert!(tls.reconcile().await.expect("renewal"));
    let after = secret_material(&stub);
    assert_ne!(after.cert, before.cert, "a new serving certificate");
    assert_ne!(after.key, before.key);
    assert_eq!(after.ca_bundle, before.ca_bundle, "same CA");
    assert_eq!(after.ca_key, before.ca_key);
    assert!(verifies(
        &after.ca_bundle,
        &after.cert,
        &format!("podmend.{NS}.svc")
    ));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("tls.crt")).unwrap(),
        after.cert
    );
}

/// A CA (and a leaf it signed for the service) valid from `from_days` to `to_days` from now.
fn handmade_pki(from_days: i64, to_days: i64) -> (String, String, String, String) {
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let at = |days: i64| now + time_delta(days);
    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "an older podmend CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = at(from_days);
    ca.not_after = at(to_days);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec![
        format!("podmend.{NS}.svc"),
        format!("podmend.{NS}.svc.cluster.local"),
    ])
    .unwrap();
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = at(from_days);
    leaf.not_after = at(to_days);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    (
        ca_cert.pem(),
        ca_key_pem,
        leaf_cert.pem(),
        leaf_key.serialize_pem(),
    )
}

fn time_delta(days: i64) -> Duration {
    // Only used with `now +`: negative days are handled by the caller via `from_days <= 0`.
    Duration::from_secs(days.unsigned_abs() * DAY)
}

fn put_secret(stub: &ApiStub, material: &Material) {
    let data = |s: &str| Value::String(BASE64.encode(s));
    stub.set_objects(
        "secrets",
        vec![json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": SECRET, "namespace": NS },
            "type": "kubernetes.io/tls",
            "data": {
                "ca.crt": data(&material.ca_bundle),
                "ca.key": data(&material.ca_key),
                "tls.crt": data(&material.cert),
                "tls.key": data(&material.key),
            }
        })],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ca_rollover_keeps_the_old_ca_in_the_bundle_until_it_expires() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // A CA (and leaf) expiring in 2 days: inside the 30-day renewal window.
    let (old_ca, old_ca_key, old_cert, old_key) = handmade_pki(0, 2);
    put_secret(
        &stub,
        &Material {
            ca_bundle: old_ca.clone(),
            ca_key: old_ca_key.clone(),
            cert: old_cert,
            key: old_key,
        },
    );
    let tls = SelfTls::new(stub.client().await, options(dir.path(), 365, 30));
    assert!(tls.reconcile().await.expect("rollover"));
    let after = secret_material(&stub);
    let cas = parse_certs(&after.ca_bundle);
    assert_eq!(cas.len(), 2, "new CA and old CA");
    assert_eq!(
        cas[1].pem,
        parse_certs(&old_ca)[0].pem,
        "the old CA comes second"
    );
    assert_ne!(after.ca_key, old_ca_key);
    // The new leaf is signed by the new CA (alone), and the bundle trusts both.
    assert!(verifies(
        &cas[0].pem,
        &after.cert,
        &format!("podmend.{NS}.svc")
    ));
    let bundles = ca_bundles(&stub);
    assert!(bundles.iter().all(|b| *b == after.ca_bundle), "{bundles:?}");

    // Later the old CA has expired: only the new one stays.
    let expired = {
        let now = x509_parser::time::ASN1Time::now().to_datetime();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.not_before = now - Duration::from_secs(10 * DAY);
        ca.not_after = now - Duration::from_secs(DAY);
        ca.self_signed(&KeyPair::generate().unwrap()).unwrap().pem()
    };
    put_secret(
        &stub,
        &Material {
            ca_bundle: format!("{}{}", cas[0].pem, expired),
            ..after.clone()
        },
    );
    tls.reconcile().await.expect("prune");
    let pruned = secret_material(&stub);
    assert_eq!(parse_certs(&pruned.ca_bundle).len(), 1);
    assert_eq!(pruned.ca_bundle, cas[0].pem);
    assert_eq!(pruned.cert, after.cert, "the serving certificate is kept");
    assert!(ca_bundles(&stub).iter().all(|b| *b == cas[0].pem));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_together_converge_on_one_secret() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut replicas = Vec::new();
    for dir in &dirs {
        replicas.push(SelfTls::new(
            stub.client().await,
            options(dir.path(), 365, 30),
        ));
    }
    let results = futures::future::join_all(replicas.iter().map(SelfTls::reconcile)).await;
    for result in results {
        result.expect("every replica succeeds");
    }
    assert_eq!(stub.objects("secrets").len(), 1);
    let material = secret_material(&stub);
    for dir in &dirs {
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls.crt")).unwrap(),
            material.cert,
            "every replica serves the Secret's certificate"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls.key")).unwrap(),
            material.key
        );
    }
    assert!(ca_bundles(&stub).iter().all(|b| *b == material.ca_bundle));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_webhook_configuration_is_a_clear_error() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = options(dir.path(), 365, 30);
    opts.webhook_configurations.push("nope".to_string());
    let error = SelfTls::new(stub.client().await, opts)
        .reconcile()
        .await
        .expect_err("no such configuration");
    assert!(error.to_string().contains("\"nope\""), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_keeps_answering_while_its_certificate_is_replaced() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tls = options(dir.path(), 365, 30);
    tls.dns_names = vec!["localhost".to_string()];
    let serve_options = ServeOptions {
        tls_cert: tls.cert_path.clone(),
        tls_key: tls.key_path.clone(),
        self_tls: Some(tls),
        ..common::server::in_process_options(dir.path(), stub.kubeconfig_path())
    };
    let (listen, metrics) = (serve_options.listen, serve_options.metrics_listen);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(serve_options, async move {
        let _ = stop_rx.await;
    }));

    // Ready once the certificate is in place.
    let plain = reqwest::Client::builder()
        .tls_backend_preconfigured(tls::client_config(tls::roots([]), &[]))
        .build()
        .unwrap();
    let readyz = format!("http://{metrics}/readyz");
    let mut ready = false;
    for _ in 0..100 {
        if let Ok(response) = plain.get(&readyz).send().await
            && response.status() == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "/readyz never became ready");
    let first = secret_material(&stub);

    // A client that opens a new connection (new handshake) for every request.
    let client_tls = tls::client_config(tls::roots([first.ca_bundle.as_bytes()]), &[]);
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(client_tls)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/mutate", listen.port());
    let review = common::server::create_review(
        "u1",
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        "default",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let looping = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match client.post(&url).json(&review).send().await {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    Ok(r) => {
                        eprintln!("status {}", r.status());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        eprintln!("request failed: {e:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Another replica (or an operator) replaces the leaf with one for other names: the
    // server's periodic check renews it with the same CA and hot-reloads it.
    let (_, _, wrong_cert, wrong_key) = handmade_pki(0, 300);
    put_secret(
        &stub,
        &Material {
            cert: wrong_cert.clone(),
            key: wrong_key,
            ..first.clone()
        },
    );
    let cert_path = dir.path().join("tls.crt");
    let mut swapped = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = secret_material(&stub);
        if now.cert != first.cert && now.cert != wrong_cert {
            let on_disk = std::fs::read_to_string(&cert_path).unwrap();
            if on_disk == now.cert {
                swapped = true;
                break;
            }
        }
    }
    assert!(swapped, "the certificate was renewed and written");
    // Let the reload poll pick it up, with requests still flowing.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stop.store(true, Ordering::Relaxed);
    looping.await.unwrap();

    let trusting_first_ca = tls::client_config(tls::roots([first.ca_bundle.as_bytes()]), &[]);
    let served = tls::presented_leaf(
        &tls::connect(listen, trusting_first_ca)
            .await
            .expect("handshake"),
    );
    let renewed = secret_material(&stub);
    assert_eq!(
        served,
        tls::leaf_der(renewed.cert.as_bytes()).to_vec(),
        "the renewed certificate is served"
    );
    assert_eq!(renewed.ca_bundle, first.ca_bundle, "same CA");
    let ok = ok.load(Ordering::Relaxed);
    assert!(ok > 10, "only {ok} requests");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{ok} ok");

    let _ = stop_tx.send(());
    server.await.unwrap().expect("serve ends cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kind_qualified_names_read_each_configuration_as_its_own_kind_only() {
    common::server::install_crypto_provider();
    let stub = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut options = options(dir.path(), 365, 30);
    options.webhook_configurations = vec![
        format!("mutatingwebhookconfigurations/{MUTATING}"),
        format!("validatingwebhookconfigurations/{VALIDATING}"),
    ];
    let tls = SelfTls::new(stub.client().await, options);
    tls.reconcile().await.expect("reconcile");
    assert_eq!(ca_bundles(&stub).len(), 4, "both configurations patched");
    let reads: Vec<String> = stub
        .calls()
        .into_iter()
        .filter(|c| c.resource.ends_with("webhookconfigurations"))
        .map(|c| format!("{} {}/{}", c.verb, c.resource, c.name))
        .collect();
    assert_eq!(
        reads,
        [
            format!("get mutatingwebhookconfigurations/{MUTATING}"),
            format!("patch mutatingwebhookconfigurations/{MUTATING}"),
            format!("get validatingwebhookconfigurations/{VALIDATING}"),
            format!("patch validatingwebhookconfigurations/{VALIDATING}"),
        ],
        "a qualified name is never looked up as the other kind (its RBAC would refuse it)"
    );
}
