//! `podmend audit` on manifests, through the real binary: golden directories (input →
//! expected findings and expected repaired YAML), the same patch as the webhook, repaired
//! output that re-audits clean and passes the official schema, and input errors. Audits that
//! repair pinned pods read the cluster from `--cluster-snapshot` ([`SNAPSHOT`]): without one
//! podmend cannot know a node's taints and leaves such pods as they are.
//!
//! `PODMEND_BLESS=1 cargo test --test audit_files` rewrites the golden files; review the diff.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::k8s_rules;
use common::schema::validate_with_schema;
use common::server::{BIN, Options, create_review, start_knowing_nodes};
use serde_json::{Value, json};

/// The `--cluster-snapshot` of the golden cases: every node they, and this file's own
/// manifests, pin a pod to (untainted), as `kubectl get nodes,namespaces,limitranges -A -o
/// yaml` prints them.
const SNAPSHOT: &str = "tests/fixtures/audit/cluster-snapshot.yaml";

/// The names of the Nodes in [`SNAPSHOT`].
fn snapshot_nodes() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOT))
        .expect("the cluster snapshot");
    let list: Value = serde_yaml_ng::from_str(&text).expect("the snapshot is a YAML List");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|item| item["kind"] == "Node")
        .map(|node| node["metadata"]["name"].as_str().expect("name").to_string())
        .collect()
}

/// `args` after `--cluster-snapshot SNAPSHOT`.
fn with_snapshot<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--cluster-snapshot", SNAPSHOT];
    all.extend_from_slice(args);
    all
}

fn case_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/audit")
        .join(case)
}

struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

fn audit(args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(BIN)
        .arg("audit")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run podmend audit");
    {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin");
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
    }
    let output = child.wait_with_output().expect("podmend audit finishes");
    Run {
        status: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The part of the JSON report a golden file pins: which rule found what, where.
fn findings_digest(report: &Value) -> Value {
    let findings = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            json!({
                "rule": f["rule"], "mode": f["mode"],
                "object": format!("{}/{}/{}", f["object"]["kind"].as_str().unwrap_or(""), f["object"]["namespace"].as_str().unwrap_or(""), f["object"]["name"].as_str().unwrap_or("")),
                "file": Path::new(f["source"]["file"].as_str().unwrap_or("")).file_name().map(|n| n.to_string_lossy().into_owned()),
                "document": f["source"]["document"], "line": f["source"]["line"],
                "helmSource": f["source"]["helmSource"], "listItem": f["source"]["listItem"],
                "message": f["message"],
            })
        })
        .collect::<Vec<_>>();
    json!({"findings": findings, "summary": report["summary"], "errors": report["errors"].as_array().map(|e| e.len())})
}

fn check_golden(path: &Path, actual: &str) {
    if std::env::var_os("PODMEND_BLESS").is_some() {
        std::fs::write(path, actual).expect("bless");
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|_| panic!("{} missing: run with PODMEND_BLESS=1", path.display()));
    assert_eq!(actual, expected, "{} differs", path.display());
}

fn run_golden(case: &str, expected_status: i32) {
    let dir = case_dir(case);
    let input = relative(&dir.join("input"));
    let json_run = audit(&with_snapshot(&["-o", "json", &input]), None);
    assert_eq!(json_run.status, expected_status, "{}", json_run.stderr);
    let report: Value = serde_json::from_str(&json_run.stdout).expect("json report");
    let digest = serde_json::to_string_pretty(&findings_digest(&report)).expect("json") + "\n";
    check_golden(&dir.join("expected-findings.json"), &digest);
    let yaml_run = audit(&with_snapshot(&["-o", "yaml", &input]), None);
    check_golden(&dir.join("expected.yaml"), &yaml_run.stdout);
}

#[test]
fn a_helm_render_gets_findings_with_helm_sources_and_repaired_yaml() {
    run_golden("helm-render", 3);
}

#[test]
fn list_items_are_audited_one_by_one() {
    run_golden("list", 3);
}

#[test]
fn real_objects_from_public_projects_match_their_golden_findings() {
    run_golden("real-objects", 3);
}

/// The node-affinity findings of a JSON report, as (object name, message, patch).
fn node_affinity_findings(report: &Value) -> Vec<(String, String, Value)> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["rule"] == "node-affinity")
        .map(|f| {
            (
                f["object"]["name"].as_str().unwrap_or("").to_string(),
                f["message"].as_str().unwrap_or("").to_string(),
                f["patch"].clone(),
            )
        })
        .collect()
}

