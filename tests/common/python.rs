//! The Python test peers (`tests/requirements.txt`), which `scripts/test` installs into
//! `<repo>/.venv`. A test that needs one fails, never skips, when it is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What to do when a peer is missing.
pub const INSTALL_HINT: &str =
    "run scripts/setup (scripts/test does: it installs tests/requirements.txt into .venv)";

/// The virtual environment's Python (`$PODMEND_TEST_PYTHON`, else `<repo>/.venv/bin/python`),
/// checked to import every module in `modules`. Panics with [`INSTALL_HINT`] otherwise.
pub fn venv_python(modules: &[&str]) -> PathBuf {
    let python = match std::env::var_os("PODMEND_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"),
    };
    assert!(
        python.is_file(),
        "{} does not exist: {INSTALL_HINT}",
        python.display()
    );
    let probe = Command::new(&python)
        .args(["-c", &format!("import {}", modules.join(", "))])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", python.display()));
    assert!(
        probe.status.success(),
        "{} cannot import {}: {INSTALL_HINT}\n{}",
        python.display(),
        modules.join(", "),
        String::from_utf8_lossy(&probe.stderr)
    );
    python
}

/// Runs the helper script `tests/common/<script>` with the venv's Python (which must import
/// `modules`): its first argument is a file holding `input` as JSON, then `args`. The
/// caller judges the output.
pub fn run_script(
    modules: &[&str],
    script: &str,
    input: &impl serde::Serialize,
    args: &[&str],
) -> Output {
    let python = venv_python(modules);
    let dir = tempfile::tempdir().expect("temporary directory");
    let input_file = dir.path().join("input.json");
    std::fs::write(
        &input_file,
        serde_json::to_vec(input).expect("input as JSON"),
    )
    .expect("write the script's input");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/common")
        .join(script);
    Command::new(&python)
        .arg(&script)
        .arg(&input_file)
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", python.display()))
}
