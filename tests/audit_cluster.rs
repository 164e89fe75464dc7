//! `audit --cluster` against a stub API server: listing (paginated, namespaced), the engine's
//! findings on live objects, the symptoms only a cluster shows, and PolicyReports.

mod common;

use std::future::Future;
use std::time::Duration;

use common::api_stub::ApiStub;
use common::server::untainted_node;
use common::storm::seed_workloads;
use podmend::audit::cluster::{ClusterAuditError, ClusterAuditOptions, audit_cluster, client_for};
use podmend::audit::policy_reports::{
    ApplyScope, PolicyReportError, ReportFormat, apply_reports, policy_reports,
};
use podmend::audit::{Report, Source, SymptomKind};
use podmend::cluster::StaticCluster;
use podmend::config::{Config, Mode};
use podmend::engine::Engine;
use serde_json::{Value, json};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const STORM: usize = 1500;
const RS: &str = "pinniped-concierge-kube-cert-agent-5d8c9f7b46";

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test took longer than its timeout");
}

fn read(path: &str) -> String {
    let path = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn cluster_fixture(name: &str) -> Value {
    serde_json::from_str(&read(&format!("cluster/{name}"))).unwrap()
}

fn yaml_fixture(name: &str) -> Value {
    serde_yaml_ng::from_str(&read(name)).unwrap()
}

/// The cluster's Nodes: three of `tests/fixtures/cluster/`, and `minikube` (untainted, as
/// minikube leaves its node), where the Pinniped Deployment pins its pods.
fn nodes() -> Vec<Value> {
    let mut nodes: Vec<Value> = [
        "node-virtual-kubelet-aci.json",
        "node-kubeadm-control-plane.json",
        "node-cordoned-worker.json",
    ]
    .iter()
    .map(|n| cluster_fixture(n))
    .collect();
    nodes.push(untainted_node("minikube"));
    nodes
}

fn limit_ranges() -> Vec<Value> {
    vec![
        cluster_fixture("limitrange-ci-agents-container-defaults.json"),
        cluster_fixture("limitrange-default-pod-container-pvc.json"),
    ]
}

/// The storm: `n` pods of the Pinniped ReplicaSet, each rejected by the kubelet (OutOfcpu).
fn storm(n: usize) -> Vec<Value> {
    let base = cluster_fixture("pod-pinniped-kube-cert-agent-rejected-outofcpu.json");
    (0..n)
        .map(|i| {
            let mut pod = base.clone();
            pod["metadata"]["name"] = json!(format!("{RS}-{i:05x}"));
            pod["metadata"]["uid"] = json!(format!("9b1f3e7a-2c4d-4e6f-a8b0-{i:012x}"));
            pod
        })
        .collect()
}

/// Running containers' statuses for every container of `pod`.
fn running(mut pod: Value, node: &str) -> Value {
    let statuses: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true, "started": true,
                "restartCount": 0, "lastState": {}, "state": {"running": {"startedAt": "2025-06-02T10:00:05Z"}}})
        })
        .collect();
    pod["spec"]["nodeName"] = json!(node);
    pod["status"] = json!({"phase": "Running", "hostIP": "192.0.2.11", "podIP": "10.244.1.7",
        "qosClass": "Burstable", "startTime": "2025-06-02T10:00:00Z", "containerStatuses": statuses});
    pod
}

/// The replicaset-controller's pod from the kubewarden capture, after scheduling.
fn kubewarden_pod() -> Value {
    let request: Value = serde_json::from_str(&read(
        "admissionrequest-pod-create-by-replicaset-controller-kubewarden.json",
    ))
    .unwrap();
    let mut pod = request["object"].clone();
    pod["metadata"]["name"] = json!("kubewarden-controller-767df6d6b-7xk2p");
    pod["metadata"]["namespace"] = json!("kubewarden");
    running(pod, "worker-2")
}

