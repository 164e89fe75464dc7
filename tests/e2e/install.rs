//! podmend installed the way users install it: the real `helm` installs `charts/podmend` into
//! the control plane, with `webhook.url` pointing both webhook configurations at a `podmend
//! serve` this suite runs on loopback (`https://localhost:PORT`), which reads the config the
//! chart installed (its ConfigMap, read back from the API server).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::Suite;
use crate::common::server::{BIN, Options, Server};

/// The release, and the namespace it is installed in.
pub const RELEASE: &str = "podmend";
pub const NAMESPACE: &str = "podmend-system";

/// podmend, installed and serving.
pub struct Installed {
    pub server: Server,
    /// What `helm get manifest` printed, one object per entry.
    pub manifest: Vec<Value>,
    /// The same, as the file `kubectl get -f` reads.
    pub manifest_file: PathBuf,
}

pub fn helm_installs_the_chart_and_the_api_server_accepts_every_object_it_renders(suite: &Suite) {
    let installed = install(suite);
    let stored = kubectl_json(
        suite,
        &[
            "get",
            "-f",
            &installed.manifest_file.display().to_string(),
            "-o",
            "json",
        ],
    );
    let stored = stored["items"].as_array().cloned().unwrap_or_default();
    let names = |objects: &[Value]| -> Vec<String> {
        let mut names: Vec<String> = objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names(&stored),
        names(&installed.manifest),
        "every object helm rendered is stored by the API server"
    );
    // The validating configuration is registered only while a rule denies; the chart's
    // defaults deny nothing.
    assert!(
        installed
            .manifest
            .iter()
            .all(|o| o["kind"] != "ValidatingWebhookConfiguration"),
        "a validating webhook with no rule in deny"
    );
    for kind in ["MutatingWebhookConfiguration"] {
        let rendered = of_kind(&installed.manifest, kind);
        let read_back = of_kind(&stored, kind);
        assert!(
            !rendered["webhooks"].as_array().is_none_or(Vec::is_empty),
            "{kind} has webhooks"
        );
        for (webhook, back) in rendered["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
            .zip(read_back["webhooks"].as_array().into_iter().flatten())
        {
            // The API server compiles every CEL matchCondition when it stores the
            // configuration, and refuses one that does not compile.
            assert_eq!(
                back["matchConditions"], webhook["matchConditions"],
                "{kind} {}",
                webhook["name"]
            );
            let url = back["clientConfig"]["url"].as_str().unwrap_or_default();
            assert!(
                url.starts_with(&format!(
                    "https://localhost:{}/",
                    installed.server.webhook.port()
                )),
                "{kind} {} calls podmend on loopback, not {url:?}",
                webhook["name"]
            );
        }
    }
    *crate::lock(&suite.podmend) = Some(installed);
}

pub fn helm_uninstall_leaves_nothing_that_touches_or_blocks_pod_creation(suite: &Suite) {
    ensure_installed(suite);
    let installed = crate::lock(&suite.podmend).take().expect("installed");
    let output = suite
        .plane
        .helm()
        .args(["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"])
        .output()
        .expect("run helm uninstall");
    assert_success("helm uninstall", &output);
    let left = kubectl(
        suite,
        &[
            "get",
            "-f",
            &installed.manifest_file.display().to_string(),
            "--ignore-not-found",
            "-o",
            "name",
        ],
    );
    assert!(left.trim().is_empty(), "helm uninstall left: {left}");

    // podmend still serves: a webhook configuration left behind would still send it this pod.
    crate::pinniped::create_node(suite, "after-uninstall", "");
    suite
        .block_on(suite.plane.create_namespace("after-uninstall"))
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pinned", "namespace": "after-uninstall"},
        "spec": {"nodeName": "after-uninstall",
                 "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "10m"}}}]}
    });
    kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    let stored = kubectl_json(
        suite,
        &[
            "get",
            "pod",
            "pinned",
            "-n",
            "after-uninstall",
            "-o",
            "json",
        ],
    );
    assert_eq!(
        stored["spec"]["nodeName"], "after-uninstall",
        "the pod is stored as created"
    );
    assert!(
        stored["metadata"]["annotations"]["podmend.io/mutated"].is_null(),
        "no webhook called podmend: {}",
        stored["metadata"]
    );

    // With podmend gone as well, pods are created at once: nothing waits for a webhook.
    drop(installed);
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "unpinned", "namespace": "after-uninstall"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let began = Instant::now();
    kubectl_stdin(suite, &["create", "-f", "-"], &pod);
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "creating a pod took {:?} with podmend uninstalled and stopped",
        began.elapsed()
    );
}

