//! Reinvocation through the real API server: a second mutating webhook, called after podmend,
//! changes the pod, and the API server calls podmend again because the chart registers it with
//! `reinvocationPolicy: IfNeeded`.
//!
//! The second webhook is a tiny injector in the test process, the Vault agent injector's
//! pattern: an HTTPS server on loopback that adds a `vault-agent` container with requests (or,
//! for a pod annotated `e2e.podmend.io/inject: annotation`, only an annotation), registered with
//! a MutatingWebhookConfiguration whose name sorts after podmend's, for one namespace only.
//!
//! What the API server does, and where (Kubernetes v1.37):
//! - Configurations are called in order of their names:
//!   `staging/src/k8s.io/apiserver/pkg/admission/configuration/mutating_webhook_manager.go`,
//!   `mutatingWebhookConfigurationManager.getMutatingWebhookConfigurations` sorts them `ByName`
//!   (`a[i].Name < a[j].Name`) before appending their webhooks.
//! - A webhook whose patch changed the object makes every earlier webhook with
//!   `reinvocationPolicy: IfNeeded` due for one more call:
//!   `staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`,
//!   `mutatingDispatcher.Dispatch` (`RequireReinvokingPreviouslyInvokedPlugins` when `changed`,
//!   and in the reinvocation round only webhooks `ShouldReinvokeWebhook` names are called);
//!   `reinvocationcontext.go` keeps that set. The whole mutating chain runs a second time, once
//!   only: `staging/src/k8s.io/apiserver/pkg/admission/reinvocation.go`, `reinvoker.Admit`
//!   calls `Admit` again when `ShouldReinvoke`, after `SetIsReinvoke`, and never a third time.
//!   So the injector (`reinvocationPolicy: Never`) is called once and podmend twice.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::dind::{all_containers, fixture_pod};
use crate::install::{ensure_installed, installed_name, kubectl_json, kubectl_stdin};
use crate::own_webhook::{OwnWebhook, Registration};
use podmend::dind::GUARD_CONTAINER;

/// The injector's configuration: it sorts after podmend's (`podmend-mutating`), as the Vault
/// injector's `vault-agent-injector-cfg` does.
const INJECTOR_CONFIGURATION: &str = "vault-style-injector-e2e";

/// The container the injector adds, with requests of its own.
fn vault_agent() -> Value {
    json!({
        "name": "vault-agent", "image": "hashicorp/vault:1.18",
        "args": ["agent", "-config=/vault/config/agent.hcl"],
        "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}}
    })
}

/// The annotation a pod sets to get only the injector's annotation, no container.
const INJECT: &str = "e2e.podmend.io/inject";
/// The annotation the injector adds to every pod it is called for.
const INJECTED: &str = "e2e.podmend.io/injected";

/// What the injector was sent: each request's object, in order.
type Calls = Arc<Mutex<Vec<Value>>>;

/// The injector's answer to one AdmissionReview: the Vault pattern, a container and an
/// annotation added by JSON Patch.
async fn inject(
    State(calls): State<Calls>,
    body: axum::body::Bytes,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    let request = &review["request"];
    let object = request["object"].clone();
    let only_annotation = object["metadata"]["annotations"][INJECT] == "annotation";
    let mut patch = vec![if object["metadata"]["annotations"].is_object() {
        json!({"op": "add", "path": "/metadata/annotations/e2e.podmend.io~1injected", "value": "true"})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {INJECTED: "true"}})
    }];
    if !only_annotation {
        patch.push(json!({"op": "add", "path": "/spec/containers/-", "value": vault_agent()}));
    }
    crate::lock(&calls).push(object);
    let patch = base64::engine::general_purpose::STANDARD.encode(Value::from(patch).to_string());
    let answer = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": request["uid"], "allowed": true,
                     "patchType": "JSONPatch", "patch": patch}
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
}

/// The injector, serving and registered for `namespace`; unregistered and stopped when
/// dropped, also when the test panics.
struct Injector<'a> {
    calls: Calls,
    _webhook: OwnWebhook<'a>,
}

