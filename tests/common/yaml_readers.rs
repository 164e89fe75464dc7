//! YAML as Kubernetes tools read it (YAML 1.1: PyYAML, pure and over libyaml) and as YAML 1.2
//! reads it (ruamel.yaml), compared exactly with the value it was meant to hold
//! (`yaml_readers.py` beside this file).

use serde::Serialize;
use serde_json::Value;

use super::python::{INSTALL_HINT, run_script};

/// How many readers read each case.
pub const READERS: usize = 3;

/// One YAML document and the JSON value it must read back as.
#[derive(Debug, Clone, Serialize)]
pub struct ReaderCase {
    pub name: String,
    pub yaml: String,
    pub expected: Value,
}

/// Reads every case with every reader; returns one line per case and reader that did not
/// read back exactly `expected` (an error, another type, another value, another key order).
pub fn reader_disagreements(cases: &[ReaderCase]) -> Vec<String> {
    let output = run_script(&["yaml", "ruamel.yaml"], "yaml_readers.py", &cases, &[]);
    let script = "tests/common/yaml_readers.py";
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} failed ({}): {stdout}\n{}\n{INSTALL_HINT}",
        script,
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{} printed no JSON report ({e}): {stdout}", script));
    assert_eq!(
        report["checked"].as_u64(),
        Some((cases.len() * READERS) as u64),
        "not every case was read by every reader: {stdout}"
    );
    report["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .map(|f| {
            format!(
                "{} [{}]: {}",
                f["name"].as_str().unwrap_or(""),
                f["reader"].as_str().unwrap_or(""),
                f["problem"].as_str().unwrap_or("")
            )
        })
        .collect()
}