/// Without look-ups podmend cannot know the node's taints, and a rewrite could leave a pod
/// that ran on a tainted node Pending for ever: each pinned pod is reported as a note saying
/// so, and left as it is in every output. With `--cluster-snapshot` naming the node it is
/// repaired; a node the snapshot lacks is not known, so its pod is left as it is too.
#[test]
fn an_offline_audit_leaves_node_name_pods_as_they_are_and_says_a_snapshot_would_repair_them() {
    let input = relative(&case_dir("helm-render").join("input/helm-template.yaml"));
    let pinned = [
        ("pinned-builder", "build-node-1"),
        ("jenkins-agent-7", "build-node-2"),
    ];

    let offline = audit(&["-o", "json", &input], None);
    let report: Value = serde_json::from_str(&offline.stdout).expect("json report");
    let findings = node_affinity_findings(&report);
    assert_eq!(findings.len(), pinned.len(), "{report:#}");
    for ((name, message, patch), (object, node)) in findings.iter().zip(pinned) {
        assert_eq!(name, object);
        assert_eq!(
            message,
            &format!("left as is: node {node}'s taints are unknown without cluster look-ups")
        );
        assert_eq!(patch, &json!([]), "{name}: no patch");
    }
    for repair in report["repairs"].as_array().expect("repairs") {
        assert!(
            !repair["patch"].to_string().contains("nodeName"),
            "an offline repair touched nodeName: {repair}"
        );
    }
    let table = audit(&[&input], None);
    let rows: Vec<&str> = table
        .stdout
        .lines()
        .filter(|line| line.contains("node-affinity") && line.contains("left as is"))
        .collect();
    assert_eq!(rows.len(), pinned.len(), "{}", table.stdout);
    assert!(rows.iter().all(|row| row.starts_with("note ")), "{rows:?}");
    let yaml = audit(&["-o", "yaml", &input], None);
    for (_, node) in pinned {
        assert!(
            yaml.stdout.contains(&format!("nodeName: {node}\n")),
            "{}",
            yaml.stdout
        );
    }
    // A note never fails the run: a pinned pod alone, offline, exits clean.
    let only_pinned = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ci}\nspec:\n  nodeName: node-1\n  containers: [{name: a, image: busybox}]\n";
    assert_eq!(audit(&["-o", "json", "-"], Some(only_pinned)).status, 0);

    // The snapshot variant: the same files, repaired.
    let known = audit(&with_snapshot(&["-o", "json", &input]), None);
    let report: Value = serde_json::from_str(&known.stdout).expect("json report");
    let findings = node_affinity_findings(&report);
    assert_eq!(findings.len(), pinned.len(), "{report:#}");
    for ((name, message, patch), (_, node)) in findings.iter().zip(pinned) {
        assert_eq!(
            message,
            &format!(
                "spec.nodeName={node} became required node affinity, so the scheduler checks the pod fits"
            )
        );
        assert!(
            patch
                .as_array()
                .expect("patch")
                .iter()
                .any(|op| op["op"] == "remove"
                    && op["path"].as_str().unwrap_or("").ends_with("/nodeName")),
            "{name}: {patch}"
        );
    }
    let yaml = audit(&with_snapshot(&["-o", "yaml", &input]), None);
    assert!(!yaml.stdout.contains("nodeName"), "{}", yaml.stdout);
    assert_eq!(
        audit(&with_snapshot(&["-o", "json", "-"]), Some(only_pinned)).status,
        3
    );

    // A node the snapshot does not have: podmend cannot know its taints either.
    let elsewhere = only_pinned.replace("node-1", "not-in-the-snapshot");
    let run = audit(&with_snapshot(&["-o", "json", "-"]), Some(&elsewhere));
    let report: Value = serde_json::from_str(&run.stdout).expect("json report");
    let findings = node_affinity_findings(&report);
    assert_eq!(findings.len(), 1, "{report:#}");
    assert!(
        findings[0]
            .1
            .starts_with("left as is: node not-in-the-snapshot is not known"),
        "{findings:?}"
    );
    assert_eq!(findings[0].2, json!([]));
    assert_eq!(run.status, 0);
}

