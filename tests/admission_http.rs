//! The webhook over real TLS, with the test playing the API server: it sends the
//! AdmissionReviews an API server sends, checks each answer the way `VerifyAdmissionResponse`
//! does, applies the patch the way the mutating dispatcher does (then re-defaults), and checks
//! the repaired object against the API's validation rules and the official schema.

mod common;

use common::k8s_rules;
use common::schema::validate_with_schema;
use common::server::{
    Options, Server, create_review, fixture, review_of, start_knowing_nodes, warnings_of,
};
use serde_json::{Value, json};

const H1: &[&[u8]] = &[b"http/1.1"];
const H2: &[&[u8]] = &[b"h2"];

/// Sends a review to `path` and returns (HTTP status, body as JSON or text).
async fn post(
    server: &Server,
    alpn: &[&[u8]],
    path: &str,
    review: &Value,
) -> (u16, Value, reqwest::Version) {
    let response = server
        .client(alpn)
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(review).expect("json"))
        .send()
        .await
        .expect("request reaches the webhook");
    let status = response.status().as_u16();
    let version = response.version();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body, version)
}

/// What the API server does with one mutating answer: verify it, apply the patch, re-default.
struct Applied {
    object: Value,
    patched: bool,
    warnings: Vec<String>,
}

async fn mutate(server: &Server, review: &Value) -> Applied {
    let (status, body, _) = post(server, H1, "/mutate", review).await;
    assert_eq!(status, 200, "{body}");
    let uid = review["request"]["uid"].as_str().expect("uid");
    let patch = k8s_rules::verify_admission_response(uid, &body, true)
        .unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let object = &review["request"]["object"];
    let (object, patched) = match patch {
        Some(bytes) => (
            k8s_rules::apply_patch_as_api_server(object, &bytes).unwrap_or_else(|e| panic!("{e}")),
            true,
        ),
        None => (object.clone(), false),
    };
    let warnings = warnings_of(&body);
    Applied {
        object,
        patched,
        warnings,
    }
}

/// The checks the API server runs after mutation, plus the official schema.
fn assert_valid(object: &Value) {
    let spec = k8s_rules::pod_spec_of(object).expect("object has a pod spec");
    let errors = k8s_rules::validate_pod_spec(spec);
    assert!(
        errors.is_empty(),
        "validation errors: {errors:?}\n{object:#}"
    );
    validate_with_schema(std::slice::from_ref(object), false)
        .unwrap_or_else(|e| panic!("schema: {e}\n{object:#}"));
}

/// Sends the repaired object again as a new CREATE: podmend must find nothing left to do.
async fn assert_idempotent(server: &Server, object: &Value) {
    let again = mutate(server, &create_review("again", object, "default")).await;
    assert!(
        !again.patched,
        "a second pass patched again: {:#}",
        again.object
    );
}

fn gke_pod() -> Value {
    fixture("admissionreview-v1-pod-create-gke-kube-rs.json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_node_name_comes_back_with_required_node_affinity() {
    let (_stub, server) = start_knowing_nodes(&["gke-node-1"], Options::default()).await;
    let mut review = gke_pod();
    review["request"]["object"]["spec"]["nodeName"] = json!("gke-node-1");
    let applied = mutate(&server, &review).await;

    assert!(applied.patched);
    let spec = &applied.object["spec"];
    assert!(spec.get("nodeName").is_none(), "{spec:#}");
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gke-node-1"]}]}])
    );
    assert_eq!(
        applied.object["metadata"]["annotations"]["podmend.io/mutated"],
        "node-affinity"
    );
    // Everything else of the captured pod is untouched.
    assert_eq!(
        spec["tolerations"],
        review["request"]["object"]["spec"]["tolerations"]
    );
    assert_eq!(
        spec["containers"],
        review["request"]["object"]["spec"]["containers"]
    );
    assert!(!applied.warnings.is_empty());
    for warning in &applied.warnings {
        assert!(warning.starts_with("podmend node-affinity"), "{warning}");
        assert!(warning.chars().count() <= 120, "too long: {warning}");
    }
    assert_valid(&applied.object);
    assert_idempotent(&server, &applied.object).await;
}

