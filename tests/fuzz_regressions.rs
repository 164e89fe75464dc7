//! Inputs on which a fuzz target (`fuzz/`, run by `scripts/fuzz`) found podmend wrong, each
//! fed through the target's path again and checked for the clean result. The inputs live in
//! `tests/fixtures/fuzz/`; `fuzz/README.md` says which target and invariant found each.

mod common;

use std::path::PathBuf;

use common::k8s_rules;
use podmend::admission::{self, AdmissionDecision, Webhook};
use podmend::audit::manifests::{self, ManifestFile};
use podmend::audit::{InputError, Report};
use podmend::cluster::StaticCluster;
use podmend::config::Config;
use podmend::engine::{Engine, Skip};
use serde_json::{Value, json};

fn fixture_bytes(name: &str) -> Vec<u8> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "fuzz",
        name,
    ]
    .iter()
    .collect();
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The fuzz targets read their input as lossy UTF-8, as here.
fn fixture(name: &str) -> String {
    String::from_utf8_lossy(&fixture_bytes(name)).into_owned()
}

/// `podmend audit --cluster-snapshot SNAPSHOT FILE` with a snapshot holding node `n1`, which
/// the inputs pin pods to (untainted): the reader, then every object through the engine.
/// Without the node podmend would leave such pods as they are, and repair nothing to render.
fn audit(text: &str) -> (ManifestFile, Report) {
    let engine = Engine::new(&Config::default());
    let cluster = StaticCluster::empty().with_node("n1", vec![]);
    let mut errors: Vec<InputError> = Vec::new();
    let file = manifests::parse("input.yaml", text.to_string(), &mut errors);
    let mut report = Report::default();
    for error in errors {
        report.add_error(error);
    }
    report.add_file(&engine, &cluster, &file);
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

/// `audit_reader` (the repairs apply to the documents they were computed from): on a DinD pod
/// whose docker.sock mounts lack `name` or `mountPath`, the repair was diffed from the typed
/// spec, where the missing fields read as `""`, so it replaced paths the document does not
/// have. Such an object is now left alone (the API server's validation names what is missing).
#[test]
fn a_dind_manifest_with_mounts_missing_fields_gets_no_repair_that_cannot_apply() {
    let text = fixture("audit-dind-mounts-without-name-or-path.yaml");
    let (file, report) = audit(&text);
    for repair in &report.repairs {
        let document = &file.documents[repair.source.document - 1];
        let mut value = document
            .value
            .clone()
            .expect("a repaired document has a value");
        json_patch::patch(&mut value, &repair.patch).unwrap_or_else(|e| {
            panic!(
                "repair of document {} does not apply: {e}",
                repair.source.document
            )
        });
    }
    let rendered = manifests::render_repaired(std::slice::from_ref(&file), &report.repairs);
    let (again, _) = audit(&rendered);
    assert_eq!(again.documents.len(), file.documents.len(), "{rendered}");
}

/// `review`, the same object as a webhook request: `/mutate` answered with a patch the API
/// server could not apply, so the create failed with "Internal error occurred" instead of
/// the validation error saying which field is missing.
#[test]
fn a_dind_pod_with_a_mount_missing_its_path_gets_no_patch_the_api_server_cannot_apply() {
    let body = fixture_bytes("review-dind-mount-without-path.json");
    let request = admission::decode(&body).expect("the review decodes");
    let engine = Engine::new(&Config::default());
    let outcome = engine.review_raw(&request.subject(), &StaticCluster::offline());
    assert!(
        matches!(outcome.skipped, Some(Skip::UndecodablePodSpec(_))),
        "{outcome:?}"
    );
    let decision = AdmissionDecision::from_outcome(&outcome, Webhook::Mutate);
    let response: Value =
        serde_json::from_slice(&admission::encode_response(&request.inner.uid, &decision))
            .expect("the response is JSON");
    let patch = k8s_rules::verify_admission_response(&request.inner.uid, &response, true)
        .expect("the API server accepts the response");
    let review: Value = serde_json::from_slice(&body).expect("JSON");
    let object = &review["request"]["object"];
    k8s_rules::apply_patch_as_api_server(object, &patch.unwrap_or_default())
        .expect("the API server applies the answer");
    // And the API server's own validation is what refuses the pod, naming the field.
    let mount = &object["spec"]["containers"][0]["volumeMounts"][0];
    assert!(mount.get("mountPath").is_none());
}
