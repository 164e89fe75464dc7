//! The Helm chart's tests (`tests/chart/test_chart.py`), run by `cargo test` so CI runs them.
//!
//! They render and lint `charts/podmend` with Helm's own engine (PyPI `helm-python-sdk`),
//! validate every object against the official schemas, check the config the chart writes
//! with this build's `podmend config --check`, check the webhook paths against
//! `src/server/paths.rs`, evaluate the webhooks' `matchConditions` with a CEL engine
//! (`cel-expr-python`), run the `helm test` script against this build's `podmend serve`,
//! and lint the release workflow and the `Dockerfile` (actionlint, ShellCheck, hadolint).
//! The tests below them read the config the chart renders with podmend's own parser
//! ([`Config::from_yaml`]): the chart's defaults are podmend's, and every rule value reaches
//! the config key of the same meaning. The last ones render `webhook.url` (a `podmend serve`
//! outside the cluster): every webhook calls the URL with the CA bundle, nothing runs the
//! webhook in the cluster, and URLs or TLS modes the API server could not use fail the render
//! saying what to set. `scripts/test` installs `tests/requirements.txt` into `.venv`; this
//! test never skips: without them it fails and says how to get them.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use podmend::config::Config;
use serde_json::{Value, json};

const RELEASE: &str = "podmend";
const NAMESPACE: &str = "podmend-system";

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

/// The config the chart renders for `values`, read by podmend's own parser, and the values
/// the release uses (the chart's defaults with `values` on top).
fn rendered_config(values: &Value) -> (Config, Value) {
    let render = common::chart::render(values, RELEASE, NAMESPACE);
    let text = render
        .of_kind("ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["config.yaml"].as_str())
        .expect("the config ConfigMap")
        .to_string();
    let config = Config::from_yaml(&text, "the chart's ConfigMap")
        .unwrap_or_else(|e| panic!("podmend refuses the chart's config: {e}\n{text}"));
    (config, render.values)
}

/// A rule's key in the chart's values, as podmend names the rule: `dindRm` is `dind-rm`.
fn podmend_name(chart_key: &str) -> String {
    let mut name = String::new();
    for c in chart_key.chars() {
        if c.is_ascii_uppercase() {
            name.push('-');
        }
        name.push(c.to_ascii_lowercase());
    }
    name
}

fn keys(object: &Value) -> BTreeSet<String> {
    object
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_chart_defaults_are_podmends_defaults() {
    // The guard image is the chart's own (ghcr.io/podmend/podmend:<appVersion>, the crate's
    // version: tests/chart/test_chart.py), and the chart excludes kube-system and its namespace.
    let (config, _) = rendered_config(&json!({}));
    let expected = Config {
        exclude_namespaces: vec!["kube-system".to_string(), NAMESPACE.to_string()],
        ..Config::default()
    };
    assert_eq!(config, expected);
}

/// Each rule value of the chart at something other than its default: (chart rule, key, value).
fn non_defaults() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("nodeAffinity", "mode", json!("warn")),
        ("nodeAffinity", "templates", json!("enforce")),
        ("nodeAffinity", "tolerateNodeTaints", json!(false)),
        (
            "nodeAffinity",
            "ignoreTaints",
            json!(["example.com/maintenance"]),
        ),
        (
            "nodeAffinity",
            "schedulers",
            json!(["default-scheduler", "volcano"]),
        ),
        ("nodeAffinity", "rewriteConstrainedPods", json!(true)),
        ("nodeAffinity", "skipPriorityClasses", json!(true)),
        ("agentRequests", "mode", json!("deny")),
        ("agentRequests", "templates", json!("deny")),
        (
            "agentRequests",
            "presets",
            json!(["pinniped-kube-cert-agent", "jenkins-agent"]),
        ),
        (
            "agentRequests",
            "selectors",
            json!([{"matchLabels": {"app": "ci-agent"}}]),
        ),
        ("agentRequests", "resources", json!(["ephemeral-storage"])),
        ("agentRequests", "onlyPinned", json!(false)),
        ("agentRequests", "limitFromRequest", json!(true)),
        ("agentRequests", "zeroExclusiveCpus", json!(true)),
        ("dindRm", "mode", json!("warn")),
        ("dindRm", "templates", json!("enforce")),
        ("dindRm", "policy", json!("rm")),
        ("dindRm", "minAge", json!("90s")),
        ("dindRm", "maxExited", json!(3)),
        ("dindRm", "nodeAgents", json!("guard")),
        ("dindRm", "sidecarMode", json!("container")),
        ("dindRm", "guardImage", json!("registry.example/podmend:1")),
        ("dindRm", "guardImageNeedsPullSecret", json!(true)),
        ("dindRm", "guardCpuLimit", json!("500m")),
        ("dindRm", "kubeletRootDir", json!("/var/lib/k0s/kubelet")),
        (
            "dindRm",
            "daemonImages",
            json!(["registry.example/ci/dind:*"]),
        ),
        ("virtualNodePhase", "mode", json!("warn")),
        (
            "virtualNodePhase",
            "nodeSelector",
            json!({"kubernetes.azure.com/managed": "false"}),
        ),
    ]
}

