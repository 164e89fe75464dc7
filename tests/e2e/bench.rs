//! What podmend costs a pod create through the real API server: `scripts/bench-apiserver`
//! runs this (`cargo test --release --test e2e -- --bench-pod-create --rounds=R --pods=N`)
//! instead of the tests, on the suite's control plane with podmend installed by helm.
//!
//! Four namespaces, four arms. The chart's namespaceSelector leaves out namespaces labelled
//! `podmend.io/ignore`: in one such namespace the API server calls no webhook (arm A); in
//! another it calls only a null webhook of the test's own, which allows every pod without a
//! patch (arm N: what any webhook costs the API server, its call and the AdmissionReview's
//! encoding); in a third, a webhook of the test's own that adds one annotation by JSON Patch
//! (arm M: what any patch costs, as the API server applies it and, the object changed, runs
//! its built-in mutating plugins again: `staging/src/k8s.io/apiserver/pkg/admission/
//! reinvocation.go`, `reinvoker.Admit`); in the fourth it calls podmend (arm P). Creates go
//! round the arms pod by pod (A N M P A N M P), through one kube client, so every arm shares
//! the machine's noise. Each create is one `POST pods` timed from request to stored
//! answer; the pods stay unscheduled (no scheduler runs in this mode), so deleting them
//! between rounds is immediate. Two pod shapes: a plain pod podmend answers without a patch,
//! and Pinniped's pinned agent, which both `node-affinity` and `agent-requests` repair.

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header;
use axum::routing::post;
use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::fixture;
use crate::install::{ensure_installed, kubectl};
use crate::node_affinity::wait_until_podmend_knows;
use crate::own_webhook::{OwnWebhook, Registration};
use crate::pinniped::create_node;

const DIRECT: &str = "bench-no-webhook";
const NULL: &str = "bench-null-webhook";
const PATCHING: &str = "bench-patching-webhook";
const THROUGH: &str = "bench-podmend";
const NODE: &str = "bench-node";

/// How many rounds, and how many pods of each arm and shape per round.
pub struct Plan {
    pub rounds: usize,
    pub pods: usize,
}

impl Plan {
    /// `--rounds=R` and `--pods=N` among `args` (3 and 200 when absent). Err says which
    /// argument is not a positive number.
    pub fn from_args(args: &[String]) -> Result<Plan, String> {
        let value = |name: &str, default: usize| -> Result<usize, String> {
            match args.iter().find_map(|a| a.strip_prefix(name)) {
                None => Ok(default),
                Some(text) => text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name}{text}: give a positive whole number")),
            }
        };
        Ok(Plan {
            rounds: value("--rounds=", 3)?,
            pods: value("--pods=", 200)?,
        })
    }
}

/// Runs the plan and returns the table it measured.
pub fn pod_create(suite: &Suite, plan: &Plan) -> String {
    ensure_installed(suite);
    let _null = own_webhook(suite, NULL, false);
    let _patching = own_webhook(suite, PATCHING, true);
    prepare(suite);
    let client = suite.block_on(suite.plane.client());
    let arms: [Api<Pod>; 4] =
        [DIRECT, NULL, PATCHING, THROUGH].map(|ns| Api::namespaced(client.clone(), ns));
    let mut table = String::from(
        "| pod | round | no webhook (A) | null webhook (N) | one-op patch (M) | podmend (P) | P/A | P/N | P/M |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (shape, pod) in [("plain", plain_pod()), ("pinned agent", pinned_agent())] {
        let (mut over_a, mut over_n, mut over_m) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=plan.rounds {
            let [a, n, m, p] = suite.block_on(one_round(&arms, &pod, plan.pods));
            let [a50, n50, m50, p50] = [&a, &n, &m, &p].map(|arm| percentile(arm, 50));
            over_a.push(p50 / a50);
            over_n.push(p50 / n50);
            over_m.push(p50 / m50);
            let cell =
                |arm: &[f64], median: f64| format!("{median:.2}, {:.2}", percentile(arm, 90));
            table.push_str(&format!(
                "| {shape} | {round} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} |\n",
                cell(&a, a50),
                cell(&n, n50),
                cell(&m, m50),
                cell(&p, p50),
                p50 / a50,
                p50 / n50,
                p50 / m50
            ));
        }
        table.push_str(&format!(
            "| {shape} | median of rounds | | | | | **{:.3}** | **{:.3}** | **{:.3}** |\n",
            percentile(&over_a, 50),
            percentile(&over_n, 50),
            percentile(&over_m, 50)
        ));
    }
    table.push_str("\nEach arm's cell: median, p90 of one create in ms.\n");
    table
}

