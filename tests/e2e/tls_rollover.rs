//! Certificate rotations of `serve --tls-self-manage` on the real API server, each under a
//! stream of pod creates. A CA rollover, with the caBundle patch refused (RBAC, HTTP 403) when
//! the rollover comes and allowed again a moment later: podmend keeps serving the certificate
//! the API server trusts until its patch of the new bundle succeeded, and retries the patch
//! within seconds. A serving-certificate renewal under the same CA: the new certificate is
//! served with the bundle unchanged. In both, every pod created meanwhile is repaired by the
//! API server's call.
//!
//! The API server verifies the webhook's certificate against the configuration's caBundle on
//! each new connection (apiserver `pkg/util/webhook/client.go`, `ClientManager.HookClient`:
//! the rest client's TLS config takes `CAData` from `clientConfig.caBundle`, and a changed
//! bundle is a new cache key, so a new client). A connection made while podmend served a
//! certificate of a CA not in the bundle fails; with `failurePolicy: Ignore` the pod is then
//! stored unrepaired. Each test therefore also checks, every 100 ms, that the served
//! certificate verifies against the caBundle the API server holds at that moment, and reads
//! the API server's `apiserver_admission_webhook_fail_open_count` for its webhook before and
//! after the stream: with `Ignore`, "no create failed" proves nothing, while a call that
//! failed open is counted there (apiserver `pkg/admission/plugin/webhook/mutating/dispatcher.go`,
//! `mutatingDispatcher.dispatch`, `ObserveWebhookFailOpen`) whatever the pod looks like.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::{Options, Server};
use crate::common::tls;
use crate::install::{assert_success, kubectl, kubectl_json, kubectl_stdin};
use crate::outages::fail_open_count;
use crate::pinniped::create_node;

/// The objects of one rotation test, each its own so the tests do not meet.
struct Names {
    /// The namespace of podmend's ServiceAccount, its Secret and the streamed pods.
    ns: &'static str,
    /// The MutatingWebhookConfiguration, and the prefix of the RBAC objects' names.
    configuration: &'static str,
    /// The webhook in it: the name the API server's metrics use.
    webhook: &'static str,
    node: &'static str,
    /// The Secret's certificates that come due do so this long after the test made them
    /// (with `--tls-renew-before-days 1`, they are made valid for a day and this much): long
    /// enough for podmend to start and serve them first.
    due_in: Duration,
    /// `--tls-check-seconds`: a certificate come due is seen at the first check after
    /// `due_in`.
    check_seconds: u64,
}

const CA_ROLLOVER: Names = Names {
    ns: "podmend-rollover",
    configuration: "podmend-rollover",
    webhook: "mutate.rollover.podmend.io",
    node: "rollover-node",
    due_in: Duration::from_secs(25),
    check_seconds: 20,
};

const LEAF_RENEWAL: Names = Names {
    ns: "podmend-leaf-renewal",
    configuration: "podmend-leaf-renewal",
    webhook: "mutate.leaf-renewal.podmend.io",
    node: "leaf-renewal-node",
    due_in: Duration::from_secs(12),
    check_seconds: 4,
};

const ACCOUNT: &str = "rollover";
const SECRET: &str = "podmend-rollover-tls";

impl Names {
    /// The ClusterRole and binding of the caBundle patch, bound and unbound by the CA test.
    fn patch_binding(&self) -> String {
        format!("{}-patch", self.configuration)
    }
}

/// RBAC for podmend's ServiceAccount, but the patch of the configuration (bound apart).
fn rbac(names: &Names) -> Value {
    let subject = json!([{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": names.ns}]);
    let role = names.configuration;
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": names.ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [
            {"apiGroups": [""], "resources": ["nodes", "namespaces", "limitranges"], "verbs": ["list", "watch"]},
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
             "resourceNames": [names.configuration], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": names.patch_binding()},
         "rules": [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                    "resourceNames": [names.configuration], "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": role, "namespace": names.ns},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update", "create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": role, "namespace": names.ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
         "subjects": subject},
    ]})
}

fn patch_binding(names: &Names) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": names.patch_binding()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": names.patch_binding()},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": names.ns}]})
}

/// The Secret podmend manages, holding a CA valid for `ca_valid_for` and a serving
/// certificate valid for `leaf_valid_for`: (Secret, CA PEM, certificate PEM).
fn secret(
    names: &Names,
    ca_valid_for: Duration,
    leaf_valid_for: Duration,
) -> (Value, String, String) {
    let (ca, ca_key, cert, key) =
        tls::pki_with_leaf_valid_for(ca_valid_for, leaf_valid_for, &["localhost"]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET, "namespace": names.ns},
        "data": {"ca.crt": b64(&ca), "ca.key": b64(&ca_key), "tls.crt": b64(&cert), "tls.key": b64(&key)}});
    (secret, ca, cert)
}

