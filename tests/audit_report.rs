//! The audit renderers (`podmend::audit::report`) on reports built through the real engine:
//! table, JSON, JSON Lines patches, and SARIF checked against the official SARIF 2.1.0 schema
//! (`tests/fixtures/sarif/sarif-schema-2.1.0.json`) with Python `jsonschema` from `.venv`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use podmend::audit::report::{self, OutputFormat};
use podmend::audit::{InputError, ObjectRef, Report, Source, Symptom, SymptomKind};
use podmend::cluster::StaticCluster;
use podmend::config::{AgentRequestsConfig, Config, Mode, RulesConfig};
use podmend::engine::{Engine, Operation, Subject};
use serde_json::{Value, json};

fn source(file: &str, document: usize, line: usize) -> Source {
    Source {
        file: file.into(),
        document,
        line,
        helm_source: None,
        list_item: None,
    }
}

fn pinned_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pinned", "namespace": "ci"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "busybox"}]}})
}

fn pinned_deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"nodeName": "node-2", "containers": [{"name": "web", "image": "nginx"}]}}}})
}

/// The cluster the pinned objects' nodes are in, untainted, as the webhook or `podmend audit
/// --cluster-snapshot` looks it up: without the nodes podmend leaves those objects as they are.
fn cluster() -> StaticCluster {
    StaticCluster::empty()
        .with_node("node-1", vec![])
        .with_node("node-2", vec![])
}

/// A Jenkins agent selected explicitly (the Jenkins preset is opt-in), pinned or not.
fn jenkins_agent(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "jenkins", "labels": {"jenkins/label": "build"},
            "annotations": {"podmend.io/agent": "true"}},
        "spec": {"containers": [{"name": "jnlp", "image": "jenkins/inbound-agent",
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                          "limits": {"cpu": "1", "memory": "1Gi"}}}]}})
}

fn service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"ports": [{"port": 80}]}})
}

fn deny_agents() -> Config {
    Config {
        rules: RulesConfig {
            agent_requests: AgentRequestsConfig {
                mode: Mode::Deny,
                ..AgentRequestsConfig::default()
            },
            ..RulesConfig::default()
        },
        ..Config::default()
    }
}

/// A report with every kind of entry, and the objects it was built from (by name).
struct Fixture {
    report: Report,
    objects: Vec<(String, Value)>,
}

fn full_report() -> Fixture {
    let engine = Engine::new(&Config::default());
    let deny = Engine::new(&deny_agents());
    let cluster = cluster();
    let mut report = Report::default();
    let mut objects = Vec::new();
    let mut add = |engine: &Engine, object: Value, source: Source| {
        report.add_object(engine, &cluster, &object, source);
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        objects.push((name, object));
    };
    // enforce, from a file
    add(&engine, pinned_pod(), source("manifests/pod.yaml", 1, 1));
    // warn (templates default to warn), third document of a file
    add(
        &engine,
        pinned_deployment(),
        source("manifests/web.yaml", 3, 27),
    );
    // not a pod spec: counted, no finding
    add(&engine, service(), source("manifests/web.yaml", 2, 14));
    // enforce, from stdin, as the second item of a `kind: List`
    add(
        &engine,
        jenkins_agent("agent-a"),
        Source {
            helm_source: Some("ci/templates/agent.yaml".into()),
            list_item: Some(1),
            ..source("-", 2, 9)
        },
    );
    // deny
    add(
        &deny,
        jenkins_agent("agent-b"),
        source("manifests/agent-b.yaml", 1, 1),
    );
    report.add_error(InputError {
        file: "manifests/broken.yaml".into(),
        document: 2,
        line: 7,
        message: "mapping values are not allowed in this context".into(),
    });
    report.add_symptom(Symptom {
        kind: SymptomKind::FailedPods,
        object: ObjectRef {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            namespace: "shop".into(),
            name: "web-5d4f".into(),
        },
        count: 1204,
        reason: "OutOfcpu".into(),
        message: "ReplicaSet shop/web-5d4f: 1,204 Failed pods (OutOfcpu) — its template pins spec.nodeName=node-2".into(),
    });
    Fixture { report, objects }
}

