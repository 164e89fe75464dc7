//! The cluster the stand-in serves: N Nodes, N LimitRanges, M Pods and R ReplicaSets, built
//! from the fixtures in `tests/fixtures/cluster/` and the GKE pod capture, made as large as
//! the real objects are.
//!
//! - **Nodes**, "real" shape: the kubeadm control-plane and cordoned-worker fixtures, with
//!   what a kubelet on a cloud VM reports on top: ~15 labels (hostname, topology, instance
//!   type, node group), the CSI node-id and provided-IP annotations, `providerID`, pod CIDRs,
//!   addresses, `nodeInfo`, capacity and allocatable, the four conditions, the kubelet's
//!   status `managedFields`, and **50 `status.images`** (the kubelet's default
//!   `nodeStatusMaxImages`) each with a digest name, a tag name and a size. Three in the
//!   first hundred are control planes (tainted), every tenth is tainted
//!   `dedicated=ci:NoSchedule`, every fiftieth is cordoned. About 14 KB of JSON each.
//!   "Bare" shape: the same names, labels and taints (what the rules read), nothing else.
//! - **LimitRanges**: one per namespace `ns-00000`…, alternately the two LimitRange fixtures.
//! - **ReplicaSets**: Deployment-owned, `app-NNNNNN-<hash>`, spread over `--namespaces`
//!   namespaces, templated on the GKE capture's pod spec; one in a hundred is the Pinniped
//!   kube-cert-agent ReplicaSet of the fixtures (pinned with `nodeName`: a finding).
//! - **Pods**: M pods spread evenly over the ReplicaSets (`ownerReferences`), each the GKE
//!   capture's pod scheduled on a node and `Running` (conditions, IPs, container status);
//!   those of the Pinniped ReplicaSets are the fixture pod the kubelet rejected (`Failed`,
//!   `OutOfcpu`): the audit counts them for its symptoms.
//!
//! Every value is derived from the object's index, so a run is the same every time.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::template::Template;

/// The sizes of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub nodes: usize,
    /// Nodes without status, annotations or managedFields.
    pub bare_nodes: bool,
    pub limit_ranges: usize,
    pub pods: usize,
    pub replicasets: usize,
    /// Namespaces the ReplicaSets and pods are spread over.
    pub namespaces: usize,
}

/// Images per node: the kubelet reports at most `nodeStatusMaxImages` (default 50).
pub const IMAGES_PER_NODE: usize = 50;
/// One ReplicaSet in this many is the Pinniped agent's (a finding; its pods failed).
const PINNIPED_EVERY: usize = 100;

/// Renders item `index` of a collection, appending its JSON.
pub type Render = Box<dyn Fn(usize, &mut Vec<u8>) + Send + Sync>;

/// One listable resource.
pub struct Collection {
    /// `nodes`, `replicasets`, ...
    pub resource: &'static str,
    /// `v1`, `apps/v1`, ...
    pub api_version: &'static str,
    pub kind: &'static str,
    pub len: usize,
    pub render: Render,
}

impl Collection {
    /// `/api/v1/nodes`, `/apis/apps/v1/replicasets`.
    pub fn path(&self) -> String {
        if self.api_version.contains('/') {
            format!("/apis/{}/{}", self.api_version, self.resource)
        } else {
            format!("/api/{}/{}", self.api_version, self.resource)
        }
    }

    /// One item as JSON.
    pub fn item(&self, index: usize) -> anyhow::Result<Value> {
        let mut out = Vec::new();
        (self.render)(index, &mut out);
        serde_json::from_slice(&out)
            .with_context(|| format!("{} item {index} is not JSON", self.resource))
    }

