//! The audit's reports stay true: PolicyReports (`wgpolicyk8s.io/v1alpha2`) and OpenReports
//! (`openreports.io/v1alpha1`) split so that no object exceeds 1 MiB (a namespace of 20,000
//! findings), valid against the upstream CRDs' schemas (`tests/fixtures/crds/`), labelled as
//! podmend's, and on apply the reports podmend owns that the run no longer produces are
//! deleted (namespaces without findings, the extra parts of a report that shrank), nobody
//! else's.

mod common;

use std::collections::BTreeSet;

use common::api_stub::ApiStub;
use common::crd_schema::{Check, crd_path, problems};
use podmend::audit::policy_reports::{
    ApplyScope, MAX_REPORT_BYTES, REPORT_SET, ReportFormat, apply_reports, part_name, reports,
};
use podmend::audit::{Report, Source};
use podmend::cluster::StaticCluster;
use podmend::config::Config;
use podmend::engine::Engine;
use serde_json::{Value, json};

const FORMATS: [ReportFormat; 2] = [ReportFormat::PolicyReport, ReportFormat::OpenReports];

/// `n` node-affinity findings in namespace `ns`: the engine's finding on one pinned
/// Deployment, for `n` Deployments of different names.
fn findings(ns: &str, n: usize) -> Report {
    let engine = Engine::new(&Config::default());
    let mut one = Report::default();
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "agent", "namespace": ns},
        "spec": {"template": {"spec": {"nodeName": "worker-17", "containers": [{"name": "agent", "image": "registry.example/ci/agent:4.2"}]}}}});
    let source = Source {
        file: "cluster".into(),
        document: 0,
        line: 0,
        helm_source: None,
        list_item: None,
    };
    // The cluster has the node (untainted): without it podmend leaves the template as it is
    // and the finding is a note, without the patch a real finding carries.
    let cluster = StaticCluster::empty().with_node("worker-17", vec![]);
    one.add_object(&engine, &cluster, &deployment, source);
    assert_eq!(one.findings.len(), 1, "{:#?}", one.findings);
    assert!(!one.findings[0].patch.is_empty(), "{:#?}", one.findings);
    let mut report = Report::default();
    for i in 0..n {
        let mut finding = one.findings[0].clone();
        finding.object.name = format!("ci-agent-{i:05}");
        report.findings.push(finding);
    }
    report
}

fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).unwrap().len()
}

/// The CRD file and version of `format`'s kind `kind`.
fn crd_of(format: ReportFormat, namespaced: bool) -> (&'static str, &'static str) {
    match (format, namespaced) {
        (ReportFormat::PolicyReport, true) => ("wgpolicyk8s.io_policyreports.yaml", "v1alpha2"),
        (ReportFormat::PolicyReport, false) => {
            ("wgpolicyk8s.io_clusterpolicyreports.yaml", "v1alpha2")
        }
        (ReportFormat::OpenReports, true) => ("openreports.io_reports.yaml", "v1alpha1"),
        (ReportFormat::OpenReports, false) => ("openreports.io_clusterreports.yaml", "v1alpha1"),
    }
}

/// Every object passes its CRD's schema, and strictly (no field the API server would prune)
/// the newest schema of its API: for wgpolicyk8s.io that is the ClusterPolicyReport CRD of
/// 037274b (see `the_wg_policy_crds_differ_only_in_names_and_the_later_results_source`).
fn assert_valid(format: ReportFormat, objects: &[Value]) {
    let namespaced: Vec<Value> = objects
        .iter()
        .filter(|o| o["metadata"].get("namespace").is_some())
        .cloned()
        .collect();
    let cluster: Vec<Value> = objects
        .iter()
        .filter(|o| o["metadata"].get("namespace").is_none())
        .cloned()
        .collect();
    let (ns_crd, version) = crd_of(format, true);
    let (cluster_crd, _) = crd_of(format, false);
    let strict_crd = match format {
        ReportFormat::PolicyReport => cluster_crd,
        ReportFormat::OpenReports => ns_crd,
    };
    let mut checks = vec![];
    if strict_crd != ns_crd {
        // The strict check of another file does not cover this one.
        checks.push(Check {
            crd: ns_crd,
            version,
            strict: false,
            objects: &namespaced,
        });
    }
    checks.extend([
        Check {
            crd: strict_crd,
            version,
            strict: true,
            objects: &namespaced,
        },
        Check {
            crd: cluster_crd,
            version,
            strict: true,
            objects: &cluster,
        },
    ]);
    let found = problems(&checks);
    assert!(found.is_empty(), "{format:?}:\n{}", found.join("\n"));
}