fn has_ansi(text: &str) -> bool {
    text.contains('\x1b')
}

#[test]
fn the_fixture_report_has_every_mode_a_symptom_and_an_error() {
    let Fixture { report, .. } = full_report();
    let modes: Vec<Mode> = report.findings.iter().map(|f| f.mode).collect();
    assert_eq!(
        modes,
        [Mode::Enforce, Mode::Warn, Mode::Enforce, Mode::Deny],
        "{report:#?}"
    );
    assert_eq!(report.summary.objects, 5);
    assert_eq!(report.summary.without_pod_spec, 1);
    assert_eq!(report.repairs.len(), 4);
}

#[test]
fn format_names_are_the_cli_values() {
    use clap::ValueEnum;
    let names: Vec<String> = OutputFormat::value_variants()
        .iter()
        .filter_map(|f| f.to_possible_value().map(|v| v.get_name().to_string()))
        .collect();
    assert_eq!(names, ["table", "json", "sarif", "patch", "yaml"]);
}

// ---------------------------------------------------------------------------------------------
// table

#[test]
fn the_table_has_a_header_a_row_per_finding_and_the_summary() {
    let Fixture { report, .. } = full_report();
    let text = report::table(&report, false);
    let lines: Vec<&str> = text.lines().collect();
    let header = lines[0];
    for column in ["MODE", "RULE", "OBJECT", "LOCATION", "MESSAGE"] {
        assert!(header.contains(column), "{text}");
    }
    let rows = &lines[1..=report.findings.len()];
    for (row, finding) in rows.iter().zip(&report.findings) {
        assert!(row.starts_with(finding.mode.as_str()), "{row}");
        assert!(row.contains(&finding.rule), "{row}");
        assert!(row.contains(&finding.object.display()), "{row}");
        assert!(
            row.contains(&finding.message),
            "long messages are not truncated: {row}"
        );
    }
    assert_eq!(
        lines[report.findings.len() + 1],
        "",
        "a blank line ends the findings"
    );
    assert!(rows[0].contains("Pod/ci/pinned") && rows[0].contains("manifests/pod.yaml:1"));
    assert!(rows[1].contains("Deployment/shop/web") && rows[1].contains("manifests/web.yaml:27"));
    assert!(
        rows[2].contains("stdin:9#1"),
        "list items show #item: {}",
        rows[2]
    );
    // Columns line up: every row's RULE starts where the header's does.
    let rule_at = header.find("RULE").unwrap();
    for row in rows {
        assert!(
            row[rule_at..].starts_with("node-affinity")
                || row[rule_at..].starts_with("agent-requests"),
            "{text}"
        );
    }
    assert!(text.contains("symptoms:"), "{text}");
    assert!(text.contains("1204"), "{text}");
    assert!(text.contains("1,204 Failed pods (OutOfcpu)"), "{text}");
    assert!(text.contains("input errors:"), "{text}");
    assert!(
        text.contains("manifests/broken.yaml: document 2 (line 7): mapping values are not allowed"),
        "{text}"
    );
    let summary = lines.last().unwrap();
    assert_eq!(
        *summary,
        "5 objects, 4 findings (2 enforce, 1 warn, 1 deny, 0 notes), 1 symptom, 1 input error; \
         1 without a pod spec skipped"
    );
}

