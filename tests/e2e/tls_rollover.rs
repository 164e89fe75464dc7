//! A CA rollover of `serve --tls-self-manage` on the real API server, under a stream of pod
//! creates, with the caBundle patch refused (RBAC, HTTP 403) when the rollover comes and
//! allowed again a moment later: podmend keeps serving the certificate the API server trusts
//! until its patch of the new bundle succeeded, retries the patch within seconds, and every
//! pod created meanwhile is repaired by the API server's call.
//!
//! The API server verifies the webhook's certificate against the configuration's caBundle on
//! each new connection (apiserver `pkg/util/webhook/client.go`, `ClientManager.HookClient`:
//! the rest client's TLS config takes `CAData` from `clientConfig.caBundle`, and a changed
//! bundle is a new cache key, so a new client). A connection made while podmend served a
//! certificate of a CA not in the bundle fails; with `failurePolicy: Ignore` the pod is then
//! stored unrepaired. The test therefore also checks, every 100 ms, that the served certificate
//! verifies against the caBundle the API server holds at that moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::{Options, Server};
use crate::common::tls;
use crate::install::{assert_success, kubectl, kubectl_json, kubectl_stdin};
use crate::pinniped::create_node;

const NS: &str = "podmend-rollover";
const ACCOUNT: &str = "rollover";
const WEBHOOK: &str = "podmend-rollover";
const SECRET: &str = "podmend-rollover-tls";
const NODE: &str = "rollover-node";
/// The patch permission, bound and unbound during the test.
const PATCH_BINDING: &str = "podmend-rollover-patch";
/// The Secret's CA and certificate come due this long after the test made them (with
/// `--tls-renew-before-days 1`, they are made valid for a day and this much).
const DUE_IN: Duration = Duration::from_secs(25);
/// `--tls-check-seconds`: the rollover is seen at the first check after `DUE_IN`.
const CHECK_SECONDS: u64 = 20;

/// RBAC for podmend's ServiceAccount, but the patch of the configuration (bound apart).
fn rbac() -> Value {
    let subject = json!([{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NS}]);
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "podmend-rollover"},
         "rules": [
            {"apiGroups": [""], "resources": ["nodes", "namespaces", "limitranges"], "verbs": ["list", "watch"]},
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
             "resourceNames": [WEBHOOK], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "podmend-rollover"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "podmend-rollover"},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": PATCH_BINDING},
         "rules": [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                    "resourceNames": [WEBHOOK], "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "podmend-rollover", "namespace": NS},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update", "create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "podmend-rollover", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podmend-rollover"},
         "subjects": subject},
    ]})
}

fn patch_binding() -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": PATCH_BINDING},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PATCH_BINDING},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NS}]})
}

/// The Secret podmend manages, holding a PKI that comes due in [`DUE_IN`]: (Secret, CA PEM).
fn coming_due_secret() -> (Value, String) {
    let (ca, ca_key, cert, key) =
        tls::pki_valid_for(Duration::from_secs(86_400) + DUE_IN, &["localhost"]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET, "namespace": NS},
        "data": {"ca.crt": b64(&ca), "ca.key": b64(&ca_key), "tls.crt": b64(&cert), "tls.key": b64(&key)}});
    (secret, ca)
}

/// A mutating webhook for this namespace's pods only, at `port`, without a caBundle:
/// podmend writes it.
fn webhook_configuration(port: u16) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK},
        "webhooks": [{
            "name": "mutate.rollover.podmend.io",
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 5,
            "clientConfig": {"url": format!("https://localhost:{port}/mutate")},
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NS]}]},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "Namespaced"}]}]})
}

