//! The official OpenAPI schema check, through the PyPI package `kubernetes-validate`.
//!
//! `kubernetes-validate` carries the JSON schemas generated from Kubernetes' OpenAPI
//! definitions. It checks types, required fields and (in strict mode) unknown fields; the
//! rules the schema cannot express (matchFields, requests vs limits, ...) are in
//! `k8s_rules.rs`. `scripts/test` installs the pinned version into `.venv`.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The Kubernetes version the objects are validated against (`-k`).
pub const KUBERNETES_VERSION: &str = "1.37.0";

/// Where to find the `kubernetes-validate` executable: `$PODMEND_KUBERNETES_VALIDATE`, else
/// `<crate>/.venv/bin/kubernetes-validate`. Panics if neither exists: the schema check is
/// never skipped.
pub fn kubernetes_validate_path() -> PathBuf {
    if let Some(path) = std::env::var_os("PODMEND_KUBERNETES_VALIDATE") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return path;
        }
        panic!(
            "kubernetes-validate is not installed: PODMEND_KUBERNETES_VALIDATE={} does not exist; \
             run scripts/test (it installs it into .venv), or set PODMEND_KUBERNETES_VALIDATE",
            path.display()
        );
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubernetes-validate");
    if venv.is_file() {
        return venv;
    }
    panic!(
        "kubernetes-validate is not installed: run scripts/test (it installs it into .venv), or \
         set PODMEND_KUBERNETES_VALIDATE"
    );
}

/// Validates `objects` against the official Kubernetes 1.37 schemas with one run of the
/// `kubernetes-validate` CLI (it starts slowly, so batch objects into one call).
///
/// `strict` adds `--strict`: unknown fields are errors. Every object must be reported as
/// passed: an object of a kind the tool has no schema for is a failure, not a skip. Objects
/// without `metadata.name` (generateName) get a placeholder name, because the tool needs one
/// for its report. Returns the tool's output on failure.
pub fn validate_with_schema(objects: &[Value], strict: bool) -> Result<(), String> {
    if objects.is_empty() {
        return Ok(());
    }
    let exe = kubernetes_validate_path();
    let dir =
        tempfile::tempdir().map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let mut files = Vec::with_capacity(objects.len());
    for (i, object) in objects.iter().enumerate() {
        let mut object = object.clone();
        if let Some(map) = object.as_object_mut() {
            let metadata = map
                .entry("metadata")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(metadata) = metadata.as_object_mut()
                && !metadata.get("name").is_some_and(Value::is_string)
            {
                metadata.insert(
                    "name".to_string(),
                    Value::String(format!("schema-check-placeholder-{i}")),
                );
            }
        }
        let path = dir.path().join(format!("object-{i:04}.json"));
        let text = serde_json::to_string_pretty(&object).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        files.push(path);
    }

    let mut command = Command::new(&exe);
    command.arg("--kubernetes-version").arg(KUBERNETES_VERSION);
    if strict {
        command.arg("--strict");
    }
    command.args(&files);
    let output = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    let not_passed: Vec<String> = files
        .iter()
        .enumerate()
        .filter(|(_, file)| {
            let prefix = format!("INFO {} passed for resource", file.display());
            !stdout.lines().any(|line| line.starts_with(&prefix))
        })
        .map(|(i, _)| {
            let object = &objects[i];
            format!(
                "object {i} ({}/{})",
                object.get("kind").and_then(Value::as_str).unwrap_or("?"),
                object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
            )
        })
        .collect();
    if output.status.success() && not_passed.is_empty() {
        return Ok(());
    }
    let shown_dir = dir.path().display().to_string();
    Err(format!(
        "kubernetes-validate ({}, Kubernetes {KUBERNETES_VERSION}{}) rejected {}; {}\n{}{}",
        exe.display(),
        if strict { ", strict" } else { "" },
        if not_passed.is_empty() {
            "the batch".to_string()
        } else {
            not_passed.join(", ")
        },
        output.status,
        stdout.replace(&format!("{shown_dir}/"), ""),
        stderr.replace(&format!("{shown_dir}/"), ""),
    ))
}