/// Without cluster look-ups (`podmend serve` without a kubeconfig) the node's taints are
/// unknown, and a rewrite could leave the pod Pending for ever on a tainted node: the pod is
/// allowed as it is and the warning says why.
#[tokio::test]
async fn without_look_ups_a_pod_with_node_name_is_allowed_unchanged_and_the_warning_says_why() {
    let server = Server::start(Options::default());
    let mut review = gke_pod();
    review["request"]["object"]["spec"]["nodeName"] = json!("gke-node-1");
    let applied = mutate(&server, &review).await;
    assert!(!applied.patched, "{:#}", applied.object);
    assert_eq!(applied.object, review["request"]["object"]);
    assert_eq!(applied.warnings.len(), 1, "{:?}", applied.warnings);
    let warning = &applied.warnings[0];
    assert!(
        warning.starts_with("podmend node-affinity")
            && warning.contains(
                "left as is: node gke-node-1's taints are unknown without cluster look-ups"
            ),
        "{warning}"
    );
    assert!(warning.chars().count() <= 120, "too long: {warning}");
}

/// How many review helpers `serve` started, from the line that says it is serving.
fn review_helpers(server: &Server) -> usize {
    let log = server.log_once(|log| log.contains("review_helpers"));
    let (_, after) = log
        .split_once("review_helpers")
        .unwrap_or_else(|| panic!("no review_helpers in the serving line:\n{log}"));
    let digits: String = after
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("review_helpers is a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_handed_to_a_review_helper_get_the_answers_the_worker_gives() {
    let (_stub, server) = start_knowing_nodes(&["gke-node-1"], Options::default()).await;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(
        review_helpers(&server),
        usize::from(cores > 1),
        "one helper on two cores or more"
    );
    let untouched = gke_pod();
    let mut pinned = gke_pod();
    pinned["request"]["object"]["spec"]["nodeName"] = json!("gke-node-1");
    // Each answered first after an untouched pod, by the worker that read it.
    let untouched_answer = post(&server, H1, "/mutate", &untouched).await;
    let pinned_answer = post(&server, H1, "/mutate", &pinned).await;
    assert_ne!(untouched_answer.1, pinned_answer.1);
    assert!(
        pinned_answer.1["response"]["patch"].is_string(),
        "the pinned pod is repaired: {}",
        pinned_answer.1
    );
    // After a repair the next review goes to a free helper (with two cores or more), after an
    // untouched pod it stays where it was read: these take both ways, one at a time and then
    // sixteen at once, over HTTP/2.
    for (review, expected) in [
        (&pinned, &pinned_answer),
        (&untouched, &untouched_answer),
        (&pinned, &pinned_answer),
        (&pinned, &pinned_answer),
        (&untouched, &untouched_answer),
        (&untouched, &untouched_answer),
    ] {
        let answer = post(&server, H1, "/mutate", review).await;
        assert_eq!(&answer, expected);
    }
    let together = futures::future::join_all((0..16).map(|i| {
        post(
            &server,
            H2,
            "/mutate",
            if i % 3 == 0 { &untouched } else { &pinned },
        )
    }))
    .await;
    for (i, answer) in together.iter().enumerate() {
        let expected = if i % 3 == 0 {
            &untouched_answer
        } else {
            &pinned_answer
        };
        assert_eq!(answer.0, expected.0);
        assert_eq!(answer.1, expected.1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jenkins_agent_keeps_the_request_no_limit_bounds_and_gets_no_invented_limit() {
    // The Jenkins preset is opt-in; a user turned it on. The plugin's default jnlp container
    // requests 100m/256Mi and sets no limit. Before, it got limits of 100m/256Mi copied from
    // those requests (throttled and OOM-killed at its request) and requests of 0; now it
    // keeps its requests, gets no limit, and the warning says why.
    let (_stub, server) = start_knowing_nodes(
        &["ip-10-0-1-23.ec2.internal"],
        Options {
            config: Some(
                "rules:\n  agent-requests:\n    presets: [pinniped-kube-cert-agent, jenkins-agent]\n"
                    .to_string(),
            ),
            ..Options::default()
        },
    )
    .await;
    let mut pod = fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml");
    pod["spec"]["nodeName"] = json!("ip-10-0-1-23.ec2.internal");
    let applied = mutate(&server, &create_review("jenkins", &pod, "jenkins")).await;

    assert!(applied.patched, "node-affinity still repairs the pod");
    let jnlp = &applied.object["spec"]["containers"][1];
    assert_eq!(jnlp["name"], "jnlp");
    assert_eq!(
        jnlp["resources"]["requests"],
        json!({"cpu": "100m", "memory": "256Mi"})
    );
    assert!(
        jnlp["resources"]["limits"]
            .as_object()
            .is_none_or(|l| l.is_empty()),
        "no limit invented: {jnlp}"
    );
    assert_eq!(
        applied.object["metadata"]["annotations"]["podmend.io/mutated"],
        "node-affinity"
    );
    assert!(
        applied.warnings.iter().any(|w| w.starts_with(
            "podmend agent-requests: agent pod: requests kept, no limit bounds them: cpu/memory (jnlp)"
        )),
        "{:?}",
        applied.warnings
    );
    assert_eq!(k8s_rules::qos_class(&applied.object["spec"]), "Burstable");
    assert_valid(&applied.object);
    assert_idempotent(&server, &applied.object).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinniped_agent_deployment_is_warned_about_but_unchanged_by_default() {
    let (_stub, server) = start_knowing_nodes(&["minikube"], Options::default()).await;
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let applied = mutate(
        &server,
        &create_review("pinniped", &deployment, "pinniped-concierge"),
    )
    .await;
    assert!(!applied.patched);
    assert!(
        applied
            .warnings
            .iter()
            .any(|w| w.starts_with("podmend node-affinity would repair")),
        "{:?}",
        applied.warnings
    );
    assert!(
        applied
            .warnings
            .iter()
            .any(|w| w.starts_with("podmend agent-requests would repair")),
        "{:?}",
        applied.warnings
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinniped_agent_deployment_is_repaired_when_templates_are_enforced() {
    let config =
        "rules:\n  node-affinity: {templates: enforce}\n  agent-requests: {templates: enforce}\n";
    let (_stub, server) = start_knowing_nodes(
        &["minikube"],
        Options {
            config: Some(config.to_string()),
            ..Options::default()
        },
    )
    .await;
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let applied = mutate(
        &server,
        &create_review("pinniped", &deployment, "pinniped-concierge"),
    )
    .await;
    assert!(applied.patched);
    let template = &applied.object["spec"]["template"];
    assert!(template["spec"].get("nodeName").is_none());
    assert_eq!(
        template["spec"]["containers"][0]["resources"]["requests"],
        json!({"cpu": "0", "memory": "0"})
    );
    assert_eq!(
        template["spec"]["containers"][0]["resources"]["limits"],
        json!({"cpu": "20m", "memory": "32Mi"})
    );
    assert_eq!(
        template["metadata"]["annotations"]["podmend.io/mutated"],
        "node-affinity,agent-requests"
    );
    // The original NoExecute toleration stays.
    assert_eq!(
        template["spec"]["tolerations"],
        json!([{"effect": "NoExecute", "operator": "Exists"}])
    );
    assert_valid(&applied.object);
    assert_idempotent(&server, &applied.object).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_unknown_to_podmend_survive_the_round_trip() {
    let (_stub, server) = start_knowing_nodes(&["n1"], Options::default()).await;
    let mut review = gke_pod();
    let object = &mut review["request"]["object"];
    object["spec"]["nodeName"] = json!("n1");
    object["spec"]["inventedSpecField"] = json!({"nested": [1, 2, 3]});
    object["spec"]["containers"][0]["inventedContainerField"] = json!("keep me");
    let applied = mutate(&server, &review).await;
    assert!(applied.patched);
    assert_eq!(
        applied.object["spec"]["inventedSpecField"],
        json!({"nested": [1, 2, 3]})
    );
    assert_eq!(
        applied.object["spec"]["containers"][0]["inventedContainerField"],
        "keep me"
    );
}

#[tokio::test]
async fn every_captured_request_podmend_must_not_change_is_allowed_without_a_patch() {
    let server = Server::start(Options::default());
    let requests = [
        "admissionrequest-pod-delete-kubewarden.json",
        "admissionrequest-pod-status-subresource-update-by-kubelet-kyverno.json",
        "admissionrequest-configmap-create-unhandled-kind-pepr-log.json",
        "admissionrequest-deployment-update-with-oldobject-kubewarden-echo.json",
        "admissionrequest-deployment-update-label-k3s-pepr.json",
        "admissionrequest-pod-create-by-replicaset-controller-kubewarden.json",
        "admissionrequest-cronjob-create-kubewarden.json",
        "admissionrequest-job-create-kubewarden.json",
        "admissionrequest-daemonset-create-kubewarden.json",
        "admissionrequest-deployment-create-kubewarden-echo.json",
    ];
    for name in requests {
        let review = review_of(fixture(name));
        let applied = mutate(&server, &review).await;
        assert!(!applied.patched, "{name} was patched");
        assert!(
            applied.warnings.is_empty(),
            "{name}: {:?}",
            applied.warnings
        );
    }
    let dry_run = fixture("admissionreview-v1-deployment-create-dryrun-kube-review-generated.json");
    assert!(!mutate(&server, &dry_run).await.patched);

    // A mirror pod carries nodeName by design: never touched.
    let mut mirror = fixture("kube-controller-manager-mirror-pod-minikube.yaml");
    mirror.as_object_mut().expect("object").remove("status");
    let applied = mutate(&server, &create_review("mirror", &mirror, "kube-system")).await;
    assert!(!applied.patched);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_kubelet_pod_keeps_its_node_selector_and_tolerations() {
    let (_stub, server) = start_knowing_nodes(&["vk-aci-test-aks"], Options::default()).await;
    let pod = fixture("virtual-kubelet-aci-e2e-pod-with-nodename-and-nodeselector.yaml");
    let applied = mutate(&server, &create_review("vk", &pod, "default")).await;
    assert!(applied.patched);
    assert_eq!(
        applied.object["spec"]["nodeSelector"],
        pod["spec"]["nodeSelector"]
    );
    assert_eq!(
        applied.object["spec"]["tolerations"],
        pod["spec"]["tolerations"]
    );
    assert_valid(&applied.object);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_negotiated_and_answers_the_same() {
    let (_stub, server) = start_knowing_nodes(&["n1"], Options::default()).await;
    let mut review = gke_pod();
    review["request"]["object"]["spec"]["nodeName"] = json!("n1");
    let (status1, body1, version1) = post(&server, H1, "/mutate", &review).await;
    let (status2, body2, version2) = post(&server, H2, "/mutate", &review).await;
    assert_eq!((status1, status2), (200, 200));
    assert_eq!(version1, reqwest::Version::HTTP_11);
    assert_eq!(version2, reqwest::Version::HTTP_2);
    assert!(body1["response"]["patch"].is_string(), "{body1}");
    assert_eq!(body1, body2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_mode_rejects_on_the_validating_webhook_with_a_message() {
    let (_stub, server) = start_knowing_nodes(
        &["n1"],
        Options {
            config: Some("rules:\n  node-affinity: {mode: deny}\n".to_string()),
            ..Options::default()
        },
    )
    .await;
    let mut review = gke_pod();
    review["request"]["object"]["spec"]["nodeName"] = json!("n1");
    let (status, body, _) = post(&server, H1, "/validate", &review).await;
    assert_eq!(status, 200);
    let uid = review["request"]["uid"].as_str().expect("uid");
    assert_eq!(
        k8s_rules::verify_admission_response(uid, &body, false).expect("valid response"),
        None
    );
    assert_eq!(body["response"]["allowed"], false);
    assert_eq!(body["response"]["status"]["code"], 403);
    let message = body["response"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.contains("node-affinity") && message.contains("matchFields"),
        "{message}"
    );
    // The mutating webhook neither repairs nor warns in deny mode.
    let applied = mutate(&server, &review).await;
    assert!(!applied.patched);
}

#[tokio::test]
async fn unreadable_requests_get_a_clear_4xx_and_the_server_stays_healthy() {
    let server = Server::start(Options::default());
    let client = server.client(H1);
    let send = |content_type: &'static str, body: Vec<u8>| {
        let request = client
            .post(server.url("/mutate"))
            .header("content-type", content_type)
            .body(body);
        async move {
            let response = request.send().await.expect("answered");
            (
                response.status().as_u16(),
                response.text().await.expect("text"),
            )
        }
    };
    let (status, text) = send("application/json", b"{not json".to_vec()).await;
    assert_eq!(status, 400);
    assert!(text.contains("not valid JSON"), "{text}");
    let (status, text) = send("text/plain", b"{}".to_vec()).await;
    assert_eq!(status, 415);
    assert!(text.contains("application/json"), "{text}");
    let v1beta1 = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}})).expect("json");
    let (status, text) = send("application/json", v1beta1).await;
    assert_eq!(status, 400);
    assert!(text.contains("admissionReviewVersions"), "{text}");
    // tests/bad_input.rs covers the same over HTTP/1.1 (declared, chunked, 100-continue).
    let response = server
        .client(H2)
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .body(vec![b' '; 9 * 1024 * 1024])
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status().as_u16(), 413);
    assert!(response.text().await.expect("text").contains("larger than"));
    let (status, _) = send(
        "application/json; charset=utf-8",
        serde_json::to_vec(&gke_pod()).expect("json"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(server.metrics_get("/healthz").expect("healthz").0, 200);
    let (_, metrics) = server.metrics_get("/metrics").expect("metrics");
    assert!(
        metrics.contains("podmend_bad_requests_total{reason=\"not-json\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podmend_bad_requests_total{reason=\"content-type\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podmend_bad_requests_total{reason=\"too-large\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_rule_actions_and_certificate_expiry() {
    let (_stub, server) = start_knowing_nodes(&["n1"], Options::default()).await;
    let mut review = gke_pod();
    review["request"]["object"]["spec"]["nodeName"] = json!("n1");
    mutate(&server, &review).await;
    let (status, metrics) = server.metrics_get("/metrics").expect("metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("podmend_admission_requests_total{webhook=\"mutate\",kind=\"Pod\",operation=\"CREATE\",result=\"patched\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("podmend_rule_actions_total{rule=\"node-affinity\",action=\"repaired\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podmend_admission_duration_seconds_count{webhook=\"mutate\"} 1"),
        "{metrics}"
    );
    let expiry: i64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("podmend_tls_certificate_expiry_timestamp_seconds "))
        .and_then(|v| v.parse().ok())
        .expect("expiry gauge");
    assert!(expiry > 1_700_000_000, "{expiry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_its_controller_creates_is_logged_by_its_generate_name() {
    let (_stub, server) = start_knowing_nodes(&["gke-node-1"], Options::default()).await;
    // As a ReplicaSet's pod reaches admission: no name yet, in the request or the object.
    let unnamed = |generate_name: &str, node_name: Option<&str>| {
        let mut review = gke_pod();
        let request = &mut review["request"];
        request["name"] = json!("");
        let metadata = request["object"]["metadata"]
            .as_object_mut()
            .expect("metadata");
        metadata.remove("name");
        metadata.insert("generateName".into(), json!(generate_name));
        if let Some(node) = node_name {
            request["object"]["spec"]["nodeName"] = json!(node);
        }
        review
    };
    // Decided on the object's sketch, and repaired from the whole object.
    assert!(!mutate(&server, &unnamed("web-7d9f8-", None)).await.patched);
    assert!(
        mutate(&server, &unnamed("agent-5c4b-", Some("gke-node-1")))
            .await
            .patched
    );
    let log = server.log_once(|log| log.contains("name=agent-5c4b-"));
    for name in ["web-7d9f8-", "agent-5c4b-"] {
        assert!(log.contains(&format!("name={name} ")), "{name}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_config_is_reloaded_and_an_invalid_one_keeps_the_old() {
    let (_stub, server) = start_knowing_nodes(
        &["minikube"],
        Options {
            config: Some("rules:\n  node-affinity: {templates: warn}\n".to_string()),
            ..Options::default()
        },
    )
    .await;
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let review = create_review("reload", &deployment, "pinniped-concierge");
    assert!(!mutate(&server, &review).await.patched);

    std::fs::write(
        server.config_path(),
        "rules:\n  node-affinity: {templates: enforce}\n",
    )
    .expect("write");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !mutate(&server, &review).await.patched {
        assert!(
            std::time::Instant::now() < deadline,
            "config not reloaded:\n{}",
            server.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    std::fs::write(
        server.config_path(),
        "rules:\n  node-affinity: {templates: sometimes}\n",
    )
    .expect("write");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, metrics) = server.metrics_get("/metrics").expect("metrics");
        if metrics.contains("podmend_config_reloads_total{result=\"error\"} 1") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "invalid config not noticed:\n{metrics}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        mutate(&server, &review).await.patched,
        "the old config must keep serving"
    );
    let log = server.log_once(|log| log.contains("keeping the old one"));
    assert!(
        log.contains("keeping the old one") && log.contains("templates"),
        "{log}"
    );
}

#[tokio::test]
async fn sigterm_drops_readiness_and_exits_cleanly() {
    let mut server = Server::start(Options {
        wait_ready: true,
        ..Options::default()
    });
    assert!(
        server
            .log_once(|log| log.contains("cluster look-ups off"))
            .contains("cluster look-ups off"),
        "{}",
        server.log_text()
    );
    assert!(
        server.terminate(),
        "podmend did not exit cleanly on SIGTERM:\n{}",
        server.log_text()
    );
    let log = server.log_text();
    assert!(
        log.contains("shutting down") && log.contains("stopped"),
        "{log}"
    );
}