/// The Jenkins agent pod as the plugin submitted it, running on a worker, from a pod template
/// that gives jnlp limits and selects it with `podmend.io/agent: "true"` (the Jenkins preset
/// is opt-in; the plugin's default jnlp, with no limit, keeps its requests).
fn jenkins_agent() -> Value {
    let mut pod = yaml_fixture("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml");
    pod["metadata"]["namespace"] = json!("jenkins");
    pod["metadata"]["annotations"]["podmend.io/agent"] = json!("true");
    pod["spec"]["containers"][1]["resources"]["limits"] = json!({"cpu": "500m", "memory": "512Mi"});
    running(pod, "worker-2")
}

/// The docker-outside-of-docker example pod, running.
fn dood_pod() -> Value {
    let mut pod = yaml_fixture("jenkins-k8s-plugin-example-dood-pod-template.yaml");
    pod["metadata"] = json!({"name": "dood-7g2kd", "namespace": "jenkins"});
    running(pod, "worker-2")
}

/// Pending with every container running (JENKINS-68649 on the ACI virtual node).
fn pending_running_pod() -> Value {
    yaml_fixture(
        "virtual-kubelet-aci-pod-pending-with-running-containers-JENKINS-68649-reconstructed.yaml",
    )
}

/// Pending because a container is still being created.
fn pending_waiting_pod() -> Value {
    let mut pod = kubewarden_pod();
    pod["metadata"]["name"] = json!("kubewarden-controller-767df6d6b-w8v4c");
    pod["status"]["phase"] = json!("Pending");
    pod["status"]["containerStatuses"][1]["state"] =
        json!({"waiting": {"reason": "ContainerCreating"}});
    pod["status"]["containerStatuses"][1]["ready"] = json!(false);
    pod
}

/// A stub serving every kind the audit lists, with the storm and the other pods.
async fn stub_with(pods: Vec<Value>) -> ApiStub {
    let stub = ApiStub::start(nodes(), limit_ranges()).await;
    seed_workloads(&stub, pods);
    stub
}

fn every_pod() -> Vec<Value> {
    let mut pods = storm(STORM);
    pods.extend([
        kubewarden_pod(),
        jenkins_agent(),
        dood_pod(),
        pending_running_pod(),
        pending_waiting_pod(),
    ]);
    pods
}

/// Applies `reports` as `audit --policy-report --apply` does, cluster-wide; how many.
async fn apply_policy_reports(
    stub: &ApiStub,
    reports: &[Value],
) -> Result<usize, PolicyReportError> {
    let scope = ApplyScope {
        namespace: None,
        page_size: 500,
    };
    let done = apply_reports(
        stub.client().await,
        ReportFormat::PolicyReport,
        reports,
        &scope,
    )
    .await?;
    Ok(done.applied)
}

async fn audit(stub: &ApiStub, options: &ClusterAuditOptions) -> Report {
    let engine = Engine::new(&Config::default());
    let mut report = Report::default();
    audit_cluster(stub.client().await, &engine, options, &mut report)
        .await
        .expect("audit succeeds");
    report
}

fn options(page_size: u32, namespace: Option<&str>) -> ClusterAuditOptions {
    ClusterAuditOptions {
        namespace: namespace.map(str::to_string),
        page_size,
        progress: false,
    }
}

#[tokio::test]
async fn the_storm_is_one_symptom_naming_the_replicaset_the_count_and_the_pinned_node() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(500, None)).await;

        let failed: Vec<_> = report
            .symptoms
            .iter()
            .filter(|s| s.kind == SymptomKind::FailedPods)
            .collect();
        assert_eq!(failed.len(), 1, "{failed:#?}");
        let storm = failed[0];
        assert_eq!(storm.count, STORM);
        assert_eq!(storm.reason, "OutOfcpu");
        assert_eq!(storm.object.kind, "ReplicaSet");
        assert_eq!(storm.object.name, RS);
        assert_eq!(storm.object.namespace, "pinniped-concierge");
        assert_eq!(
            storm.message,
            format!(
                "ReplicaSet pinniped-concierge/{RS} (owned by Deployment pinniped-concierge-kube-cert-agent): \
                 1,500 Failed pods (OutOfcpu) — its template pins spec.nodeName=minikube"
            )
        );
        // Failed pods are counted, not reviewed.
        assert!(
            report
                .findings
                .iter()
                .all(|f| !(f.object.kind == "Pod" && f.object.namespace == "pinniped-concierge")),
            "{:#?}",
            report.findings
        );
    })
    .await;
}

