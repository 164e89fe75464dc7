//! RBAC proven, not assumed: for each component of the chart that talks to the API server,
//! the real binary runs with the arguments and environment the chart gives it, against the
//! API stand-in, which records every request as the authorizer sees it
//! (`tests/common/api_stub.rs`). Each request must be allowed by the RBAC objects the chart
//! renders for that component's ServiceAccount (`tests/common/rbac.rs` follows the API
//! server's rule semantics), and every permission those objects grant must be used by some
//! request, unless a `# rbac-unused-ok:` comment in the chart says why.
//!
//! A component is one entry of [`COMPONENTS`]: the chart values that turn it on, the workload
//! that runs it, how its run ends, and the scenarios that exercise it (each seeds the stub
//! and checks the run did its job, so that the requests are the ones a real run sends).
//! Adding one is appending an entry. The container runs with its env as the kubelet resolves
//! it (downward API fields, `$(NAME)` in args); a `--upstream` on a unix socket (the node's
//! Docker socket the reaper mounts) is a real dockerd's (`tests/common/dockerd.rs`).

mod common;
#[path = "common/rbac.rs"]
mod rbac;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::api_stub::{ApiStub, Call};
use common::chart::{Render, render};
use common::dockerd::{self, text};
use common::net::{free_port, http_get};
use common::storm::{NS, fixture, healthy, seed_workloads, storm};
use rbac::{Policy, Request, User, justifications};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;

const BIN: &str = env!("CARGO_BIN_EXE_podmend");
const RELEASE: &str = "podmend";
const NAMESPACE: &str = "podmend-system";
/// The node a DaemonSet's pod runs on (the downward API's `spec.nodeName`).
const NODE: &str = "ci-worker-1";

