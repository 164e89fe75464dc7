//! The `review_structured` target: the fuzzer's bytes pick, through `arbitrary`, an object
//! built from the vocabulary podmend's rules react to (nodeName, agent labels, resource
//! quantities in every notation, Docker daemons and sockets, tolerations, affinity terms,
//! the podmend annotations), a workload kind, an operation and a cluster (node taints,
//! LimitRanges). Raw bytes rarely stay a valid AdmissionReview under mutation; these always
//! do, so the rules' own logic is what gets explored.

use arbitrary::{Arbitrary, Unstructured};
use k8s_openapi::api::core::v1::{LimitRangeItem, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Map, Value, json};

use crate::review::{self, FuzzCluster};

fn pick(list: &'static [&'static str], index: u8) -> &'static str {
    list[usize::from(index) % list.len()]
}

const NODE_NAMES: &[&str] = &[
    "worker-1",
    "unknown-node",
    "",
    "virtual-node-aci-linux",
    "n.1",
];
const NAMESPACES: &[&str] = &["ci-agents", "", "kube-system", "default"];
const LABEL_KEYS: &[&str] = &[
    "jenkins/label",
    "kube-cert-agent.pinniped.dev",
    "app",
    "jenkins/label-digest",
];
const ANNOTATION_KEYS: &[&str] = &[
    "podmend.io/skip",
    "podmend.io/mutated",
    "podmend.io/agent",
    "podmend.io/dind-policy",
    "kubernetes.io/config.mirror",
    "other",
];
const ANNOTATION_VALUES: &[&str] = &[
    "true",
    "all",
    "node-affinity",
    "agent-requests",
    "dind-rm",
    "node-affinity, dind-rm",
    "rm",
    "deny",
    "reap",
    "audit",
    "off",
    " RM ",
    "bogus",
    "",
];
const CONTAINER_NAMES: &[&str] = &["jnlp", "dind", "podmend-guard", "build", "agent"];
const IMAGES: &[&str] = &[
    "docker:dind",
    "docker:27-dind-rootless",
    "registry.example/docker:27.3.1-dind-alpine3.20@sha256:abc",
    "jenkins/inbound-agent:3283.v92c105e0f819-4",
    "busybox",
    "docker:27",
    "",
];
const COMMANDS: &[&str] = &["dockerd", "dockerd-entrypoint.sh", "/bin/sh", "sleep"];
const ENV_NAMES: &[&str] = &[
    "DOCKER_HOST",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
    "PATH",
];
const ENV_VALUES: &[&str] = &[
    "tcp://localhost:2375",
    "tcp://127.0.0.1:2376",
    "unix:///var/run/docker.sock",
    "1",
    "",
];
const VOLUME_NAMES: &[&str] = &["docker-sock", "dind-storage", "certs", "podmend-docker"];
const MOUNT_PATHS: &[&str] = &[
    "/var/run/docker.sock",
    "/var/run",
    "/run",
    "/var/lib/docker",
    "/certs/client",
    "/run/podmend",
];
const HOST_PATHS: &[&str] = &[
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run",
    "/tmp",
];
const RESOURCE_NAMES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "hugepages-2Mi",
    "nvidia.com/gpu",
];
const QUANTITIES: &[&str] = &[
    "0",
    "1",
    "100m",
    "250m",
    "1.5",
    "0.5Gi",
    "64Mi",
    "128Mi",
    "1Gi",
    "1e3",
    "2E-3",
    "1n",
    "1u",
    "-1",
    "+1",
    "0.0001",
    "1k",
    "1Ki",
    "999999999999999999",
    "9Ei",
    "1e30",
    "",
    "1.",
    ".5",
];
const SUFFIXES: &[&str] = &[
    "", "m", "n", "u", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e3",
    "e-3", "E18", "e30",
];
const TAINT_KEYS: &[&str] = &[
    "node-role.kubernetes.io/control-plane",
    "virtual-kubelet.io/provider",
    "node.kubernetes.io/unschedulable",
    "dedicated",
];
const TAINT_VALUES: &[&str] = &["azure", "", "ci"];
const EFFECTS: &[&str] = &["NoSchedule", "NoExecute", "PreferNoSchedule", ""];
const OPERATORS: &[&str] = &["Exists", "Equal", "", "In"];
const LIMIT_TYPES: &[&str] = &["Container", "Pod", "PersistentVolumeClaim"];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    Pod,
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
    ConfigMap,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::Pod | Kind::ConfigMap => "v1",
            Kind::Job | Kind::CronJob => "batch/v1",
            _ => "apps/v1",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Deployment => "Deployment",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
            Kind::Job => "Job",
            Kind::CronJob => "CronJob",
            Kind::ConfigMap => "ConfigMap",
        }
    }
}