/// Installs podmend unless a test already did.
pub fn ensure_installed(suite: &Suite) {
    if crate::lock(&suite.podmend).is_none() {
        let installed = install(suite);
        *crate::lock(&suite.podmend) = Some(installed);
    }
}

/// Runs `test` while podmend serves the chart's config as `change` edits it (the config as
/// JSON, e.g. `config["rules"]["agent-requests"]["onlyPinned"] = json!(false)`), then serves
/// the chart's config again, whether `test` passed or panicked. Each swap writes the file
/// `podmend serve` reloads and waits for its "configuration reloaded" log line.
pub fn with_config<T>(
    suite: &Suite,
    change: impl FnOnce(&mut Value),
    test: impl FnOnce() -> T,
) -> T {
    ensure_installed(suite);
    let chart_config = {
        let podmend = crate::lock(&suite.podmend);
        let server = &podmend.as_ref().expect("installed").server;
        std::fs::read_to_string(server.config_path()).expect("the installed config")
    };
    let mut config: Value =
        serde_yaml_ng::from_str(&chart_config).expect("the installed config is YAML");
    change(&mut config);
    // JSON is YAML: podmend reads it as it reads the chart's.
    serve_config(suite, &serde_json::to_string_pretty(&config).expect("JSON"));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(test));
    serve_config(suite, &chart_config);
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Runs `test` with the release upgraded by `helm upgrade` to the suite's install values with
/// `values` over them, and podmend serving the config the chart then renders; afterwards
/// upgrades back to the install values and serves the install's config again, whether `test`
/// passed or panicked, so later tests see the default install.
pub fn with_values<T>(suite: &Suite, values: Value, test: impl FnOnce() -> T) -> T {
    ensure_installed(suite);
    let (base, installed_config) = {
        let podmend = crate::lock(&suite.podmend);
        let server = &podmend.as_ref().expect("installed").server;
        let config = std::fs::read_to_string(server.config_path()).expect("the installed config");
        (values_for(server), config)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let base_file = dir.path().join("install-values.json");
    let extra_file = dir.path().join("test-values.json");
    std::fs::write(&base_file, base.to_string()).expect("write the install values");
    std::fs::write(&extra_file, values.to_string()).expect("write the test values");

    let upgraded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        helm_upgrade(suite, &[&base_file, &extra_file]);
        serve_config(suite, &rendered_config(suite));
    }));
    let result =
        upgraded.and_then(|()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(test)));
    helm_upgrade(suite, &[&base_file]);
    serve_config(suite, &installed_config);
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// `helm upgrade` of the suite's release to the current chart with exactly these values files
/// (no `--reuse-values`: what a file does not set is the chart's default).
pub fn helm_upgrade(suite: &Suite, values: &[&Path]) {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/podmend");
    let mut command = suite.plane.helm();
    command
        .args(["upgrade", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE]);
    for file in values {
        command.arg("--values").arg(file);
    }
    let output = command.output().expect("run helm upgrade");
    assert_success("helm upgrade", &output);
}

/// The name of the release's object of `kind` (one the chart renders once), as helm installed it.
pub fn installed_name(suite: &Suite, kind: &str) -> String {
    let podmend = crate::lock(&suite.podmend);
    let manifest = &podmend.as_ref().expect("installed").manifest;
    of_kind(manifest, kind)["metadata"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("helm installed a {kind} with a name"))
        .to_string()
}

/// The config in the release's ConfigMap, as the API server stores it.
pub fn rendered_config(suite: &Suite) -> String {
    let name = installed_name(suite, "ConfigMap");
    let stored = kubectl_json(
        suite,
        &["get", "configmap", &name, "-n", NAMESPACE, "-o", "json"],
    );
    stored["data"]["config.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap holds config.yaml: {stored}"))
        .to_string()
}

/// Writes `text` as the config of the installed `podmend serve` and waits until it reloaded
/// it (it reloads a changed file within a second, and logs each reload).
pub fn serve_config(suite: &Suite, text: &str) {
    let podmend = crate::lock(&suite.podmend);
    let server = &podmend.as_ref().expect("installed").server;
    let path = server.config_path();
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text) {
        return;
    }
    let reloads = |log: &str| log.matches("configuration reloaded").count();
    let before = reloads(&server.log_text());
    std::fs::write(&path, text).expect("write the config");
    let log = server.log_once(|log| reloads(log) > before);
    assert!(
        reloads(&log) > before,
        "podmend did not reload the config:\n{text}\n{log}"
    );
}