/// A pod that failed without a reason (its containers exited with errors) is no storm.
#[tokio::test]
async fn failed_pods_group_by_owner_and_reason_biggest_first() {
    within(async {
        let mut pods = storm(3);
        let mut evicted = kubewarden_pod();
        evicted["metadata"]["name"] = json!("kubewarden-controller-767df6d6b-ev1ct");
        evicted["status"] = json!({"phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory."});
        let mut no_reason = kubewarden_pod();
        no_reason["metadata"]["name"] = json!("kubewarden-controller-767df6d6b-n0rsn");
        no_reason["status"]["phase"] = json!("Failed");
        let mut other_node = storm(1).remove(0);
        other_node["metadata"]["name"] = json!(format!("{RS}-other"));
        pods.extend([evicted, no_reason, other_node]);
        let stub = stub_with(pods).await;
        let report = audit(&stub, &options(2, None)).await;

        let failed: Vec<(usize, &str, &str)> = report
            .symptoms
            .iter()
            .filter(|s| s.kind == SymptomKind::FailedPods)
            .map(|s| (s.count, s.object.name.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            failed,
            vec![
                (4, RS, "OutOfcpu"),
                (1, "kubewarden-controller-767df6d6b", "Evicted"),
            ]
        );
        let evicted = &report.symptoms[1];
        // The ReplicaSet is not listed: no template clause, but the node they were on.
        assert_eq!(
            evicted.message,
            "ReplicaSet kubewarden/kubewarden-controller-767df6d6b: 1 Failed pod (Evicted) — it was on node worker-2"
        );
        assert_eq!(evicted.object.api_version, "apps/v1");
    })
    .await;
}

#[tokio::test]
async fn listing_is_paginated_with_the_page_size_and_continue_tokens() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(100, None)).await;
        assert_eq!(report.symptoms[0].count, STORM);

        let requests = stub.requests();
        let pod_lists: Vec<&String> = requests
            .iter()
            .filter(|r| r.starts_with("/api/v1/pods?"))
            .collect();
        // 1,505 pods in pages of 100.
        assert_eq!(pod_lists.len(), 16, "{pod_lists:#?}");
        assert!(pod_lists.iter().all(|r| r.contains("limit=100")));
        assert!(!pod_lists[0].contains("continue="));
        assert!(pod_lists[1..].iter().all(|r| r.contains("continue=")));
        for list in [
            "/api/v1/nodes?",
            "/api/v1/limitranges?",
            "/api/v1/podtemplates?",
            "/api/v1/replicationcontrollers?",
            "/apis/apps/v1/deployments?",
            "/apis/apps/v1/replicasets?",
            "/apis/apps/v1/statefulsets?",
            "/apis/apps/v1/daemonsets?",
            "/apis/batch/v1/jobs?",
            "/apis/batch/v1/cronjobs?",
        ] {
            assert!(
                requests
                    .iter()
                    .any(|r| r.starts_with(list) && r.contains("limit=100")),
                "no {list} in {requests:#?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn templates_get_node_affinity_agents_get_requests_and_scheduled_pods_nothing() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(500, None)).await;

        let deployment = report
            .findings
            .iter()
            .find(|f| f.object.kind == "Deployment" && f.rule == "node-affinity")
            .expect("the Deployment's template finding");
        assert_eq!(deployment.mode, Mode::Warn);
        assert_eq!(deployment.object.name, "pinniped-concierge-kube-cert-agent");
        assert_eq!(deployment.object.api_version, "apps/v1");
        assert_eq!(
            deployment.source,
            Source {
                file: "cluster".into(),
                document: 0,
                line: 0,
                helm_source: None,
                list_item: None,
            }
        );
        assert!(
            deployment.message.contains("spec.nodeName=minikube"),
            "{}",
            deployment.message
        );
        assert!(
            deployment
                .patch
                .iter()
                .any(|op| op.path().as_str() == "/spec/template/spec/nodeName"),
            "{:?}",
            deployment.patch
        );
        // Its ReplicaSet belongs to the Deployment: left alone, as the webhook does.
        assert!(
            report
                .findings
                .iter()
                .all(|f| f.object.kind != "ReplicaSet")
        );

        let agent: Vec<_> = report
            .findings
            .iter()
            .filter(|f| f.object.kind == "Pod" && f.object.name == "mypod-88fnc-fttdj")
            .collect();
        assert_eq!(agent.len(), 1, "{agent:#?}");
        assert_eq!(agent[0].rule, "agent-requests");
        assert_eq!(agent[0].mode, Mode::Enforce);
        assert_eq!(agent[0].object.namespace, "jenkins");

        assert!(
            report
                .findings
                .iter()
                .all(|f| !(f.object.kind == "Pod" && f.rule == "node-affinity")),
            "{:#?}",
            report.findings
        );
        // Reviewed: 1 Deployment, 1 ReplicaSet, 5 live pods (failed ones are not reviewed).
        assert_eq!(report.summary.objects, 7);
    })
    .await;
}