/// A kubeconfig for podmend's ServiceAccount (a token from the TokenRequest API).
fn account_kubeconfig(suite: &Suite, dir: &std::path::Path) -> std::path::PathBuf {
    let token = kubectl(
        suite,
        &["create", "token", ACCOUNT, "-n", NS, "--duration", "1h"],
    );
    let ca = std::fs::read(&suite.plane.pki.ca_cert).expect("the cluster CA");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {ACCOUNT}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {ACCOUNT}\ncurrent-context: e2e\n",
        server = suite.plane.server,
        ca = base64::engine::general_purpose::STANDARD.encode(ca),
        token = token.trim(),
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).expect("write the kubeconfig");
    path
}

/// The caBundle of the configuration's webhook as the API server stores it (PEM).
fn stored_bundle(suite: &Suite) -> Option<String> {
    let config = kubectl_json(
        suite,
        &["get", "mutatingwebhookconfiguration", WEBHOOK, "-o", "json"],
    );
    let encoded = config["webhooks"][0]["clientConfig"]["caBundle"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(pem).ok()
}

/// The certificate podmend presents, if it verifies against `bundle` (PEM), else the error.
fn served_against(suite: &Suite, server: &Server, bundle: &str) -> Result<Vec<u8>, String> {
    let config = tls::client_config(tls::roots([bundle.as_bytes()]), &[]);
    suite
        .block_on(tls::connect(server.webhook, config))
        .map(|connection| tls::presented_leaf(&connection))
        .map_err(|error| error.to_string())
}

/// Whether the DER certificate `leaf` was issued by the CA `ca_pem`.
fn issued_by(leaf: &[u8], ca_pem: &str) -> bool {
    let ca_der = tls::leaf_der(ca_pem.as_bytes());
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("the CA");
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).expect("the served certificate");
    cert.issuer() == ca.subject()
}

fn wait_for(
    what: &str,
    within: Duration,
    log: impl Fn() -> String,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}; podmend's log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sets its flag when dropped, also while unwinding.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Creates pods pinned with `nodeName` until `stop`; their names.
fn pod_stream(suite: &Suite, stop: &AtomicBool) -> Vec<String> {
    let mut names = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let name = format!("stream-{}", names.len());
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}});
        kubectl_stdin(suite, &["create", "-f", "-"], &pod);
        names.push(name);
    }
    names
}