#[test]
fn a_namespace_of_20000_findings_is_split_into_valid_objects_under_1_mib() {
    let report = findings("ci", 20_000);
    for format in FORMATS {
        let objects = reports(&report, format);
        assert!(objects.len() > 1, "{format:?}: {} object(s)", objects.len());
        let mut names = BTreeSet::new();
        for (i, object) in objects.iter().enumerate() {
            let size = json_len(object);
            assert!(
                size <= MAX_REPORT_BYTES,
                "{format:?} part {i}: {size} bytes"
            );
            assert_eq!(object["metadata"]["name"], part_name(i));
            assert_eq!(object["metadata"]["namespace"], "ci");
            assert_eq!(
                object["metadata"]["labels"],
                json!({"app.kubernetes.io/managed-by": "podmend", "podmend.io/report-set": REPORT_SET})
            );
            let results = object["results"].as_array().unwrap();
            assert_eq!(
                object["summary"]["warn"],
                results.len(),
                "the part's own summary"
            );
            for result in results {
                assert!(names.insert(result["resources"][0]["name"].as_str().unwrap().to_string()));
            }
            // Parts are filled: all but the last would not take another result.
            if i + 1 < objects.len() {
                assert!(
                    size > MAX_REPORT_BYTES - 2 * json_len(&results[0]),
                    "part {i} is {size} bytes"
                );
            }
        }
        assert_eq!(names.len(), 20_000, "every finding in exactly one part");
        println!(
            "{format:?}: 20,000 findings in {} objects, the largest {} bytes",
            objects.len(),
            objects.iter().map(json_len).max().unwrap()
        );
        assert_valid(format, &objects);
    }
}

