//! `podmend clean-storms`, the real binary against the API stand-in holding a storm of 5,000
//! `Failed` pods of one ReplicaSet among healthy pods, `Failed` pods of other reasons and a
//! small storm below the threshold: the dry run lists exactly what the real run deletes, in
//! its order; the real run deletes it, keeps the newest few, touches nothing else, posts an
//! Event on the owner, and never deletes faster than it was told (measured from the stub's
//! request times). The UID precondition and the metrics hand-over are tested beside it.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::api_stub::{ApiStub, Call};
use common::storm::{
    EVICTED_RS, NS, RS, SMALL_RS, evicted, failed_without_reason, healthy, key, small_storm, storm,
    storm_pod,
};
use podmend::storms::{self, CleanOptions};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_podmend");
const STORM: usize = 5000;
const KEEP: usize = 5;
const THRESHOLD: usize = 50;

async fn stub_with(pods: Vec<Value>) -> ApiStub {
    let stub = ApiStub::start(vec![], vec![]).await;
    stub.set_objects("pods", pods);
    stub
}

/// The cluster of the issue: the storm among everything the clean-up must leave alone.
fn cluster(storm_size: usize) -> Vec<Value> {
    let mut pods = storm(storm_size);
    pods.extend(healthy(20));
    pods.extend(failed_without_reason(7));
    pods.extend(evicted(THRESHOLD + 10));
    pods.extend(small_storm(THRESHOLD - 1));
    pods
}

/// The storm pods the clean-up must delete, oldest first (computed here from the
/// fixture, independently of podmend): all but the newest `KEEP` by creation time.
fn expected_deletions(pods: &[Value]) -> Vec<String> {
    let mut storm: Vec<&Value> = pods
        .iter()
        .filter(|p| p["status"]["reason"] == "OutOfcpu")
        .filter(|p| p["metadata"]["ownerReferences"][0]["name"] == RS)
        .collect();
    storm.sort_by_key(|p| {
        (
            p["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .to_string(),
            p["metadata"]["name"].as_str().unwrap().to_string(),
        )
    });
    storm[..storm.len() - KEEP].iter().map(|p| key(p)).collect()
}

struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

async fn clean(stub: &ApiStub, args: &[&str]) -> Run {
    let started = Instant::now();
    let output = tokio::process::Command::new(BIN)
        .arg("clean-storms")
        .arg("--kubeconfig")
        .arg(stub.kubeconfig_path())
        .args(args)
        .output()
        .await
        .expect("run podmend clean-storms");
    Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        took: started.elapsed(),
    }
}

fn deletes(calls: &[Call]) -> Vec<&Call> {
    calls.iter().filter(|c| c.verb == "delete").collect()
}