#[test]
fn the_table_has_no_escapes_without_color_and_colours_modes_with_it() {
    let Fixture { report, .. } = full_report();
    let plain = report::table(&report, false);
    assert!(!has_ansi(&plain), "{plain}");
    let coloured = report::table(&report, true);
    assert!(has_ansi(&coloured));
    assert!(
        coloured.contains("\x1b[31mdeny\x1b[0m"),
        "deny is red: {coloured}"
    );
    assert!(coloured.contains("\x1b[33mwarn\x1b[0m"), "warn is yellow");
    assert!(
        coloured.contains("\x1b[36menforce\x1b[0m"),
        "enforce is cyan"
    );
    // Colour changes nothing but the escapes.
    let stripped = strip_ansi(&coloured);
    assert_eq!(stripped, plain);
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn an_empty_report_says_no_findings_and_gives_the_summary() {
    let text = report::table(&Report::default(), false);
    assert_eq!(
        text,
        "no findings\n\n0 objects, 0 findings (0 enforce, 0 warn, 0 deny, 0 notes), 0 symptoms, \
         0 input errors; 0 without a pod spec skipped\n"
    );
}

#[test]
fn cluster_objects_show_no_location_in_the_table() {
    let mut report = Report::default();
    report.add_object(
        &Engine::new(&Config::default()),
        &cluster(),
        &pinned_pod(),
        source("cluster", 0, 0),
    );
    let text = report::table(&report, false);
    let row = text.lines().nth(1).unwrap();
    assert!(!row.contains("cluster:"), "{row}");
    let header = text.lines().next().unwrap();
    let message_at = header.find("MESSAGE").unwrap();
    assert_eq!(&row[message_at..], report.findings[0].message, "{text}");
}

// ---------------------------------------------------------------------------------------------
// JSON

#[test]
fn the_json_report_parses_and_its_counts_match() {
    let Fixture { report, .. } = full_report();
    let text = report::json(&report);
    assert!(text.ends_with("}\n"));
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["apiVersion"], "podmend.io/v1alpha1");
    assert_eq!(doc["kind"], "AuditReport");
    let keys: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "apiVersion",
            "kind",
            "summary",
            "findings",
            "repairs",
            "symptoms",
            "errors"
        ]
    );
    let summary = &doc["summary"];
    assert_eq!(summary["objects"], 5);
    assert_eq!(summary["withoutPodSpec"], 1);
    assert_eq!(summary["findings"], 4);
    assert_eq!(summary["enforce"], 2);
    assert_eq!(summary["warn"], 1);
    assert_eq!(summary["deny"], 1);
    assert_eq!(summary["symptoms"], 1);
    assert_eq!(summary["inputErrors"], 1);
    assert_eq!(doc["findings"].as_array().unwrap().len(), 4);
    assert_eq!(doc["repairs"].as_array().unwrap().len(), 4);
    assert_eq!(doc["symptoms"].as_array().unwrap().len(), 1);
    assert_eq!(doc["symptoms"][0]["kind"], "failed-pods");
    assert_eq!(doc["errors"][0]["line"], 7);
    for finding in doc["findings"].as_array().unwrap() {
        let patch = finding["patch"].as_array().expect("patch is an array");
        assert!(!patch.is_empty(), "{finding}");
        for op in patch {
            assert!(op["op"].is_string() && op["path"].is_string(), "{op}");
        }
        assert!(["enforce", "warn", "deny"].contains(&finding["mode"].as_str().unwrap()));
    }
    let stdin_finding = &doc["findings"][2];
    assert_eq!(stdin_finding["source"]["file"], "-");
    assert_eq!(
        stdin_finding["source"]["helmSource"],
        "ci/templates/agent.yaml"
    );
    assert_eq!(stdin_finding["source"]["listItem"], 1);
    assert_eq!(stdin_finding["object"]["apiVersion"], "v1");
}

// ---------------------------------------------------------------------------------------------
// patches