    fn empty(resource: &'static str, api_version: &'static str, kind: &'static str) -> Self {
        Collection {
            resource,
            api_version,
            kind,
            len: 0,
            render: Box::new(|_, _| {}),
        }
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_json(name: &str) -> anyhow::Result<Value> {
    let path = fixtures().join(name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// A deterministic 64-bit mix (splitmix64) of a stream tag and an index.
fn mix(tag: u64, index: u64) -> u64 {
    let mut z = tag
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hex(tag: u64, index: u64, len: usize) -> String {
    let mut out = String::with_capacity(len + 16);
    let mut round = 0;
    while out.len() < len {
        out.push_str(&format!("{:016x}", mix(tag, index * 16 + round)));
        round += 1;
    }
    out.truncate(len);
    out
}

fn make_uid(tag: u64, index: u64) -> String {
    let h = hex(tag, index, 32);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// Like the suffixes Kubernetes generates (`rand.SafeEncodeString`).
fn safe_string(tag: u64, index: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = mix(tag, index);
    (0..len)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn ipv4(base: u8, index: usize) -> String {
    format!("10.{base}.{}.{}", (index / 250) % 256, index % 250 + 1)
}

fn node_name(k: usize) -> String {
    format!("node-{k:05}")
}

fn namespace(n: usize) -> String {
    format!("ns-{n:05}")
}

// ---------------------------------------------------------------------------------------
// Nodes

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeVariant {
    ControlPlane,
    Worker,
    Dedicated,
    Cordoned,
}

impl NodeVariant {
    const ALL: [NodeVariant; 4] = [
        NodeVariant::ControlPlane,
        NodeVariant::Worker,
        NodeVariant::Dedicated,
        NodeVariant::Cordoned,
    ];

    fn of(k: usize) -> NodeVariant {
        match k % 100 {
            0..=2 => NodeVariant::ControlPlane,
            _ if k % 50 == 49 => NodeVariant::Cordoned,
            _ if k % 10 == 9 => NodeVariant::Dedicated,
            _ => NodeVariant::Worker,
        }
    }
}

const NODE_VARS: &[&str] = &[
    "name", "uid", "rv", "zone", "ip", "podcidr", "instance", "boot", "machine",
];

/// The 50 images a kubelet reports, largest first: the cluster's own, then applications'.
fn images(variant: NodeVariant) -> Vec<Value> {
    let system: &[(&str, &str, u64)] = &[
        ("registry.k8s.io/pause", "3.10", 320_368),
        ("registry.k8s.io/kube-proxy", "v1.33.1", 31_894_231),
        ("registry.k8s.io/coredns/coredns", "v1.12.0", 20_939_036),
        (
            "registry.k8s.io/sig-storage/csi-node-driver-registrar",
            "v2.13.0",
            14_387_654,
        ),
        (
            "registry.k8s.io/sig-storage/livenessprobe",
            "v2.15.0",
            13_744_296,
        ),
        (
            "public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver",
            "v1.43.0",
            94_538_113,
        ),
        ("quay.io/prometheus/node-exporter", "v1.9.1", 12_874_553),
        ("cr.fluentbit.io/fluent/fluent-bit", "4.0.3", 35_012_981),
        ("quay.io/calico/node", "v3.30.1", 157_354_119),
        ("quay.io/calico/cni", "v3.30.1", 96_003_212),
        (
            "registry.k8s.io/metrics-server/metrics-server",
            "v0.7.2",
            19_494_617,
        ),
        ("docker.io/jmalloc/echo-server", "latest", 4_296_140),
    ];
    let control_plane: &[(&str, &str, u64)] = &[
        ("registry.k8s.io/etcd", "3.5.21-0", 58_938_593),
        ("registry.k8s.io/kube-apiserver", "v1.33.1", 30_071_307),
        (
            "registry.k8s.io/kube-controller-manager",
            "v1.33.1",
            27_646_507,
        ),
        ("registry.k8s.io/kube-scheduler", "v1.33.1", 21_776_259),
    ];
    let mut list: Vec<(String, String, u64)> = system
        .iter()
        .chain(if variant == NodeVariant::ControlPlane {
            control_plane
        } else {
            &[]
        })
        .map(|&(repo, tag, size)| (repo.to_string(), tag.to_string(), size))
        .collect();
    let mut app = 0u64;
    while list.len() < IMAGES_PER_NODE {
        let team = app % 17;
        let service = app / 17;
        list.push((
            format!("registry.example.com/team-{team:02}/service-{service:02}"),
            format!("v1.{}.{}", mix(1, app) % 40, mix(2, app) % 10),
            40_000_000 + mix(3, app) % 600_000_000,
        ));
        app += 1;
    }
    list.sort_by_key(|image| std::cmp::Reverse(image.2));
    list.iter()
        .enumerate()
        .map(|(i, (repo, tag, size))| {
            json!({
                "names": [
                    format!("{repo}@sha256:{}", hex(4, i as u64 + 100 * variant as u64, 64)),
                    format!("{repo}:{tag}"),
                ],
                "sizeBytes": size,
            })
        })
        .collect()
}

fn node_template(variant: NodeVariant, bare: bool) -> anyhow::Result<Template> {
    let fixture = match variant {
        NodeVariant::ControlPlane => "cluster/node-kubeadm-control-plane.json",
        _ => "cluster/node-cordoned-worker.json",
    };
    let mut node = read_json(fixture)?;
    node.as_object_mut()
        .context("a Node fixture is an object")?
        .retain(|k, _| k != "apiVersion" && k != "kind");
    let metadata = &mut node["metadata"];
    metadata["name"] = json!("@@name@@");
    metadata["uid"] = json!("@@uid@@");
    metadata["resourceVersion"] = json!("@@rv@@");
    let labels = metadata["labels"]
        .as_object_mut()
        .context("fixture node labels")?;
    labels.insert("kubernetes.io/hostname".into(), json!("@@name@@"));
    for (key, value) in [
        ("topology.kubernetes.io/region", "eu-west-1"),
        ("topology.kubernetes.io/zone", "eu-west-1@@zone@@"),
        ("failure-domain.beta.kubernetes.io/region", "eu-west-1"),
        (
            "failure-domain.beta.kubernetes.io/zone",
            "eu-west-1@@zone@@",
        ),
        ("topology.ebs.csi.aws.com/zone", "eu-west-1@@zone@@"),
        ("node.kubernetes.io/instance-type", "m6i.xlarge"),
        ("beta.kubernetes.io/instance-type", "m6i.xlarge"),
        ("node.example.com/pool", "general-purpose"),
    ] {
        labels.insert(key.into(), json!(value));
    }
    let mut spec = json!({});
    match variant {
        NodeVariant::ControlPlane | NodeVariant::Cordoned => {
            spec["taints"] = node["spec"]["taints"].clone();
        }
        NodeVariant::Dedicated => {
            spec["taints"] = json!([{"key": "dedicated", "value": "ci", "effect": "NoSchedule"}]);
        }
        NodeVariant::Worker => {}
    }
    if variant == NodeVariant::Cordoned {
        spec["unschedulable"] = json!(true);
    }

    if bare {
        let metadata = json!({
            "name": "@@name@@",
            "uid": "@@uid@@",
            "resourceVersion": "@@rv@@",
            "creationTimestamp": node["metadata"]["creationTimestamp"],
            "labels": node["metadata"]["labels"],
        });
        return Template::new(&json!({"metadata": metadata, "spec": spec}), NODE_VARS);
    }

    let annotations = node["metadata"]["annotations"]
        .as_object_mut()
        .context("fixture node annotations")?;
    annotations.insert(
        "csi.volume.kubernetes.io/nodeid".into(),
        json!("{\"ebs.csi.aws.com\":\"i-@@instance@@\"}"),
    );
    annotations.insert(
        "alpha.kubernetes.io/provided-node-ip".into(),
        json!("@@ip@@"),
    );
    let managed = node["metadata"]
        .get_mut("managedFields")
        .and_then(Value::as_array_mut);
    let kubelet_status = json!({
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {
            "f:allocatable": {"f:cpu": {}, "f:ephemeral-storage": {}, "f:memory": {}, "f:pods": {}},
            "f:capacity": {"f:cpu": {}, "f:ephemeral-storage": {}, "f:memory": {}, "f:pods": {}},
            "f:conditions": {
                "k:{\"type\":\"DiskPressure\"}": {"f:lastHeartbeatTime": {}},
                "k:{\"type\":\"MemoryPressure\"}": {"f:lastHeartbeatTime": {}},
                "k:{\"type\":\"PIDPressure\"}": {"f:lastHeartbeatTime": {}},
                "k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}}
            },
            "f:images": {},
            "f:nodeInfo": {"f:bootID": {}, "f:containerRuntimeVersion": {}, "f:kernelVersion": {}, "f:kubeletVersion": {}}
        }},
        "manager": "kubelet",
        "operation": "Update",
        "subresource": "status",
        "time": "2025-06-03T11:02:44Z"
    });
    match managed {
        Some(list) => list.push(kubelet_status),
        None => node["metadata"]["managedFields"] = json!([kubelet_status]),
    }
    spec["podCIDR"] = json!("@@podcidr@@");
    spec["podCIDRs"] = json!(["@@podcidr@@"]);
    spec["providerID"] = json!("aws:///eu-west-1@@zone@@/i-@@instance@@");
    node["spec"] = spec;
    let status = &mut node["status"];
    status["addresses"] = json!([
        {"type": "InternalIP", "address": "@@ip@@"},
        {"type": "InternalDNS", "address": "@@name@@.eu-west-1.compute.internal"},
        {"type": "Hostname", "address": "@@name@@.eu-west-1.compute.internal"},
    ]);
    let info = &mut status["nodeInfo"];
    info["bootID"] = json!("@@boot@@");
    info["machineID"] = json!("@@machine@@");
    info["systemUUID"] = json!("@@uid@@");
    status["images"] = Value::Array(images(variant));
    Template::new(&node, NODE_VARS)
}

fn nodes(count: usize, bare: bool) -> anyhow::Result<Collection> {
    let templates: Vec<Template> = NodeVariant::ALL
        .iter()
        .map(|&v| node_template(v, bare))
        .collect::<anyhow::Result<_>>()?;
    Ok(Collection {
        resource: "nodes",
        api_version: "v1",
        kind: "Node",
        len: count,
        render: Box::new(move |k, out| {
            let variant = NodeVariant::of(k);
            let template = &templates[NodeVariant::ALL
                .iter()
                .position(|&v| v == variant)
                .unwrap_or(1)];
            let name = node_name(k);
            let uid = make_uid(10, k as u64);
            let rv = (100_000 + k).to_string();
            let zone = ["a", "b", "c"][k % 3];
            let ip = ipv4(20, k);
            let podcidr = format!("10.{}.{}.0/24", 100 + k / 256 % 100, k % 256);
            let instance = hex(11, k as u64, 17);
            let boot = make_uid(12, k as u64);
            let machine = hex(13, k as u64, 32);
            template.render(
                out,
                &[
                    &name, &uid, &rv, zone, &ip, &podcidr, &instance, &boot, &machine,
                ],
            );
        }),
    })
}

// ---------------------------------------------------------------------------------------
// LimitRanges

const LIMIT_RANGE_VARS: &[&str] = &["ns", "uid", "rv"];

fn limit_ranges(count: usize) -> anyhow::Result<Collection> {
    let templates: Vec<Template> = [
        "cluster/limitrange-ci-agents-container-defaults.json",
        "cluster/limitrange-default-pod-container-pvc.json",
    ]
    .iter()
    .map(|name| {
        let mut lr = read_json(name)?;
        lr.as_object_mut()
            .context("a LimitRange fixture is an object")?
            .retain(|k, _| k != "apiVersion" && k != "kind");
        lr["metadata"]["namespace"] = json!("@@ns@@");
        lr["metadata"]["uid"] = json!("@@uid@@");
        lr["metadata"]["resourceVersion"] = json!("@@rv@@");
        if let Some(applied) = lr
            .pointer_mut("/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration")
        {
            let text = applied.as_str().unwrap_or_default().to_string();
            // The namespace inside the annotation too (escaped quotes around it are kept).
            *applied = json!(text.replace("ci-agents", "@@ns@@"));
        }
        Template::new(&lr, LIMIT_RANGE_VARS)
    })
    .collect::<anyhow::Result<_>>()?;
    Ok(Collection {
        resource: "limitranges",
        api_version: "v1",
        kind: "LimitRange",
        len: count,
        render: Box::new(move |i, out| {
            let ns = namespace(i);
            let uid = make_uid(20, i as u64);
            let rv = (300_000 + i).to_string();
            templates[i % templates.len()].render(out, &[&ns, &uid, &rv]);
        }),
    })
}

// ---------------------------------------------------------------------------------------
// Namespaces

/// The namespaces the other objects are in (`ns-00000`, ...): what `serve` watches for their
/// toleration whitelists, none of which names one.
fn namespaces(count: usize) -> Collection {
    Collection {
        resource: "namespaces",
        api_version: "v1",
        kind: "Namespace",
        len: count,
        render: Box::new(move |i, out| {
            let item = json!({
                "metadata": {"name": namespace(i), "uid": make_uid(30, i as u64),
                             "resourceVersion": (400_000 + i).to_string(),
                             "labels": {"kubernetes.io/metadata.name": namespace(i)}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"}
            });
            let _ = serde_json::to_writer(out, &item);
        }),
    }
}

// ---------------------------------------------------------------------------------------
// ReplicaSets and pods

/// The pod the GKE capture creates, as the API server stores it (no status yet).
fn gke_pod() -> anyhow::Result<Value> {
    let review = read_json("admissionreview-v1-pod-create-gke-kube-rs.json")?;
    review
        .pointer("/request/object")
        .cloned()
        .context("the GKE capture has no request.object")
}

fn pinniped(sizes: &Sizes, j: usize) -> bool {
    sizes.replicasets >= PINNIPED_EVERY && j % PINNIPED_EVERY == PINNIPED_EVERY / 2
}

const RS_VARS: &[&str] = &["j", "hash", "ns", "uid", "rv", "duid"];

fn pods_per_rs(sizes: &Sizes) -> usize {
    sizes.pods.div_ceil(sizes.replicasets.max(1))
}

fn replicaset_templates(sizes: &Sizes) -> anyhow::Result<(Template, Template)> {
    let replicas = pods_per_rs(sizes);
    let gke = gke_pod()?;
    let mut pod_spec = gke["spec"].clone();
    pod_spec
        .as_object_mut()
        .context("pod spec")?
        .remove("nodeName");
    let labels = json!({"app": "app-@@j@@", "pod-template-hash": "@@hash@@"});
    let plain = json!({
        "metadata": {
            "annotations": {
                "deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                "deployment.kubernetes.io/max-replicas": (replicas + replicas.div_ceil(4)).to_string(),
                "deployment.kubernetes.io/revision": "1",
            },
            "creationTimestamp": "2025-06-02T09:20:41Z",
            "generation": 1,
            "labels": labels,
            "managedFields": [
                {"apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:annotations": {".": {}, "f:deployment.kubernetes.io/desired-replicas": {}, "f:deployment.kubernetes.io/max-replicas": {}, "f:deployment.kubernetes.io/revision": {}},
                        "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                        "f:ownerReferences": {".": {}, "k:{\"uid\":\"@@duid@@\"}": {}}},
                    "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"echo-server\"}": {".": {}, "f:image": {}, "f:name": {}, "f:ports": {}}}}}}},
                 "manager": "kube-controller-manager", "operation": "Update", "time": "2025-06-02T09:20:41Z"},
                {"apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:availableReplicas": {}, "f:fullyLabeledReplicas": {}, "f:observedGeneration": {}, "f:readyReplicas": {}, "f:replicas": {}}},
                 "manager": "kube-controller-manager", "operation": "Update", "subresource": "status", "time": "2025-06-02T09:21:30Z"},
            ],
            "name": "app-@@j@@-@@hash@@",
            "namespace": "@@ns@@",
            "ownerReferences": [{
                "apiVersion": "apps/v1", "blockOwnerDeletion": true, "controller": true,
                "kind": "Deployment", "name": "app-@@j@@", "uid": "@@duid@@",
            }],
            "resourceVersion": "@@rv@@",
            "uid": "@@uid@@",
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"creationTimestamp": null, "labels": labels},
                "spec": pod_spec,
            },
        },
        "status": {
            "availableReplicas": replicas,
            "fullyLabeledReplicas": replicas,
            "observedGeneration": 1,
            "readyReplicas": replicas,
            "replicas": replicas,
        },
    });
    let mut agent = read_json("cluster/replicaset-pinniped-kube-cert-agent-nodename.json")?;
    agent
        .as_object_mut()
        .context("the ReplicaSet fixture is an object")?
        .retain(|k, _| k != "apiVersion" && k != "kind");
    agent["metadata"]["name"] = json!("app-@@j@@-@@hash@@");
    agent["metadata"]["namespace"] = json!("@@ns@@");
    agent["metadata"]["uid"] = json!("@@uid@@");
    agent["metadata"]["resourceVersion"] = json!("@@rv@@");
    agent["metadata"]["ownerReferences"][0]["uid"] = json!("@@duid@@");
    for path in [
        "/metadata/labels/pod-template-hash",
        "/spec/selector/matchLabels/pod-template-hash",
        "/spec/template/metadata/labels/pod-template-hash",
    ] {
        if let Some(v) = agent.pointer_mut(path) {
            *v = json!("@@hash@@");
        }
    }
    Ok((
        Template::new(&plain, RS_VARS)?,
        Template::new(&agent, RS_VARS)?,
    ))
}