/// Which rendered workload runs a component.
#[derive(Debug, Clone, Copy)]
pub enum Workload {
    /// The webhook's Deployment (no component label).
    Deployment,
    /// A CronJob with this `app.kubernetes.io/component` label.
    CronJob(&'static str),
    /// A DaemonSet with this `app.kubernetes.io/component` label.
    DaemonSet(&'static str),
}

/// How a component's run ends.
#[derive(Debug, Clone, Copy)]
pub enum Finish {
    /// A job: it exits by itself, successfully.
    Exits,
    /// A server: it is stopped once `/readyz` on its `--metrics-listen` port answers 200
    /// and it had `settle` to finish what it does after that.
    Ready { settle: Duration },
    /// A loop that reports each pass on stdout (a node agent): stopped once it printed
    /// `text` (its pass is done), failed if it has not within `within`.
    Printed {
        text: &'static str,
        within: Duration,
    },
}

/// One run of a component against a seeded stub.
pub struct Scenario {
    pub name: &'static str,
    /// Puts the cluster the run needs into the stub.
    pub seed: fn(&ApiStub, &Render),
    /// Checks the run did its job.
    pub check: fn(&ApiStub, &Output),
}

pub struct Component {
    pub name: &'static str,
    pub values: fn() -> Value,
    pub workload: Workload,
    pub finish: Finish,
    pub scenarios: &'static [Scenario],
}

/// What the binary printed.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// Every component of the chart that talks to the API server. Append to add one.
pub const COMPONENTS: &[Component] = &[
    Component {
        name: "webhook, tls.mode self (Node/LimitRange look-ups, TLS Secret, caBundles)",
        values: || json!({}),
        workload: Workload::Deployment,
        finish: Finish::Ready {
            settle: Duration::from_millis(500),
        },
        scenarios: &[
            Scenario {
                name: "first start: creates the Secret, writes both caBundles",
                seed: seed_webhook,
                check: check_webhook_tls,
            },
            Scenario {
                name: "renewal: replaces a Secret that holds no usable PKI",
                seed: seed_webhook_with_stale_secret,
                check: check_webhook_tls,
            },
        ],
    },
    Component {
        name: "webhook, tls.mode certManager (look-ups only)",
        values: || json!({"tls": {"mode": "certManager"}}),
        workload: Workload::Deployment,
        finish: Finish::Ready {
            settle: Duration::from_millis(500),
        },
        scenarios: &[Scenario {
            name: "serving with cert-manager's certificate",
            seed: seed_webhook,
            check: |stub, _| assert!(stub.objects("secrets").is_empty(), "nothing written"),
        }],
    },
    Component {
        name: "report refresh CronJob, PolicyReports, every namespace",
        values: || json!({"reports": {"enabled": true}}),
        workload: Workload::CronJob("reports"),
        finish: Finish::Exits,
        scenarios: &[Scenario {
            name: "applies the reports and deletes a stale one",
            seed: |stub, _| {
                seed_audit(
                    stub,
                    "policyreports",
                    "wgpolicyk8s.io/v1alpha2",
                    "PolicyReport",
                    "gone",
                )
            },
            check: |stub, out| {
                assert!(
                    out.stdout.contains("deleted 1 stale: gone/podmend-audit"),
                    "{}",
                    out.stdout
                );
                assert!(!stub.objects("policyreports").is_empty());
            },
        }],
    },
    Component {
        name: "report refresh CronJob, OpenReports, one namespace",
        values: || json!({"reports": {"enabled": true, "format": "openreports", "namespace": NS}}),
        workload: Workload::CronJob("reports"),
        finish: Finish::Exits,
        scenarios: &[Scenario {
            name: "applies the namespace's report and deletes its stale part",
            seed: |stub, _| seed_audit(stub, "reports", "openreports.io/v1alpha1", "Report", NS),
            check: |stub, out| {
                assert!(
                    out.stdout
                        .contains(&format!("deleted 1 stale: {NS}/podmend-audit-2")),
                    "{}",
                    out.stdout
                );
                assert_eq!(stub.objects("reports").len(), 1);
            },
        }],
    },
    Component {
        name: "storm clean-up CronJob, every namespace",
        values: || json!({"stormCleanup": {"enabled": true, "deletesPerSecond": 1000}}),
        workload: Workload::CronJob("storm-cleanup"),
        finish: Finish::Exits,
        scenarios: &[Scenario {
            name: "deletes a storm of 60 but the newest 5, posts an Event",
            seed: seed_storm,
            check: |stub, out| {
                assert!(
                    out.stdout.contains("55 Failed pods deleted"),
                    "{}",
                    out.stdout
                );
                assert_eq!(stub.objects("events").len(), 1);
            },
        }],
    },
    Component {
        name: "storm clean-up CronJob, dry run, one namespace",
        values: || json!({"stormCleanup": {"enabled": true, "dryRun": true, "namespace": NS}}),
        workload: Workload::CronJob("storm-cleanup"),
        finish: Finish::Exits,
        scenarios: &[Scenario {
            name: "lists what would go and deletes nothing",
            seed: seed_storm,
            check: |stub, out| {
                assert!(
                    out.stdout.contains("55 Failed pods would be deleted"),
                    "{}",
                    out.stdout
                );
                assert_eq!(stub.objects("pods").len(), 65);
            },
        }],
    },
    Component {
        name: "node reaper DaemonSet, with an image budget",
        // A budget every daemon is over, so the image pass runs to its end (the images are
        // in use or younger than imageMinAge: none goes).
        values: || json!({"reaper": {"enabled": true, "imagesHigh": "1", "imagesLow": "0"}}),
        workload: Workload::DaemonSet("reaper"),
        finish: Finish::Printed {
            text: "above the low mark",
            within: Duration::from_secs(60),
        },
        scenarios: &[Scenario {
            name: "removes the containers of its node's gone and finished pods, keeps a live one's",
            seed: seed_reaper,
            check: check_reaper,
        }],
    },
];

// ---------------------------------------------------------------------------------------------
// seeds

fn nodes() -> Vec<Value> {
    [
        "node-kubeadm-control-plane.json",
        "node-cordoned-worker.json",
    ]
    .iter()
    .map(|n| fixture(&format!("cluster/{n}")))
    .collect()
}

fn limit_ranges() -> Vec<Value> {
    vec![fixture(
        "cluster/limitrange-ci-agents-container-defaults.json",
    )]
}

/// The webhook configurations as the chart renders them, and an empty Secret store.
fn seed_webhook(stub: &ApiStub, render: &Render) {
    stub.serve_resource("secrets", "v1", "Secret", true);
    for (plural, kind) in [
        (
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
        ),
        (
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
        ),
    ] {
        stub.serve_resource(plural, "admissionregistration.k8s.io/v1", kind, false);
        let objects: Vec<Value> = render.of_kind(kind).into_iter().cloned().collect();
        stub.set_objects(plural, objects);
    }
}

fn seed_webhook_with_stale_secret(stub: &ApiStub, render: &Render) {
    seed_webhook(stub, render);
    let args = container(render, Workload::Deployment)["args"].clone();
    let secret = args
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--tls-secret="))
        .expect("--tls-secret")
        .to_string();
    stub.set_objects(
        "secrets",
        vec![json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": NAMESPACE, "uid": "5ec2e7-0000-4000-8000-000000000001"},
            "data": {"tls.crt": "bm90IGEgY2VydA==", "tls.key": "bm90IGEga2V5"}})],
    );
}