impl<'a> Injector<'a> {
    /// Serves the injector on loopback with a certificate of its own CA, registers it for
    /// `namespace` (failing closed, so a call that did not happen fails the create), and waits
    /// until the API server calls it.
    fn start(suite: &'a Suite, namespace: &str) -> Injector<'a> {
        let calls = Calls::default();
        let app = Router::new()
            .route("/inject", post(inject))
            .with_state(calls.clone());
        let registration = Registration {
            configuration: INJECTOR_CONFIGURATION,
            webhook: "inject.e2e.podmend.io",
            namespace,
            failure_policy: "Fail",
            path: "/inject",
            rules: None,
        };
        let injector = Injector {
            calls,
            _webhook: OwnWebhook::start(suite, &registration, app),
        };
        injector.wait_until_called(suite, namespace);
        injector
    }

    /// Dry-runs a probe pod in `namespace` until the stored answer carries the injector's
    /// annotation: the API server's webhook configurations follow the stored ones a moment
    /// behind.
    fn wait_until_called(&self, suite: &Suite, namespace: &str) {
        let probe = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "annotations": {INJECT: "annotation"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        });
        crate::node_affinity::poll(Duration::from_secs(30), || {
            let answer = crate::install::kubectl_stdin_output(
                suite,
                &[
                    "create",
                    "-n",
                    namespace,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                &probe,
            );
            let text = String::from_utf8_lossy(&answer.stdout).into_owned();
            if text.contains(INJECTED) {
                Ok(())
            } else {
                Err(format!(
                    "the API server never called the injector: {text}{}",
                    String::from_utf8_lossy(&answer.stderr)
                ))
            }
        });
    }

    /// The objects the injector was sent for pod `name`.
    fn calls_for(&self, name: &str) -> Vec<Value> {
        crate::lock(&self.calls)
            .iter()
            .filter(|object| object["metadata"]["name"] == name)
            .cloned()
            .collect()
    }
}

/// podmend installed, `namespace` created, and the injector registered for it; checks that
/// the injector's configuration sorts after podmend's, so the API server calls it second.
fn prepare<'a>(suite: &'a Suite, namespace: &str) -> Injector<'a> {
    ensure_installed(suite);
    let podmend = installed_name(suite, "MutatingWebhookConfiguration");
    assert!(
        podmend.as_str() < INJECTOR_CONFIGURATION,
        "{INJECTOR_CONFIGURATION} must sort after {podmend} to be called after it"
    );
    suite
        .block_on(suite.plane.create_namespace(namespace))
        .unwrap_or_else(|e| panic!("{e}"));
    Injector::start(suite, namespace)
}

/// podmend's decisions on pod `name` in `namespace` (the `admission` log lines of its
/// mutating webhook, which also takes `pods/status`): each call's operation and result
/// (`CREATE patched`), in order. Waits until there are `expected` of them: `serve` writes its
/// log in batches.
pub fn podmend_decisions(
    suite: &Suite,
    namespace: &str,
    name: &str,
    expected: usize,
) -> Vec<String> {
    let field = |line: &str, key: &str| -> String {
        line.split_once(&format!(" {key}=\""))
            .and_then(|(_, rest)| rest.split_once('"'))
            .map_or_else(|| format!("{key}?"), |(value, _)| value.to_string())
    };
    let decisions = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|line| {
                line.contains(" admission ")
                    && line.contains("webhook=\"mutate\"")
                    && line.contains(&format!("namespace=\"{namespace}\""))
                    && line.contains(&format!(" name={name} "))
            })
            .map(|line| format!("{} {}", field(line, "operation"), field(line, "result")))
            .collect()
    };
    let podmend = crate::lock(&suite.podmend);
    let server = &podmend.as_ref().expect("installed").server;
    decisions(&server.log_once(|log| decisions(log).len() >= expected))
}

/// Creates `pod` in `namespace` and reads the stored pod back.
fn create(suite: &Suite, namespace: &str, pod: &Value) -> Value {
    let printed = kubectl_stdin(suite, &["create", "-n", namespace, "-f", "-"], pod);
    assert!(printed.contains("created"), "kubectl create: {printed}");
    let name = pod["metadata"]["name"].as_str().expect("a named pod");
    kubectl_json(suite, &["get", "pod", name, "-n", namespace, "-o", "json"])
}

/// The container `name` of a pod.
fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    all_containers(&pod["spec"])
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}: {:#}", pod["spec"]))
}