fn rs_namespace(sizes: &Sizes, j: usize) -> String {
    namespace(j * sizes.namespaces.max(1) / sizes.replicasets.max(1))
}

fn replicasets(sizes: Sizes) -> anyhow::Result<Collection> {
    let (plain, agent) = replicaset_templates(&sizes)?;
    Ok(Collection {
        resource: "replicasets",
        api_version: "apps/v1",
        kind: "ReplicaSet",
        len: sizes.replicasets,
        render: Box::new(move |j, out| {
            let jj = format!("{j:06}");
            let hash = safe_string(30, j as u64, 10);
            let ns = rs_namespace(&sizes, j);
            let uid = make_uid(31, j as u64);
            let rv = (400_000 + j).to_string();
            let duid = uid_of_deployment(j);
            let template = if pinniped(&sizes, j) { &agent } else { &plain };
            template.render(out, &[&jj, &hash, &ns, &uid, &rv, &duid]);
        }),
    })
}

fn uid_of_deployment(j: usize) -> String {
    make_uid(32, j as u64)
}

const POD_VARS: &[&str] = &[
    "j", "hash", "suffix", "ns", "uid", "rv", "rsuid", "node", "hostip", "podip", "cid",
];

fn pod_templates() -> anyhow::Result<(Template, Template)> {
    let mut pod = gke_pod()?;
    pod.as_object_mut()
        .context("the GKE pod is an object")?
        .retain(|k, _| k != "apiVersion" && k != "kind");
    let metadata = &mut pod["metadata"];
    metadata["name"] = json!("app-@@j@@-@@hash@@-@@suffix@@");
    metadata["generateName"] = json!("app-@@j@@-@@hash@@-");
    metadata["namespace"] = json!("@@ns@@");
    metadata["uid"] = json!("@@uid@@");
    metadata["resourceVersion"] = json!("@@rv@@");
    metadata["creationTimestamp"] = json!("2025-06-02T09:21:07Z");
    metadata["labels"] = json!({"app": "app-@@j@@", "pod-template-hash": "@@hash@@"});
    if let Some(m) = metadata.as_object_mut() {
        m.remove("annotations");
    }
    metadata["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "blockOwnerDeletion": true, "controller": true,
        "kind": "ReplicaSet", "name": "app-@@j@@-@@hash@@", "uid": "@@rsuid@@",
    }]);
    pod["spec"]["nodeName"] = json!("@@node@@");
    let at = "2025-06-02T09:21:09Z";
    let condition = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": at});
    pod["status"] = json!({
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
            condition("PodScheduled"),
        ],
        "hostIP": "@@hostip@@",
        "hostIPs": [{"ip": "@@hostip@@"}],
        "podIP": "@@podip@@",
        "podIPs": [{"ip": "@@podip@@"}],
        "startTime": "2025-06-02T09:21:07Z",
        "containerStatuses": [{
            "name": "echo-server",
            "state": {"running": {"startedAt": at}},
            "lastState": {},
            "ready": true,
            "restartCount": 0,
            "image": "docker.io/jmalloc/echo-server:latest",
            "imageID": format!("docker.io/jmalloc/echo-server@sha256:{}", hex(40, 0, 64)),
            "containerID": "containerd://@@cid@@",
            "started": true,
        }],
        "qosClass": "BestEffort",
    });

    let mut agent = read_json("cluster/pod-pinniped-kube-cert-agent-rejected-outofcpu.json")?;
    agent
        .as_object_mut()
        .context("the pod fixture is an object")?
        .retain(|k, _| k != "apiVersion" && k != "kind");
    let metadata = &mut agent["metadata"];
    metadata["name"] = json!("app-@@j@@-@@hash@@-@@suffix@@");
    metadata["generateName"] = json!("app-@@j@@-@@hash@@-");
    metadata["namespace"] = json!("@@ns@@");
    metadata["uid"] = json!("@@uid@@");
    metadata["resourceVersion"] = json!("@@rv@@");
    metadata["labels"]["pod-template-hash"] = json!("@@hash@@");
    metadata["ownerReferences"][0]["name"] = json!("app-@@j@@-@@hash@@");
    metadata["ownerReferences"][0]["uid"] = json!("@@rsuid@@");
    agent["spec"]["nodeName"] = json!("@@node@@");
    Ok((
        Template::new(&pod, POD_VARS)?,
        Template::new(&agent, POD_VARS)?,
    ))
}