fn check_webhook_tls(stub: &ApiStub, _: &Output) {
    let secrets = stub.objects("secrets");
    assert_eq!(secrets.len(), 1);
    assert!(
        secrets[0]["data"]["ca.crt"].is_string(),
        "a PKI in the Secret"
    );
    for plural in [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ] {
        for config in stub.objects(plural) {
            for webhook in config["webhooks"].as_array().unwrap() {
                assert!(
                    webhook["clientConfig"]["caBundle"].is_string(),
                    "{plural}: no caBundle"
                );
            }
        }
    }
}

/// A cluster to audit: the stalled Pinniped Deployment, its ReplicaSet and a storm, and the
/// report kind served with a stale podmend report in `stale_namespace`.
fn seed_audit(stub: &ApiStub, plural: &str, api_version: &str, kind: &str, stale_namespace: &str) {
    let mut pods = storm(60);
    pods.extend(healthy(5));
    seed_workloads(stub, pods);
    stub.serve_resource(plural, api_version, kind, true);
    let stale_name = if stale_namespace == NS {
        "podmend-audit-2"
    } else {
        "podmend-audit"
    };
    stub.set_objects(
        plural,
        vec![json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": stale_name, "namespace": stale_namespace, "uid": "0b50-0000-4000-8000-000000000001",
                "labels": {"app.kubernetes.io/managed-by": "podmend", "podmend.io/report-set": "podmend-audit"}},
            "results": []})],
    );
}

fn seed_storm(stub: &ApiStub, _: &Render) {
    let mut pods = storm(60);
    pods.extend(healthy(5));
    stub.set_objects("pods", pods);
}

/// The node's containers for the reaper, one per owner pod: `(owner uid, container id)`.
static REAPER_CONTAINERS: std::sync::Mutex<Vec<(String, String)>> =
    std::sync::Mutex::new(Vec::new());

/// Owner pod UIDs of the reaper scenario: running on its node, finished there, gone.
fn reaper_owners() -> [String; 3] {
    let run = std::process::id();
    ["alive", "finished", "gone"].map(|o| format!("{o}-{run}-0000-4000-8000-000000000001"))
}

/// The node's daemon (a real dockerd) with a container labelled as a guard labels it for each
/// of a running pod, a finished pod and a pod that is gone; the API knows the first two.
fn seed_reaper(stub: &ApiStub, _: &Render) {
    let [alive, finished, gone] = reaper_owners();
    let daemon = dockerd::shared();
    let mut containers = Vec::new();
    for owner in [&alive, &finished, &gone] {
        let created = dockerd::run(
            daemon
                .docker()
                .args(["create", "--pull=never", "--network=none", "--label"])
                .arg(format!("podmend.io/owner-pod={owner}"))
                .args(["busybox", "true"]),
            None,
            Duration::from_secs(60),
        );
        assert!(created.status.success(), "{}", text(&created.stderr));
        containers.push((owner.clone(), text(&created.stdout).trim().to_string()));
    }
    *REAPER_CONTAINERS.lock().unwrap() = containers;
    let pod = |name: &str, uid: &str, phase: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"nodeName": NODE, "containers": [{"name": "job", "image": "docker:27-cli"}]},
            "status": {"phase": phase}})
    };
    stub.set_objects(
        "pods",
        vec![
            pod("runner-alive", &alive, "Running"),
            pod("runner-finished", &finished, "Succeeded"),
        ],
    );
}