/// Every (rule, key) whose value differs between two configs, with the value in `changed`.
fn differences(base: &Config, changed: &Config) -> Vec<(String, String, Value)> {
    let base = serde_json::to_value(&base.rules).expect("the rules as JSON");
    let changed = serde_json::to_value(&changed.rules).expect("the rules as JSON");
    let mut found = Vec::new();
    for (rule, fields) in changed.as_object().into_iter().flatten() {
        for (key, value) in fields.as_object().into_iter().flatten() {
            if base[rule][key] != *value {
                found.push((rule.clone(), key.clone(), value.clone()));
            }
        }
    }
    found
}

#[test]
fn every_rule_value_reaches_the_config_key_of_the_same_meaning() {
    // The chart's rules are podmend's, each with podmend's keys; the table covers them all.
    let (_, effective) = rendered_config(&json!({}));
    let defaults = serde_json::to_value(Config::default().rules).expect("the defaults as JSON");
    let chart_rules = effective["rules"].as_object().expect("rules in the values");
    let chart_names: BTreeSet<String> = chart_rules.keys().map(|k| podmend_name(k)).collect();
    assert_eq!(
        chart_names,
        keys(&defaults),
        "the chart's rules are podmend's"
    );
    let table = non_defaults();
    for (chart_key, chart_rule) in chart_rules {
        let name = podmend_name(chart_key);
        assert_eq!(
            keys(chart_rule),
            keys(&defaults[&name]),
            "rules.{chart_key} in the chart and rules.{name} in podmend's config"
        );
        let covered: BTreeSet<String> = table
            .iter()
            .filter(|(rule, _, _)| rule == chart_key)
            .map(|(_, key, _)| key.to_string())
            .collect();
        assert_eq!(
            covered,
            keys(chart_rule),
            "non_defaults() covers rules.{chart_key}"
        );
    }

    // Changing one value changes that key of the config, to that value, and nothing else:
    // a value the chart dropped, wrote under another key or into another rule would show.
    // virtual-node-phase is written only while it is on, so its other keys are changed on
    // top of mode warn.
    let vnp_on = json!({"rules": {"virtualNodePhase": {"mode": "warn"}}});
    let (default_config, _) = rendered_config(&json!({}));
    let (vnp_config, _) = rendered_config(&vnp_on);
    let mut problems = Vec::new();
    for (chart_key, key, value) in table {
        let (mut values, base) = if chart_key == "virtualNodePhase" && key != "mode" {
            (vnp_on.clone(), &vnp_config)
        } else {
            (json!({"rules": {}}), &default_config)
        };
        values["rules"][chart_key][key] = value.clone();
        let (config, effective) = rendered_config(&values);
        // The value as the release has it: Helm merges a map into the default map.
        let value = &effective["rules"][chart_key][key];
        let expected = vec![(podmend_name(chart_key), key.to_string(), value.clone())];
        let found = differences(base, &config);
        if found != expected {
            problems.push(format!(
                "rules.{chart_key}.{key}: {value} changed {found:?} in podmend's config, not {expected:?}"
            ));
        }
    }
    // And webhook.skipNamespaces, the chart's other config key, reaches excludeNamespaces.
    let (config, _) = rendered_config(&json!({"webhook": {"skipNamespaces": ["ci-system"]}}));
    if config.exclude_namespaces != ["kube-system", NAMESPACE, "ci-system"] {
        problems.push(format!(
            "webhook.skipNamespaces [ci-system] gave excludeNamespaces {:?}",
            config.exclude_namespaces
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// webhook.url: a podmend serve outside the cluster (development and tests)

/// Base64 of the CA that signs a `podmend certs` certificate for localhost, as
/// `tls.secret.caBundle` takes it.
fn local_ca_bundle() -> String {
    use base64::Engine as _;
    let pki = podmend::certs::generate(&["localhost".to_string()], 1).expect("a dev PKI");
    base64::engine::general_purpose::STANDARD.encode(pki.ca_pem)
}

/// Values for a podmend at `url`, with the CA bundle `tls.mode secret` takes.
fn url_values(url: &str, ca_bundle: &str) -> Value {
    json!({
        "webhook": {"url": url},
        "tls": {"mode": "secret", "secret": {"caBundle": ca_bundle}},
    })
}

/// The message Helm refuses `values` with; panics if it renders them.
fn refusal(values: &Value) -> String {
    match common::chart::try_render(values, RELEASE, NAMESPACE) {
        Ok(_) => panic!("the chart renders {values}"),
        Err(message) => message,
    }
}

#[test]
fn with_webhook_url_every_webhook_calls_the_url_and_nothing_runs_in_the_cluster() {
    use podmend::server::paths::{MUTATE, VALIDATE};
    let ca_bundle = local_ca_bundle();
    // (webhook.url, what the paths are appended to): trailing slashes go, a path stays.
    for (url, base) in [
        ("https://localhost:8443", "https://localhost:8443"),
        (
            "https://127.0.0.1:8443/podmend//",
            "https://127.0.0.1:8443/podmend",
        ),
    ] {
        let mut values = url_values(url, &ca_bundle);
        // The status.podmend.io entry too, and the validating configuration (registered
        // while a rule denies).
        values["rules"] = json!({
            "virtualNodePhase": {"mode": "enforce"},
            "nodeAffinity": {"mode": "deny"}
        });
        let render = common::chart::render(&values, RELEASE, NAMESPACE);

        let mut names = Vec::new();
        for (kind, path) in [
            ("MutatingWebhookConfiguration", MUTATE),
            ("ValidatingWebhookConfiguration", VALIDATE),
        ] {
            let configs = render.of_kind(kind);
            assert_eq!(configs.len(), 1, "one {kind}");
            for webhook in configs[0]["webhooks"].as_array().expect("webhooks") {
                names.push(webhook["name"].as_str().expect("a name").to_string());
                assert_eq!(
                    webhook["clientConfig"],
                    json!({"url": format!("{base}{path}"), "caBundle": ca_bundle}),
                    "{url}: {kind} {} calls the URL, with no service",
                    webhook["name"]
                );
            }
        }
        assert_eq!(
            names,
            [
                "mutate.podmend.io",
                "status.podmend.io",
                "validate.podmend.io"
            ]
        );

        for kind in [
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "ServiceMonitor",
        ] {
            assert!(render.of_kind(kind).is_empty(), "{url}: a {kind} rendered");
        }
        let hooks: Vec<_> = render
            .objects
            .iter()
            .filter(|r| !render.installed().contains(&&r.object))
            .map(|r| r.template.as_str())
            .collect();
        assert!(
            hooks.is_empty(),
            "{url}: `helm test` hooks rendered: {hooks:?}"
        );
        // What does not run the webhook stays.
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
        ] {
            assert_eq!(render.of_kind(kind).len(), 1, "{url}: one {kind}");
        }
    }
}

#[test]
fn with_webhook_url_the_jobs_the_reaper_and_the_dashboard_still_render_on_their_own_values() {
    let mut values = url_values("https://localhost:8443", &local_ca_bundle());
    values["reports"] = json!({"enabled": true});
    values["stormCleanup"] = json!({"enabled": true});
    values["reaper"] = json!({"enabled": true});
    values["metrics"] =
        json!({"serviceMonitor": {"enabled": true}, "dashboard": {"enabled": true}});
    let render = common::chart::render(&values, RELEASE, NAMESPACE);
    let component = |o: &&Value| {
        o.pointer("/metadata/labels/app.kubernetes.io~1component")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let components = |kind: &str| -> Vec<Option<String>> {
        render.of_kind(kind).iter().map(component).collect()
    };
    assert_eq!(
        render.of_kind("CronJob").len(),
        2,
        "reports and storm clean-up"
    );
    assert_eq!(components("DaemonSet"), [Some("reaper".to_string())]);
    // The reaper's metrics Service and ServiceMonitor are its own; the webhook's are gone.
    assert_eq!(components("Service"), [Some("reaper".to_string())]);
    assert_eq!(components("ServiceMonitor"), [Some("reaper".to_string())]);
    assert!(render.of_kind("Deployment").is_empty());
    let dashboards = render
        .of_kind("ConfigMap")
        .into_iter()
        .filter(|c| c["data"]["podmend.json"].is_string())
        .count();
    assert_eq!(dashboards, 1, "the dashboard ConfigMap");
}

#[test]
fn a_webhook_url_the_api_server_would_refuse_fails_the_render_saying_what_to_set() {
    let ca_bundle = local_ca_bundle();
    for (url, problem) in [
        ("http://localhost:8443", "is not an https:// URL"),
        ("localhost:8443", "is not an https:// URL"),
        ("https://localhost:8443?debug=1", "has a query"),
        ("https://localhost:8443/?", "has a query"),
        ("https://localhost:8443#top", "has a fragment"),
        (
            "https://admin:secret@localhost:8443",
            "has user information",
        ),
        ("https:///mutate", "names no host"),
    ] {
        let message = refusal(&url_values(url, &ca_bundle));
        for part in [
            format!("webhook.url {url:?} {problem}"),
            "Set webhook.url to https://HOST[:PORT][/PATH]".to_string(),
        ] {
            assert!(
                message.contains(&part),
                "{url}: {part:?} not in:\n{message}"
            );
        }
    }
}

#[test]
fn a_webhook_url_with_another_tls_mode_than_secret_fails_the_render_saying_what_to_set() {
    for mode in ["self", "certManager"] {
        let values = json!({"webhook": {"url": "https://localhost:8443"}, "tls": {"mode": mode}});
        let message = refusal(&values);
        for part in [
            format!("tls.mode is {mode}"),
            "set tls.mode secret and tls.secret.caBundle".to_string(),
        ] {
            assert!(
                message.contains(&part),
                "{mode}: {part:?} not in:\n{message}"
            );
        }
    }
}

#[test]
fn a_webhook_url_needs_the_ca_bundle_but_not_the_secret_name_and_refuses_tls_client_ca() {
    // tls.secret.name names a Secret for the in-cluster Deployment: not needed here.
    let values = url_values("https://localhost:8443", &local_ca_bundle());
    assert!(common::chart::try_render(&values, RELEASE, NAMESPACE).is_ok());
    // Without the CA the API server could not verify podmend.
    let message = refusal(&url_values("https://localhost:8443", ""));
    assert!(
        message.contains("/tls/secret/caBundle"),
        "the schema names the missing caBundle:\n{message}"
    );
    assert!(!message.contains("/tls/secret/name"), "{message}");
    // Without webhook.url the name is still required.
    let message = refusal(&json!({"tls": {"mode": "secret", "secret": {"caBundle": "QQ=="}}}));
    assert!(message.contains("/tls/secret/name"), "{message}");
    // tls.clientCA configures the Deployment, which is not rendered.
    let mut values = url_values("https://localhost:8443", &local_ca_bundle());
    values["tls"]["clientCA"] = json!({"secretName": "apiserver-client-ca"});
    let message = refusal(&values);
    assert!(
        message.contains("tls.clientCA configures the in-cluster Deployment"),
        "{message}"
    );
}