#[test]
fn patches_are_one_json_line_per_repair_that_applies_to_the_original_object() {
    let Fixture { report, objects } = full_report();
    let text = report::patches(&report);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), report.repairs.len());
    assert!(text.ends_with('\n'));
    for line in lines {
        let entry: Value = serde_json::from_str(line).unwrap();
        let keys: Vec<&str> = entry
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["object", "source", "patch"]);
        let name = entry["object"]["name"].as_str().unwrap();
        let mut object = objects.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let patch: json_patch::Patch = serde_json::from_value(entry["patch"].clone()).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
        let original = &objects.iter().find(|(n, _)| n == name).unwrap().1;
        assert_ne!(&object, original, "the patch changes the object");
        let pod_meta = if entry["object"]["kind"] == "Deployment" {
            "/spec/template/metadata"
        } else {
            "/metadata"
        };
        let mutated = format!("{pod_meta}/annotations/podmend.io~1mutated");
        assert!(object.pointer(&mutated).is_some(), "{object}");
        match entry["object"]["kind"].as_str().unwrap() {
            "Pod" if name == "pinned" => assert!(object.pointer("/spec/nodeName").is_none()),
            "Deployment" => assert!(object.pointer("/spec/template/spec/nodeName").is_none()),
            _ => assert_eq!(
                object.pointer("/spec/containers/0/resources/requests/cpu"),
                Some(&json!("0")),
                "{object}"
            ),
        }
    }
}

#[test]
fn a_report_without_repairs_has_no_patch_lines() {
    assert_eq!(report::patches(&Report::default()), "");
}

// ---------------------------------------------------------------------------------------------
// SARIF

const VALIDATE: &str = r#"
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
log = json.load(open(sys.argv[2]))
cls = jsonschema.validators.validator_for(schema)
cls.check_schema(schema)
validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
for error in errors:
    print(error.json_path, error.message)
sys.exit(1 if errors else 0)
"#;

/// Validates a SARIF log against the official schema; Err with the validator's output.
fn validate_sarif(text: &str) -> Result<(), String> {
    let schema = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sarif/sarif-schema-2.1.0.json");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.sarif");
    std::fs::write(&log, text).unwrap();
    let output = Command::new(common::python::venv_python(&["jsonschema"]))
        .args(["-c", VALIDATE])
        .arg(&schema)
        .arg(&log)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("ModuleNotFoundError"),
        "jsonschema is missing from the venv: {stderr}"
    );
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{stderr}",
            String::from_utf8_lossy(&output.stdout)
        ))
    }
}

#[test]
fn the_sarif_log_validates_against_the_official_schema() {
    let Fixture { report, .. } = full_report();
    let text = report::sarif(&report, "1.2.3");
    if let Err(errors) = validate_sarif(&text) {
        panic!("SARIF does not validate:\n{errors}\n{text}");
    }
}

#[test]
fn the_schema_check_rejects_an_invalid_log() {
    let Fixture { report, .. } = full_report();
    let mut log: Value = serde_json::from_str(&report::sarif(&report, "1.2.3")).unwrap();
    log["runs"][0]["results"][0]["level"] = json!("fatal");
    let errors = validate_sarif(&log.to_string()).expect_err("an unknown level is invalid");
    assert!(errors.contains("fatal"), "{errors}");
}

