//! The whole admission path inside the library, per object type, from request bytes to
//! response bytes: exactly what `server::handlers::review` does, minus HTTP, metrics and
//! logging. Run with `cargo bench --bench engine`; the figures are in BENCHMARKS.md.
//!
//! The request bodies are built once, before any timing, from the captures in
//! `tests/fixtures/`; each case's answer is checked once so a bench can never quietly
//! measure an error path.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use podmend::admission::{self, Decision, Webhook};
use podmend::cluster::StaticCluster;
use podmend::config::Config;
use podmend::engine::{Engine, Skip};
use serde_json::{Value, json};

/// The benchmark group; Criterion writes `target/criterion/<GROUP>/<case>/new/estimates.json`.
const GROUP: &str = "admission_review";
/// The per-stage breakdown: `target/criterion/<STAGES_GROUP>/<stage>/<case>/`.
const STAGES_GROUP: &str = "admission_stages";
/// The cases the breakdown covers.
const STAGED_CASES: &[&str] = &["pod-create-untouched", "pod-create-nodename"];
/// The node the cluster knows (no taints), and the one the nodeName case names.
const NODE: &str = "minikube";
/// Containers in the large-pod case.
const LARGE_POD_CONTAINERS: usize = 40;

/// What a case's answer must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Reviewed, nothing found: no patch, no warning.
    Clean,
    /// Reviewed and repaired: a patch (and its warnings).
    Patched,
    /// Reviewed, findings in `warn` mode: warnings, no patch.
    WarnedOnly,
    /// Not a kind podmend handles.
    Unhandled,
}

struct Case {
    name: &'static str,
    body: Vec<u8>,
    expect: Expect,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_json(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn read_yaml(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

/// Wraps an `AdmissionRequest` (the `.request` member) in a v1 AdmissionReview.
fn review(request: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    }))
    .expect("a Value serializes")
}

/// A CREATE request for a bare object, shaped like the captured ones (GVK, GVR, user,
/// `oldObject: null`, `dryRun`, `options`) so its size is realistic.
fn create_request(
    uid: &str,
    (group, version, kind, resource): (&str, &str, &str, &str),
    namespace: &str,
    object: Value,
) -> Value {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    json!({
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "minikube-user", "groups": ["system:masters", "system:authenticated"]},
        "object": object,
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    })
}

fn cases() -> Vec<Case> {
    let gke = read_json("admissionreview-v1-pod-create-gke-kube-rs.json");

    let mut nodename = gke.clone();
    nodename["request"]["object"]["spec"]["nodeName"] = json!(NODE);

    let mut large = gke.clone();
    let container = large["request"]["object"]["spec"]["containers"][0].clone();
    let containers: Vec<Value> = (0..LARGE_POD_CONTAINERS)
        .map(|i| {
            let mut c = container.clone();
            c["name"] = json!(format!("echo-server-{i}"));
            c
        })
        .collect();
    large["request"]["object"]["spec"]["containers"] = Value::Array(containers);

    let jenkins = create_request(
        "5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e01",
        ("", "v1", "Pod", "pods"),
        "jenkins",
        read_yaml("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml"),
    );
    let pinniped = create_request(
        "5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e02",
        ("apps", "v1", "Deployment", "deployments"),
        "pinniped-concierge",
        read_yaml("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml"),
    );

    let encode = |v: &Value| serde_json::to_vec(v).expect("a Value serializes");
    vec![
        Case {
            name: "pod-create-untouched",
            body: encode(&gke),
            expect: Expect::Clean,
        },
        Case {
            name: "pod-create-nodename",
            body: encode(&nodename),
            expect: Expect::Patched,
        },
        Case {
            name: "pod-create-jenkins-agent",
            body: review(jenkins),
            expect: Expect::Patched,
        },
        Case {
            name: "pod-create-large-40-containers",
            body: encode(&large),
            expect: Expect::Clean,
        },
        Case {
            name: "deployment-create-pinniped",
            body: review(pinniped),
            expect: Expect::WarnedOnly,
        },
        Case {
            name: "deployment-create-echo",
            body: review(read_json(
                "admissionrequest-deployment-create-kubewarden-echo.json",
            )),
            expect: Expect::Clean,
        },
        Case {
            name: "configmap-unhandled",
            body: review(read_json(
                "admissionrequest-configmap-create-unhandled-kind-pepr-log.json",
            )),
            expect: Expect::Unhandled,
        },
    ]
}