#[test]
fn a_broken_document_among_good_ones_exits_1_names_the_line_and_reports_the_rest() {
    run_golden("broken-document", 1);
    let input = relative(&case_dir("broken-document").join("input/three-documents.yaml"));
    let run = audit(&["-o", "json", &input], None);
    let report: Value = serde_json::from_str(&run.stdout).expect("json");
    let error = &report["errors"][0];
    assert_eq!(error["document"], 2);
    assert_eq!(error["line"], 15, "{error}");
    assert!(
        error["file"]
            .as_str()
            .unwrap_or("")
            .ends_with("three-documents.yaml")
    );
    let names: Vec<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["object"]["name"].as_str())
        .collect();
    assert_eq!(names, ["before-the-break", "after-the-break"]);
    let table = audit(&[&input], None);
    assert_eq!(table.status, 1);
    assert!(
        table.stdout.contains("document 2 (line 15)"),
        "{}",
        table.stdout
    );
}

#[test]
fn fail_on_decides_the_exit_status() {
    let input = relative(&case_dir("helm-render").join("input"));
    assert_eq!(
        audit(&with_snapshot(&["-o", "json", &input]), None).status,
        3
    );
    assert_eq!(
        audit(
            &with_snapshot(&["-o", "json", "--fail-on", "enforce", &input]),
            None
        )
        .status,
        3
    );
    let only_warn = relative(&case_dir("helm-render").join("input/helm-template.yaml"));
    let config = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(
        config.path(),
        "rules:\n  node-affinity: {mode: warn}\n  agent-requests: {mode: warn}\n",
    )
    .expect("write");
    let config_path = config.path().display().to_string();
    assert_eq!(
        audit(
            &with_snapshot(&[
                "-o",
                "json",
                "--config",
                &config_path,
                "--fail-on",
                "deny",
                &only_warn
            ]),
            None
        )
        .status,
        0
    );
    assert_eq!(
        audit(
            &with_snapshot(&["-o", "json", "--config", &config_path, &only_warn]),
            None
        )
        .status,
        3
    );
    assert_eq!(
        audit(
            &with_snapshot(&["-o", "json", "--fail-on", "never", &input]),
            None
        )
        .status,
        0
    );
    let clean = "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec:\n  containers: [{name: a, image: x}]\n";
    assert_eq!(
        audit(&with_snapshot(&["-o", "json", "-"]), Some(clean)).status,
        0
    );
}

#[test]
fn yaml_output_works_as_a_post_renderer_on_stdin_and_re_audits_clean() {
    let input = std::fs::read_to_string(case_dir("helm-render").join("input/helm-template.yaml"))
        .expect("input");
    let repaired = audit(&with_snapshot(&["-o", "yaml", "-"]), Some(&input));
    assert_eq!(
        repaired.status, 0,
        "a post-renderer must exit 0: {}",
        repaired.stderr
    );
    assert!(
        repaired
            .stdout
            .contains("# Source: ci-agents/templates/service.yaml")
    );
    assert!(
        repaired.stdout.contains("- port: 80   # kept as written"),
        "untouched documents stay byte for byte"
    );
    assert!(!repaired.stdout.contains("nodeName"), "{}", repaired.stdout);
    let again = audit(&with_snapshot(&["-o", "json", "-"]), Some(&repaired.stdout));
    let report: Value = serde_json::from_str(&again.stdout).expect("json");
    assert_eq!(report["summary"]["findings"], 0, "{}", again.stdout);
    assert_eq!(again.status, 0);
}

#[test]
fn repaired_yaml_passes_the_official_schema_and_the_api_rules() {
    for case in ["helm-render", "list", "real-objects"] {
        let run = audit(
            &with_snapshot(&["-o", "yaml", &relative(&case_dir(case).join("input"))]),
            None,
        );
        assert!(!run.stdout.contains("nodeName:"), "{case}: {}", run.stdout);
        let mut objects = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(&run.stdout) {
            let value: Value = serde::Deserialize::deserialize(document).expect("yaml document");
            if value.is_null() {
                continue;
            }
            let items = if value["kind"] == "List" {
                value["items"].as_array().cloned().unwrap_or_default()
            } else {
                vec![value]
            };
            for item in items {
                if let Some(spec) = k8s_rules::pod_spec_of(&item) {
                    let errors = k8s_rules::validate_pod_spec(spec);
                    assert!(errors.is_empty(), "{case}: {errors:?}");
                }
                objects.push(item);
            }
        }
        assert!(!objects.is_empty());
        validate_with_schema(&objects, false).unwrap_or_else(|e| panic!("{case}: {e}"));
    }
}