/// A quantity: one from the list, or built from parts (so the fuzzer reaches overflows).
#[derive(Arbitrary, Debug)]
enum Qty {
    Listed(u8),
    Built {
        negative: bool,
        whole: u64,
        fraction: Option<u16>,
        suffix: u8,
    },
    /// A JSON number, as some clients send (k8s-openapi reads it as a quantity too).
    Number(i64),
}

impl Qty {
    fn to_json(&self) -> Value {
        match self {
            Qty::Listed(i) => Value::String(pick(QUANTITIES, *i).to_string()),
            Qty::Built {
                negative,
                whole,
                fraction,
                suffix,
            } => {
                let sign = if *negative { "-" } else { "" };
                let fraction = fraction.map(|f| format!(".{f}")).unwrap_or_default();
                Value::String(format!(
                    "{sign}{whole}{fraction}{}",
                    pick(SUFFIXES, *suffix)
                ))
            }
            Qty::Number(n) => Value::from(*n),
        }
    }

    fn to_string(&self) -> String {
        match self.to_json() {
            Value::String(s) => s,
            other => other.to_string(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Resources {
    requests: Vec<(u8, Qty)>,
    limits: Vec<(u8, Qty)>,
}

impl Resources {
    fn to_json(&self) -> Value {
        let list = |entries: &[(u8, Qty)]| {
            let map: Map<String, Value> = entries
                .iter()
                .map(|(name, q)| (pick(RESOURCE_NAMES, *name).to_string(), q.to_json()))
                .collect();
            Value::Object(map)
        };
        let mut out = Map::new();
        if !self.requests.is_empty() {
            out.insert("requests".into(), list(&self.requests));
        }
        if !self.limits.is_empty() {
            out.insert("limits".into(), list(&self.limits));
        }
        Value::Object(out)
    }
}

#[derive(Arbitrary, Debug)]
struct ContainerCase {
    name: u8,
    image: u8,
    command: Option<u8>,
    args: Option<u8>,
    env: Vec<(u8, u8)>,
    mounts: Vec<(u8, u8)>,
    resources: Option<Resources>,
    /// For init containers: a sidecar (`restartPolicy: Always`).
    restart_always: bool,
}

impl ContainerCase {
    fn to_json(&self, index: usize) -> Value {
        let mut c = Map::new();
        // Distinct names unless the fuzzer picks the guard's or collides on purpose.
        let name = pick(CONTAINER_NAMES, self.name);
        let name = if name == "podmend-guard" || index == 0 {
            name.to_string()
        } else {
            format!("{name}-{index}")
        };
        c.insert("name".into(), json!(name));
        c.insert("image".into(), json!(pick(IMAGES, self.image)));
        if let Some(command) = self.command {
            c.insert("command".into(), json!([pick(COMMANDS, command)]));
        }
        if let Some(args) = self.args {
            c.insert("args".into(), json!([pick(COMMANDS, args), "--tls=false"]));
        }
        if !self.env.is_empty() {
            let env: Vec<Value> = self
                .env
                .iter()
                .map(|(n, v)| json!({"name": pick(ENV_NAMES, *n), "value": pick(ENV_VALUES, *v)}))
                .collect();
            c.insert("env".into(), Value::Array(env));
        }
        if !self.mounts.is_empty() {
            let mounts: Vec<Value> = self
                .mounts
                .iter()
                .map(|(n, p)| {
                    json!({"name": pick(VOLUME_NAMES, *n), "mountPath": pick(MOUNT_PATHS, *p)})
                })
                .collect();
            c.insert("volumeMounts".into(), Value::Array(mounts));
        }
        if let Some(resources) = &self.resources {
            c.insert("resources".into(), resources.to_json());
        }
        Value::Object(c)
    }
}

#[derive(Arbitrary, Debug)]
enum VolumeCase {
    HostPath { name: u8, path: u8 },
    EmptyDir { name: u8 },
}

#[derive(Arbitrary, Debug)]
struct TolerationCase {
    key: Option<u8>,
    operator: u8,
    value: Option<u8>,
    effect: u8,
}

/// Existing required node affinity: terms of expressions and fields (an empty term too).
#[derive(Arbitrary, Debug)]
struct AffinityCase {
    terms: Vec<(bool, bool)>,
    preferred: bool,
}

#[derive(Arbitrary, Debug)]
struct SpecCase {
    node_name: Option<u8>,
    containers: Vec<ContainerCase>,
    init_containers: Vec<ContainerCase>,
    volumes: Vec<VolumeCase>,
    tolerations: Vec<TolerationCase>,
    affinity: Option<AffinityCase>,
    pod_resources: Option<Resources>,
    scheduling_gates: bool,
    host_network: bool,
}

impl SpecCase {
    fn to_json(&self) -> Value {
        let mut spec = Map::new();
        if let Some(node) = self.node_name {
            spec.insert("nodeName".into(), json!(pick(NODE_NAMES, node)));
        }
        let containers = |list: &[ContainerCase], init: bool| -> Vec<Value> {
            list.iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut value = c.to_json(i);
                    if init {
                        value["name"] =
                            json!(format!("init-{}", value["name"].as_str().unwrap_or("")));
                        if c.restart_always {
                            value["restartPolicy"] = json!("Always");
                        }
                    }
                    value
                })
                .collect()
        };
        spec.insert(
            "containers".into(),
            Value::Array(containers(&self.containers, false)),
        );
        if !self.init_containers.is_empty() {
            spec.insert(
                "initContainers".into(),
                Value::Array(containers(&self.init_containers, true)),
            );
        }
        if !self.volumes.is_empty() {
            let volumes: Vec<Value> = self
                .volumes
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    VolumeCase::HostPath { name, path } => json!({
                        "name": unique(pick(VOLUME_NAMES, *name), i),
                        "hostPath": {"path": pick(HOST_PATHS, *path)}
                    }),
                    VolumeCase::EmptyDir { name } => {
                        json!({"name": unique(pick(VOLUME_NAMES, *name), i), "emptyDir": {}})
                    }
                })
                .collect();
            spec.insert("volumes".into(), Value::Array(volumes));
        }
        if !self.tolerations.is_empty() {
            let tolerations: Vec<Value> = self
                .tolerations
                .iter()
                .map(|t| {
                    let mut v = Map::new();
                    if let Some(key) = t.key {
                        v.insert("key".into(), json!(pick(TAINT_KEYS, key)));
                    }
                    let operator = pick(OPERATORS, t.operator);
                    if !operator.is_empty() {
                        v.insert("operator".into(), json!(operator));
                    }
                    if let Some(value) = t.value {
                        v.insert("value".into(), json!(pick(TAINT_VALUES, value)));
                    }
                    let effect = pick(EFFECTS, t.effect);
                    if !effect.is_empty() {
                        v.insert("effect".into(), json!(effect));
                    }
                    Value::Object(v)
                })
                .collect();
            spec.insert("tolerations".into(), Value::Array(tolerations));
        }
        if let Some(affinity) = &self.affinity {
            let terms: Vec<Value> = affinity
                .terms
                .iter()
                .map(|(expressions, fields)| {
                    let mut term = Map::new();
                    if *expressions {
                        term.insert(
                            "matchExpressions".into(),
                            json!([{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]),
                        );
                    }
                    if *fields {
                        term.insert(
                            "matchFields".into(),
                            json!([{"key": "metadata.name", "operator": "In", "values": ["worker-1"]}]),
                        );
                    }
                    Value::Object(term)
                })
                .collect();
            let mut node_affinity = Map::new();
            if !terms.is_empty() {
                node_affinity.insert(
                    "requiredDuringSchedulingIgnoredDuringExecution".into(),
                    json!({"nodeSelectorTerms": terms}),
                );
            }
            if affinity.preferred {
                node_affinity.insert(
                    "preferredDuringSchedulingIgnoredDuringExecution".into(),
                    json!([{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]),
                );
            }
            spec.insert("affinity".into(), json!({"nodeAffinity": node_affinity}));
        }
        if let Some(resources) = &self.pod_resources {
            spec.insert("resources".into(), resources.to_json());
        }
        if self.scheduling_gates {
            spec.insert(
                "schedulingGates".into(),
                json!([{"name": "example.com/gate"}]),
            );
        }
        if self.host_network {
            spec.insert("hostNetwork".into(), json!(true));
        }
        Value::Object(spec)
    }
}

fn unique(name: &str, index: usize) -> String {
    if index == 0 {
        name.to_string()
    } else {
        format!("{name}-{index}")
    }
}

/// A value that does not belong where it is put, to reach the engine's refusals.
#[derive(Arbitrary, Debug)]
enum Junk {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(u8),
    EmptyList,
    EmptyMap,
}

impl Junk {
    fn to_json(&self) -> Value {
        match self {
            Junk::Null => Value::Null,
            Junk::Bool(b) => json!(b),
            Junk::Int(n) => json!(n),
            Junk::Float(f) => json!(f),
            Junk::Text(i) => json!(pick(QUANTITIES, *i)),
            Junk::EmptyList => json!([]),
            Junk::EmptyMap => json!({}),
        }
    }
}

/// Where junk may go, relative to the pod spec (or the object, for `metadata` paths).
const JUNK_PATHS: &[&str] = &[
    "/containers/0/resources",
    "/containers/0/resources/requests",
    "/containers/0/resources/limits/cpu",
    "/containers/0/image",
    "/containers/0/volumeMounts",
    "/containers/0/env/0/value",
    "/nodeName",
    "/tolerations",
    "/affinity/nodeAffinity",
    "/volumes/0/hostPath/path",
    "/initContainers/0/restartPolicy",
    "/resources/requests",
];

#[derive(Arbitrary, Debug)]
struct TaintCase {
    key: u8,
    value: Option<u8>,
    effect: u8,
}

#[derive(Arbitrary, Debug)]
struct LimitRangeCase {
    type_: u8,
    min: Vec<(u8, Qty)>,
    max: Vec<(u8, Qty)>,
    ratio: Vec<(u8, Qty)>,
}

/// One fuzz case: an object under review, how it arrives, and the cluster around it.
#[derive(Arbitrary, Debug)]
pub struct Case {
    kind: Kind,
    update: bool,
    /// On UPDATE: whether the old object had another template (else the same one).
    old_differs: bool,
    namespace: u8,
    /// In the request only, in the object only, or both (the object wins when the request has none).
    namespace_in_object: bool,
    labels: Vec<(u8, u8)>,
    annotations: Vec<(u8, u8)>,
    /// A template's metadata besides the object's own (for workloads).
    object_annotations: Vec<(u8, u8)>,
    deployment_owned: bool,
    spec: SpecCase,
    junk: Option<(u8, Junk)>,
    lookups: bool,
    taints: Vec<TaintCase>,
    limit_ranges: Vec<LimitRangeCase>,
}

impl Case {
    /// The AdmissionReview body and the cluster this case describes.
    pub fn build(&self) -> (Vec<u8>, Option<FuzzCluster>) {
        let pairs =
            |list: &[(u8, u8)], keys: &'static [&'static str], values: &'static [&'static str]| {
                let map: Map<String, Value> = list
                    .iter()
                    .map(|(k, v)| (pick(keys, *k).to_string(), json!(pick(values, *v))))
                    .collect();
                Value::Object(map)
            };
        let labels = pairs(&self.labels, LABEL_KEYS, &["", "x", "agent"]);
        let annotations = pairs(&self.annotations, ANNOTATION_KEYS, ANNOTATION_VALUES);
        let mut spec = self.spec.to_json();
        if let Some((path, junk)) = &self.junk {
            let path = pick(JUNK_PATHS, *path);
            if let Some(slot) = spec.pointer_mut(path) {
                *slot = junk.to_json();
            }
        }
        let namespace = pick(NAMESPACES, self.namespace);
        let mut metadata = json!({"name": "fuzz", "uid": "5e3f6c1a-0000-4000-8000-000000000001"});
        if self.namespace_in_object {
            metadata["namespace"] = json!(namespace);
        }
        let template =
            json!({"metadata": {"labels": labels, "annotations": annotations}, "spec": spec});
        let object = match self.kind {
            Kind::Pod | Kind::ConfigMap => {
                metadata["labels"] = template["metadata"]["labels"].clone();
                metadata["annotations"] = template["metadata"]["annotations"].clone();
                json!({"apiVersion": self.kind.api_version(), "kind": self.kind.name(), "metadata": metadata, "spec": template["spec"]})
            }
            kind => {
                metadata["annotations"] =
                    pairs(&self.object_annotations, ANNOTATION_KEYS, ANNOTATION_VALUES);
                if self.deployment_owned {
                    metadata["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": true}]);
                }
                let spec = if matches!(kind, Kind::CronJob) {
                    json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}})
                } else {
                    json!({"template": template})
                };
                json!({"apiVersion": kind.api_version(), "kind": kind.name(), "metadata": metadata, "spec": spec})
            }
        };
        let (group, version) = match self.kind.api_version().split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", "v1"),
        };
        let mut request = json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": self.kind.name()},
            "name": "fuzz",
            "operation": if self.update { "UPDATE" } else { "CREATE" },
            "object": object,
        });
        if !self.namespace_in_object || self.namespace % 2 == 0 {
            request["namespace"] = json!(namespace);
        }
        if self.update {
            let mut old = object.clone();
            if self.old_differs
                && let Some(spec) = old.pointer_mut(template_pointer(self.kind))
            {
                *spec = json!({"containers": [{"name": "old"}]});
            }
            request["oldObject"] = old;
        }
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
        let body = serde_json::to_vec(&review).expect("a review serializes");
        let cluster = self.lookups.then(|| FuzzCluster {
            taints: self
                .taints
                .iter()
                .map(|t| Taint {
                    key: pick(TAINT_KEYS, t.key).to_string(),
                    value: t.value.map(|v| pick(TAINT_VALUES, v).to_string()),
                    effect: pick(EFFECTS, t.effect).to_string(),
                    time_added: None,
                })
                .collect(),
            limit_ranges: self
                .limit_ranges
                .iter()
                .map(|l| {
                    let list = |entries: &[(u8, Qty)]| {
                        (!entries.is_empty()).then(|| {
                            entries
                                .iter()
                                .map(|(n, q)| {
                                    (
                                        pick(RESOURCE_NAMES, *n).to_string(),
                                        Quantity(q.to_string()),
                                    )
                                })
                                .collect()
                        })
                    };
                    LimitRangeItem {
                        type_: pick(LIMIT_TYPES, l.type_).to_string(),
                        min: list(&l.min),
                        max: list(&l.max),
                        max_limit_request_ratio: list(&l.ratio),
                        default: None,
                        default_request: None,
                    }
                })
                .collect(),
        });
        (body, cluster)
    }
}

fn template_pointer(kind: Kind) -> &'static str {
    match kind {
        Kind::Pod | Kind::ConfigMap => "/spec",
        Kind::CronJob => "/spec/jobTemplate/spec/template/spec",
        _ => "/spec/template/spec",
    }
}

/// The `review_structured` target.
pub fn check(data: &[u8]) {
    let mut input = Unstructured::new(data);
    let Ok(case) = Case::arbitrary(&mut input) else {
        return;
    };
    let (body, cluster) = case.build();
    let request = review::decode(&body).expect("a built review decodes");
    match cluster {
        Some(cluster) => {
            let limit_ranges = review::limit_range_values(&cluster.limit_ranges);
            review::check_request(&request, &cluster, &limit_ranges);
        }
        None => review::check_request(&request, &podmend::cluster::StaticCluster::offline(), &[]),
    }
}
