//! Report objects checked against the upstream CRDs' `openAPIV3Schema`
//! (`tests/fixtures/crds/`, provenance in `tests/fixtures/SOURCES.md`) with the `jsonschema`
//! package (`crd_schema.py` beside this file, run by the virtual environment's Python).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::python::run_script;

/// One CRD version and the objects that must pass it.
pub struct Check<'a> {
    /// File name under `tests/fixtures/crds/`.
    pub crd: &'a str,
    pub version: &'a str,
    /// Unknown fields (which the API server would prune) are errors too.
    pub strict: bool,
    pub objects: &'a [Value],
}

pub fn crd_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/crds")
        .join(name)
}

/// Every problem, one line each (`check object /path: message`); empty when all pass.
pub fn problems(checks: &[Check<'_>]) -> Vec<String> {
    let checks: Vec<Value> = checks
        .iter()
        .map(|c| {
            json!({"crd": crd_path(c.crd), "version": c.version, "strict": c.strict, "objects": c.objects})
        })
        .collect();
    let output = run_script(
        &["jsonschema", "yaml"],
        "crd_schema.py",
        &json!({ "checks": checks }),
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code().is_some_and(|c| c <= 1) && stderr.trim().is_empty(),
        "crd_schema.py failed ({}): {stderr}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