fn pods(sizes: Sizes) -> anyhow::Result<Collection> {
    let (plain, agent) = pod_templates()?;
    Ok(Collection {
        resource: "pods",
        api_version: "v1",
        kind: "Pod",
        len: sizes.pods,
        render: Box::new(move |i, out| {
            // Pods of one ReplicaSet are contiguous, so the list stays in namespace order.
            let j = i * sizes.replicasets / sizes.pods.max(1);
            let jj = format!("{j:06}");
            let hash = safe_string(30, j as u64, 10);
            let suffix = safe_string(50, i as u64, 5);
            let ns = rs_namespace(&sizes, j);
            let uid = make_uid(51, i as u64);
            let rv = (1_000_000 + i).to_string();
            let rsuid = make_uid(31, j as u64);
            let k = if sizes.nodes == 0 { 0 } else { i % sizes.nodes };
            let node = node_name(k);
            let hostip = ipv4(20, k);
            let podip = ipv4(128 + (i / 62_500 % 64) as u8, i % 62_500);
            let cid = hex(52, i as u64, 64);
            let template = if pinniped(&sizes, j) { &agent } else { &plain };
            template.render(
                out,
                &[
                    &jj, &hash, &suffix, &ns, &uid, &rv, &rsuid, &node, &hostip, &podip, &cid,
                ],
            );
        }),
    })
}