fn check_reaper(_: &ApiStub, out: &Output) {
    let [alive, ..] = reaper_owners();
    let daemon = dockerd::shared();
    for (owner, id) in REAPER_CONTAINERS.lock().unwrap().iter() {
        let inspected = dockerd::run(
            daemon.docker().args(["container", "inspect", id]),
            None,
            Duration::from_secs(30),
        );
        assert_eq!(
            inspected.status.success(),
            *owner == alive,
            "{owner}'s container: kept only for the running pod\n{}\n{}",
            out.stdout,
            out.stderr
        );
        if *owner != alive {
            assert!(
                out.stdout
                    .contains(&format!("podmend.io/owner-pod={owner}")),
                "{}",
                out.stdout
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// running a component as the chart runs it

/// The pod spec of `workload`.
fn pod_spec(render: &Render, workload: Workload) -> Value {
    let (kind, component, pointer) = match workload {
        Workload::Deployment => ("Deployment", None, "/spec/template/spec"),
        Workload::CronJob(c) => ("CronJob", Some(c), "/spec/jobTemplate/spec/template/spec"),
        Workload::DaemonSet(c) => ("DaemonSet", Some(c), "/spec/template/spec"),
    };
    let found: Vec<&Value> = render
        .of_kind(kind)
        .into_iter()
        .filter(|o| {
            o.pointer("/metadata/labels/app.kubernetes.io~1component")
                .and_then(Value::as_str)
                == component
        })
        .collect();
    assert_eq!(found.len(), 1, "one {kind} for {component:?}");
    found[0].pointer(pointer).expect("a pod spec").clone()
}

fn container(render: &Render, workload: Workload) -> Value {
    pod_spec(render, workload)["containers"][0].clone()
}

/// The container's arguments, with the pod's paths moved under `dir` (the config from the
/// rendered ConfigMap, a serving certificate from `podmend certs`) and its ports on loopback.
/// Returns the arguments and the metrics address.
fn local_args(render: &Render, args: &[String], dir: &Path) -> (Vec<String>, Option<SocketAddr>) {
    let mut metrics = None;
    let mut out = Vec::new();
    for arg in args {
        let (flag, value) = arg.split_once('=').unwrap_or((arg, ""));
        let mapped = match flag {
            "--listen" => format!("{flag}={}", free_port()),
            "--metrics-listen" => {
                let addr = free_port();
                metrics = Some(addr);
                format!("{flag}={addr}")
            }
            // The node's Docker socket, mounted from the host: here a real dockerd's.
            "--upstream" if value.starts_with("unix://") => {
                format!("{flag}={}", dockerd::shared().host())
            }
            _ if value.starts_with("/etc/podmend/") => {
                let local = dir.join(value.trim_start_matches('/'));
                prepare_file(render, &local);
                format!("{flag}={}", local.display())
            }
            _ => arg.clone(),
        };
        out.push(mapped);
    }
    (out, metrics)
}

/// What a mounted file holds in the pod: the rendered config, or a development certificate.
fn prepare_file(render: &Render, path: &Path) {
    let dir = path.parent().expect("a directory");
    std::fs::create_dir_all(dir).expect("create dir");
    match path.file_name().and_then(|n| n.to_str()) {
        Some("config.yaml") => {
            let config = render
                .of_kind("ConfigMap")
                .into_iter()
                .find_map(|c| c["data"]["config.yaml"].as_str())
                .expect("the config ConfigMap")
                .to_string();
            std::fs::write(path, config).expect("write config");
        }
        Some("tls.crt" | "tls.key") if !dir.join("tls.crt").exists() => {
            let status = Command::new(BIN)
                .args(["certs", "--dns", "localhost", "--out"])
                .arg(dir)
                .stdout(Stdio::null())
                .status()
                .expect("podmend certs");
            assert!(status.success());
        }
        _ => {}
    }
}

fn readyz(addr: SocketAddr) -> bool {
    let answer = http_get(
        addr,
        "/readyz",
        Duration::from_millis(200),
        Duration::from_millis(500),
    );
    matches!(answer, Ok((200, _)))
}

/// Runs one scenario of `component`; returns the calls the binary made.
async fn run_scenario(component: &Component, scenario: &Scenario, render: &Render) -> Vec<Call> {
    let stub = ApiStub::start(nodes(), limit_ranges()).await;
    (scenario.seed)(&stub, render);
    stub.clear_calls();

    let container = container(render, component.workload);
    // The container's env as the kubelet resolves it: values, and the downward API fields
    // the chart uses.
    let mut env = BTreeMap::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap_or_default().to_string();
        let value = match (
            var["value"].as_str(),
            var.pointer("/valueFrom/fieldRef/fieldPath"),
        ) {
            (Some(value), _) => value.to_string(),
            (None, Some(field)) if field == "metadata.namespace" => NAMESPACE.to_string(),
            (None, Some(field)) if field == "spec.nodeName" => NODE.to_string(),
            (None, other) => panic!("{}: env {name} from {other:?}", component.name),
        };
        env.insert(name, value);
    }
    // The kubelet expands $(NAME) in args from the container's env.
    let args: Vec<String> = container["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|arg| {
                    env.iter().fold(arg.to_string(), |arg, (name, value)| {
                        arg.replace(&format!("$({name})"), value)
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let (args, metrics) = local_args(render, &args, dir.path());
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        // In the pod, the ServiceAccount's token; here, the stub's credentials stand for it.
        .env("KUBECONFIG", stub.kubeconfig_path())
        .envs(&env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("start podmend");
    // What a component that reports on stdout printed before it was stopped.
    let mut printed = String::new();
    match component.finish {
        Finish::Exits => {}
        Finish::Printed { text, within } => {
            let mut stdout = child.stdout.take().expect("stdout");
            let deadline = tokio::time::Instant::now() + within;
            let mut buffer = [0u8; 8192];
            while !printed.contains(text) {
                match tokio::time::timeout_at(deadline, stdout.read(&mut buffer)).await {
                    Ok(Ok(0)) | Err(_) => break,
                    Ok(Ok(n)) => printed.push_str(&String::from_utf8_lossy(&buffer[..n])),
                    Ok(Err(error)) => panic!("{}: reading its stdout: {error}", component.name),
                }
            }
            child.start_kill().expect("stop podmend");
            let _ = stdout.read_to_string(&mut printed).await;
            if !printed.contains(text) {
                let output = child.wait_with_output().await.expect("output");
                panic!(
                    "{}: podmend {args:?} did not print {text:?} within {within:?}:\n{printed}\n{}",
                    component.name,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        Finish::Ready { settle } => {
            let addr = metrics.expect("a --metrics-listen argument");
            let deadline = Instant::now() + Duration::from_secs(30);
            while !readyz(addr) {
                assert!(
                    Instant::now() < deadline,
                    "{}: not ready within 30 s; calls: {:#?}",
                    component.name,
                    stub.calls()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                );
                if let Ok(Some(status)) = child.try_wait() {
                    let output = child.wait_with_output().await.expect("output");
                    panic!(
                        "{}: podmend {args:?} exited before it was ready ({status}):\n{}",
                        component.name,
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(settle).await;
            child.start_kill().expect("stop podmend");
        }
    }
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("podmend finished within 2 minutes")
        .expect("podmend's output");
    let out = Output {
        stdout: printed + &String::from_utf8_lossy(&output.stdout),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    if matches!(component.finish, Finish::Exits) {
        assert!(
            output.status.success(),
            "{} / {}: podmend {args:?} failed ({}):\n{}\n{}",
            component.name,
            scenario.name,
            output.status,
            out.stdout,
            out.stderr
        );
    }
    (scenario.check)(&stub, &out);
    stub.calls()
}

fn to_request(call: &Call) -> Vec<Request> {
    call.verbs()
        .into_iter()
        .map(|verb| {
            if call.resource_request {
                let resource = if call.subresource.is_empty() {
                    call.resource.clone()
                } else {
                    format!("{}/{}", call.resource, call.subresource)
                };
                Request::resource(verb, &call.group, &resource, &call.namespace, &call.name)
            } else {
                let path = call.path.split('?').next().unwrap_or_default();
                Request::non_resource(verb, path)
            }
        })
        .collect()
}

/// Runs every scenario of `component` and checks its requests against the chart's RBAC;
/// returns one line per problem.
async fn prove(component: &Component) -> Vec<String> {
    let render = render(&(component.values)(), RELEASE, NAMESPACE);
    let account = pod_spec(&render, component.workload)["serviceAccountName"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let user = User::service_account(NAMESPACE, &account);
    let policy = Policy::from_objects(render.installed()).with_bootstrap();
    let mut problems = Vec::new();
    let mut requests = Vec::new();
    for scenario in component.scenarios {
        for call in run_scenario(component, scenario, &render).await {
            for request in to_request(&call) {
                if policy.authorize(&user, &request).is_none() {
                    problems.push(format!(
                        "{} / {}: {account} may not {request}: {call}",
                        component.name, scenario.name
                    ));
                }
                requests.push(request);
            }
        }
    }
    let mut markers = Vec::new();
    for (template, text) in &render.templates {
        match justifications(text) {
            Ok(found) => markers.extend(found),
            Err(error) => problems.push(format!("{template}: {error}")),
        }
    }
    let permissions = policy.permissions_of(&user);
    assert!(
        !permissions.is_empty() || requests.iter().all(|r| !r.resource_request),
        "{}: the chart grants {account} nothing",
        component.name
    );
    for permission in permissions {
        let used = requests.iter().any(|r| permission.used_by(r));
        let justified = markers.iter().any(|m| permission.justified_by(m));
        if !used && !justified {
            problems.push(format!(
                "{}: {account} is granted {permission} but never uses it; remove it from the chart, or say why with `{} VERB RESOURCE: WHY` in its RBAC template",
                component.name,
                rbac::JUSTIFICATION_MARKER
            ));
        }
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_every_component_is_allowed_by_its_chart_rbac_and_every_permission_is_used()
 {
    let mut problems = BTreeMap::new();
    for component in COMPONENTS {
        let found = prove(component).await;
        if !found.is_empty() {
            problems.insert(component.name, found);
        }
    }
    assert!(
        problems.is_empty(),
        "{}",
        problems
            .values()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_and_an_unused_one_are_both_reported() {
    // The storm clean-up with the chart's RBAC changed under it: the Event permission taken
    // away, and a watch on pods added that the binary never uses.
    let component = &COMPONENTS
        .iter()
        .find(|c| {
            c.name
                .starts_with("storm clean-up CronJob, every namespace")
        })
        .expect("the storm clean-up");
    let mut render = render(&(component.values)(), RELEASE, NAMESPACE);
    for rendered in &mut render.objects {
        if rendered.object["kind"] == "ClusterRole"
            && rendered
                .object
                .pointer("/metadata/labels/app.kubernetes.io~1component")
                == Some(&json!("storm-cleanup"))
        {
            let rules = rendered.object["rules"].as_array_mut().unwrap();
            rules.retain(|r| r["resources"] != json!(["events"]));
            rules.push(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["watch"]}));
        }
    }
    let account = pod_spec(&render, component.workload)["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_string();
    let user = User::service_account(NAMESPACE, &account);
    let policy = Policy::from_objects(render.installed()).with_bootstrap();
    let calls = run_scenario(component, &component.scenarios[0], &render).await;
    let requests: Vec<Request> = calls.iter().flat_map(to_request).collect();
    let denied: Vec<String> = requests
        .iter()
        .filter(|r| policy.authorize(&user, r).is_none())
        .map(ToString::to_string)
        .collect();
    assert_eq!(denied, [format!("create events in {NS}")]);
    let unused: Vec<String> = policy
        .permissions_of(&user)
        .into_iter()
        .filter(|p| !requests.iter().any(|r| p.used_by(r)))
        .map(|p| p.to_string())
        .collect();
    assert_eq!(
        unused,
        [format!(
            "watch pods (ClusterRoleBinding {account} of ClusterRole {account})"
        )]
    );
}

/// The component table finds each workload and its ServiceAccount in the chart (a renamed
/// template or label would otherwise make a component vanish from the proof).
#[test]
fn every_component_runs_as_a_service_account_of_its_own() {
    let mut accounts = BTreeMap::new();
    for component in COMPONENTS {
        let render = render(&(component.values)(), RELEASE, NAMESPACE);
        let spec = pod_spec(&render, component.workload);
        let account = spec["serviceAccountName"]
            .as_str()
            .expect("a ServiceAccount")
            .to_string();
        assert!(
            render
                .of_kind("ServiceAccount")
                .iter()
                .any(|sa| sa["metadata"]["name"] == account.as_str()),
            "{}: {account} is not rendered",
            component.name
        );
        accounts
            .entry(format!("{:?}", component.workload))
            .or_insert_with(Vec::new)
            .push(account);
    }
    let distinct: std::collections::BTreeSet<&String> = accounts.values().flatten().collect();
    assert_eq!(
        distinct.len(),
        accounts.len(),
        "one ServiceAccount per workload: {accounts:?}"
    );
}
