//! Inputs on which a fuzz target (`fuzz/`, run by `scripts/fuzz`) found podmend wrong, each
//! fed through the target's path again and checked for the clean result. The inputs live in
//! `tests/fixtures/fuzz/`; `fuzz/README.md` says which target and invariant found each.

use std::path::PathBuf;

use podmend::audit::manifests::{self, ManifestFile};
use podmend::audit::{InputError, Report};
use podmend::cluster::StaticCluster;
use podmend::config::Config;
use podmend::engine::Engine;
use serde_json::json;

fn fixture(name: &str) -> String {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "fuzz",
        name,
    ]
    .iter()
    .collect();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `podmend audit FILE` without a cluster: the reader, then every object through the engine.
fn audit(text: &str) -> (ManifestFile, Report) {
    let engine = Engine::new(&Config::default());
    let mut errors: Vec<InputError> = Vec::new();
    let file = manifests::parse("input.yaml", text.to_string(), &mut errors);
    let mut report = Report::default();
    for error in errors {
        report.add_error(error);
    }
    let offline = StaticCluster::offline();
    for document in &file.documents {
        for (item, object) in document.objects() {
            report.add_object(&engine, &offline, object, document.source(&file.name, item));
        }
    }
    (file, report)
}

/// `audit_reader`: a repaired document whose `...` line ended it lost that line in `-o yaml`,
/// so the next document, which started without `---`, ran on into it: two documents read
/// back as one (with a duplicate `kind`), and a Helm post-renderer would fail on it.
#[test]
fn a_repaired_document_ended_by_dots_keeps_the_next_document_apart() {
    let text = fixture("audit-document-ended-by-dots.yaml");
    let (file, report) = audit(&text);
    assert_eq!(file.documents.len(), 2);
    assert_eq!(report.repairs.len(), 1, "{report:?}");

    let rendered = manifests::render_repaired(std::slice::from_ref(&file), &report.repairs);
    let (again, second) = audit(&rendered);
    assert!(second.errors.is_empty(), "{:?}\n{rendered}", second.errors);
    assert_eq!(again.documents.len(), 2, "{rendered}");
    let pod = again.documents[0].value.as_ref().expect("the pod");
    assert!(pod["spec"].get("nodeName").is_none(), "{rendered}");
    assert_eq!(
        pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values"),
        Some(&json!(["n1"]))
    );
    assert_eq!(
        again.documents[1].value,
        Some(json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "b"}})),
        "{rendered}"
    );
    assert!(second.repairs.is_empty(), "{rendered}");
}
