//! `helm upgrade` of an installed release to a chart that has a value the installed one did
//! not, with the real `helm`: the flag the README recommends keeps what the user set and gives
//! the new value its default; `--reuse-values` loses the default.
//!
//! Helm v4 `pkg/action/upgrade.go`, `Upgrade.reuseValues`: with `ReuseValues` the chart's
//! values are replaced by the old release's coalesced values (`chart.Values = oldVals`), so a
//! key only the new chart has is absent; with `ResetThenReuseValues` the new chart's values
//! stay and the old release's user-supplied values are coalesced over them.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::Suite;
use crate::install::{assert_success, ensure_installed, values_for};

const RELEASE: &str = "upgraded";
const NAMESPACE: &str = "podmend-upgrade";

/// The value the current chart has and the "previous" chart lacks, and its default.
const NEW_VALUE: &str = "  port: 8443\n";

/// A copy of `from` (a chart directory) at `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the chart copy");
    for entry in std::fs::read_dir(from).expect("read the chart") {
        let entry = entry.expect("a chart file");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a chart file");
        }
    }
}

/// The current chart without `webhook.port`: the chart as it was before that value existed.
fn previous_chart(dir: &Path, current: &Path) -> PathBuf {
    let previous = dir.join("previous-chart");
    copy_dir(current, &previous);
    let values_path = previous.join("values.yaml");
    let values = std::fs::read_to_string(&values_path).expect("values.yaml");
    assert_eq!(
        values.matches(NEW_VALUE).count(),
        1,
        "webhook.port is in values.yaml once"
    );
    std::fs::write(&values_path, values.replacen(NEW_VALUE, "", 1)).expect("write values.yaml");
    previous
}

/// `helm get values --all`: the values the release's templates were rendered with.
fn computed_values(suite: &Suite) -> Value {
    let output = suite
        .plane
        .helm()
        .args(["get", "values", RELEASE, "--namespace", NAMESPACE, "--all"])
        .args(["--output", "json"])
        .output()
        .expect("run helm get values");
    assert_success("helm get values", &output);
    serde_json::from_slice(&output.stdout).expect("helm prints JSON")
}

fn helm(suite: &Suite, what: &str, args: &[&str], chart: &Path, values: Option<&Path>) {
    let mut command = suite.plane.helm();
    command
        .args(args)
        .args([RELEASE])
        .arg(chart)
        .args(["--namespace", NAMESPACE]);
    if let Some(values) = values {
        command.arg("--values").arg(values);
    }
    let output = command.output().expect("run helm");
    assert_success(what, &output);
}

pub fn an_upgrade_with_reset_then_reuse_values_keeps_the_settings_and_gives_a_new_value_its_default(
    suite: &Suite,
) {
    ensure_installed(suite);
    let (values, url) = {
        let podmend = crate::lock(&suite.podmend);
        let server = &podmend.as_ref().expect("installed").server;
        let values = values_for(server);
        (values.clone(), values["webhook"]["url"].clone())
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let values_file = dir.path().join("values.json");
    std::fs::write(&values_file, values.to_string()).expect("write values");
    let current = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/podmend");
    let previous = previous_chart(dir.path(), &current);

    let install = ["install", "--create-namespace"];
    helm(
        suite,
        "helm install (previous chart)",
        &install,
        &previous,
        Some(&values_file),
    );
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(computed_values(suite)["webhook"].get("port").is_none());

        // --reuse-values: the templates still see no webhook.port.
        helm(
            suite,
            "helm upgrade --reuse-values",
            &["upgrade", "--reuse-values"],
            &current,
            None,
        );
        let reused = computed_values(suite);
        assert_eq!(reused["webhook"]["url"], url, "{reused}");
        assert!(
            reused["webhook"].get("port").is_none_or(Value::is_null),
            "--reuse-values gave the new value a default after all: {reused}"
        );

        // --reset-then-reuse-values: the user's settings and the new chart's default.
        let reset = ["upgrade", "--reset-then-reuse-values"];
        helm(
            suite,
            "helm upgrade --reset-then-reuse-values",
            &reset,
            &current,
            None,
        );
        let upgraded = computed_values(suite);
        assert_eq!(upgraded["webhook"]["url"], url, "{upgraded}");
        assert_eq!(upgraded["tls"]["mode"], "secret", "{upgraded}");
        assert_eq!(upgraded["webhook"]["port"], 8443, "{upgraded}");
    }));
    let uninstall = suite
        .plane
        .helm()
        .args(["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"])
        .output()
        .expect("run helm uninstall");
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert_success("helm uninstall", &uninstall);
}
