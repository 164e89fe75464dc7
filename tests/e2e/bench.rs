//! What podmend costs a pod create through the real API server: `scripts/bench-apiserver`
//! runs this (`cargo test --release --test e2e -- --bench-pod-create --rounds=R --pods=N`)
//! instead of the tests, on the suite's control plane with podmend installed by helm.
//!
//! Two namespaces, one label apart: the chart's namespaceSelector leaves out namespaces
//! labelled `podmend.io/ignore`, so the API server never calls podmend for pods created there
//! (no webhook, arm A), and calls it for every pod created in the other (arm B). Creates
//! alternate between the arms pod by pod (A B A B), through one kube client, so both arms
//! share the machine's noise. Each create is one `POST pods` timed from request to stored
//! answer; the pods stay unscheduled (no scheduler runs in this mode), so deleting them
//! between rounds is immediate. Two pod shapes: a plain pod podmend answers without a patch,
//! and Pinniped's pinned agent, which both `node-affinity` and `agent-requests` repair.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::fixture;
use crate::install::{ensure_installed, kubectl};
use crate::node_affinity::wait_until_podmend_knows;
use crate::pinniped::create_node;

const DIRECT: &str = "bench-no-webhook";
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
    prepare(suite);
    let api = |ns: &str| -> Api<Pod> {
        let client = suite.block_on(suite.plane.client());
        Api::namespaced(client, ns)
    };
    let (direct, through) = (api(DIRECT), api(THROUGH));
    let mut table = String::from(
        "| pod | round | no webhook: median, p90 (ms) | through podmend: median, p90 (ms) | ratio of medians |\n| --- | --- | --- | --- | --- |\n",
    );
    for (shape, pod) in [("plain", plain_pod()), ("pinned agent", pinned_agent())] {
        let mut ratios = Vec::new();
        for round in 1..=plan.rounds {
            let (a, b) = suite.block_on(one_round(&direct, &through, &pod, plan.pods));
            let (a_median, b_median) = (percentile(&a, 50), percentile(&b, 50));
            ratios.push(b_median / a_median);
            table.push_str(&format!(
                "| {shape} | {round} | {a_median:.2}, {:.2} | {b_median:.2}, {:.2} | {:.3} |\n",
                percentile(&a, 90),
                percentile(&b, 90),
                b_median / a_median
            ));
        }
        table.push_str(&format!(
            "| {shape} | median of rounds | | | **{:.3}** |\n",
            percentile(&ratios, 50)
        ));
    }
    table
}

/// The node, both namespaces, and proof that the arms differ as they should: podmend repairs
/// the pinned agent in one namespace and is never asked in the other.
fn prepare(suite: &Suite) {
    create_node(suite, NODE, "");
    for ns in [DIRECT, THROUGH] {
        suite
            .block_on(suite.plane.create_namespace(ns))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    kubectl(
        suite,
        &["label", "namespace", DIRECT, "podmend.io/ignore=true"],
    );
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
    while mutated(DIRECT, format!("arms-differ-{attempt}")) {
        assert!(
            Instant::now() < deadline,
            "the API server still calls podmend for namespace {DIRECT} labelled podmend.io/ignore"
        );
        attempt += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        mutated(THROUGH, "arms-differ".to_string()),
        "podmend repairs the agent in {THROUGH}"
    );
}

/// One round: `pods` creates in each arm, alternating, then both namespaces emptied. The
/// latencies in milliseconds, per arm.
async fn one_round(
    direct: &Api<Pod>,
    through: &Api<Pod>,
    pod: &Value,
    pods: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut a, mut b) = (Vec::with_capacity(pods), Vec::with_capacity(pods));
    for i in 0..pods {
        a.push(timed_create(direct, pod, i).await);
        b.push(timed_create(through, pod, i).await);
    }
    for api in [direct, through] {
        api.delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("delete the round's pods: {e}"));
    }
    (a, b)
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