/// A mutating webhook for the test namespace's pods only, at `port`, without a caBundle:
/// podmend writes it.
fn webhook_configuration(names: &Names, port: u16) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": names.configuration},
        "webhooks": [{
            "name": names.webhook,
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 5,
            "clientConfig": {"url": format!("https://localhost:{port}/mutate")},
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [names.ns]}]},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "Namespaced"}]}]})
}

/// A kubeconfig for podmend's ServiceAccount (a token from the TokenRequest API).
fn account_kubeconfig(suite: &Suite, names: &Names, dir: &std::path::Path) -> std::path::PathBuf {
    let token = kubectl(
        suite,
        &[
            "create",
            "token",
            ACCOUNT,
            "-n",
            names.ns,
            "--duration",
            "1h",
        ],
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
fn stored_bundle(suite: &Suite, names: &Names) -> Option<String> {
    let config = kubectl_json(
        suite,
        &[
            "get",
            "mutatingwebhookconfiguration",
            names.configuration,
            "-o",
            "json",
        ],
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
fn pod_stream(suite: &Suite, names: &Names, stop: &AtomicBool) -> Vec<String> {
    let mut created = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let name = format!("stream-{}", created.len());
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": names.ns},
            "spec": {"nodeName": names.node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}});
        kubectl_stdin(suite, &["create", "-f", "-"], &pod);
        created.push(name);
    }
    created
}

/// The test's namespace, node, RBAC and `secret`, and `podmend serve --tls-self-manage` for
/// them, returned once the API server holds the Secret's CA in the caBundle and podmend serves
/// a certificate it verifies. Keep the directory as long as the server.
fn start(suite: &Suite, names: &Names, secret: &Value) -> (Server, tempfile::TempDir) {
    suite
        .block_on(suite.plane.create_namespace(names.ns))
        .unwrap_or_else(|e| panic!("{e}"));
    // The chart's webhooks (installed by earlier tests) leave this namespace alone.
    kubectl(
        suite,
        &[
            "label",
            "namespace",
            names.ns,
            "podmend.io/ignore=true",
            "--overwrite",
        ],
    );
    create_node(suite, names.node, "");
    kubectl_stdin(suite, &["apply", "-f", "-"], &rbac(names));
    kubectl_stdin(suite, &["apply", "-f", "-"], &patch_binding(names));
    kubectl_stdin(suite, &["create", "-f", "-"], secret);

    let dir = tempfile::tempdir().expect("tempdir");
    let tls_dir = dir.path().join("tls");
    std::fs::create_dir_all(&tls_dir).expect("tls dir");
    let kubeconfig = account_kubeconfig(suite, names, dir.path());
    let server = Server::start(Options {
        kubeconfig: Some(kubeconfig),
        tls_dir: Some(tls_dir),
        args: [
            "--tls-self-manage",
            "--tls-secret",
            SECRET,
            "--tls-namespace",
            names.ns,
            "--webhook-configurations",
            &format!("mutatingwebhookconfigurations/{}", names.configuration),
            "--tls-service-dns",
            "localhost",
            "--tls-validity-days",
            "2",
            "--tls-renew-before-days",
            "1",
            "--tls-check-seconds",
            &names.check_seconds.to_string(),
            "--tls-ca-settle-seconds",
            "1",
        ]
        .map(Into::into)
        .to_vec(),
        ..Options::default()
    });
    kubectl_stdin(
        suite,
        &["apply", "-f", "-"],
        &webhook_configuration(names, server.webhook.port()),
    );
    wait_for(
        "the Secret's CA in the caBundle and its certificate served",
        Duration::from_secs(30),
        || server.log_text(),
        || {
            stored_bundle(suite, names)
                .is_some_and(|bundle| served_against(suite, &server, &bundle).is_ok())
        },
    );
    (server, dir)
}

/// Streams pod creates while `rotation` runs and for 3 s after it returned, checking every
/// 100 ms that the served certificate verifies against the stored caBundle; then asserts that
/// it always did, that the API server counted no call to the webhook as failing open, and that
/// every pod of the namespace carries podmend's repair. `rotation`'s value.
fn under_a_stream_of_creates<T>(
    suite: &Suite,
    names: &Names,
    server: &Server,
    rotation: impl FnOnce() -> T,
) -> T {
    let failed_open = fail_open_count(suite, names.webhook);
    let stop = AtomicBool::new(false);
    let (created, untrusted, value) = std::thread::scope(|scope| {
        // A failed wait in `rotation` panics: the threads must stop for the scope to end.
        let _stop = StopOnDrop(&stop);
        let stream = scope.spawn(|| pod_stream(suite, names, &stop));
        let checker = scope.spawn(|| {
            let mut untrusted = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                // Read again after a failure: the bundle read may predate a patch and the
                // switch that followed it by more than the settle delay on a loaded machine.
                let check =
                    || stored_bundle(suite, names).map(|b| served_against(suite, server, &b));
                if let Some(Err(_)) = check()
                    && let Some(Err(error)) = check()
                {
                    untrusted.push(error);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            untrusted
        });
        let value = rotation();
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let created = stream.join().expect("the pod stream");
        let untrusted = checker.join().expect("the certificate checker");
        (created, untrusted, value)
    });
    println!("({} pods created during the rotation)", created.len());
    assert!(created.len() >= 10, "only {} pods created", created.len());
    assert!(
        untrusted.is_empty(),
        "podmend served a certificate the caBundle did not trust {} times: {:?}\nlog:\n{}",
        untrusted.len(),
        untrusted.first(),
        server.log_text()
    );
    // Had a call failed (an untrusted certificate, a connection cut during the switch), the
    // pod would be stored unrepaired and the API server would count it here.
    assert_eq!(
        fail_open_count(suite, names.webhook),
        failed_open,
        "calls to {} the API server failed open during the rotation; log:\n{}",
        names.webhook,
        server.log_text()
    );
    let pods = kubectl_json(suite, &["get", "pods", "-n", names.ns, "-o", "json"]);
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
    value
}

fn delete_configuration(suite: &Suite, names: &Names) {
    let cleanup = suite
        .plane
        .kubectl()
        .args([
            "delete",
            "mutatingwebhookconfiguration",
            names.configuration,
        ])
        .output()
        .expect("run kubectl");
    assert_success("delete the rotation's webhook", &cleanup);
}

pub fn a_ca_rollover_under_a_stream_of_pod_creates_never_serves_an_untrusted_certificate_and_every_pod_is_repaired(
    suite: &Suite,
) {
    let names = &CA_ROLLOVER;
    let due = Duration::from_secs(86_400) + names.due_in;
    let (secret, first_ca, _) = secret(names, due, due);
    let (server, _dir) = start(suite, names, &secret);
    let log = || server.log_text();

    // From now on the patch is refused, until the rollover has been tried.
    kubectl(
        suite,
        &["delete", "clusterrolebinding", &names.patch_binding()],
    );
    let switched_after = under_a_stream_of_creates(suite, names, &server, || {
        let refused = |text: &str| text.contains("cannot patch MutatingWebhookConfiguration");
        wait_for(
            "the rollover's caBundle patch refused",
            names.due_in + Duration::from_secs(2 * names.check_seconds),
            log,
            || refused(&server.log_text()),
        );
        // Allowed again: the next retry must publish the bundle and then switch.
        let granted = Instant::now();
        kubectl_stdin(suite, &["apply", "-f", "-"], &patch_binding(names));
        wait_for(
            "the new CA's certificate served (a prompt retry of the patch)",
            Duration::from_secs(12),
            log,
            || {
                stored_bundle(suite, names).is_some_and(|bundle| {
                    served_against(suite, &server, &bundle)
                        .is_ok_and(|leaf| !issued_by(&leaf, &first_ca))
                })
            },
        );
        granted.elapsed()
    });
    println!(
        "(new certificate served {:.1} s after the patch was allowed)",
        switched_after.as_secs_f64()
    );
    let bundle = stored_bundle(suite, names).expect("a caBundle");
    let in_bundle: Vec<Vec<u8>> = tls::all_der(bundle.as_bytes());
    assert_eq!(in_bundle.len(), 2, "the new CA and the old one:\n{bundle}");
    assert!(
        in_bundle.contains(&tls::leaf_der(first_ca.as_bytes()).to_vec()),
        "the old CA stays in the bundle until it expires:\n{bundle}"
    );
    delete_configuration(suite, names);
}

pub fn a_serving_certificate_renewal_under_the_same_ca_and_a_stream_of_pod_creates_keeps_the_bundle_and_every_pod_is_repaired(
    suite: &Suite,
) {
    let names = &LEAF_RENEWAL;
    // The CA stays valid for a month; only the serving certificate comes due.
    let (secret, ca, first_leaf) = secret(
        names,
        Duration::from_secs(30 * 86_400),
        Duration::from_secs(86_400) + names.due_in,
    );
    let first_leaf = tls::leaf_der(first_leaf.as_bytes()).to_vec();
    let (server, _dir) = start(suite, names, &secret);
    let bundle_before = stored_bundle(suite, names).expect("a caBundle");
    under_a_stream_of_creates(suite, names, &server, || {
        // Without a renewal, the first certificate would be served on and this wait fail.
        wait_for(
            "a new certificate of the same CA served",
            names.due_in + Duration::from_secs(2 * names.check_seconds),
            || server.log_text(),
            || {
                stored_bundle(suite, names).is_some_and(|bundle| {
                    served_against(suite, &server, &bundle)
                        .is_ok_and(|leaf| leaf != first_leaf && issued_by(&leaf, &ca))
                })
            },
        );
    });
    assert_eq!(
        tls::all_der(stored_bundle(suite, names).expect("a caBundle").as_bytes()),
        tls::all_der(bundle_before.as_bytes()),
        "the caBundle still holds the one CA, unchanged"
    );
    delete_configuration(suite, names);
}
