//! The maintenance commands against the real API server, in the situations they exist for: a
//! report refresh while a namespace is being deleted, and a long list whose continue token
//! expires because etcd was compacted under it.

use std::process::Output;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::Suite;
use crate::common::control_plane::ControlPlane;
use crate::common::server::BIN;
use crate::install::{kubectl, kubectl_json, kubectl_stdin};

/// `podmend ARGS` with the admin kubeconfig of `plane`, to its end.
fn podmend(plane: &ControlPlane, args: &[&str]) -> Output {
    let kubeconfig = plane.kubeconfig.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--kubeconfig", &kubeconfig]);
    std::process::Command::new(BIN)
        .args(&all)
        .output()
        .expect("run podmend")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A Deployment of no replicas whose template pins `spec.nodeName`: a finding in every
/// namespace it is in, and no pod anywhere.
fn pinned_deployment(namespace: &str, finalizers: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "pinned", "namespace": namespace, "finalizers": finalizers},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "pinned"}},
            "template": {"metadata": {"labels": {"app": "pinned"}},
                "spec": {"nodeName": "reports-node", "containers": [{"name": "a", "image": "busybox"}]}}}})
}

/// OpenReports: the wg-policy PolicyReport CRD of the fixtures predates `results[].source`,
/// which the API server's server-side apply refuses ("field not declared in schema").
///
/// The NamespaceLifecycle admission plugin refuses to create anything in a namespace being
/// deleted (`plugin/pkg/admission/namespace/lifecycle/admission.go`, `Lifecycle.Admit`: 403
/// with the cause `NamespaceTerminating`). The namespace here stays terminating because its
/// Deployment carries a finalizer the test holds: the namespace controller
/// (`pkg/controller/namespace/deletion/namespaced_resources_deleter.go`, `Delete`) removes
/// the namespace only when nothing is left in it.
pub fn a_namespace_being_deleted_is_skipped_by_the_report_refresh_which_goes_on_with_the_others_and_the_clean_up(
    suite: &Suite,
) {
    let crds = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/crds/openreports.io_reports.yaml"
    );
    kubectl(suite, &["apply", "-f", crds]);
    kubectl(
        suite,
        &[
            "wait",
            "--for=condition=Established",
            "crd/reports.openreports.io",
            "--timeout=60s",
        ],
    );
    let hold = json!(["podmend.io/e2e-hold"]);
    for namespace in ["reports-a", "reports-doomed", "reports-z"] {
        suite
            .block_on(suite.plane.create_namespace(namespace))
            .unwrap_or_else(|e| panic!("{e}"));
        let finalizers = if namespace == "reports-doomed" {
            hold.clone()
        } else {
            json!([])
        };
        kubectl_stdin(
            suite,
            &["create", "-f", "-"],
            &pinned_deployment(namespace, finalizers),
        );
    }
    // A report of podmend's set that no run produces any more: the clean-up deletes it.
    let stale = json!({"apiVersion": "openreports.io/v1alpha1", "kind": "Report", "source": "podmend",
        "metadata": {"name": "podmend-audit-2", "namespace": "reports-a",
            "labels": {"app.kubernetes.io/managed-by": "podmend", "podmend.io/report-set": "podmend-audit"}},
        "summary": {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}, "results": []});
    kubectl_stdin(suite, &["create", "-f", "-"], &stale);
    kubectl(
        suite,
        &["delete", "namespace", "reports-doomed", "--wait=false"],
    );
    let phase = kubectl_json(suite, &["get", "namespace", "reports-doomed", "-o", "json"]);
    assert_eq!(phase["status"]["phase"], "Terminating", "{phase}");

    let run = podmend(
        &suite.plane,
        &[
            "audit",
            "--cluster",
            "--policy-report",
            "--report-format",
            "openreports",
            "--apply",
            "--fail-on",
            "never",
        ],
    );
    let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
    // Let the namespace go whatever the outcome.
    kubectl(
        suite,
        &[
            "patch",
            "deployment",
            "pinned",
            "-n",
            "reports-doomed",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    );
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("namespace reports-doomed is being deleted"),
        "{stderr}"
    );
    assert!(
        stdout.contains("skipped namespace(s) reports-doomed (is being deleted"),
        "{stdout}"
    );
    assert!(
        stdout.contains("deleted 1 stale: reports-a/podmend-audit-2"),
        "{stdout}"
    );
    for namespace in ["reports-a", "reports-z"] {
        let report = kubectl_json(
            suite,
            &[
                "get",
                "reports.openreports.io",
                "podmend-audit",
                "-n",
                namespace,
                "-o",
                "json",
            ],
        );
        assert_eq!(report["results"][0]["policy"], "podmend", "{report}");
    }
    let left = kubectl(
        suite,
        &[
            "get",
            "reports.openreports.io",
            "-n",
            "reports-a",
            "-o",
            "name",
        ],
    );
    assert_eq!(left.trim(), "report.openreports.io/podmend-audit");
}

/// Failed pods the storm clean-up lists, all of one ReplicaSet.
const EXPIRY_PODS: usize = 1000;