/// The audit's repair for an object is exactly what the webhook sends for it (every rule
/// enforcing, as audit shows the repair whatever the mode), both looking up the same nodes:
/// the audit in [`SNAPSHOT`], the webhook in a cluster that has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_patch_equals_the_webhook_patch_for_the_same_object() {
    // agent-requests acting as widely as it can (the Jenkins preset, unpinned agents, limits
    // from lone requests), so that the Jenkins agents are compared too; audit reads the same
    // file.
    let all_enforce = "rules:\n  node-affinity: {templates: enforce}\n  agent-requests: {templates: enforce, \
                       presets: [pinniped-kube-cert-agent, jenkins-agent], onlyPinned: false, limitFromRequest: true}\n";
    let nodes = snapshot_nodes();
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let (_stub, server) = start_knowing_nodes(
        &nodes,
        Options {
            config: Some(all_enforce.to_string()),
            ..Options::default()
        },
    )
    .await;
    let config = server.config_path().display().to_string();
    let mut compared = 0;
    for case in ["helm-render", "list", "real-objects"] {
        let dir = case_dir(case).join("input");
        let run = audit(
            &with_snapshot(&["-o", "patch", "--config", &config, &relative(&dir)]),
            None,
        );
        let json_report = audit(
            &with_snapshot(&["-o", "json", "--config", &config, &relative(&dir)]),
            None,
        );
        let report: Value = serde_json::from_str(&json_report.stdout).expect("json");
        assert_eq!(
            run.stdout.lines().count(),
            report["repairs"].as_array().map_or(0, Vec::len)
        );
        for repair in report["repairs"].as_array().expect("repairs") {
            let object = find_object(&dir, &repair["object"]);
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            let review = create_review("audit-vs-webhook", &object, namespace);
            let response = server
                .client(&[b"h2"])
                .post(server.url("/mutate"))
                .json(&review)
                .send()
                .await
                .expect("webhook answers");
            let body: Value = response.json().await.expect("json");
            let patch = k8s_rules::verify_admission_response("audit-vs-webhook", &body, true)
                .expect("valid response")
                .expect("the webhook patches what audit repairs");
            let webhook_patch: Value = serde_json::from_slice(&patch).expect("patch json");
            assert_eq!(
                webhook_patch, repair["patch"],
                "{case}: {}",
                repair["object"]
            );
            compared += 1;
        }
    }
    assert!(compared >= 6, "only {compared} objects compared");
}

/// The object a repair is about, read back from the case's input files by kind and name.
fn find_object(dir: &Path, object: &Value) -> Value {
    let mut candidates = Vec::new();
    for entry in std::fs::read_dir(dir).expect("case dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.file_name().is_some_and(|n| n == "expected.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("input file");
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document).unwrap_or(Value::Null);
            let items = if value["kind"] == "List" {
                value["items"].as_array().cloned().unwrap_or_default()
            } else {
                vec![value]
            };
            candidates.extend(items);
        }
    }
    candidates
        .into_iter()
        .find(|c| c["kind"] == object["kind"] && c["metadata"]["name"] == object["name"])
        .unwrap_or_else(|| panic!("{object} not found in {}", dir.display()))
}

/// A directory with one broken file and one good one.
fn broken_and_good_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(
        dir.path().join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\n   bad: indent\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("good.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: good, namespace: ci}\nspec:\n  nodeName: node-1\n  containers: [{name: a, image: busybox}]\n",
    )
    .expect("write");
    dir
}

