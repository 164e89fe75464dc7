//! YAML out means what YAML in meant: every object in `tests/fixtures` and a table of
//! ambiguous scalars, written by podmend (`podmend audit -o yaml`, through the real binary,
//! and the writer itself), read back by YAML 1.1 readers (PyYAML, pure and over libyaml:
//! what kubectl, Helm and the API server resolve like) and a YAML 1.2 reader (ruamel.yaml),
//! must be exactly the input with podmend's reported patch applied: same types, same values,
//! same key order. Documents podmend does not repair must come out byte for byte.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::server::{BIN, untainted_node};
use common::yaml_readers::{ReaderCase, reader_disagreements};
use podmend::audit::{manifests, yaml};
use serde_json::{Map, Value, json};

const NODE: &str = "roundtrip-worker";

/// Strings some YAML 1.1 or 1.2 reader takes for something else, or that plain style cannot
/// carry, and ordinary ones that must stay themselves.
#[rustfmt::skip]
const AMBIGUOUS: &[&str] = &[
    // booleans and null, YAML 1.1 (go-yaml resolves y/n too) and 1.2
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
    "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL", "~", "",
    // integers
    "0", "1", "-1", "+1", "007", "0777", "0o17", "0x1F", "0b1010", "1_000", "-_1", "+1_000",
    "1:20", "190:20:30", "9223372036854775808", "18446744073709551616",
    // floats
    "1.0", "1.", ".5", "-.5", "1e3", "1E3", "1.0e+3", "6.8523015e+5", "1_000.5", "190:20:30.15",
    ".inf", "-.Inf", "+.INF", ".nan", ".NaN", ".NAN", "-inf", "Infinity", "NaN",
    // timestamps
    "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",
    "2001-12-15T02:59:43.1Z",
    // merge and value keys
    "<<", "=",
    // indicators, comments, document markers
    "- a", "-", "? a", "?", ": a", ":", "a:", "a: b", "a #b", "#a", "[a]", "{a: 1}", "a,b",
    "&a", "*a", "!a", "!!str", "|", ">", "'a", "\"a", "%a", "@a", "`a", "---", "...", "--- a",
    // whitespace and control characters
    " a", "a ", "a\tb", "\t", "a\rb", "a\r\nb", "\u{85}", "a\u{2028}b", "\u{2029}", "\u{FEFF}a",
    "\u{0}", "\u{7}", "\u{1B}[0m", "\u{7F}", "\u{9F}", "\u{A0}", "\u{FFFE}",
    // quotes, escapes, characters outside ASCII
    "it's", "'", "''", "\"", "\\", "a\\nb", "é", "日本語", "😀",
    // multi-line text: shell scripts in args, chomping, indentation, trailing spaces
    "#!/bin/sh\nset -eu\nif [ \"$MODE\" = yes ]; then\n  echo \"on: $1\" # comment\nfi\n",
    "a\nb", "a\nb\n", "a\nb\n\n", "\na", "\n\na\n", " a\nb", "  indented\n    more\n",
    "\tcat <<EOF\n\tx\n\tEOF\n", "a\n b", "a \nb", "a\n\nb", "\n", "\n\n", "a\n  \nb",
    "a\n---\nb", "a\n...\n", "line\r\nwindows\r\n", "key: value\n- item\n",
    // ordinary strings, written plain
    "nginx:1.27", "100m", "256Mi", "10.244.0.0/16", "--bind-address=127.0.0.1", "-c",
    "http://example.com:8080/a%20b", "kubernetes.io/os", "IfNotPresent", "yesterday",
];

/// Where each kind keeps its pod spec (the kinds podmend's target table handles, and a few
/// it may handle one day: giving them a `nodeName` too does no harm).
fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some("/spec"),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => Some("/spec/template/spec"),
        "CronJob" => Some("/spec/jobTemplate/spec/template/spec"),
        "PodTemplate" => Some("/template/spec"),
        _ => None,
    }
}

/// The object's pod spec, if it has one.
fn pod_spec(object: &Value) -> Option<&Value> {
    pod_spec_pointer(object["kind"].as_str()?).and_then(|pointer| object.pointer(pointer))
}