/// Starts `podmend serve` on loopback (look-ups through the admin kubeconfig), installs the
/// chart with `webhook.url` pointing at it, and gives it the config the chart installed.
fn install(suite: &Suite) -> Installed {
    let defaults = Command::new(BIN)
        .arg("config")
        .output()
        .expect("podmend config");
    assert_success("podmend config", &defaults);
    let server = Server::start(Options {
        config: Some(String::from_utf8_lossy(&defaults.stdout).into_owned()),
        kubeconfig: Some(suite.plane.kubeconfig.clone()),
        wait_ready: true,
        ..Options::default()
    });
    let dir = server.dir.path().to_path_buf();
    let values = dir.join("values.json");
    std::fs::write(&values, values_for(&server).to_string()).expect("write values");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/podmend");
    let output = suite
        .plane
        .helm()
        .args(["install", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE, "--create-namespace", "--values"])
        .arg(&values)
        .output()
        .expect("run helm install");
    assert_success("helm install", &output);

    let manifest_text = suite
        .plane
        .helm()
        .args(["get", "manifest", RELEASE, "--namespace", NAMESPACE])
        .output()
        .expect("run helm get manifest");
    assert_success("helm get manifest", &manifest_text);
    let manifest_file = dir.join("manifest.yaml");
    std::fs::write(&manifest_file, &manifest_text.stdout).expect("write the manifest");
    let manifest: Vec<Value> = serde_yaml_ng::Deserializer::from_slice(&manifest_text.stdout)
        .filter_map(|document| serde::Deserialize::deserialize(document).ok())
        .filter(|object: &Value| object.is_object())
        .collect();

    // podmend reads the config the chart installed, as it does in the cluster.
    let config_map = of_kind(&manifest, "ConfigMap");
    let name = config_map["metadata"]["name"]
        .as_str()
        .expect("the ConfigMap's name");
    let stored = kubectl_json(
        suite,
        &["get", "configmap", name, "-n", NAMESPACE, "-o", "json"],
    );
    let config = stored["data"]
        .as_object()
        .and_then(|data| data.values().next())
        .and_then(Value::as_str)
        .expect("the ConfigMap holds the config");
    std::fs::write(server.config_path(), config).expect("write the installed config");
    let log = server.log_once(|log| log.contains("configuration reloaded"));
    assert!(
        log.contains("configuration reloaded"),
        "podmend did not load the chart's config:\n{log}"
    );
    Installed {
        server,
        manifest,
        manifest_file,
    }
}

/// The chart values that point both webhook configurations at `server` on loopback.
pub fn values_for(server: &Server) -> Value {
    let ca = base64::engine::general_purpose::STANDARD.encode(server.ca_pem());
    json!({
        "webhook": {"url": format!("https://localhost:{}", server.webhook.port())},
        "tls": {"mode": "secret", "secret": {"caBundle": ca}},
    })
}

/// The one object of `kind` in `objects`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} among {} objects", objects.len());
    found[0]
}

/// Fails with the command's output unless it succeeded.
pub fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `kubectl ARGS` as the admin: its standard output.
pub fn kubectl(suite: &Suite, args: &[&str]) -> String {
    let output = suite
        .plane
        .kubectl()
        .args(args)
        .output()
        .expect("run kubectl");
    assert_success(&format!("kubectl {}", args.join(" ")), &output);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `kubectl ARGS` printing JSON, parsed.
pub fn kubectl_json(suite: &Suite, args: &[&str]) -> Value {
    let text = kubectl(suite, args);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("kubectl {}: {e}: {text}", args.join(" ")))
}

/// `kubectl ARGS` with `object` as JSON on its standard input: its output (stdout and stderr).
pub fn kubectl_stdin(suite: &Suite, args: &[&str], object: &Value) -> String {
    let output = kubectl_stdin_output(suite, args, object);
    assert_success(&format!("kubectl {}", args.join(" ")), &output);
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `kubectl ARGS` with `object` as JSON on its standard input, whether or not it succeeds.
pub fn kubectl_stdin_output(suite: &Suite, args: &[&str], object: &Value) -> Output {
    use std::io::Write as _;
    let mut child = suite
        .plane
        .kubectl()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(object.to_string().as_bytes())
        .expect("write to kubectl");
    child.wait_with_output().expect("kubectl exits")
}