/// Every collection the stand-in serves: the sizes asked for, and the other kinds
/// `audit --cluster` lists, empty.
pub fn collections(sizes: Sizes) -> anyhow::Result<Vec<Collection>> {
    if sizes.pods > 0 && sizes.replicasets == 0 {
        bail!("--pods needs --replicasets of at least 1: every pod has a ReplicaSet");
    }
    if sizes.replicasets > 0 && sizes.namespaces == 0 {
        bail!("--namespaces must be at least 1");
    }
    let collections = vec![
        nodes(sizes.nodes, sizes.bare_nodes)?,
        limit_ranges(sizes.limit_ranges)?,
        namespaces(sizes.namespaces.max(sizes.limit_ranges)),
        replicasets(sizes)?,
        pods(sizes)?,
        Collection::empty("podtemplates", "v1", "PodTemplate"),
        Collection::empty("replicationcontrollers", "v1", "ReplicationController"),
        Collection::empty("deployments", "apps/v1", "Deployment"),
        Collection::empty("statefulsets", "apps/v1", "StatefulSet"),
        Collection::empty("daemonsets", "apps/v1", "DaemonSet"),
        Collection::empty("jobs", "batch/v1", "Job"),
        Collection::empty("cronjobs", "batch/v1", "CronJob"),
    ];
    // Every template renders valid JSON (the first and last item, and one of each variant).
    for c in &collections {
        let mut probe: Vec<usize> = vec![0, c.len.saturating_sub(1)];
        probe.extend((0..c.len.min(200)).step_by(7));
        for index in probe.into_iter().filter(|&i| i < c.len) {
            c.item(index)?;
        }
    }
    Ok(collections)
}