#[test]
fn an_unreadable_file_is_named_on_stderr_in_every_format_and_the_good_files_are_still_reported() {
    let dir = broken_and_good_dir();
    let path = dir.path().display().to_string();
    for format in ["table", "json", "sarif", "patch", "yaml"] {
        let run = audit(&with_snapshot(&["-o", format, &path]), None);
        assert_eq!(run.status, 1, "-o {format}: {}", run.stderr);
        let line = run
            .stderr
            .lines()
            .find(|line| line.contains("broken.yaml"))
            .unwrap_or_else(|| panic!("-o {format}: no error on stderr: {:?}", run.stderr));
        assert!(
            line.starts_with("podmend audit: ")
                && line.contains("document 1 (line ")
                && line.contains("invalid YAML"),
            "-o {format}: {line}"
        );
        // The good file is still audited and reported.
        assert!(
            run.stdout.contains("good"),
            "-o {format} lost the good file: {}",
            run.stdout
        );
        if format == "yaml" {
            assert!(!run.stdout.contains("nodeName"), "{}", run.stdout);
        }
    }
    // The formats with a place for errors keep them there too.
    let json: Value =
        serde_json::from_str(&audit(&["-o", "json", &path], None).stdout).expect("json report");
    assert_eq!(json["errors"].as_array().map(Vec::len), Some(1), "{json}");
    let sarif: Value =
        serde_json::from_str(&audit(&["-o", "sarif", &path], None).stdout).expect("sarif log");
    let notifications = &sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"];
    assert_eq!(notifications.as_array().map(Vec::len), Some(1), "{sarif}");
    assert!(audit(&[&path], None).stdout.contains("input errors:"));
}

#[test]
fn a_missing_file_is_named_on_stderr_as_the_whole_file() {
    let run = audit(&["-o", "json", "no/such/file.yaml"], None);
    assert_eq!(run.status, 1);
    assert!(
        run.stderr
            .contains("podmend audit: no/such/file.yaml: cannot read:"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_pod_whose_spec_does_not_decode_is_an_input_error_naming_the_field() {
    let manifests = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n\
        apiVersion: v1\nkind: Pod\nmetadata: {name: bad-env, namespace: ci}\nspec:\n  nodeName: node-1\n  containers:\n  - name: app\n    image: busybox\n    env:\n    - {name: RETRIES, value: 3}\n";
    let run = audit(&["-o", "json", "-"], Some(manifests));
    assert_eq!(run.status, 1, "{}", run.stdout);
    assert!(
        run.stderr.contains(
            "podmend audit: stdin: document 2 (line 5): not a valid Pod: spec.containers[0].env[0].value: invalid type: integer `3`, expected a string"
        ),
        "{}",
        run.stderr
    );
    let report: Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(
        report["summary"]["findings"], 0,
        "an invalid object is not reviewed"
    );
    assert_eq!(report["summary"]["inputErrors"], 1);
    assert_eq!(report["summary"]["objects"], 2);
    assert_eq!(report["errors"][0]["line"], 5);

    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers:\n      - name: app\n        ports: [{containerPort: http}]\n";
    let run = audit(&["-"], Some(deployment));
    assert_eq!(run.status, 1);
    assert!(
        run.stderr.contains(
            "not a valid Deployment: spec.template.spec.containers[0].ports[0].containerPort:"
        ),
        "{}",
        run.stderr
    );
}

#[test]
fn replication_controllers_and_pod_templates_are_audited_like_other_workloads() {
    let manifests = "apiVersion: v1\nkind: ReplicationController\nmetadata: {name: rc, namespace: ci}\nspec:\n  replicas: 1\n  selector: {app: rc}\n  template:\n    metadata: {labels: {app: rc}}\n    spec:\n      nodeName: node-1\n      containers: [{name: a, image: busybox}]\n---\n\
        apiVersion: v1\nkind: PodTemplate\nmetadata: {name: pt, namespace: ci}\ntemplate:\n  metadata: {labels: {app: pt}}\n  spec:\n    nodeName: node-2\n    containers: [{name: a, image: busybox}]\n";
    let run = audit(&with_snapshot(&["-o", "json", "-"]), Some(manifests));
    assert_eq!(run.status, 3, "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(report["summary"]["withoutPodSpec"], 0, "{report}");
    let findings = report["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 2, "{report}");
    for (finding, (kind, pointer)) in findings.iter().zip([
        ("ReplicationController", "/spec/template/spec/nodeName"),
        ("PodTemplate", "/template/spec/nodeName"),
    ]) {
        assert_eq!(finding["object"]["kind"], kind);
        assert_eq!(finding["rule"], "node-affinity");
        assert_eq!(
            finding["mode"], "warn",
            "templates are warned about by default"
        );
        let removes_node_name = finding["patch"]
            .as_array()
            .expect("patch")
            .iter()
            .any(|op| op["op"] == "remove" && op["path"] == pointer);
        assert!(removes_node_name, "{finding}");
    }
    let repaired = audit(&with_snapshot(&["-o", "yaml", "-"]), Some(manifests));
    assert_eq!(repaired.status, 0);
    assert!(!repaired.stdout.contains("nodeName"), "{}", repaired.stdout);
}

/// The documents of a YAML stream, each as JSON; a stream that does not read fails the test.
fn yaml_documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).unwrap_or_else(|e| panic!("{e}:\n{text}")))
        .collect()
}

#[test]
fn a_document_marker_with_a_comment_or_content_before_a_repaired_document_keeps_it_a_document_of_its_own()
 {
    let input = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: ci}\ndata: {a: b}\n\
--- # the pod\n\
apiVersion: v1\nkind: Pod\nmetadata: {name: pinned, namespace: ci}\nspec:\n  nodeName: build-node-1\n  containers: [{name: a, image: busybox}]\n\
--- {apiVersion: v1, kind: Pod, metadata: {name: inline, namespace: ci}, spec: {nodeName: build-node-2, containers: [{name: a, image: busybox}]}}\n";
    let run = audit(&with_snapshot(&["-o", "yaml", "-"]), Some(input));
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(run.stdout.contains("--- # the pod\n"), "{}", run.stdout);
    let documents = yaml_documents(&run.stdout);
    let names: Vec<(&str, &str)> = documents
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("ConfigMap", "settings"),
            ("Pod", "pinned"),
            ("Pod", "inline")
        ],
        "{}",
        run.stdout
    );
    assert_eq!(documents[0]["data"], json!({"a": "b"}));
    for pod in &documents[1..] {
        assert!(pod["spec"].get("nodeName").is_none(), "{}", run.stdout);
        assert!(pod["spec"]["affinity"]["nodeAffinity"].is_object(), "{pod}");
    }
}