/// What the webhook's handler does between reading the body and answering it.
fn mutate(engine: &Engine, cluster: &StaticCluster, body: &[u8]) -> Vec<u8> {
    let request = admission::decode(body).expect("the body decodes");
    let outcome = engine.review(&request.subject(), cluster);
    let decision = Decision::from_outcome(&outcome, Webhook::Mutate);
    admission::encode_response(&request.inner.uid, &decision)
}

/// Checks, once and outside timing, that a case gives the answer it is meant to measure.
fn check(engine: &Engine, cluster: &StaticCluster, case: &Case) {
    let request = admission::decode(&case.body)
        .unwrap_or_else(|e| panic!("{}: body does not decode: {e}", case.name));
    let outcome = engine.review(&request.subject(), cluster);
    let decision = Decision::from_outcome(&outcome, Webhook::Mutate);
    let name = case.name;
    assert!(decision.allowed, "{name}: not allowed");
    match case.expect {
        Expect::Clean => {
            assert_eq!(outcome.skipped, None, "{name}: {outcome:?}");
            assert!(outcome.findings.is_empty(), "{name}: {outcome:?}");
            assert!(decision.patch.is_empty(), "{name}: {outcome:?}");
        }
        Expect::Patched => {
            assert_eq!(outcome.skipped, None, "{name}: {outcome:?}");
            assert!(!decision.patch.is_empty(), "{name}: no patch: {outcome:?}");
            assert!(!decision.warnings.is_empty(), "{name}: {outcome:?}");
        }
        Expect::WarnedOnly => {
            assert_eq!(outcome.skipped, None, "{name}: {outcome:?}");
            assert!(!outcome.findings.is_empty(), "{name}: {outcome:?}");
            assert!(decision.patch.is_empty(), "{name}: {outcome:?}");
            assert!(!decision.warnings.is_empty(), "{name}: {outcome:?}");
        }
        Expect::Unhandled => {
            assert_eq!(outcome.skipped, Some(Skip::UnhandledKind), "{name}");
            assert!(decision.patch.is_empty(), "{name}");
        }
    }
    // The bytes the timed loop produces say the same.
    let response: Value =
        serde_json::from_slice(&mutate(engine, cluster, &case.body)).expect("response is JSON");
    assert_eq!(response["response"]["uid"], json!(request.inner.uid));
    assert_eq!(response["response"]["allowed"], json!(true));
    let patched = case.expect == Expect::Patched;
    assert_eq!(
        response["response"]["patchType"] == json!("JSONPatch"),
        patched,
        "{name}: {response}"
    );
}

fn bench_reviews(c: &mut Criterion) {
    let engine = Engine::new(&Config::default());
    let cluster = StaticCluster::empty().with_node(NODE, vec![]);
    let cases = cases();
    for case in &cases {
        check(&engine, &cluster, case);
    }

    let mut group = c.benchmark_group(GROUP);
    for case in &cases {
        group.throughput(Throughput::Bytes(case.body.len() as u64));
        group.bench_function(case.name, |b| {
            b.iter(|| mutate(&engine, &cluster, black_box(&case.body)))
        });
    }
    group.finish();

    // The same path cut into its three stages, for the typical pod with nothing to repair
    // and with a repair: where the time goes, measured rather than guessed.
    let mut stages = c.benchmark_group(STAGES_GROUP);
    for case in cases.iter().filter(|c| STAGED_CASES.contains(&c.name)) {
        let request = admission::decode(&case.body).expect("the body decodes");
        let outcome = engine.review(&request.subject(), &cluster);
        stages.bench_function(BenchmarkId::new("decode", case.name), |b| {
            b.iter(|| admission::decode(black_box(&case.body)).expect("the body decodes"))
        });
        stages.bench_function(BenchmarkId::new("review", case.name), |b| {
            b.iter(|| engine.review(&black_box(&request).subject(), &cluster))
        });
        stages.bench_function(BenchmarkId::new("respond", case.name), |b| {
            b.iter(|| {
                let decision = Decision::from_outcome(black_box(&outcome), Webhook::Mutate);
                admission::encode_response(&request.inner.uid, &decision)
            })
        });
    }
    stages.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = bench_reviews
}
criterion_main!(benches);