pub fn a_container_an_injector_adds_after_podmend_has_its_requests_zeroed_when_the_api_server_reinvokes_podmend(
    suite: &Suite,
) {
    let namespace = "reinvoke-agent";
    let injector = prepare(suite, namespace);
    let agent = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent", "annotations": {"podmend.io/agent": "true"}},
        "spec": {"containers": [{"name": "agent", "image": "busybox",
            "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                          "limits": {"cpu": "200m", "memory": "64Mi"}}}]}
    });
    let stored = create(suite, namespace, &agent);

    // The injector was called once, after podmend: the pod it was sent is already repaired
    // and has no vault-agent yet.
    let sent = injector.calls_for("agent");
    assert_eq!(sent.len(), 1, "the injector is called once: {sent:#?}");
    assert_eq!(
        container(&sent[0], "agent")["resources"]["requests"],
        json!({"cpu": "0", "memory": "0"}),
        "podmend ran before the injector"
    );
    // Without the reinvocation the stored vault-agent would keep the 250m/64Mi the injector
    // gave it (and without podmend at all, the agent its 100m/32Mi).
    let vault = container(&stored, "vault-agent");
    assert_eq!(
        vault["resources"]["requests"],
        json!({"cpu": "0", "memory": "0"}),
        "{vault:#}"
    );
    assert_eq!(
        vault["resources"]["limits"],
        json!({"cpu": "500m", "memory": "128Mi"})
    );
    assert_eq!(
        container(&stored, "agent")["resources"],
        json!({"requests": {"cpu": "0", "memory": "0"},
               "limits": {"cpu": "200m", "memory": "64Mi"}})
    );
    assert_eq!(stored["metadata"]["annotations"][INJECTED], "true");
    // podmend was called twice for this pod, and patched both times.
    assert_eq!(
        podmend_decisions(suite, namespace, "agent", 2),
        ["CREATE patched", "CREATE patched"]
    );
}

pub fn a_dind_pod_gets_no_second_guard_when_the_api_server_reinvokes_podmend(suite: &Suite) {
    let namespace = "reinvoke-dind";
    let injector = prepare(suite, namespace);
    let mut pod = fixture_pod(
        "gitlab-runner-k8s-executor-dind-tls-service-pod-reconstructed.yaml",
        "dind",
    );
    pod["metadata"]["namespace"] = json!(namespace);
    let stored = create(suite, namespace, &pod);

    let sent = injector.calls_for("dind");
    assert_eq!(sent.len(), 1, "the injector is called once");
    let guards = |pod: &Value| {
        all_containers(&pod["spec"])
            .iter()
            .filter(|c| c["name"] == GUARD_CONTAINER)
            .count()
    };
    assert_eq!(guards(&sent[0]), 1, "podmend ran before the injector");
    // One guard, and the injector's container beside it: without podmend there would be no
    // guard; a podmend that repaired the repaired pod again would add a second one (which the
    // API server would refuse, two containers of one name).
    assert_eq!(guards(&stored), 1, "{:#}", stored["spec"]);
    container(&stored, "vault-agent");
    assert_eq!(stored["metadata"]["annotations"][INJECTED], "true");
    // podmend was called twice; the second time it found its guard and changed nothing.
    assert_eq!(
        podmend_decisions(suite, namespace, "dind", 2),
        ["CREATE patched", "CREATE allowed"]
    );
}

pub fn a_pod_podmend_already_repaired_gets_no_patch_when_the_api_server_reinvokes_podmend(
    suite: &Suite,
) {
    let namespace = "reinvoke-repaired";
    let injector = prepare(suite, namespace);
    let agent = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent",
                     "annotations": {"podmend.io/agent": "true", INJECT: "annotation"}},
        "spec": {"containers": [{"name": "agent", "image": "busybox",
            "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                          "limits": {"cpu": "200m", "memory": "64Mi"}}}]}
    });
    let stored = create(suite, namespace, &agent);

    let sent = injector.calls_for("agent");
    assert_eq!(sent.len(), 1, "the injector is called once");
    // The injector changed the pod (its annotation is stored), so the API server called podmend
    // again; podmend found its repair in place and answered without a patch. A podmend that
    // patched again would log `patched` twice; without podmend, the requests stay 100m/32Mi.
    assert_eq!(stored["metadata"]["annotations"][INJECTED], "true");
    assert_eq!(
        podmend_decisions(suite, namespace, "agent", 2),
        ["CREATE patched", "CREATE allowed"]
    );
    assert_eq!(
        stored["spec"]["containers"], sent[0]["spec"]["containers"],
        "the stored containers are those podmend's first call made"
    );
    assert_eq!(
        container(&stored, "agent")["resources"]["requests"],
        json!({"cpu": "0", "memory": "0"})
    );
}