/// Two pods of one List: the second takes its node and its container's image and resources
/// from the first through merge keys, as kubectl and Helm read them (go-yaml v2 under
/// sigs.k8s.io/yaml: `decoder.mapping` and `decoder.merge` in gopkg.in/yaml.v2's decode.go).
const MERGED_PODS: &str = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: builder-a, namespace: ci}
  spec: &builder-spec
    nodeName: build-node-1
    containers:
    - &builder
      name: build
      image: registry.example/builder:1.2
      resources:
        requests: {cpu: 500m, memory: 1Gi}
- apiVersion: v1
  kind: Pod
  metadata: {name: builder-b, namespace: ci}
  spec:
    <<: *builder-spec
    containers:
    - <<: *builder
      name: build-b
";

#[test]
fn a_node_name_that_arrives_through_a_merge_key_is_audited_and_o_yaml_keeps_the_merged_fields() {
    let run = audit(&with_snapshot(&["-o", "json", "-"]), Some(MERGED_PODS));
    let report: Value = serde_json::from_str(&run.stdout).expect("json report");
    assert!(
        report["errors"].as_array().expect("errors").is_empty(),
        "{report:#}"
    );
    let findings = node_affinity_findings(&report);
    let names: Vec<&str> = findings.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(names, ["builder-a", "builder-b"], "{report:#}");
    let (_, message, patch) = &findings[1];
    assert!(
        message.starts_with("spec.nodeName=build-node-1 became"),
        "{message}"
    );
    assert!(patch.to_string().contains("/nodeName"), "{patch}");

    let yaml = audit(&with_snapshot(&["-o", "yaml", "-"]), Some(MERGED_PODS));
    assert_eq!(yaml.status, 0, "{}", yaml.stderr);
    assert!(!yaml.stdout.contains("<<"), "{}", yaml.stdout);
    let documents = yaml_documents(&yaml.stdout);
    assert_eq!(documents.len(), 1, "{}", yaml.stdout);
    let second = &documents[0]["items"][1];
    assert_eq!(second["metadata"]["name"], "builder-b");
    assert_eq!(
        second["spec"]["containers"],
        json!([{
            "name": "build-b",
            "image": "registry.example/builder:1.2",
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
        }]),
        "{}",
        yaml.stdout
    );
    assert!(second["spec"].get("nodeName").is_none(), "{}", yaml.stdout);
    let again = audit(&with_snapshot(&["-o", "json", "-"]), Some(&yaml.stdout));
    let report: Value = serde_json::from_str(&again.stdout).expect("json");
    assert_eq!(report["summary"]["findings"], 0, "{}", again.stdout);
}