/// A webhook of the test's own for the pods of `namespace`: it allows each, without a patch
/// or, with `patch`, adding one annotation.
fn own_webhook<'a>(suite: &'a Suite, namespace: &str, patch: bool) -> OwnWebhook<'a> {
    let answer = move |body: axum::body::Bytes| async move {
        let review: Value = serde_json::from_slice(&body).unwrap_or_default();
        let mut response = json!({"uid": review["request"]["uid"], "allowed": true});
        if patch {
            let ops = json!([{"op": "add", "path": "/metadata/annotations",
                              "value": {"bench.podmend.io/patched": "true"}}]);
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64::engine::general_purpose::STANDARD.encode(ops.to_string()));
        }
        let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                            "response": response});
        (
            [(header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
    };
    let registration = Registration {
        configuration: namespace,
        webhook: if patch {
            "patching.bench.podmend.io"
        } else {
            "null.bench.podmend.io"
        },
        namespace,
        failure_policy: "Fail",
        path: "/mutate",
        rules: None,
    };
    OwnWebhook::start(
        suite,
        &registration,
        Router::new().route("/mutate", post(answer)),
    )
}

/// The node, the namespaces, and proof that the arms differ as they should: podmend repairs
/// the pinned agent in its namespace and is never asked in the others.
fn prepare(suite: &Suite) {
    create_node(suite, NODE, "");
    for ns in [DIRECT, NULL, PATCHING, THROUGH] {
        suite
            .block_on(suite.plane.create_namespace(ns))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for ns in [DIRECT, NULL, PATCHING] {
        kubectl(suite, &["label", "namespace", ns, "podmend.io/ignore=true"]);
    }
    wait_until_podmend_knows(suite, THROUGH, NODE);
    let client = suite.block_on(suite.plane.client());
    let mutated = |ns: &str, name: String| -> bool {
        let mut pod: Pod = serde_json::from_value(pinned_agent()).expect("a Pod");
        pod.metadata.name = Some(name);
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let stored = suite
            .block_on(api.create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| panic!("create in {ns}: {e}"));
        stored
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key("podmend.io/mutated"))
    };
    // The namespaceSelector reaches the API server through its informer a moment after the
    // label: wait until the direct arm is really left alone.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    while mutated(DIRECT, format!("arms-differ-{attempt}"))
        || mutated(NULL, format!("arms-differ-{attempt}"))
        || mutated(PATCHING, format!("arms-differ-{attempt}"))
    {
        assert!(
            Instant::now() < deadline,
            "the API server still calls podmend for namespaces labelled podmend.io/ignore"
        );
        attempt += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        mutated(THROUGH, "arms-differ".to_string()),
        "podmend repairs the agent in {THROUGH}"
    );
}

/// One round: `pods` creates in each arm, taking turns, then the arms' namespaces emptied.
/// The latencies in milliseconds, per arm.
async fn one_round(arms: &[Api<Pod>; 4], pod: &Value, pods: usize) -> [Vec<f64>; 4] {
    let mut latencies = [(); 4].map(|()| Vec::with_capacity(pods));
    for i in 0..pods {
        for (api, arm) in arms.iter().zip(latencies.iter_mut()) {
            arm.push(timed_create(api, pod, i).await);
        }
    }
    for api in arms {
        api.delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("delete the round's pods: {e}"));
    }
    latencies
}

/// Creates `pod` named `p-I` and returns how long the API server took, in milliseconds.
async fn timed_create(api: &Api<Pod>, pod: &Value, i: usize) -> f64 {
    let mut pod: Pod = serde_json::from_value(pod.clone()).expect("a Pod");
    pod.metadata.name = Some(format!("p-{i}"));
    let began = Instant::now();
    api.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create p-{i}: {e}"));
    began.elapsed().as_secs_f64() * 1000.0
}

/// The `p`th percentile (nearest rank) of `values`.
fn percentile(values: &[f64], p: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A pod podmend is asked about and leaves as it is.
fn plain_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "busybox",
                    "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "100m"}}}]}})
}

/// The pod of Pinniped's kube-cert-agent Deployment, pinned to the bench node.
fn pinned_agent() -> Value {
    let deployment = fixture("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml");
    let mut template = deployment["spec"]["template"].clone();
    template["spec"]["nodeName"] = json!(NODE);
    // The ServiceAccount is not this benchmark's subject: the API server's ServiceAccount
    // admission would refuse a pod naming one the namespace lacks.
    if let Some(spec) = template["spec"].as_object_mut() {
        spec.remove("serviceAccountName");
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "labels": template["metadata"]["labels"]},
           "spec": template["spec"]})
}