/// Fixture objects the API server would refuse, which podmend does not look at (so never
/// rewrites): they stay out of the `-o yaml` run, and the writer's own test reads them back.
const INVALID: &[&str] = &[
    // A volumeMount without mountPath (a fuzz finding).
    "fuzz/review-dind-mount-without-path.json#1/request/object",
];

/// Objects podmend never touches (README, "Never touched" and "Per object"): mirror pods,
/// `podmend.io/skip`, ReplicaSets a Deployment controls.
fn left_alone(object: &Value) -> bool {
    let annotations = &object["metadata"]["annotations"];
    let controlled_by_deployment = object["kind"] == "ReplicaSet"
        && object["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|owners| {
                owners
                    .iter()
                    .any(|o| o["controller"] == true && o["kind"] == "Deployment")
            });
    annotations.get("kubernetes.io/config.mirror").is_some()
        || annotations.get("podmend.io/skip").is_some()
        || controlled_by_deployment
}

/// The object with a `spec.nodeName` in its pod spec, which podmend's node-affinity rule
/// repairs, so that `-o yaml` writes it anew.
fn repairable(mut object: Value) -> Value {
    let kind = object["kind"].as_str().unwrap_or("").to_string();
    if let Some(spec) = pod_spec_pointer(&kind)
        .and_then(|pointer| object.pointer_mut(pointer))
        .and_then(Value::as_object_mut)
        && !spec.contains_key("nodeName")
    {
        spec.insert("nodeName".into(), json!(NODE));
    }
    object
}

/// Every object in `tests/fixtures`, as podmend reads it, with a name saying where it is:
/// each YAML document and JSON file, each item of a List, and the `object` and `oldObject`
/// of AdmissionReview and AdmissionRequest captures.
fn fixture_objects() -> Vec<(String, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    let mut objects = Vec::new();
    for path in files {
        let name = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        // Files that are not UTF-8 (a fuzz case) and unreadable documents (the broken-document
        // case) are input errors, not objects.
        let Ok(text) = String::from_utf8(std::fs::read(&path).expect("read fixture")) else {
            continue;
        };
        let mut errors = Vec::new();
        let file = manifests::parse(&name, text, &mut errors);
        for document in &file.documents {
            let Some(value) = &document.value else {
                continue;
            };
            let at = format!("{name}#{}", document.index);
            objects.push((at.clone(), value.clone()));
            for (item, object) in document.objects() {
                if let Some(item) = item {
                    objects.push((format!("{at}/items/{item}"), object.clone()));
                }
            }
            let is_review = value["kind"] == "AdmissionReview" || value.get("operation").is_some();
            for pointer in [
                "/request/object",
                "/request/oldObject",
                "/object",
                "/oldObject",
            ] {
                if let Some(inner) = value
                    .pointer(pointer)
                    .filter(|v| is_review && v.is_object())
                {
                    objects.push((format!("{at}{pointer}"), inner.clone()));
                }
            }
        }
    }
    assert!(objects.len() > 60, "found only {} objects", objects.len());
    objects
}

fn collect(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("fixture directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect(&path, found);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            found.push(path);
        }
    }
}

/// Every ambiguous string as a label and annotation key and value, a nodeSelector key and
/// value, a container's command, args and env values, and every kind of JSON scalar (in a
/// field podmend does not know, which it keeps as it is) under ambiguous keys.
fn ambiguous_pod() -> Value {
    let strings: Map<String, Value> = AMBIGUOUS
        .iter()
        .map(|s| (s.to_string(), json!(s)))
        .collect();
    let env: Vec<Value> = AMBIGUOUS
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"name": format!("VALUE_{i}"), "value": s}))
        .collect();
    let scalars = json!([
        0, 1, -1, 1000, i64::MAX, i64::MIN, u64::MAX,
        0.0, -0.0, 0.1, 1.0, -2.5, 100.0, 1e15, 1e16, 1e100, 1.5e-7, 5e-324, f64::MAX,
        123456789.125, true, false, null, {}, [], [[]], [{}], {"a": {}}
    ]);
    let scalar_keys: Map<String, Value> = AMBIGUOUS
        .iter()
        .zip(scalars.as_array().expect("array").iter().cycle())
        .map(|(key, value)| (key.to_string(), value.clone()))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "ambiguous-scalars",
            "namespace": "default",
            "labels": strings,
            "annotations": strings,
        },
        "spec": {
            "nodeName": NODE,
            "nodeSelector": strings,
            "containers": [{
                "name": "app",
                "image": "busybox:1.36",
                "command": AMBIGUOUS,
                "args": AMBIGUOUS,
                "env": env,
            }],
        },
        "roundTrip": {
            "scalars": scalars,
            "underAmbiguousKeys": scalar_keys,
            "nested": [scalars, [[scalars]], [[AMBIGUOUS]], [{"strings": [AMBIGUOUS]}]],
        },
    })
}

