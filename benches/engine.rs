//! The whole admission path inside the library, per object type, from request bytes to
//! response bytes: exactly what `server::handlers::review` does, minus HTTP, metrics and
//! logging. Run with `cargo bench --bench engine`; the figures are in BENCHMARKS.md. The last
//! group, `log_line`, prices the logging apart: the handler's one line per decision.
//!
//! The request bodies are built once, before any timing, from the captures in
//! `tests/fixtures/`; each case's answer is checked once so a bench can never quietly
//! measure an error path.

#[path = "common/cases.rs"]
mod cases;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use podmend::admission::{self, AdmissionDecision, Webhook};
use podmend::cluster::StaticCluster;
use podmend::config::{Config, Mode};
use podmend::engine::{Engine, Skip};
use podmend::server::handlers::AdmissionLine;
use podmend::telemetry::{self, LogFormat};
use serde::de::IgnoredAny;
use serde_json::{Value, json};

use cases::{Case, Expect, NODE, VIRTUAL_NODE, cases, status_cases};

/// The allocator `serve` runs with (`src/main.rs`, the same file), so the medians and profiles
/// are what the server pays: with glibc's, allocation was about 45 % of a repair here, and the
/// stages' shares were not the server's.
#[path = "../src/allocator.rs"]
mod allocator;

#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

/// The benchmark group; Criterion writes `target/criterion/<GROUP>/<case>/new/estimates.json`.
const GROUP: &str = "admission_review";
/// The per-stage breakdown: `target/criterion/<STAGES_GROUP>/<stage>/<case>/`.
const STAGES_GROUP: &str = "admission_stages";
/// `UPDATE pods/status` with `virtual-node-phase`: `target/criterion/<STATUS_GROUP>/<case>/`.
const STATUS_GROUP: &str = "pod_status";
/// The decision's log line, as `serve` writes it: `target/criterion/<LOG_GROUP>/<case>/`.
const LOG_GROUP: &str = "log_line";
/// The cases the breakdown covers: the typical pod, one repair, and the limit bench's repair.
const STAGED_CASES: &[&str] = &[
    "pod-create-untouched",
    "pod-create-nodename",
    "pod-create-agent-pinned",
];

/// What the webhook's handler does between reading the body and answering it.
fn mutate(engine: &Engine, cluster: &StaticCluster, body: &[u8]) -> Vec<u8> {
    let request = admission::decode(body).expect("the body decodes");
    let outcome = engine.review_raw(&request.subject(), cluster);
    let decision = AdmissionDecision::from_outcome(&outcome, Webhook::Mutate);
    admission::encode_response(&request.inner.uid, &decision)
}

/// Checks, once and outside timing, that a case gives the answer it is meant to measure.
fn check(engine: &Engine, cluster: &StaticCluster, case: &Case) {
    let request = admission::decode(&case.body)
        .unwrap_or_else(|e| panic!("{}: body does not decode: {e}", case.name));
    let outcome = engine.review_raw(&request.subject(), cluster);
    let decision = AdmissionDecision::from_outcome(&outcome, Webhook::Mutate);
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
    // and two repairs: where the time goes, measured rather than guessed.
    let mut stages = c.benchmark_group(STAGES_GROUP);
    for case in cases.iter().filter(|c| STAGED_CASES.contains(&c.name)) {
        let request = admission::decode(&case.body).expect("the body decodes");
        let outcome = engine.review_raw(&request.subject(), &cluster);
        stages.bench_function(BenchmarkId::new("decode", case.name), |b| {
            b.iter(|| admission::decode(black_box(&case.body)).expect("the body decodes"))
        });
        stages.bench_function(BenchmarkId::new("review", case.name), |b| {
            b.iter(|| engine.review_raw(&black_box(&request).subject(), &cluster))
        });
        // Two references, not stages: serde_json reading the body without building anything
        // (the floor of any serde_json pass), and building all of it as a `Value`.
        stages.bench_function(BenchmarkId::new("scan", case.name), |b| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(&case.body)))
        });
        stages.bench_function(BenchmarkId::new("value", case.name), |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&case.body)))
        });
        stages.bench_function(BenchmarkId::new("respond", case.name), |b| {
            b.iter(|| {
                let decision =
                    AdmissionDecision::from_outcome(black_box(&outcome), Webhook::Mutate);
                admission::encode_response(&request.inner.uid, &decision)
            })
        });
    }
    stages.finish();

    // pods/status writes with virtual-node-phase on: a correction, and the common write the
    // rule only glances at; and that same write with the rule off (the default).
    let mut config = Config::default();
    config.rules.virtual_node_phase.mode = Mode::Enforce;
    let status_engine = Engine::new(&config);
    let virtual_cluster =
        StaticCluster::empty().with_labeled_node(VIRTUAL_NODE, &[("type", "virtual-kubelet")]);
    let mut status = c.benchmark_group(STATUS_GROUP);
    for case in &status_cases() {
        check(&status_engine, &virtual_cluster, case);
        status.bench_function(case.name, |b| {
            b.iter(|| mutate(&status_engine, &virtual_cluster, black_box(&case.body)))
        });
    }
    let running = status_cases()
        .into_iter()
        .find(|c| c.name == "pod-status-running")
        .expect("the running case");
    status.bench_function("pod-status-running-rule-off", |b| {
        b.iter(|| mutate(&engine, &virtual_cluster, black_box(&running.body)))
    });
    status.finish();
}

/// A sink that counts what is written to it.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicUsize>);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.fetch_add(bytes.len(), Ordering::Relaxed);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The handler's log line for the typical pod and for the limit bench's repair, through the
/// subscriber `serve` installs (text, batched; its thread writes to a sink here). It installs
/// the process's global subscriber, so it must stay the last target: the groups before it time
/// the engine without one.
fn bench_log_line(c: &mut Criterion) {
    let written = Counted::default();
    let _guard = telemetry::init_batched(LogFormat::Text, written.clone());
    let allowed = AdmissionLine {
        webhook: "mutate",
        uid: "705ab4f5-6393-11e8-b7cc-42010a800002",
        kind: "Pod",
        namespace: "default",
        name: "echo-server-7d9c5b6f4-",
        operation: "CREATE",
        result: "allowed",
        rules: &[],
        skipped: "",
        duration_us: 12,
    };
    let patched = AdmissionLine {
        namespace: "pinniped-concierge",
        name: "pinniped-concierge-kube-cert-agent-6b5d8c9f7-",
        result: "patched",
        rules: &["node-affinity", "agent-requests"],
        duration_us: 41,
        ..allowed
    };
    // A line that is not written (RUST_LOG above info, another subscriber) costs nothing:
    // the bench would time a disabled call.
    allowed.log();
    let deadline = Instant::now() + Duration::from_secs(5);
    while written.0.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "the log line is not written: unset RUST_LOG (or set it to info) and run again"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut group = c.benchmark_group(LOG_GROUP);
    group.bench_function("allowed", |b| b.iter(|| black_box(&allowed).log()));
    group.bench_function("patched", |b| b.iter(|| black_box(&patched).log()));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    // `bench_log_line` last: see its doc.
    targets = bench_reviews, bench_log_line
}
criterion_main!(benches);