pub fn a_ca_rollover_under_a_stream_of_pod_creates_never_serves_an_untrusted_certificate_and_every_pod_is_repaired(
    suite: &Suite,
) {
    suite
        .block_on(suite.plane.create_namespace(NS))
        .unwrap_or_else(|e| panic!("{e}"));
    // The chart's webhooks (installed by earlier tests) leave this namespace alone.
    kubectl(
        suite,
        &[
            "label",
            "namespace",
            NS,
            "podmend.io/ignore=true",
            "--overwrite",
        ],
    );
    create_node(suite, NODE, "");
    kubectl_stdin(suite, &["apply", "-f", "-"], &rbac());
    kubectl_stdin(suite, &["apply", "-f", "-"], &patch_binding());
    let (secret, first_ca) = coming_due_secret();
    kubectl_stdin(suite, &["create", "-f", "-"], &secret);

    let dir = tempfile::tempdir().expect("tempdir");
    let tls_dir = dir.path().join("tls");
    std::fs::create_dir_all(&tls_dir).expect("tls dir");
    let kubeconfig = account_kubeconfig(suite, dir.path());
    let server = Server::start(Options {
        kubeconfig: Some(kubeconfig),
        tls_dir: Some(tls_dir),
        args: [
            "--tls-self-manage",
            "--tls-secret",
            SECRET,
            "--tls-namespace",
            NS,
            "--webhook-configurations",
            &format!("mutatingwebhookconfigurations/{WEBHOOK}"),
            "--tls-service-dns",
            "localhost",
            "--tls-validity-days",
            "2",
            "--tls-renew-before-days",
            "1",
            "--tls-check-seconds",
            &CHECK_SECONDS.to_string(),
            "--tls-ca-settle-seconds",
            "1",
        ]
        .map(Into::into)
        .to_vec(),
        ..Options::default()
    });
    let log = || server.log_text();
    kubectl_stdin(
        suite,
        &["apply", "-f", "-"],
        &webhook_configuration(server.webhook.port()),
    );
    wait_for(
        "the first CA in the caBundle and its certificate served",
        Duration::from_secs(30),
        log,
        || {
            stored_bundle(suite)
                .is_some_and(|bundle| served_against(suite, &server, &bundle).is_ok())
        },
    );

    // From now on the patch is refused, until the rollover has been tried.
    kubectl(suite, &["delete", "clusterrolebinding", PATCH_BINDING]);
    let stop = Arc::new(AtomicBool::new(false));
    let untrusted = std::thread::scope(|scope| {
        // A failed wait below panics: the threads must stop for the scope to end.
        let _stop = StopOnDrop(&stop);
        let stream = scope.spawn(|| pod_stream(suite, &stop));
        let checker = scope.spawn(|| {
            let mut untrusted = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                // Read again after a failure: the bundle read may predate a patch and the
                // switch that followed it by more than the settle delay on a loaded machine.
                let check = || stored_bundle(suite).map(|b| served_against(suite, &server, &b));
                if let Some(Err(_)) = check()
                    && let Some(Err(error)) = check()
                {
                    untrusted.push(error);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            untrusted
        });
        let refused = |text: &str| text.contains("cannot patch MutatingWebhookConfiguration");
        wait_for(
            "the rollover's caBundle patch refused",
            DUE_IN + Duration::from_secs(2 * CHECK_SECONDS),
            log,
            || refused(&server.log_text()),
        );
        // Allowed again: the next retry must publish the bundle and then switch.
        let granted = Instant::now();
        kubectl_stdin(suite, &["apply", "-f", "-"], &patch_binding());
        wait_for(
            "the new CA's certificate served (a prompt retry of the patch)",
            Duration::from_secs(12),
            log,
            || {
                stored_bundle(suite).is_some_and(|bundle| {
                    served_against(suite, &server, &bundle)
                        .is_ok_and(|leaf| !issued_by(&leaf, &first_ca))
                })
            },
        );
        let switched_after = granted.elapsed();
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let names = stream.join().expect("the pod stream");
        let untrusted = checker.join().expect("the certificate checker");
        println!(
            "({} pods created during the rollover; new certificate served {:.1} s after the patch was allowed)",
            names.len(),
            switched_after.as_secs_f64()
        );
        assert!(names.len() >= 10, "only {} pods created", names.len());
        untrusted
    });
    assert!(
        untrusted.is_empty(),
        "podmend served a certificate the caBundle did not trust {} times: {:?}\nlog:\n{}",
        untrusted.len(),
        untrusted.first(),
        server.log_text()
    );
    let bundle = stored_bundle(suite).expect("a caBundle");
    let in_bundle: Vec<Vec<u8>> = tls::all_der(bundle.as_bytes());
    assert_eq!(in_bundle.len(), 2, "the new CA and the old one:\n{bundle}");
    assert!(
        in_bundle.contains(&tls::leaf_der(first_ca.as_bytes()).to_vec()),
        "the old CA stays in the bundle until it expires:\n{bundle}"
    );
    let pods = kubectl_json(suite, &["get", "pods", "-n", NS, "-o", "json"]);
    let unrepaired: Vec<&str> = pods["items"]
        .as_array()
        .expect("pods")
        .iter()
        .filter(|pod| pod["metadata"]["annotations"]["podmend.io/mutated"].is_null())
        .filter_map(|pod| pod["metadata"]["name"].as_str())
        .collect();
    assert!(
        unrepaired.is_empty(),
        "pods the API server stored without podmend's repair: {unrepaired:?}\nlog:\n{}",
        server.log_text()
    );
    let cleanup = suite
        .plane
        .kubectl()
        .args(["delete", "mutatingwebhookconfiguration", WEBHOOK])
        .output()
        .expect("run kubectl");
    assert_success("delete the rollover webhook", &cleanup);
}
