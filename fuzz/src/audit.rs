//! The `audit_reader` target: text → `audit::manifests::parse` (YAML streams, JSON, Lists) →
//! `Report::add_object` (the engine, as `podmend audit --cluster-snapshot` runs on files with
//! a snapshot holding every node they name) → every report format and `-o yaml`'s repaired
//! manifests, read back.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{LimitRangeItem, Taint};
use podmend::audit::manifests::{self, ManifestFile};
use podmend::audit::{InputError, Report, report};
use podmend::cluster::ClusterView;
use podmend::config::Config;
use podmend::engine::Engine;
use serde_json::Value;

static ENGINE: LazyLock<Engine> = LazyLock::new(|| Engine::new(&Config::default()));

/// A cluster that has every node an input names, untainted, and no LimitRanges: the look-ups
/// of a snapshot of such a cluster, so node-affinity's rewrite is reached (without the node's
/// taints it leaves a pinned pod as it is).
struct EveryNodeKnown;

impl ClusterView for EveryNodeKnown {
    fn lookups_enabled(&self) -> bool {
        true
    }

    fn node_taints(&self, _name: &str) -> Option<Vec<Taint>> {
        Some(Vec::new())
    }

    fn node_labels(&self, _name: &str) -> Option<BTreeMap<String, String>> {
        Some(BTreeMap::new())
    }

    fn limit_range_items(&self, _namespace: &str) -> Vec<LimitRangeItem> {
        Vec::new()
    }
}

/// Reads `text` as `podmend audit` reads a file called `name`, and reviews every object.
fn audit(name: &str, text: String) -> (ManifestFile, Report) {
    let mut errors: Vec<InputError> = Vec::new();
    let file = manifests::parse(name, text, &mut errors);
    let mut report = Report::default();
    for error in errors {
        report.add_error(error);
    }
    report.add_file(&ENGINE, &EveryNodeKnown, &file);
    (file, report)
}

/// The value a document should have once its repairs are applied, as `-o yaml` writes it.
fn repaired_value(file: &ManifestFile, index: usize, report: &Report) -> Option<Value> {
    let document = file.documents.iter().find(|d| d.index == index)?;
    let mut value = document.value.clone()?;
    for repair in report
        .repairs
        .iter()
        .filter(|r| r.source.file == file.name && r.source.document == index)
    {
        let target = match repair.source.list_item {
            None => &mut value,
            Some(item) => value
                .get_mut("items")
                .and_then(|items| items.get_mut(item))
                .expect("a repair names a List item that exists"),
        };
        if let Err(error) = json_patch::patch(target, &repair.patch) {
            panic!(
                "the repair of document {index} does not apply to it: {error}\npatch: {}",
                serde_json::to_string(&repair.patch).unwrap_or_default()
            );
        }
    }
    Some(value)
}

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    check_as("input.yaml", &text);
    if !text.trim_start().starts_with('{') {
        check_as("input.json", &text);
    }
}

fn check_as(name: &str, text: &str) {
    let (file, report) = audit(name, text.to_string());
    // Every output format renders without panicking, and the machine-readable ones are JSON.
    let _ = report::table(&report, true);
    let _ = report::table(&report, false);
    for (format, output) in [
        ("json", report::json(&report)),
        ("sarif", report::sarif(&report, "0.0.0")),
    ] {
        if let Err(error) = serde_json::from_str::<Value>(&output) {
            panic!("-o {format} is not JSON: {error}\n{output}");
        }
    }
    for line in report::patches(&report).lines() {
        if let Err(error) = serde_json::from_str::<Value>(line) {
            panic!("-o patch wrote a line that is not JSON: {error}\n{line}");
        }
    }
    let files = [file];
    let file = &files[0];
    let rendered = manifests::render_repaired(&files, &report.repairs);
    if report.repairs.is_empty() {
        // Untouched documents are written byte for byte.
        assert_eq!(
            rendered, file.text,
            "-o yaml changed a file it had nothing to repair"
        );
        return;
    }
    // `-o yaml` is a Helm post-renderer: its output must read back as the same documents,
    // each with exactly the value the repairs give it, and need no further repair.
    let (again, second) = audit(name, rendered.clone());
    assert_eq!(
        again.documents.len(),
        file.documents.len(),
        "-o yaml changed the number of documents\n--- input:\n{}\n--- output:\n{rendered}",
        file.text
    );
    assert!(
        second.errors.len() <= report.errors.len(),
        "-o yaml wrote documents that no longer parse: {:?}\n--- output:\n{rendered}",
        second.errors
    );
    for document in &file.documents {
        let expected = repaired_value(file, document.index, &report);
        let got = again.documents[document.index - 1].value.clone();
        assert_eq!(
            got, expected,
            "-o yaml wrote document {} with another value\n--- input:\n{}\n--- output:\n{rendered}",
            document.index, file.text
        );
    }
    assert!(
        second.repairs.is_empty(),
        "the repaired manifests need repairs again: {:?}\n--- output:\n{rendered}",
        second.repairs
    );
}