#[test]
fn the_sarif_log_has_a_result_per_finding_and_symptom_with_mapped_levels() {
    let Fixture { report, .. } = full_report();
    let log: Value = serde_json::from_str(&report::sarif(&report, "1.2.3")).unwrap();
    assert_eq!(
        log["$schema"],
        "https://json.schemastore.org/sarif-2.1.0.json"
    );
    assert_eq!(log["version"], "2.1.0");
    let runs = log["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    let driver = &run["tool"]["driver"];
    assert_eq!(driver["name"], "podmend");
    assert_eq!(driver["version"], "1.2.3");
    let rule_ids: Vec<&str> = driver["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        rule_ids,
        [
            "node-affinity",
            "agent-requests",
            "cluster-symptom/failed-pods"
        ]
    );
    assert_eq!(
        driver["rules"][0]["help"]["text"],
        report.findings[0].advice
    );

    let results = run["results"].as_array().unwrap();
    assert_eq!(results.len(), report.findings.len() + report.symptoms.len());
    let levels: Vec<&str> = results
        .iter()
        .map(|r| r["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["warning", "note", "warning", "error", "warning"]);
    for (result, finding) in results.iter().zip(&report.findings) {
        assert_eq!(result["ruleId"], finding.rule.as_str());
        assert_eq!(
            result["message"]["text"],
            format!("{} — {}", finding.message, finding.advice)
        );
        let physical = &result["locations"][0]["physicalLocation"];
        assert_eq!(physical["region"]["startLine"], finding.source.line);
        assert_eq!(result["properties"]["mode"], finding.mode.as_str());
        assert_eq!(result["properties"]["object"], finding.object.display());
        assert_eq!(
            result["properties"]["patch"],
            serde_json::to_value(&finding.patch).unwrap()
        );
        let index = result["ruleIndex"].as_u64().unwrap() as usize;
        assert_eq!(rule_ids[index], finding.rule);
    }
    assert_eq!(
        results[1]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "manifests/web.yaml"
    );
    assert_eq!(
        results[1]["locations"][0]["physicalLocation"]["region"]["startLine"],
        27
    );

    let symptom = &results[4];
    assert_eq!(symptom["ruleId"], "cluster-symptom/failed-pods");
    assert_eq!(
        symptom["locations"][0]["logicalLocations"][0],
        json!({"kind": "resource", "fullyQualifiedName": "ReplicaSet/shop/web-5d4f"})
    );
    assert_eq!(symptom["properties"]["count"], 1204);
}

#[test]
fn input_errors_are_notifications_and_make_the_run_unsuccessful() {
    let Fixture { report, .. } = full_report();
    let log: Value = serde_json::from_str(&report::sarif(&report, "1.2.3")).unwrap();
    let invocation = &log["runs"][0]["invocations"][0];
    assert_eq!(invocation["executionSuccessful"], false);
    let notifications = invocation["toolExecutionNotifications"].as_array().unwrap();
    assert_eq!(notifications.len(), 1);
    let notification = &notifications[0];
    assert_eq!(notification["level"], "error");
    assert!(
        notification["message"]["text"]
            .as_str()
            .unwrap()
            .contains("mapping values are not allowed"),
        "{notification}"
    );
    let physical = &notification["locations"][0]["physicalLocation"];
    assert_eq!(physical["artifactLocation"]["uri"], "manifests/broken.yaml");
    assert_eq!(physical["region"]["startLine"], 7);

    let clean: Value = serde_json::from_str(&report::sarif(&Report::default(), "1.2.3")).unwrap();
    let invocation = &clean["runs"][0]["invocations"][0];
    assert_eq!(invocation["executionSuccessful"], true);
    assert!(invocation.get("toolExecutionNotifications").is_none());
    assert_eq!(clean["runs"][0]["results"], json!([]));
    validate_sarif(&report::sarif(&Report::default(), "0.1.0")).unwrap();
}

#[test]
fn a_stdin_source_is_reported_as_uri_stdin() {
    let mut report = Report::default();
    report.add_object(
        &Engine::new(&Config::default()),
        &cluster(),
        &pinned_pod(),
        source("-", 1, 4),
    );
    let text = report::sarif(&report, "0.1.0");
    let log: Value = serde_json::from_str(&text).unwrap();
    let physical = &log["runs"][0]["results"][0]["locations"][0]["physicalLocation"];
    assert_eq!(physical["artifactLocation"]["uri"], "stdin");
    assert_eq!(physical["region"]["startLine"], 4);
    validate_sarif(&text).unwrap();
}

#[test]
fn cluster_findings_get_a_logical_location_and_no_physical_one() {
    let mut report = Report::default();
    report.add_object(
        &Engine::new(&Config::default()),
        &cluster(),
        &pinned_pod(),
        source("cluster", 0, 0),
    );
    let text = report::sarif(&report, "0.1.0");
    let log: Value = serde_json::from_str(&text).unwrap();
    let location = &log["runs"][0]["results"][0]["locations"][0];
    assert!(location.get("physicalLocation").is_none(), "{location}");
    assert_eq!(
        location["logicalLocations"][0],
        json!({"kind": "resource", "fullyQualifiedName": "Pod/ci/pinned"})
    );
    validate_sarif(&text).unwrap();
}

#[test]
fn file_paths_become_relative_forward_slash_uris() {
    let mut report = Report::default();
    let engine = Engine::new(&Config::default());
    for file in ["./deploy/pod.yaml", "deploy\\win pod.yaml"] {
        report.add_object(&engine, &cluster(), &pinned_pod(), source(file, 1, 1));
    }
    let text = report::sarif(&report, "0.1.0");
    let log: Value = serde_json::from_str(&text).unwrap();
    let uris: Vec<&str> = log["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(uris, ["deploy/pod.yaml", "deploy/win%20pod.yaml"]);
    validate_sarif(&text).unwrap();
}

/// A report with a finding of every rule in the catalog: a pinned pod (node-affinity), a
/// Docker-in-Docker pod (dind-rm), a Jenkins agent (agent-requests) and a status write of the
/// JENKINS-68649 pod on a virtual node (virtual-node-phase).
fn report_with_every_rule() -> Report {
    let mut config = Config::default();
    config.rules.virtual_node_phase.mode = Mode::Enforce;
    let engine = Engine::new(&config);
    let cluster =
        cluster().with_labeled_node("virtual-node-aci-linux", &[("type", "virtual-kubelet")]);
    let mut report = Report::default();
    let dind = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dind", "namespace": "ci"},
        "spec": {"containers": [
            {"name": "docker", "image": "docker:24-dind", "securityContext": {"privileged": true}},
            {"name": "build", "image": "docker:24-cli",
             "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}]}]}});
    for (line, object) in [pinned_pod(), dind, jenkins_agent("agent")]
        .iter()
        .enumerate()
    {
        report.add_object(
            &engine,
            &cluster,
            object,
            source("pods.yaml", line + 1, line + 1),
        );
    }
    let pending = common::server::fixture(
        "virtual-kubelet-aci-pod-pending-with-running-containers-JENKINS-68649-reconstructed.yaml",
    );
    let status_write = Subject {
        operation: Operation::Update,
        group: "",
        kind: "Pod",
        sub_resource: "status",
        namespace: pending["metadata"]["namespace"].as_str().unwrap_or(""),
        object: Some(&pending),
        old_object: Some(&pending),
    };
    report.add_review(
        &engine,
        &cluster,
        &status_write,
        source("status.yaml", 1, 1),
    );
    report
}

#[test]
fn sarif_names_every_rule_with_its_own_description_and_validates() {
    let report = report_with_every_rule();
    let rules: Vec<&str> = report.findings.iter().map(|f| f.rule.as_str()).collect();
    let catalog = podmend::rules::catalog();
    assert_eq!(
        rules,
        catalog.iter().map(|info| info.id).collect::<Vec<_>>(),
        "a finding of every rule"
    );
    let text = report::sarif(&report, "1.2.3");
    if let Err(errors) = validate_sarif(&text) {
        panic!("SARIF does not validate:\n{errors}\n{text}");
    }
    let log: Value = serde_json::from_str(&text).unwrap();
    let descriptors = log["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap();
    assert_eq!(descriptors.len(), catalog.len());
    for (descriptor, info) in descriptors.iter().zip(&catalog) {
        assert_eq!(descriptor["id"], info.id);
        assert_eq!(descriptor["shortDescription"]["text"], info.summary);
        assert_eq!(descriptor["help"]["text"], info.help);
        assert!(
            !info.summary.contains("podmend rule"),
            "{}: a placeholder, not a description",
            info.id
        );
    }
}

#[test]
fn the_table_explains_each_rule_it_shows_once() {
    let report = report_with_every_rule();
    let text = report::table(&report, false);
    let legend: Vec<&str> = text
        .lines()
        .skip_while(|line| *line != "rules:")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .collect();
    let catalog = podmend::rules::catalog();
    assert_eq!(legend.len(), catalog.len(), "{text}");
    for (line, info) in legend.iter().zip(&catalog) {
        assert!(
            line.trim_start().starts_with(info.id) && line.ends_with(info.summary),
            "{line}"
        );
    }
}