#[test]
fn a_note_is_a_skip_in_every_report_and_counts_as_no_enforce_warn_or_deny_nor_for_fail_on() {
    use podmend::audit::{EXIT_CLEAN, FailOn};
    let engine = Engine::new(&Config::default());
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "agent", "namespace": "ci"},
        "spec": {"template": {"spec": {"nodeName": "worker-17", "containers": [{"name": "agent", "image": "registry.example/ci/agent:4.2"}]}}}});
    let source = Source {
        file: "cluster".into(),
        document: 0,
        line: 0,
        helm_source: None,
        list_item: None,
    };
    // Without the node, podmend cannot know its taints: the template is left as it is and
    // the finding is a note (the rule's mode is enforce).
    let mut report = Report::default();
    report.add_object(&engine, &StaticCluster::empty(), &deployment, source);
    assert_eq!(report.findings.len(), 1, "{:#?}", report.findings);
    assert!(
        report.findings[0].patch.is_empty(),
        "{:#?}",
        report.findings
    );
    let summary = &report.summary;
    assert_eq!(
        (
            summary.findings,
            summary.notes,
            summary.enforce,
            summary.warn,
            summary.deny
        ),
        (1, 1, 0, 0, 0),
        "{summary:#?}"
    );
    assert_eq!(report.exit_status(FailOn::Warn), EXIT_CLEAN);
    for format in FORMATS {
        let objects = reports(&report, format);
        assert_eq!(objects.len(), 1, "{format:?}");
        assert_eq!(objects[0]["results"][0]["result"], "skip", "{format:?}");
        assert_eq!(
            objects[0]["summary"],
            json!({"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 1}),
            "{format:?}"
        );
        assert_valid(format, &objects);
    }
}

#[test]
fn reports_with_symptoms_and_cluster_scoped_findings_pass_the_crd_schemas() {
    let mut report = findings("ci", 3);
    let mut cluster_scoped = report.findings[0].clone();
    cluster_scoped.object.namespace = String::new();
    report.findings.push(cluster_scoped);
    report.add_symptom(podmend::audit::Symptom {
        kind: podmend::audit::SymptomKind::FailedPods,
        object: podmend::audit::ObjectRef {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            namespace: "pinniped-concierge".into(),
            name: "pinniped-concierge-kube-cert-agent-5d8c9f7b46".into(),
        },
        count: 1204,
        reason: "OutOfcpu".into(),
        message: "ReplicaSet pinniped-concierge/x: 1,204 Failed pods (OutOfcpu)".into(),
    });
    for format in FORMATS {
        let objects = reports(&report, format);
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        let (ns_kind, cluster_kind) = (format.namespaced().kind, format.cluster().kind);
        assert_eq!(kinds, [ns_kind, ns_kind, cluster_kind], "{format:?}");
        assert_valid(format, &objects);
    }
}

#[test]
fn the_schema_check_refuses_what_the_api_server_would_refuse_or_prune() {
    let report = findings("ci", 1);
    for format in FORMATS {
        let good = reports(&report, format).remove(0);
        let (crd, version) = crd_of(format, true);
        let mut bad_result = good.clone();
        bad_result["results"][0]["result"] = json!("failed");
        let mut unknown = good.clone();
        unknown["results"][0]["remedy"] = json!("pruned on write");
        let mut no_policy = good.clone();
        no_policy["results"][0]
            .as_object_mut()
            .unwrap()
            .remove("policy");
        for (name, object, strict) in [
            ("an unknown result value", bad_result, false),
            ("a field the API server prunes", unknown, true),
            ("a result without its required policy", no_policy, false),
        ] {
            let found = problems(&[Check {
                crd,
                version,
                strict,
                objects: &[object],
            }]);
            assert!(!found.is_empty(), "{format:?}: {name} passed");
        }
    }
}

#[test]
fn the_wg_policy_crds_differ_only_in_names_and_the_later_results_source() {
    let schema = |file: &str| -> Value {
        let text = std::fs::read_to_string(crd_path(file)).unwrap();
        let crd: Value = serde_yaml_ng::from_str(&text).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    };
    let namespaced = schema("wgpolicyk8s.io_policyreports.yaml");
    let mut cluster = schema("wgpolicyk8s.io_clusterpolicyreports.yaml");
    let source = cluster["properties"]["results"]["items"]["properties"]
        .as_object_mut()
        .unwrap()
        .remove("source");
    assert_eq!(source.unwrap()["type"], "string");
    cluster["description"] = namespaced["description"].clone();
    assert_eq!(cluster, namespaced);
    // OpenReports: one commit's pair, identical but for names.
    let mut open_cluster = schema("openreports.io_clusterreports.yaml");
    let open = schema("openreports.io_reports.yaml");
    open_cluster["description"] = open["description"].clone();
    assert_eq!(open_cluster, open);
}

/// A report object podmend did not write, or wrote for another report set.
fn foreign(format: ReportFormat, ns: &str, name: &str, labels: Value) -> Value {
    let kind = format.namespaced();
    json!({"apiVersion": kind.api_version(), "kind": kind.kind,
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "labels": labels},
        "summary": {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}, "results": []})
}