#[tokio::test]
async fn a_pending_pod_with_every_container_running_is_reported_and_one_waiting_is_not() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(500, None)).await;

        let pending: Vec<_> = report
            .symptoms
            .iter()
            .filter(|s| s.kind == SymptomKind::PendingWithRunningContainers)
            .collect();
        assert_eq!(pending.len(), 1, "{pending:#?}");
        assert_eq!(pending[0].object.name, "test22");
        assert_eq!(pending[0].object.namespace, "default");
        assert_eq!(pending[0].count, 1);
        assert!(pending[0].message.contains("Pod default/test22"));
        assert!(pending[0].message.contains("node virtual-node-aci-linux"));
    })
    .await;
}

#[tokio::test]
async fn a_pod_on_the_host_docker_socket_is_reported() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(500, None)).await;

        let docker: Vec<_> = report
            .symptoms
            .iter()
            .filter(|s| s.kind == SymptomKind::DindHostSocket)
            .collect();
        assert_eq!(docker.len(), 1, "{docker:#?}");
        assert_eq!(docker[0].object.display(), "Pod/jenkins/dood-7g2kd");
        assert_eq!(docker[0].count, 1);
        assert!(docker[0].message.contains("/var/run/docker.sock"));
    })
    .await;
}

#[tokio::test]
async fn a_namespace_scopes_every_namespaced_list() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(500, Some("jenkins"))).await;

        let requests = stub.requests();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("/api/v1/namespaces/jenkins/pods?"))
        );
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("/apis/apps/v1/namespaces/jenkins/deployments?"))
        );
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("/api/v1/namespaces/jenkins/limitranges?"))
        );
        // Nodes are cluster-scoped, and the namespace's own object is read (for its
        // toleration whitelist); nothing else is listed across namespaces.
        assert!(
            requests
                .iter()
                .filter(|r| !r.starts_with("/api/v1/nodes?") && !r.starts_with("/version"))
                .all(|r| r.contains("/namespaces/jenkins/") || r == "/api/v1/namespaces/jenkins"),
            "{requests:#?}"
        );
        assert!(
            report
                .findings
                .iter()
                .all(|f| f.object.namespace == "jenkins")
        );
        assert!(!report.findings.is_empty());
        assert!(
            report
                .symptoms
                .iter()
                .all(|s| s.object.namespace == "jenkins")
        );
        assert_eq!(report.symptoms.len(), 1);
    })
    .await;
}

