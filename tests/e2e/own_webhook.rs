//! A mutating webhook of the test's own beside podmend: an HTTPS server in the test process
//! (axum over rustls, with a CA of its own, `common::api_stub::serve`) and the
//! MutatingWebhookConfiguration that has the real API server call it for what its rules match
//! in one namespace (Pod CREATEs unless told otherwise). Both go when it is dropped, also when
//! the test panics.

use std::sync::Arc;

use axum::Router;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::api_stub;
use crate::install::kubectl_stdin;

/// How the API server is to call the webhook.
pub struct Registration<'a> {
    /// The configuration's name: the API server calls configurations in order of their
    /// names.
    pub configuration: &'a str,
    /// The webhook's name in it (the API server's metrics and messages use it).
    pub webhook: &'a str,
    /// The only namespace whose objects it is sent.
    pub namespace: &'a str,
    /// The configuration's `rules`; `None`: Pods on CREATE.
    pub rules: Option<Value>,
    /// `Fail` or `Ignore`.
    pub failure_policy: &'a str,
    /// The path `app` answers on, e.g. `/mutate`.
    pub path: &'a str,
}

/// The webhook serving on loopback and registered.
pub struct OwnWebhook<'a> {
    suite: &'a Suite,
    configuration: String,
    server: tokio::task::JoinHandle<()>,
}

impl<'a> OwnWebhook<'a> {
    /// Serves `app` on a free loopback port and registers it as `registration` says.
    pub fn start(suite: &'a Suite, registration: &Registration<'_>, app: Router) -> Self {
        let (ca, tls) = api_stub::tls_material();
        let listener = suite
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("its address").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let server = suite
            .runtime
            .spawn(api_stub::serve(listener, acceptor, app));
        let webhook = OwnWebhook {
            suite,
            configuration: registration.configuration.to_string(),
            server,
        };
        let printed = kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &configuration(registration, port, &ca),
        );
        assert!(printed.contains("created"), "kubectl create: {printed}");
        webhook
    }
}

impl Drop for OwnWebhook<'_> {
    fn drop(&mut self) {
        self.server.abort();
        let deleted = self
            .suite
            .plane
            .kubectl()
            .args([
                "delete",
                "mutatingwebhookconfiguration",
                &self.configuration,
                "--ignore-not-found",
            ])
            .output();
        if !deleted.as_ref().is_ok_and(|out| out.status.success()) && !std::thread::panicking() {
            panic!(
                "could not delete the webhook configuration {}: {deleted:?}",
                self.configuration
            );
        }
    }
}

/// The MutatingWebhookConfiguration: its rules (Pods on CREATE unless given) in the one
/// namespace, called once (`reinvocationPolicy: Never`), within 5 seconds.
fn configuration(registration: &Registration<'_>, port: u16, ca: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": registration.configuration},
        "webhooks": [{
            "name": registration.webhook,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": registration.failure_policy,
            "timeoutSeconds": 5,
            "reinvocationPolicy": "Never",
            "clientConfig": {
                "url": format!("https://localhost:{port}{}", registration.path),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
            },
            "rules": registration.rules.clone().unwrap_or_else(|| json!([{
                "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods"], "scope": "Namespaced"
            }])),
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "In",
                "values": [registration.namespace]
            }]}
        }]
    })
}