/// The most calls in any window of one second.
fn busiest_second(calls: &[&Call]) -> usize {
    let mut most = 0;
    let mut first = 0;
    for last in 0..calls.len() {
        while calls[last].at.duration_since(calls[first].at) >= Duration::from_secs(1) {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_5000_is_listed_by_the_dry_run_then_deleted_but_the_newest_rate_limited_with_an_event()
 {
    let pods = cluster(STORM);
    let expected = expected_deletions(&pods);
    assert_eq!(expected.len(), STORM - KEEP);
    let stub = stub_with(pods.clone()).await;
    let threshold = THRESHOLD.to_string();
    let keep = KEEP.to_string();

    // The dry run: one line per pod, in the real run's order, and not one delete.
    let dry = clean(
        &stub,
        &["--threshold", &threshold, "--keep", &keep, "--dry-run"],
    )
    .await;
    assert!(dry.status.success(), "{}\n{}", dry.stdout, dry.stderr);
    let lines: Vec<&str> = dry.stdout.lines().collect();
    let listed: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("would delete pod "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, expected,
        "the dry run lists exactly the pods to delete, oldest first"
    );
    assert_eq!(lines.len(), expected.len() + 1, "{}", dry.stdout);
    assert_eq!(
        lines.last().unwrap().rsplit_once(" (").unwrap().0,
        "clean-storms (dry run): 1 storm, 4,995 Failed pods would be deleted, 5 kept, nothing deleted"
    );
    assert!(deletes(&stub.calls()).is_empty());
    assert_eq!(stub.objects("pods").len(), pods.len());
    stub.clear_calls();

    // The real run, fast enough for a test: 2,000 deletes per second (BENCHMARKS.md runs
    // it at other rates with PODMEND_BENCH_DELETES_PER_SECOND).
    let rate: f64 = std::env::var("PODMEND_BENCH_DELETES_PER_SECOND")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2000.0);
    let real = clean(
        &stub,
        &[
            "--threshold",
            &threshold,
            "--keep",
            &keep,
            "--deletes-per-second",
            &rate.to_string(),
        ],
    )
    .await;
    assert!(real.status.success(), "{}\n{}", real.stdout, real.stderr);
    let calls = stub.calls();
    let deleted = deletes(&calls);
    let order: Vec<String> = deleted
        .iter()
        .map(|c| format!("{}/{}", c.namespace, c.name))
        .collect();
    // Up to 8 deletes are in flight at once, so arrivals may swap within a few places; the
    // set is exact and the order is the plan's up to that.
    assert_eq!(
        order.iter().cloned().collect::<BTreeSet<_>>(),
        expected.iter().cloned().collect::<BTreeSet<_>>()
    );
    for (i, name) in order.iter().enumerate() {
        let planned = expected.iter().position(|e| e == name).unwrap();
        assert!(
            planned.abs_diff(i) < 8,
            "{name} sent {i}th, planned {planned}th"
        );
    }
    assert!(
        deleted.iter().all(|c| c.status == 200),
        "every delete succeeded"
    );

    let remaining: BTreeSet<String> = stub.objects("pods").iter().map(key).collect();
    let expected_set: BTreeSet<String> = expected.iter().cloned().collect();
    for pod in &pods {
        let k = key(pod);
        assert_eq!(remaining.contains(&k), !expected_set.contains(&k), "{k}");
    }
    let kept: Vec<String> = storm(STORM)[STORM - KEEP..].iter().map(key).collect();
    assert!(
        kept.iter().all(|k| remaining.contains(k)),
        "the newest five stay"
    );
    for other in [EVICTED_RS, SMALL_RS] {
        assert!(
            remaining.iter().any(|k| k.contains(other)),
            "{other} untouched"
        );
    }

    // One Event, on the ReplicaSet, saying what and why.
    let events = stub.objects("events");
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["metadata"]["namespace"], NS);
    assert_eq!(event["involvedObject"]["kind"], "ReplicaSet");
    assert_eq!(event["involvedObject"]["name"], RS);
    assert_eq!(event["involvedObject"]["namespace"], NS);
    assert_eq!(
        event["involvedObject"]["uid"],
        "c2d4e6f8-1a3b-4c5d-8e9f-0a1b2c3d4e5f"
    );
    assert_eq!(event["reason"], "StormCleanedUp");
    assert_eq!(event["type"], "Normal");
    let message = event["message"].as_str().unwrap();
    assert!(
        message.starts_with("podmend deleted 4,995 Failed pods (OutOfcpu"),
        "{message}"
    );
    assert!(message.contains("keeping the newest 5"), "{message}");
    assert!(message.contains("threshold of 50"), "{message}");
    // As the API server would store it: the official schema, strictly.
    let mut stored = event.clone();
    stored["apiVersion"] = "v1".into();
    stored["kind"] = "Event".into();
    common::schema::validate_with_schema(&[stored], true).expect("a valid core/v1 Event");

    // Never faster than the limit: at most rate + 1 (the bucket's one token) per second.
    let most = busiest_second(&deleted);
    assert!(most as f64 <= rate + 1.0, "{most} deletes in one second");

    let summary = real.stdout.lines().last().unwrap();
    assert!(
        summary.starts_with(
            "clean-storms: 1 storm, 4,995 Failed pods deleted, 5 kept, 0 already gone, 0 recreated (left alone), 0 failed; 1 Events posted"
        ),
        "{summary}"
    );
    let requests = calls.len();
    println!(
        "dry run in {:.2} s; cleaned {} pods at --deletes-per-second {rate} in {:.2} s: {requests} API requests ({} list, {} delete, {} create), busiest second {most} deletes",
        dry.took.as_secs_f64(),
        deleted.len(),
        real.took.as_secs_f64(),
        calls.iter().filter(|c| c.verb == "list").count(),
        deleted.len(),
        calls.iter().filter(|c| c.verb == "create").count(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delete_rate_holds_the_limit_and_comes_close_to_it() {
    // 41 deletes at 20 per second: 40 gaps of 50 ms, 2 s in all.
    let stub = stub_with(storm(41)).await;
    let run = clean(
        &stub,
        &[
            "--threshold",
            "1",
            "--keep",
            "0",
            "--deletes-per-second",
            "20",
        ],
    )
    .await;
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    let calls = stub.calls();
    let deleted = deletes(&calls);
    assert_eq!(deleted.len(), 41);
    // Measured where the API server sees them: arrival times carry the network's jitter, so
    // the bounds allow a few milliseconds either way; a burst or a lost token would not fit.
    let span = deleted.last().unwrap().at - deleted[0].at;
    assert!(
        span >= Duration::from_millis(1950),
        "41 deletes in {span:?}: too fast"
    );
    assert!(
        span <= Duration::from_millis(2600),
        "41 deletes in {span:?}: far below the rate"
    );
    let most = busiest_second(&deleted);
    assert!(most <= 21, "{most} deletes in one second at 20 per second");
    let mean = span / 40;
    assert!(
        mean >= Duration::from_millis(48),
        "{mean:?} between deletes on average"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_recreated_under_the_same_name_is_never_deleted() {
    let pods = storm(12);
    let stub = stub_with(pods.clone()).await;
    let options = CleanOptions {
        threshold: 10,
        keep: 2,
        deletes_per_second: 1000.0,
        ..CleanOptions::default()
    };
    let client = stub.client().await;
    let plan = storms::plan(&client, &options).await.expect("plan");
    assert_eq!(plan.storms[0].delete.len(), 10);
    // Between the list and the delete, the oldest pod is replaced by a new one of the same name.
    let victim = plan.storms[0].delete[0].clone();
    let mut replacement = pods
        .iter()
        .find(|p| p["metadata"]["name"] == victim.name.as_str())
        .unwrap()
        .clone();
    replacement["metadata"]["uid"] = Value::String("11111111-2222-4333-8444-555555555555".into());
    stub.push_event("pods", "MODIFIED", replacement);

    let mut out = Vec::new();
    let outcome = storms::execute(&client, &plan, &options, &mut out)
        .await
        .expect("execute");
    assert_eq!(outcome.recreated, 1);
    assert_eq!(outcome.deleted, 9);
    let remaining: Vec<Value> = stub.objects("pods");
    let survivor = remaining
        .iter()
        .find(|p| p["metadata"]["name"] == victim.name.as_str())
        .expect("the recreated pod is still there");
    assert_eq!(
        survivor["metadata"]["uid"],
        "11111111-2222-4333-8444-555555555555"
    );
    let refused = stub
        .calls()
        .into_iter()
        .find(|c| c.verb == "delete" && c.name == victim.name)
        .expect("its delete was sent");
    assert_eq!(refused.status, 409, "refused by the UID precondition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_go_to_the_pushgateway_and_the_metrics_file() {
    let stub = stub_with(cluster(60)).await;
    let pushes: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let gateway = pushgateway(pushes.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("clean-storms.prom");
    let run = clean(
        &stub,
        &[
            "--threshold",
            "50",
            "--keep",
            "5",
            "--deletes-per-second",
            "1000",
            "-n",
            NS,
            "--pushgateway",
            &format!("http://{gateway}"),
            "--metrics-file",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    let pushes = pushes.lock().unwrap().clone();
    assert_eq!(pushes.len(), 1, "{pushes:?}");
    let (method, path, body) = &pushes[0];
    assert_eq!(method, "PUT");
    assert_eq!(
        path,
        &format!("/metrics/job/podmend-clean-storms/namespace/{NS}")
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(body, &text, "the same metrics both ways");
    let samples = parse_samples(&text);
    assert_eq!(samples["podmend_clean_storms_storms"], 1.0);
    assert_eq!(
        samples["podmend_clean_storms_pods{action=\"deleted\",reason=\"OutOfcpu\"}"],
        55.0
    );
    assert_eq!(
        samples["podmend_clean_storms_pods{action=\"kept\",reason=\"OutOfcpu\"}"],
        5.0
    );
    assert_eq!(
        samples["podmend_clean_storms_events{result=\"posted\"}"],
        1.0
    );
    assert_eq!(samples["podmend_clean_storms_success"], 1.0);
    assert_eq!(samples["podmend_clean_storms_dry_run"], 0.0);
    assert_eq!(
        samples["podmend_clean_storms_api_requests"] as usize,
        stub.calls().len(),
        "the run counts every request it sends"
    );
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        assert!(line.ends_with(" gauge"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_pushgateway_and_a_reason_that_is_no_rejection_say_what_to_do() {
    let stub = stub_with(storm(3)).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let run = clean(
        &stub,
        &["--dry-run", "--pushgateway", &format!("http://{closed}")],
    )
    .await;
    assert!(!run.status.success());
    assert!(
        run.stderr
            .contains("cannot push metrics to the Pushgateway"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--pushgateway"), "{}", run.stderr);

    let run = clean(&stub, &["--reason", "Evicted"]).await;
    assert!(!run.status.success());
    assert!(
        run.stderr
            .contains("--reason Evicted is not a kubelet admission rejection"),
        "{}",
        run.stderr
    );
    assert!(deletes(&stub.calls()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_stops_on_an_error_still_pushes_and_writes_success_0() {
    // A real fault, not an emulated one: the kubeconfig names an API server that is gone
    // (the stand-in stopped, its port closed).
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    {
        let stub = stub_with(storm(3)).await;
        std::fs::copy(stub.kubeconfig_path(), &kubeconfig).unwrap();
    }
    let pushes: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let gateway = pushgateway(pushes.clone()).await;
    let file = dir.path().join("clean-storms.prom");
    let output = tokio::process::Command::new(BIN)
        .arg("clean-storms")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--pushgateway", &format!("http://{gateway}")])
        .arg("--metrics-file")
        .arg(&file)
        .output()
        .await
        .expect("run podmend clean-storms");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let pushes = pushes.lock().unwrap().clone();
    assert_eq!(pushes.len(), 1, "the failure is pushed: {stderr}");
    let text = std::fs::read_to_string(&file).expect("the failure is written to the file");
    assert_eq!(pushes[0].2, text, "the same metrics both ways");
    let samples = parse_samples(&text);
    assert_eq!(samples["podmend_clean_storms_success"], 0.0, "{text}");
    assert!(
        samples["podmend_clean_storms_last_run_timestamp_seconds"] > 0.0,
        "{text}"
    );
}

/// The resource managers' rejections (kubernetes#84869): the topology manager's
/// `TopologyAffinityError` and the static CPU manager policy's `SMTAlignmentError`, which
/// the kubelet gives as the pod's reason through `GetPodAdmitResult`
/// (`pkg/kubelet/cm/admission/errors.go`: the error's `Type()`), and lists among its
/// admission rejections (`admissionRejectionReasons`, `pkg/kubelet/kubelet.go`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_affinity_and_smt_alignment_storms_are_cleaned_and_can_be_named_with_reason() {
    let mut pods: Vec<Value> = (0..60)
        .map(|i| {
            storm_pod(
                RS,
                "5a6b7c8d-0000-4000-8000-000000000011",
                "TopologyAffinityError",
                i,
            )
        })
        .collect();
    pods.extend((0..60).map(|i| {
        storm_pod(
            SMALL_RS,
            "5a6b7c8d-0000-4000-8000-000000000012",
            "SMTAlignmentError",
            i,
        )
    }));
    let stub = stub_with(pods).await;
    let fast = ["--deletes-per-second", "1000", "-n", NS];
    let deleted_of = |stub: &ApiStub, owner: &str| {
        deletes(&stub.calls())
            .iter()
            .filter(|c| c.path.contains(&format!("/pods/{owner}-")))
            .count()
    };

    let mut args = vec!["--reason", "TopologyAffinityError"];
    args.extend(fast);
    let run = clean(&stub, &args).await;
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(deleted_of(&stub, RS), 60 - KEEP, "{}", run.stdout);
    assert_eq!(deleted_of(&stub, SMALL_RS), 0, "only the reason named");
    assert!(
        run.stdout.contains("(TopologyAffinityError)"),
        "{}",
        run.stdout
    );

    stub.clear_calls();
    let run = clean(&stub, &fast).await;
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(deleted_of(&stub, SMALL_RS), 60 - KEEP, "{}", run.stdout);
    assert_eq!(deleted_of(&stub, RS), 0, "{}", run.stdout);
    assert!(run.stdout.contains("(SMTAlignmentError)"), "{}", run.stdout);
}

/// The pod GC's default ceiling (`--terminated-pod-gc-threshold` 12,500) and then some: the
/// storm `clean-storms` exists for, as many `Failed` pods as Kubernetes lets pile up.
const GC_CEILING_STORM: usize = 12_560;
/// Peak RSS allowed to plan it: well inside the chart's 256Mi limit for the CronJob.
const PLAN_PEAK_MIB: u64 = 100;

/// Runs `podmend` with `args` to its end and returns its exit status, stdout and peak RSS in
/// KiB: the highest `VmHWM` of `/proc/PID/status` read while it runs (every 2 ms; the mark
/// only rises, so the last read holds the peak of everything before it). Not `ru_maxrss`: a
/// spawned child's counts the memory of this test process, from which it was forked, until
/// it executes `podmend` (Linux records the old address space's high-water mark at `exec`).
fn run_measured(args: &[&str]) -> (i32, String, u64) {
    use std::io::Read as _;
    let mut child = std::process::Command::new(BIN)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("run podmend");
    let status_file = format!("/proc/{}/status", child.id());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let hwm = std::fs::read_to_string(&status_file)
                    .ok()
                    .and_then(|status| {
                        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
                        line.split_whitespace().nth(1)?.parse::<u64>().ok()
                    });
                peak = peak.max(hwm.unwrap_or(0));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak
        })
    };
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("read stdout");
    // Its stdout closed: it is exiting. The sampler reads until it is reaped.
    let status = child.wait().expect("podmend ends");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().expect("the sampler ends");
    (status.code().unwrap_or(-1), stdout, peak)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_12560_failed_pods_is_planned_in_well_under_the_chart_s_256mi() {
    let stub = stub_with(storm(GC_CEILING_STORM)).await;
    let kubeconfig = stub.kubeconfig_path().to_str().unwrap().to_string();
    let (code, stdout, peak_kib) = tokio::task::spawn_blocking(move || {
        run_measured(&["clean-storms", "--kubeconfig", &kubeconfig, "--dry-run"])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{stdout}");
    let would = stdout
        .lines()
        .filter(|l| l.starts_with("would delete pod "))
        .count();
    assert_eq!(would, GC_CEILING_STORM - KEEP);
    let peak_mib = peak_kib as f64 / 1024.0;
    println!("clean-storms --dry-run, {GC_CEILING_STORM} Failed pods: peak RSS {peak_mib:.1} MiB");
    assert!(
        peak_kib < PLAN_PEAK_MIB * 1024,
        "peak RSS {peak_mib:.1} MiB planning {GC_CEILING_STORM} Failed pods; the chart's CronJob has 256Mi"
    );
}

/// `name{labels}` → value, from Prometheus text.
fn parse_samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// A stand-in Pushgateway on loopback that records each push: method, path, body.
async fn pushgateway(pushes: Arc<Mutex<Vec<(String, String, String)>>>) -> SocketAddr {
    use axum::Router;
    use axum::body::Bytes;
    use axum::http::{Method, Uri};
    let app = Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
        let pushes = pushes.clone();
        async move {
            pushes.lock().unwrap().push((
                method.to_string(),
                uri.path().to_string(),
                String::from_utf8_lossy(&body).into_owned(),
            ));
            ""
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}