#[tokio::test]
async fn policy_reports_are_one_per_namespace_with_matching_summaries() {
    within(async {
        let stub = stub_with(every_pod()).await;
        let report = audit(&stub, &options(500, None)).await;
        let reports = policy_reports(&report);

        let namespaces: Vec<&str> = reports
            .iter()
            .map(|r| r["metadata"]["namespace"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(namespaces, vec!["default", "jenkins", "pinniped-concierge"]);
        for r in &reports {
            assert_eq!(r["apiVersion"], "wgpolicyk8s.io/v1alpha2");
            assert_eq!(r["kind"], "PolicyReport");
            assert_eq!(r["metadata"]["name"], "podmend-audit");
            assert_eq!(
                r["metadata"]["labels"]["app.kubernetes.io/managed-by"],
                "podmend"
            );
        }
        let by_ns = |ns: &str| {
            reports
                .iter()
                .find(|r| r["metadata"]["namespace"] == ns)
                .unwrap()
        };
        // pinniped-concierge: the Deployment's node-affinity and agent-requests warnings and the
        // storm.
        assert_eq!(
            by_ns("pinniped-concierge")["summary"],
            json!({"pass": 0, "fail": 0, "warn": 3, "error": 0, "skip": 0})
        );
        // jenkins: the agent's enforced requests and the dood pod's dind-rm guard (fail), and
        // the docker socket symptom (warn).
        assert_eq!(
            by_ns("jenkins")["summary"],
            json!({"pass": 0, "fail": 2, "warn": 1, "error": 0, "skip": 0})
        );
        let agent = by_ns("jenkins")["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == "agent-requests")
            .unwrap()
            .clone();
        assert_eq!(agent["policy"], "podmend");
        assert_eq!(agent["result"], "fail");
        assert_eq!(agent["source"], "podmend");
        assert_eq!(agent["scored"], true);
        assert!(agent["timestamp"]["seconds"].as_u64().unwrap() > 1_700_000_000);
        assert!(agent["timestamp"]["nanos"].is_u64());
        assert_eq!(
            agent["resources"],
            json!([{"apiVersion": "v1", "kind": "Pod", "name": "mypod-88fnc-fttdj", "namespace": "jenkins"}])
        );
        let storm = by_ns("pinniped-concierge")["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == "failed-pods")
            .unwrap()
            .clone();
        assert_eq!(storm["result"], "warn");
        assert_eq!(storm["resources"][0]["kind"], "ReplicaSet");
    })
    .await;
}

#[tokio::test]
async fn findings_without_a_namespace_go_to_one_cluster_policy_report() {
    let engine = Engine::new(&Config::default());
    let mut report = Report::default();
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}});
    let source = Source {
        file: "d.yaml".into(),
        document: 1,
        line: 1,
        helm_source: None,
        list_item: None,
    };
    let cluster = StaticCluster::empty().with_node("n1", vec![]);
    report.add_object(&engine, &cluster, &deployment, source);
    assert!(
        !report.findings[0].patch.is_empty(),
        "{:#?}",
        report.findings
    );
    let reports = policy_reports(&report);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0]["kind"], "ClusterPolicyReport");
    assert!(reports[0]["metadata"].get("namespace").is_none());
    assert_eq!(reports[0]["summary"]["warn"], 1);
    assert!(
        reports[0]["results"][0]["resources"][0]
            .get("namespace")
            .is_none()
    );
}