fn stored(stub: &ApiStub, format: ReportFormat) -> BTreeSet<String> {
    stub.objects(format.namespaced().plural)
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_deletes_the_reports_podmend_no_longer_produces_and_nobody_elses() {
    for format in FORMATS {
        let stub = ApiStub::start(vec![], vec![]).await;
        let kind = format.namespaced();
        stub.serve_resource(kind.plural, &kind.api_version(), kind.kind, true);
        let ours =
            json!({"app.kubernetes.io/managed-by": "podmend", "podmend.io/report-set": REPORT_SET});
        stub.set_objects(
            kind.plural,
            vec![
                // A namespace whose findings are gone.
                foreign(format, "gone", "podmend-audit", ours.clone()),
                // A part no longer needed.
                foreign(format, "ci", "podmend-audit-7", ours.clone()),
                // Somebody else's report, and podmend-managed but another set.
                foreign(format, "ci", "kyverno-polr", json!({"app.kubernetes.io/managed-by": "kyverno"})),
                foreign(format, "ci", "podmend-other", json!({"app.kubernetes.io/managed-by": "podmend", "podmend.io/report-set": "other"})),
                // Outside the scope of a namespaced run.
                foreign(format, "elsewhere", "podmend-audit", ours.clone()),
            ],
        );
        let client = stub.client().await;
        let scope_all = ApplyScope {
            namespace: None,
            page_size: 2,
        };
        let scope_ci = ApplyScope {
            namespace: Some("ci"),
            page_size: 2,
        };

        // A run scoped to ci: several parts there; only ci's stale part goes.
        let big = reports(&findings("ci", 6000), format);
        let parts = big.len();
        assert!((2..7).contains(&parts), "{format:?}: {parts} parts");
        let part_keys: BTreeSet<String> =
            (0..parts).map(|i| format!("ci/{}", part_name(i))).collect();
        let done = apply_reports(client.clone(), format, &big, &scope_ci)
            .await
            .expect("applied");
        assert_eq!(done.applied, parts);
        assert_eq!(done.deleted, ["ci/podmend-audit-7"]);
        let mut expected: BTreeSet<String> = [
            "ci/kyverno-polr",
            "ci/podmend-other",
            "elsewhere/podmend-audit",
            "gone/podmend-audit",
        ]
        .map(String::from)
        .into();
        expected.extend(part_keys.iter().cloned());
        assert_eq!(stored(&stub, format), expected);

        // The report shrinks to one part, cluster-wide: the extra parts and the other
        // namespaces' reports go, each delete preconditioned on its UID.
        stub.clear_calls();
        let small = reports(&findings("ci", 10), format);
        let done = apply_reports(client.clone(), format, &small, &scope_all)
            .await
            .expect("applied");
        assert_eq!(done.applied, 1);
        let mut gone: BTreeSet<String> = part_keys.clone();
        gone.remove("ci/podmend-audit");
        gone.extend([
            "elsewhere/podmend-audit".to_string(),
            "gone/podmend-audit".to_string(),
        ]);
        assert_eq!(done.deleted.iter().cloned().collect::<BTreeSet<_>>(), gone);
        assert_eq!(
            stored(&stub, format),
            ["ci/kyverno-polr", "ci/podmend-audit", "ci/podmend-other"]
                .map(String::from)
                .into()
        );
        let calls = stub.calls();
        let lists: Vec<_> = calls.iter().filter(|c| c.verb == "list").collect();
        assert!(
            lists.iter().all(|c| c.path.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dpodmend%2Cpodmend.io%2Freport-set%3Dpodmend-audit")),
            "{lists:#?}"
        );
        assert!(
            lists.iter().all(|c| c.path.contains("limit=2")),
            "paginated"
        );
        assert!(
            calls
                .iter()
                .filter(|c| c.verb == "delete")
                .all(|c| c.status == 200),
            "every delete matched its precondition"
        );
        let kept = stub
            .objects(kind.plural)
            .into_iter()
            .find(|o| o["metadata"]["name"] == "podmend-audit")
            .unwrap();
        assert_eq!(
            kept["results"].as_array().unwrap().len(),
            10,
            "the shrunk report applied"
        );

        // No findings at all: nothing of podmend's is left.
        let done = apply_reports(client, format, &[], &scope_all)
            .await
            .expect("applied");
        assert_eq!(done.deleted, ["ci/podmend-audit"]);
        assert_eq!(
            stored(&stub, format),
            ["ci/kyverno-polr", "ci/podmend-other"]
                .map(String::from)
                .into()
        );
    }
}
