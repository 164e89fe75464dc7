//! The request bodies the benches send, built from the captures in `tests/fixtures/`:
//! shared by `benches/engine.rs` (the library path, in-process) and `benches/load.rs` (the
//! running server over TLS), included by both with `#[path = "common/cases.rs"] mod cases;`,
//! so both measure exactly the same bytes.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The node the cluster knows (no taints), and the one the nodeName case names.
pub const NODE: &str = "minikube";
/// Containers in the large-pod case.
pub const LARGE_POD_CONTAINERS: usize = 40;

/// What a case's answer must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Reviewed, nothing found: no patch, no warning.
    Clean,
    /// Reviewed and repaired: a patch (and its warnings).
    Patched,
    /// Reviewed, findings in `warn` mode: warnings, no patch.
    WarnedOnly,
    /// Not a kind podmend handles.
    Unhandled,
}

/// One request body and the answer it must get.
pub struct Case {
    pub name: &'static str,
    pub body: Vec<u8>,
    pub expect: Expect,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_json(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn read_yaml(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

/// Wraps an `AdmissionRequest` (the `.request` member) in a v1 AdmissionReview.
fn review(request: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    }))
    .expect("a Value serializes")
}

/// A CREATE request for a bare object, shaped like the captured ones (GVK, GVR, user,
/// `oldObject: null`, `dryRun`, `options`) so its size is realistic.
fn create_request(
    uid: &str,
    (group, version, kind, resource): (&str, &str, &str, &str),
    namespace: &str,
    object: Value,
) -> Value {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    json!({
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "minikube-user", "groups": ["system:masters", "system:authenticated"]},
        "object": object,
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    })
}

/// Every case, built once (the fixtures are read from disk).
pub fn cases() -> Vec<Case> {
    let gke = read_json("admissionreview-v1-pod-create-gke-kube-rs.json");

    let mut nodename = gke.clone();
    nodename["request"]["object"]["spec"]["nodeName"] = json!(NODE);

    let mut large = gke.clone();
    let container = large["request"]["object"]["spec"]["containers"][0].clone();
    let containers: Vec<Value> = (0..LARGE_POD_CONTAINERS)
        .map(|i| {
            let mut c = container.clone();
            c["name"] = json!(format!("echo-server-{i}"));
            c
        })
        .collect();
    large["request"]["object"]["spec"]["containers"] = Value::Array(containers);

    let jenkins = create_request(
        "5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e01",
        ("", "v1", "Pod", "pods"),
        "jenkins",
        read_yaml("jenkins-k8s-plugin-agent-pod-default-jnlp-as-submitted-eks.yaml"),
    );
    let pinniped = create_request(
        "5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e02",
        ("apps", "v1", "Deployment", "deployments"),
        "pinniped-concierge",
        read_yaml("pinniped-kube-cert-agent-deployment-v0.24.0-reconstructed.yaml"),
    );

    // The Pinniped agent pod as its ReplicaSet creates it, still pinned with nodeName: both
    // node-affinity and agent-requests repair it (the repair body of scripts/bench-limit).
    let mut agent = read_json("cluster/pod-pinniped-kube-cert-agent-rejected-outofcpu.json");
    if let Some(object) = agent.as_object_mut() {
        object.remove("status");
    }
    if let Some(metadata) = agent["metadata"].as_object_mut() {
        for key in ["name", "uid", "resourceVersion", "creationTimestamp"] {
            metadata.remove(key);
        }
    }
    let agent_namespace = agent["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let agent = create_request(
        "5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e17",
        ("", "v1", "Pod", "pods"),
        &agent_namespace,
        agent,
    );

    let encode = |v: &Value| serde_json::to_vec(v).expect("a Value serializes");
    vec![
        Case {
            name: "pod-create-untouched",
            body: encode(&gke),
            expect: Expect::Clean,
        },
        Case {
            name: "pod-create-nodename",
            body: encode(&nodename),
            expect: Expect::Patched,
        },
        // Not an agent under the default config (the Jenkins preset is opt-in, and the pod is
        // not pinned): what a Jenkins pod costs a review since issue 51, no repair.
        Case {
            name: "pod-create-jenkins-agent",
            body: review(jenkins),
            expect: Expect::Clean,
        },
        Case {
            name: "pod-create-agent-pinned",
            body: review(agent),
            expect: Expect::Patched,
        },
        Case {
            name: "pod-create-large-40-containers",
            body: encode(&large),
            expect: Expect::Clean,
        },
        Case {
            name: "deployment-create-pinniped",
            body: review(pinniped),
            expect: Expect::WarnedOnly,
        },
        Case {
            name: "deployment-create-echo",
            body: review(read_json(
                "admissionrequest-deployment-create-kubewarden-echo.json",
            )),
            expect: Expect::Clean,
        },
        Case {
            name: "configmap-unhandled",
            body: review(read_json(
                "admissionrequest-configmap-create-unhandled-kind-pepr-log.json",
            )),
            expect: Expect::Unhandled,
        },
    ]
}

/// The node the status cases' pods run on: a virtual-kubelet node (label `type`).
#[allow(dead_code)]
pub const VIRTUAL_NODE: &str = "virtual-node-aci-linux";

/// `UPDATE pods/status` writes for `virtual-node-phase` (only `benches/engine.rs` uses them:
/// the load bench's server runs the default config, where the rule is off): the
/// JENKINS-68649 pod as virtual-kubelet writes it (corrected), and the same pod `Running`,
/// the common status write that the rule only glances at.
#[allow(dead_code)]
pub fn status_cases() -> Vec<Case> {
    let mut pod = read_yaml(
        "virtual-kubelet-aci-pod-pending-with-running-containers-JENKINS-68649-reconstructed.yaml",
    );
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    let write = |uid: &str, pod: &Value| {
        let mut request =
            read_json("admissionrequest-pod-status-subresource-update-by-kubelet-kyverno.json");
        request["uid"] = json!(uid);
        request["name"] = pod["metadata"]["name"].clone();
        request["namespace"] = pod["metadata"]["namespace"].clone();
        request["object"] = pod.clone();
        request["oldObject"] = pod.clone();
        review(request)
    };
    let mut running = pod.clone();
    running["status"]["phase"] = json!("Running");
    vec![
        Case {
            name: "pod-status-pending-all-running",
            body: write("5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e10", &pod),
            expect: Expect::Patched,
        },
        Case {
            name: "pod-status-running",
            body: write("5b0f7a6e-3f51-4d0c-9a57-2a1f7c0d1e11", &running),
            expect: Expect::Clean,
        },
    ]
}