#[tokio::test]
async fn applying_policy_reports_is_a_server_side_apply_by_podmend() {
    within(async {
        let stub = stub_with(every_pod()).await;
        stub.serve_resource(
            "policyreports",
            "wgpolicyk8s.io/v1alpha2",
            "PolicyReport",
            true,
        );
        let report = audit(&stub, &options(500, None)).await;
        let reports = policy_reports(&report);
        let applied = apply_policy_reports(&stub, &reports)
            .await
            .expect("applied");
        assert_eq!(applied, 3);

        let requests = stub.requests();
        let patch = requests
            .iter()
            .find(|r| {
                r.starts_with(
                    "/apis/wgpolicyk8s.io/v1alpha2/namespaces/jenkins/policyreports/podmend-audit?",
                )
            })
            .expect("a PATCH of the jenkins report");
        assert!(patch.contains("fieldManager=podmend"), "{patch}");
        assert!(patch.contains("force=true"), "{patch}");
        let stored = stub.objects("policyreports");
        assert_eq!(stored.len(), 3);
        assert_eq!(stored[1]["metadata"]["namespace"], "jenkins");
        assert_eq!(stored[1]["summary"]["fail"], 2);

        // Applying again updates in place.
        let again = apply_policy_reports(&stub, &reports)
            .await
            .expect("applied again");
        assert_eq!(again, 3);
        assert_eq!(stub.objects("policyreports").len(), 3);
    })
    .await;
}

#[tokio::test]
async fn applying_without_the_crd_says_to_install_it() {
    within(async {
        let stub = stub_with(vec![jenkins_agent()]).await;
        let report = audit(&stub, &options(500, None)).await;
        let reports = policy_reports(&report);
        let error = apply_policy_reports(&stub, &reports)
            .await
            .expect_err("no CRD");
        assert!(
            matches!(error, PolicyReportError::CrdMissing { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("PolicyReport CRD"), "{message}");
        assert!(message.contains("install"), "{message}");
    })
    .await;
}

#[tokio::test]
async fn a_failing_api_server_is_an_error_naming_what_was_listed() {
    within(async {
        let stub = stub_with(vec![]).await;
        stub.set_failing(true);
        let engine = Engine::new(&Config::default());
        let mut report = Report::default();
        let error = audit_cluster(
            stub.client().await,
            &engine,
            &options(500, None),
            &mut report,
        )
        .await
        .expect_err("the stub fails");
        let message = error.to_string();
        assert!(message.contains("listing nodes"), "{message}");
        assert!(message.contains("500"), "{message}");
    })
    .await;
}

#[tokio::test]
async fn client_for_uses_the_kubeconfig_and_names_what_is_wrong() {
    within(async {
        let stub = stub_with(vec![jenkins_agent()]).await;
        let client = client_for(Some(stub.kubeconfig_path()), None)
            .await
            .expect("client for the stub");
        let report = {
            let engine = Engine::new(&Config::default());
            let mut report = Report::default();
            audit_cluster(client, &engine, &options(500, None), &mut report)
                .await
                .expect("audit");
            report
        };
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.object.name == "mypod-88fnc-fttdj")
        );

        let Err(error) = client_for(Some(stub.kubeconfig_path()), Some("nope")).await else {
            panic!("a context that does not exist gave a client");
        };
        let message = error.to_string();
        assert!(message.contains("\"nope\""), "{message}");
        assert!(message.contains("--context"), "{message}");

        // A kubeconfig whose server does not answer.
        let dir = tempfile::tempdir().unwrap();
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let text = std::fs::read_to_string(stub.kubeconfig_path())
            .unwrap()
            .replace(&stub.url(), &format!("https://{closed}"));
        let path = dir.path().join("config");
        std::fs::write(&path, text).unwrap();
        let Err(error) = client_for(Some(&path), None).await else {
            panic!("a closed port gave a client");
        };
        let message = error.to_string();
        assert!(
            matches!(error, ClusterAuditError::Unreachable { .. }),
            "{error:?}"
        );
        assert!(
            message.contains(&format!("cannot reach the cluster at https://{closed}")),
            "{message}"
        );
    })
    .await;
}