/// The same strings in a Deployment's pod template.
fn ambiguous_deployment() -> Value {
    let pod = ambiguous_pod();
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "ambiguous-scalars", "namespace": "default", "annotations": pod["metadata"]["annotations"]},
        "spec": {
            "selector": {"matchLabels": {"app": "ambiguous"}},
            "template": {
                "metadata": {"labels": pod["metadata"]["labels"], "annotations": pod["metadata"]["annotations"]},
                "spec": pod["spec"],
            },
        },
    })
}

/// Every `nodeName` string anywhere in `value`.
fn node_names(value: &Value, names: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match inner.as_str() {
                    Some(name) if key == "nodeName" && !name.is_empty() => {
                        names.insert(name.to_string());
                    }
                    _ => node_names(inner, names),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| node_names(item, names)),
        _ => {}
    }
}

/// Writes `dir/cluster-snapshot.json`, a `--cluster-snapshot` (a List, as `kubectl get
/// nodes -o json` prints it) with an untainted Node for every `nodeName` in `objects`, and
/// returns its path: podmend rewrites a pinned pod only when it knows the node's taints, as
/// in a cluster where the node exists.
fn snapshot_of_nodes<'a>(objects: impl IntoIterator<Item = &'a Value>, dir: &Path) -> String {
    let mut names = BTreeSet::new();
    for object in objects {
        node_names(object, &mut names);
    }
    let items: Vec<Value> = names.iter().map(|name| untainted_node(name)).collect();
    let path = dir.join("cluster-snapshot.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}});
    std::fs::write(&path, serde_json::to_string_pretty(&list).expect("JSON"))
        .expect("write the snapshot");
    path.display().to_string()
}

struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

fn audit(args: &[&str]) -> Run {
    let output = Command::new(BIN)
        .arg("audit")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run podmend audit");
    Run {
        status: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `-o yaml`'s output split into its documents (at `---` lines).
fn documents(yaml: &str) -> Vec<String> {
    let mut documents = vec![String::new()];
    for line in yaml.split_inclusive('\n') {
        if line == "---\n" {
            documents.push(String::new());
        } else if let Some(last) = documents.last_mut() {
            last.push_str(line);
        }
    }
    documents
}

/// A repaired object's patch, and its index when it is an item of a List.
type Repair = (Option<usize>, Vec<json_patch::PatchOperation>);

/// Each repaired file's repairs, from `-o patch` (JSON Lines) with `snapshot`, by file name.
fn repairs(dir: &Path, snapshot: &str) -> HashMap<String, Vec<Repair>> {
    let run = audit(&[
        "--cluster-snapshot",
        snapshot,
        "-o",
        "patch",
        &dir.display().to_string(),
    ]);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let mut repairs: HashMap<String, Vec<Repair>> = HashMap::new();
    for line in run.stdout.lines() {
        let repair: Value = serde_json::from_str(line).expect("a JSON line per repair");
        let file = Path::new(repair["source"]["file"].as_str().expect("source file"))
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        let item = repair["source"]["listItem"].as_u64().map(|i| i as usize);
        let patch = serde_json::from_value(repair["patch"].clone()).expect("JSON Patch");
        repairs.entry(file).or_default().push((item, patch));
    }
    repairs
}

/// `object` with every repair applied, as `-o yaml` should have written it.
fn with_repairs(name: &str, object: &Value, repairs: &[Repair]) -> Value {
    let mut object = object.clone();
    for (item, patch) in repairs {
        let target = match item {
            None => &mut object,
            Some(index) => object
                .pointer_mut(&format!("/items/{index}"))
                .unwrap_or_else(|| panic!("{name} has no item {index}")),
        };
        json_patch::patch(target, patch).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    object
}

/// Runs `objects` (one JSON file each) through `podmend audit -o yaml`. Unrepaired files must
/// come out byte for byte; repaired ones become reader cases whose expected value is the
/// object with the patch `-o patch` reported applied. Returns the cases and the names of the
/// repaired objects.
fn through_audit_o_yaml(objects: &[(String, Value)]) -> (Vec<ReaderCase>, Vec<String>) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut files = Vec::new();
    for (index, (name, object)) in objects.iter().enumerate() {
        let file = format!("{index:04}.json");
        let text = serde_json::to_string_pretty(object).expect("JSON") + "\n";
        std::fs::write(dir.path().join(&file), &text).expect("write object");
        files.push((file, name, object, text));
    }
    let cluster = tempfile::tempdir().expect("temporary directory");
    let snapshot = snapshot_of_nodes(objects.iter().map(|(_, object)| object), cluster.path());
    let repairs = repairs(dir.path(), &snapshot);
    let run = audit(&[
        "--cluster-snapshot",
        &snapshot,
        "-o",
        "yaml",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let written = documents(&run.stdout);
    assert_eq!(written.len(), files.len(), "one document per file");

    let mut cases = Vec::new();
    let mut repaired = Vec::new();
    for ((file, name, object, text), document) in files.into_iter().zip(written) {
        let Some(repairs) = repairs.get(&file) else {
            assert!(
                pod_spec(object).is_none() || left_alone(object),
                "{name} has a pod spec with a nodeName but was not repaired (if the API server \
                 would refuse it, list it in INVALID)"
            );
            assert_eq!(
                document, text,
                "{name} was not repaired, so it must be as it was"
            );
            continue;
        };
        let expected = with_repairs(name, object, repairs);
        // podmend's own reader (libyaml, YAML 1.2 resolution) reads it back the same too.
        let reread: Value = serde_yaml_ng::from_str(&document).unwrap_or_else(|e| {
            panic!("podmend cannot read what it wrote for {name}: {e}\n{document}")
        });
        assert!(
            reread == expected,
            "{name}: podmend reads back\n{reread:#}\nexpected\n{expected:#}"
        );
        repaired.push(name.clone());
        cases.push(ReaderCase {
            name: format!("{name} (podmend audit -o yaml)"),
            yaml: document,
            expected,
        });
    }
    (cases, repaired)
}

fn assert_readers_agree(cases: &[ReaderCase]) {
    let disagreements = reader_disagreements(cases);
    assert!(
        disagreements.is_empty(),
        "{} of {} reads differ:\n{}",
        disagreements.len(),
        cases.len() * common::yaml_readers::READERS,
        disagreements.join("\n")
    );
}

#[test]
fn the_writer_s_yaml_for_every_fixture_object_and_ambiguous_scalar_reads_back_the_same_under_yaml_1_1_and_1_2()
 {
    let mut objects = fixture_objects();
    objects.push(("ambiguous Pod".into(), ambiguous_pod()));
    objects.push(("ambiguous Deployment".into(), ambiguous_deployment()));
    for (i, text) in AMBIGUOUS.iter().enumerate() {
        // Each one alone too, as the whole document, a key and a value: one failure, one line.
        objects.push((
            format!("ambiguous string {i} {text:?}"),
            json!({ *text: text, "list": [text] }),
        ));
    }
    // Keys too long for an implicit key (`? key` form), over nested values.
    let long = format!("{}: yes", "k".repeat(1100));
    objects.push((
        "long keys".into(),
        json!({ long.clone(): {"a": AMBIGUOUS}, "list": [{ long.clone(): AMBIGUOUS }, [{ long: [[1.5]] }]] }),
    ));
    let cases: Vec<ReaderCase> = objects
        .into_iter()
        .map(|(name, object)| ReaderCase {
            name,
            yaml: yaml::to_string(&object),
            expected: object,
        })
        .collect();
    assert_readers_agree(&cases);
}

#[test]
fn audit_o_yaml_round_trips_every_fixture_object_and_the_ambiguous_scalars_under_yaml_1_1_and_1_2()
{
    let mut objects: Vec<(String, Value)> = fixture_objects()
        .into_iter()
        .filter(|(name, _)| !INVALID.contains(&name.as_str()))
        .map(|(name, object)| (name, repairable(object)))
        .collect();
    objects.push(("ambiguous Pod".into(), ambiguous_pod()));
    objects.push(("ambiguous Deployment".into(), ambiguous_deployment()));
    let (cases, repaired) = through_audit_o_yaml(&objects);
    for needed in ["ambiguous Pod", "ambiguous Deployment"] {
        assert!(
            repaired.iter().any(|name| name == needed),
            "{needed} was not repaired"
        );
    }
    println!(
        "{} of {} objects repaired and read back: {repaired:#?}",
        repaired.len(),
        objects.len()
    );
    assert_readers_agree(&cases);
}

#[test]
fn the_argo_workflows_mysql_deployment_keeps_its_yes_a_string() {
    // argo-workflows' quick-start MySQL: `MYSQL_RANDOM_ROOT_PASSWORD: "yes"`. Written back as
    // `value: yes`, Kubernetes reads `true` and refuses the Deployment (env values are strings).
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/argo-workflows-mysql-deployment.yaml");
    let original = std::fs::read_to_string(&fixture).expect("fixture");
    assert!(original.contains("value: \"yes\"\n"));
    // Pinned to a node the way a user might, so podmend repairs and rewrites it.
    let input = format!("{original}      nodeName: {NODE}\n");
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("mysql-deployment.yaml");
    std::fs::write(&path, &input).expect("write input");
    let path = path.display().to_string();
    let cluster = tempfile::tempdir().expect("temporary directory");
    let snapshot = snapshot_of_nodes(&[json!({"nodeName": NODE})], cluster.path());

    let run = audit(&["--cluster-snapshot", &snapshot, "-o", "yaml", &path]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("  value: 'yes'\n"),
        "the yes is not quoted:\n{}",
        run.stdout
    );

    let repairs = repairs(dir.path(), &snapshot);
    let repairs = repairs
        .get("mysql-deployment.yaml")
        .expect("the Deployment is repaired");
    let input: Value = serde_yaml_ng::from_str(&input).expect("input");
    let expected = with_repairs("mysql-deployment.yaml", &input, repairs);
    assert_eq!(
        expected.pointer("/spec/template/spec/containers/0/env/3/value"),
        Some(&json!("yes"))
    );
    assert_readers_agree(&[ReaderCase {
        name: "argo-workflows mysql-deployment.yaml".into(),
        yaml: run.stdout,
        expected,
    }]);
}

#[test]
fn random_strings_of_yaml_s_special_characters_read_back_the_same_under_yaml_1_1_and_1_2() {
    // Characters that start, end or change something in YAML, digits and the letters of
    // numbers and booleans; a fixed seed, so a failure is found again.
    #[rustfmt::skip]
    const ALPHABET: &[char] = &[
        'a', 'e', 'n', 'o', 'y', 'x', 'f', 'E', 'N', 'O', 'Y', '0', '1', '7', '9', ' ', ' ', '\n',
        '\n', '\t', '\r', ':', '-', '#', '.', '+', '_', ',', '~', '<', '=', '?', '[', ']', '{',
        '}', '!', '&', '*', '|', '>', '%', '@', '`', '\'', '"', '\\', '/', 'é', '\u{85}',
        '\u{A0}', '\u{2028}', '\u{FEFF}', '\u{1}', '😀',
    ];
    let mut state: u64 = 0x5eed_1234_abcd_0001;
    let mut next = move |below: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % below
    };
    let mut cases = Vec::new();
    for i in 0..400 {
        let mut object = Map::new();
        let mut list = Vec::new();
        for _ in 0..8 {
            let length = next(10);
            let text: String = (0..length)
                .map(|_| ALPHABET[next(ALPHABET.len())])
                .collect();
            object.insert(text.clone(), json!(text));
            list.push(json!(text));
        }
        object.insert("list".into(), json!(list));
        let object = Value::Object(object);
        cases.push(ReaderCase {
            name: format!("random object {i}: {object}"),
            yaml: yaml::to_string(&object),
            expected: object,
        });
    }
    assert_readers_agree(&cases);
}
