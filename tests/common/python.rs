//! The Python test peers (`tests/requirements.txt`), which `scripts/test` installs into
//! `<repo>/.venv`. A test that needs one fails, never skips, when it is missing.

use std::path::PathBuf;
use std::process::Command;

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