/// kube-apiserver compacts etcd every `--etcd-compaction-interval`, to the revision it saw
/// one interval before (`k8s.io/apiserver/pkg/storage/etcd3/compact.go`, `compactor`), and
/// its watch cache drops the list snapshots compaction made stale; a continued list at a
/// compacted revision then gets 410 `Expired` with a token for the rest of the list in the
/// Status (`handleCompactedErrorForPaging` in `k8s.io/apiserver/pkg/storage/etcd3/store.go`).
/// A control plane of its own compacts every second while pods are written, and
/// `clean-storms`, listing one pod a page, is held still midway (once the API server has
/// served it two pages) until a list the test itself continued from later than that gets the
/// 410: the list outlives its snapshot, however slow the machine.
pub fn an_expired_continue_token_is_followed_with_the_token_the_410_carries_and_every_pod_is_planned_once(
    suite: &Suite,
) {
    let plane = suite
        .block_on(ControlPlane::start_with_apiserver_args(&[
            "--etcd-compaction-interval=1s",
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
    let client = suite.block_on(plane.client());
    suite.block_on(failed_pods(&client, EXPIRY_PODS));

    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = suite
        .runtime
        .spawn(write_until_stopped(client, writing.clone()));
    let started = Instant::now();
    let client = suite.block_on(plane.client());
    let run = paused_midway(
        suite,
        &plane,
        &client,
        &["clean-storms", "--dry-run", "--page-size", "1"],
    );
    let took = started.elapsed();
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    suite.block_on(writer).expect("the writer ends");
    let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the continue token expired (410 Gone"),
        "the list ({:.1} s) never expired: {stderr}",
        took.as_secs_f64()
    );
    let planned: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("would delete pod "))
        .collect();
    let distinct: std::collections::BTreeSet<&str> = planned.iter().copied().collect();
    assert_eq!(planned.len(), EXPIRY_PODS - 5, "{stdout}");
    assert_eq!(
        distinct.len(),
        planned.len(),
        "a pod planned twice: {stdout}"
    );
    drop(plane);
}

/// Runs podmend with `args` against `plane`, and holds it still (SIGSTOP) once the API
/// server has served it two pages of pods, until the continue token of a list of the test's
/// own, begun after podmend's, has expired (410): podmend's token is then older still.
fn paused_midway(
    suite: &Suite,
    plane: &ControlPlane,
    client: &kube::Client,
    args: &[&str],
) -> Output {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let lists_before = suite.block_on(pod_lists_served(client));
    let kubeconfig = plane.kubeconfig.display().to_string();
    let child = std::process::Command::new(BIN)
        .args(args)
        .args(["--kubeconfig", &kubeconfig])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run podmend");
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_secs(60);
    while suite.block_on(pod_lists_served(client)) < lists_before + 2 {
        assert!(
            Instant::now() < deadline,
            "podmend listed no pods within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signals to our own child, which has not been reaped yet.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let page = suite
        .block_on(pods.list(&ListParams::default().limit(1)))
        .expect("a first page");
    let token = page.metadata.continue_.expect("a continue token");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let next =
            suite.block_on(pods.list(&ListParams::default().limit(1).continue_token(&token)));
        match next {
            Err(kube::Error::Api(status)) if status.code == 410 => break,
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "no compaction expired a list within 60 s"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    child.wait_with_output().expect("podmend ends")
}

/// How many LIST requests for pods the API server has served (`apiserver_request_total`).
async fn pod_lists_served(client: &kube::Client) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let metrics = client
        .request_text(request)
        .await
        .expect("the API server's metrics");
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"pods\"")
                && line.contains("verb=\"LIST\"")
                && line.contains("subresource=\"\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Creates `n` pods of one ReplicaSet in `default` and sets each `Failed` with the kubelet's
/// `OutOfcpu`, as a rejection storm leaves them (the API server resets a new pod's status,
/// so the status is written through `pods/status`).
async fn failed_pods(client: &kube::Client, n: usize) {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    // No controller-manager here to make it; the ServiceAccount admission plugin needs it.
    let account = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    let _ = accounts.create(&PostParams::default(), &account).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    futures::stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let name = format!("storm-{i:05}");
                let pod = serde_json::from_value(json!({"metadata": {"name": name,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "storm", "uid": "5a6b7c8d-0000-4000-8000-0000000000e2",
                        "controller": true}]},
                    "spec": {"nodeName": "gone", "containers": [{"name": "a", "image": "busybox"}]}}))
                .unwrap();
                pods.create(&PostParams::default(), &pod)
                    .await
                    .unwrap_or_else(|e| panic!("create {name}: {e}"));
                let status = json!({"status": {"phase": "Failed", "reason": "OutOfcpu",
                    "message": "Pod was rejected: Node didn't have enough resource: cpu"}});
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .unwrap_or_else(|e| panic!("fail {name}: {e}"));
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// Creates a pod (not `Failed`: never listed by the clean-up) every 20 ms while `writing`:
/// etcd's revision moves on, and so does the pods' watch cache, so each compaction leaves
/// the list's revision and snapshot behind.
async fn write_until_stopped(
    client: kube::Client,
    writing: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut i = 0;
    while writing.load(std::sync::atomic::Ordering::Relaxed) {
        let pod = serde_json::from_value(json!({"metadata": {"name": format!("tick-{i}")},
            "spec": {"containers": [{"name": "a", "image": "busybox"}]}}))
        .unwrap();
        let _ = pods.create(&PostParams::default(), &pod).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
