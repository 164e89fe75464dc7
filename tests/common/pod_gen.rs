//! Random pod specs for the property tests (proptest), built so the API server accepts them:
//! unique DNS-label container names, requests within limits, hugepages and extended
//! resources with request == limit, pod-level resources above the containers' aggregate,
//! well-formed affinity and tolerations, mounts of volumes that exist.
//!
//! Every quantity is chosen as an exact value first, then written in one of the spellings
//! `resource.ParseQuantity` accepts for that value (`1`, `+1`, `1.`, `1000m`, `.5`, `1e3`,
//! `1E+3`, `1k`, `1Ki`, `1.5Gi`, `999999u`, JSON numbers, ...), so the checks never depend
//! on the spelling. Fields no Kubernetes version has (unknown to any typed client) are
//! planted at the pod, spec, container, resources and affinity levels, each holding a unique
//! marker, and listed in [`PodCase::unknown_fields`] so a test can find them again.
//!
//! One deliberate exception to validity: [`PodCase::api_valid`] is false when required node
//! affinity has `nodeSelectorTerms: []`. Mutating webhooks run before validation, so podmend
//! does see such objects; the tests check it never makes them worse.

use std::fmt;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value, json};

/// The namespace every generated object lives in.
pub const NAMESPACE: &str = "ci";

/// Node names pods may be pinned to; the last one is in no cluster view.
pub const NODE_NAMES: &[&str] = &[
    "worker-1",
    "tainted-1",
    "vk-aci-0",
    "gpu.node-3.example.com",
    "gone-node",
];

/// Taints a node may carry (`Taint` JSON).
pub fn taint_pool() -> Vec<Value> {
    vec![
        json!({"key": "dedicated", "value": "ci", "effect": "NoSchedule"}),
        json!({"key": "virtual-kubelet.io/provider", "value": "azure", "effect": "NoSchedule"}),
        json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2024-05-01T10:00:00Z"}),
        json!({"key": "example.com/maint", "effect": "NoExecute"}),
        json!({"key": "soft", "value": "yes", "effect": "PreferNoSchedule"}),
        json!({"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}),
        json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}),
    ]
}

/// One step from a JSON value to a child. Containers are found by name: a list that gets a
/// new entry in front (an injected sidecar) keeps each container under its own name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
    Named(String),
}

fn key(k: &str) -> Step {
    Step::Key(k.to_string())
}

/// A field no Kubernetes type has, where it was put and what it held.
#[derive(Clone, Debug, PartialEq)]
pub struct UnknownField {
    /// The object holding the field, from the root of the generated object.
    pub parent: Vec<Step>,
    pub name: String,
    pub value: Value,
    /// A string found in `value` and nowhere else in the object.
    pub marker: String,
}

/// One generated object and what the generator knows about it.
#[derive(Clone)]
pub struct PodCase {
    /// A Pod, Deployment or CronJob, as a client sends it (not defaulted).
    pub object: Value,
    pub unknown_fields: Vec<UnknownField>,
    /// False only when required node affinity has `nodeSelectorTerms: []` on purpose.
    pub api_valid: bool,
}

impl fmt::Debug for PodCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let object = serde_json::to_string_pretty(&self.object).map_err(|_| fmt::Error)?;
        write!(
            f,
            "PodCase {{ api_valid: {}, unknown fields: {}, object:\n{object}\n}}",
            self.api_valid,
            self.unknown_fields.len()
        )
    }
}

impl PodCase {
    /// The pointer-like path of the pod spec's parent steps for this object's kind.
    pub fn spec_steps(kind: &str) -> Vec<Step> {
        match kind {
            "Deployment" => vec![key("spec"), key("template"), key("spec")],
            "CronJob" => vec![
                key("spec"),
                key("jobTemplate"),
                key("spec"),
                key("template"),
                key("spec"),
            ],
            _ => vec![key("spec")],
        }
    }
}

/// The value at `steps` under `root`.
pub fn resolve<'a>(root: &'a Value, steps: &[Step]) -> Option<&'a Value> {
    let mut at = root;
    for step in steps {
        at = match step {
            Step::Key(k) => at.get(k)?,
            Step::Index(i) => at.get(*i)?,
            Step::Named(n) => at
                .as_array()?
                .iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(n))?,
        };
    }
    Some(at)
}

fn resolve_mut<'a>(root: &'a mut Value, steps: &[Step]) -> Option<&'a mut Value> {
    let mut at = root;
    for step in steps {
        at = match step {
            Step::Key(k) => at.get_mut(k)?,
            Step::Index(i) => at.get_mut(*i)?,
            Step::Named(n) => at
                .as_array_mut()?
                .iter_mut()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(n))?,
        };
    }
    Some(at)
}

/// Removes the planted unknown fields from `object` (what the API server's decoder does with
/// fields it does not know), so the strict schema can check everything else.
pub fn strip_unknown_fields(object: &mut Value, fields: &[UnknownField]) {
    for field in fields {
        if let Some(Value::Object(map)) = resolve_mut(object, &field.parent) {
            map.remove(&field.name);
        }
    }
}

/// Every planted field is in `object`, under the same parent, with the same value, and its
/// marker appears nowhere else (it did not also land on another container).
pub fn unknown_fields_errors(object: &Value, fields: &[UnknownField]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut strings = Vec::new();
    collect_strings(object, &mut strings);
    for field in fields {
        let found = resolve(object, &field.parent).and_then(|p| p.get(&field.name));
        if found != Some(&field.value) {
            errors.push(format!(
                "unknown field {:?} under {:?}: expected {}, found {}",
                field.name,
                field.parent,
                field.value,
                found.map_or("nothing".to_string(), Value::to_string)
            ));
        }
        let count = strings.iter().filter(|s| **s == field.marker).count();
        if count != 1 {
            errors.push(format!(
                "marker {} of unknown field {:?} appears {count} times in the object",
                field.marker, field.name
            ));
        }
    }
    errors
}

fn collect_strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

// ------------------------------------------------------------------------------------------------
// Quantities
// ------------------------------------------------------------------------------------------------

const KI: i128 = 1024;
const MI: i128 = 1024 * KI;
const GI: i128 = 1024 * MI;

/// Every spelling `resource.ParseQuantity` accepts whose value, rounded up to milli-units as
/// the API server does on decode, is exactly `milli`. `pick` chooses one; 0 is the plain form.
pub fn quantity_spellings(milli: i128) -> Vec<Value> {
    assert!(
        milli >= 0,
        "the generator only makes non-negative quantities"
    );
    let mut out: Vec<Value> = Vec::new();
    let s = |text: String| Value::String(text);
    if milli == 0 {
        for text in [
            "0", "0m", "0.0", ".0", "0.", "+0", "-0", "0e3", "0E-2", "0Ki", "0k", "0u",
        ] {
            out.push(s(text.to_string()));
        }
        out.push(json!(0));
        return out;
    }
    let whole = milli / 1000;
    let fraction = milli % 1000;
    if fraction == 0 {
        let n = whole;
        out.push(s(n.to_string()));
        out.push(s(format!("+{n}")));
        out.push(s(format!("{n}.")));
        out.push(s(format!("{n}.000")));
        if n < (1 << 53) {
            out.push(json!(n as i64));
        }
        let mut k = 0;
        while k < 30 && n % 10i128.pow(k + 1) == 0 {
            k += 1;
        }
        if k > 0 {
            let m = n / 10i128.pow(k);
            out.push(s(format!("{m}e{k}")));
            out.push(s(format!("{m}E+{k}")));
        }
        for (suffix, power) in [
            ("k", 3),
            ("M", 6),
            ("G", 9),
            ("T", 12),
            ("P", 15),
            ("E", 18),
        ] {
            if n % 10i128.pow(power) == 0 {
                out.push(s(format!("{}{suffix}", n / 10i128.pow(power))));
            }
        }
        for (suffix, shift) in [
            ("Ki", 10),
            ("Mi", 20),
            ("Gi", 30),
            ("Ti", 40),
            ("Pi", 50),
            ("Ei", 60),
        ] {
            let unit = 1i128 << shift;
            if n % unit == 0 {
                out.push(s(format!("{}{suffix}", n / unit)));
            } else if (2 * n) % unit == 0 {
                out.push(s(format!("{}.5{suffix}", n / unit)));
            }
        }
    } else {
        let digits = format!("{fraction:03}");
        let trimmed = digits.trim_end_matches('0');
        if whole == 0 {
            out.push(s(format!(".{trimmed}")));
            out.push(s(format!("0.{digits}")));
        } else {
            out.push(s(format!("{whole}.{trimmed}")));
            out.push(s(format!("+{whole}.{digits}")));
        }
        if milli % 500 == 0 && whole < (1 << 50) {
            out.push(json!(milli as f64 / 1000.0));
        }
    }
    out.push(s(format!("{milli}m")));
    out.push(s(format!("{milli}e-3")));
    out.push(s(format!("{}u", milli * 1000)));
    // Finer than a milli-unit: the API server rounds these up to exactly `milli`.
    out.push(s(format!("{}u", milli * 1000 - 1)));
    out.push(s(format!("{}n", milli * 1_000_000 - 999_999)));
    out.push(s(format!("{}.{:06}m", milli - 1, 1)));
    out
}

fn spell(milli: i128, pick: usize) -> Value {
    let spellings = quantity_spellings(milli);
    spellings[pick % spellings.len()].clone()
}

/// The resources a container may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Res {
    Cpu,
    Memory,
    EphemeralStorage,
    HugePages2Mi,
    HugePages1Gi,
    Widget,
    Gpu,
}

impl Res {
    fn name(self) -> &'static str {
        match self {
            Res::Cpu => "cpu",
            Res::Memory => "memory",
            Res::EphemeralStorage => "ephemeral-storage",
            Res::HugePages2Mi => "hugepages-2Mi",
            Res::HugePages1Gi => "hugepages-1Gi",
            Res::Widget => "example.com/widget",
            Res::Gpu => "nvidia.com/gpu",
        }
    }

    /// `IsOvercommitAllowed`: the others need request == limit.
    fn overcommit(self) -> bool {
        matches!(self, Res::Cpu | Res::Memory | Res::EphemeralStorage)
    }

    /// Values in milli-units.
    fn values(self) -> BoxedStrategy<i128> {
        let bytes = |list: Vec<i128>| {
            prop_oneof![
                4 => select(list).prop_map(|b| b * 1000),
                2 => (0i128..=(1 << 36)).prop_map(|b| b * 1000),
                // Fractions of a byte are legal for memory, if odd.
                1 => 0i128..=5_000_000,
            ]
            .boxed()
        };
        match self {
            Res::Cpu => prop_oneof![
                3 => select(vec![0i128, 1, 10, 100, 250, 500, 750, 1000, 1500, 2000, 4000, 64000]),
                1 => 0i128..=20_000,
            ]
            .boxed(),
            Res::Memory | Res::EphemeralStorage => bytes(vec![
                0,
                1,
                1000,
                KI,
                64 * MI,
                128 * MI,
                256 * MI,
                GI,
                GI + GI / 2,
                1_000_000_000,
                2_000_000_000,
                8 * GI,
                1024 * GI,
            ]),
            Res::HugePages2Mi => (0i128..=4).prop_map(|k| k * 2 * MI * 1000).boxed(),
            Res::HugePages1Gi => (0i128..=2).prop_map(|k| k * GI * 1000).boxed(),
            Res::Widget | Res::Gpu => (0i128..=8).prop_map(|k| k * 1000).boxed(),
        }
    }
}

const RESOURCES: [Res; 7] = [
    Res::Cpu,
    Res::Memory,
    Res::EphemeralStorage,
    Res::HugePages2Mi,
    Res::HugePages1Gi,
    Res::Widget,
    Res::Gpu,
];

#[derive(Clone, Copy, Debug)]
enum Shape {
    RequestOnly,
    LimitOnly,
    Both,
}

/// One resource's request and/or limit, before spelling.
#[derive(Clone, Debug)]
struct Amount {
    shape: Shape,
    /// The limit (or the lone request), in milli-units.
    value: i128,
    /// The request as a share of the limit, for `Both`.
    request_percent: i128,
    request_spelling: usize,
    limit_spelling: usize,
}

fn amount(res: Res) -> impl Strategy<Value = Amount> {
    (
        select(vec![Shape::Both, Shape::LimitOnly, Shape::RequestOnly]),
        res.values(),
        prop_oneof![select(vec![100i128, 0, 50, 10, 99]), 0i128..=100],
        0usize..64,
        0usize..64,
    )
        .prop_map(
            move |(shape, value, request_percent, request_spelling, limit_spelling)| Amount {
                shape,
                value,
                request_percent,
                request_spelling,
                limit_spelling,
            },
        )
}

/// A container's `resources`, with the milli values the generator needs for pod-level totals.
#[derive(Clone, Debug, Default)]
struct ResourceSketch {
    /// (resource, request, limit), spelled; `None` where absent.
    entries: Vec<(Res, Option<Value>, Option<Value>)>,
    /// How the object is written when empty: omitted, `{}`, or with empty maps.
    empty_style: u8,
    unknown: Option<UnknownSketch>,
}

impl ResourceSketch {
    /// The request the API server ends up with after defaulting (request, else limit), in
    /// milli-units, and the limit.
    fn effective(&self, res: Res) -> (i128, Option<i128>) {
        let milli = |v: &Option<Value>| v.as_ref().map(value_milli);
        for (r, request, limit) in &self.entries {
            if *r == res {
                let limit = milli(limit);
                return (milli(request).or(limit).unwrap_or(0), limit);
            }
        }
        (0, None)
    }
}

/// The milli value of a spelling made by [`quantity_spellings`] (rounded up like the API).
///
/// Read with the tests' own parser ([`super::k8s_rules::Quantity`]), never with
/// `podmend::quantity`: this second quantity parser is a duplicate on purpose, an oracle
/// written from `resource.ParseQuantity` that must not share a bug with the code under test.
fn value_milli(value: &Value) -> i128 {
    let q = super::k8s_rules::Quantity::from_json(value)
        .unwrap_or_else(|e| panic!("generator spelled an invalid quantity {value}: {e}"));
    i128::from(q.round_up_to_milli().milli_value())
}

fn resources() -> impl Strategy<Value = ResourceSketch> {
    (
        (
            option::weighted(0.6, amount(Res::Cpu)),
            option::weighted(0.55, amount(Res::Memory)),
            option::weighted(0.15, amount(Res::EphemeralStorage)),
            option::weighted(0.07, amount(Res::HugePages2Mi)),
            option::weighted(0.04, amount(Res::HugePages1Gi)),
            option::weighted(0.08, amount(Res::Widget)),
            option::weighted(0.08, amount(Res::Gpu)),
        ),
        0u8..3,
        option::weighted(0.15, unknown_value()),
    )
        .prop_map(|(amounts, empty_style, unknown)| {
            let amounts = [
                amounts.0, amounts.1, amounts.2, amounts.3, amounts.4, amounts.5, amounts.6,
            ];
            let mut entries = Vec::new();
            for (res, amount) in RESOURCES.iter().zip(amounts) {
                let Some(a) = amount else { continue };
                let shape = match (res.overcommit(), a.shape) {
                    (false, Shape::RequestOnly) => Shape::LimitOnly,
                    (_, shape) => shape,
                };
                let request_milli = if res.overcommit() {
                    a.value * a.request_percent / 100
                } else {
                    a.value
                };
                let (request, limit) = match shape {
                    Shape::RequestOnly => (Some(spell(a.value, a.request_spelling)), None),
                    Shape::LimitOnly => (None, Some(spell(a.value, a.limit_spelling))),
                    Shape::Both => (
                        Some(spell(request_milli, a.request_spelling)),
                        Some(spell(a.value, a.limit_spelling)),
                    ),
                };
                entries.push((*res, request, limit));
            }
            // "HugePages require cpu or memory".
            let huge = entries
                .iter()
                .any(|(r, _, _)| matches!(r, Res::HugePages2Mi | Res::HugePages1Gi));
            let cpu_or_memory = entries
                .iter()
                .any(|(r, _, _)| matches!(r, Res::Cpu | Res::Memory));
            if huge && !cpu_or_memory {
                entries.push((Res::Memory, None, Some(json!("64Mi"))));
            }
            ResourceSketch {
                entries,
                empty_style,
                unknown,
            }
        })
}

// ------------------------------------------------------------------------------------------------
// Unknown fields
// ------------------------------------------------------------------------------------------------

/// Field names no Kubernetes type has.
const UNKNOWN_NAMES: &[&str] = &["x-podmend-unknown", "futureField", "zzNewerApiField"];

/// Which name and which shape of value; the marker is assigned when the object is built.
#[derive(Clone, Copy, Debug)]
struct UnknownSketch {
    name: usize,
    shape: u8,
}

fn unknown_value() -> impl Strategy<Value = UnknownSketch> {
    (0..UNKNOWN_NAMES.len(), 0u8..4).prop_map(|(name, shape)| UnknownSketch { name, shape })
}

/// Builds objects and records where unknown fields went.
struct Builder {
    unknown: Vec<UnknownField>,
}

impl Builder {
    fn plant(
        &mut self,
        map: &mut Map<String, Value>,
        at: Vec<Step>,
        sketch: Option<UnknownSketch>,
    ) {
        let Some(sketch) = sketch else { return };
        let marker = format!("podmend-unknown-marker-{}", self.unknown.len());
        let value = match sketch.shape {
            0 => json!({"nested": [1, "a", {"deep": true}], "marker": marker}),
            1 => json!(marker),
            2 => json!([marker, 2, null]),
            _ => json!({"list": [{"name": "not-a-container", "marker": marker}]}),
        };
        let name = UNKNOWN_NAMES[sketch.name].to_string();
        if map.contains_key(&name) {
            return;
        }
        map.insert(name.clone(), value.clone());
        self.unknown.push(UnknownField {
            parent: at,
            name,
            value,
            marker,
        });
    }
}

// ------------------------------------------------------------------------------------------------
// Containers
// ------------------------------------------------------------------------------------------------

const NAME_BASES: &[&str] = &[
    "app", "jnlp", "dind", "docker", "builder", "sidecar", "setup", "x",
];

const IMAGES: &[&str] = &[
    "busybox:1.36",
    "jenkins/inbound-agent:3148.v532a_7e715ee3-1",
    "docker:27-dind",
    "docker:dind-rootless",
    "registry.example.com/library/docker:27.3.1-dind-alpine3.20",
    "docker:27-cli",
    "ghcr.io/example/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "nginx",
];

fn commands() -> Vec<Option<Value>> {
    vec![
        None,
        Some(json!(["dockerd-entrypoint.sh"])),
        Some(json!([
            "dockerd",
            "--host=tcp://0.0.0.0:2375",
            "--host=unix:///var/run/docker.sock"
        ])),
        Some(json!(["sh", "-c", "sleep 3600"])),
        Some(json!(["/usr/local/bin/dockerd"])),
        // Argo's emissary executor wraps every container's command, a dind sidecar's too.
        Some(json!([
            "/var/run/argo/argoexec",
            "emissary",
            "--loglevel",
            "info",
            "--",
            "dockerd-entrypoint.sh"
        ])),
    ]
}

/// What a container's args may be: dockerd for the dind entrypoint, flags for its default
/// branch (as Tekton's and GitLab's daemons pass them).
fn args_options() -> Vec<Option<Value>> {
    vec![
        None,
        Some(json!([
            "dockerd",
            "--host=unix:///var/run/docker.sock",
            "--group=$(DOCKER_GROUP_GID)"
        ])),
        Some(json!(["--storage-driver=vfs", "--debug"])),
        Some(json!(["dockerd", "-H", "tcp://0.0.0.0:2375", "--mtu=1400"])),
    ]
}

/// The dind entrypoint's TLS switch: unset (the image's `/certs`), off, on.
const CERTDIRS: &[Option<&str>] = &[None, Some(""), Some("/certs")];

fn docker_hosts() -> Vec<Value> {
    vec![
        json!({"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}),
        json!({"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"}),
        json!({"name": "DOCKER_HOST", "value": "tcp://localhost:2376"}),
        json!({"name": "DOCKER_HOST", "value": "localhost:2375"}),
        json!({"name": "DOCKER_HOST", "value": "127.0.0.1"}),
        json!({"name": "DOCKER_HOST", "valueFrom": {"configMapKeyRef": {"name": "docker", "key": "host"}}}),
    ]
}

/// The volumes a container may mount: (volume, mount path, the volume itself).
fn mount_kinds() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "docker-sock",
            "/var/run",
            json!({"name": "docker-sock", "emptyDir": {}}),
        ),
        (
            "docker-certs",
            "/certs/client",
            json!({"name": "docker-certs", "emptyDir": {"medium": "Memory"}}),
        ),
        (
            "host-docker",
            "/var/run/docker.sock",
            json!({"name": "host-docker", "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}}),
        ),
        (
            "workspace",
            "/home/jenkins/agent",
            json!({"name": "workspace", "emptyDir": {"sizeLimit": "1Gi"}}),
        ),
        // A node agent's fixed path for the node's socket (sysdig).
        (
            "host-docker",
            "/host/var/run/docker.sock",
            json!({"name": "host-docker", "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}}),
        ),
        // The legacy ARC runner shares /run, not /var/run.
        (
            "run",
            "/run",
            json!({"name": "run", "emptyDir": {"medium": "Memory"}}),
        ),
    ]
}

#[derive(Clone, Debug)]
struct ContainerSketch {
    base: &'static str,
    image: &'static str,
    command: usize,
    args: usize,
    certdir: usize,
    docker_host: Option<usize>,
    tls_verify: bool,
    cert_path: bool,
    other_env: bool,
    mounts: u8,
    privileged: bool,
    /// Init containers only: a restartable sidecar (`restartPolicy: Always`).
    sidecar: bool,
    resources: Option<ResourceSketch>,
    unknown: Option<UnknownSketch>,
}

fn container() -> impl Strategy<Value = ContainerSketch> {
    (
        (
            select(NAME_BASES),
            select(IMAGES),
            0..commands().len(),
            (
                prop_oneof![6 => Just(0), 1 => 1..args_options().len()],
                0..CERTDIRS.len(),
            ),
            option::weighted(0.3, 0..docker_hosts().len()),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            (
                0u8..16,
                prop::bool::weighted(0.1),
                prop::bool::weighted(0.15),
            )
                .prop_map(|(common, agent, run)| {
                    common | u8::from(agent) << 4 | u8::from(run) << 5
                }),
            any::<bool>(),
            any::<bool>(),
            option::weighted(0.8, resources()),
            option::weighted(0.2, unknown_value()),
        ),
    )
        .prop_map(
            |(
                (
                    base,
                    image,
                    command,
                    (args, certdir),
                    docker_host,
                    tls_verify,
                    cert_path,
                    other_env,
                ),
                (mounts, privileged, sidecar, resources, unknown),
            )| ContainerSketch {
                base,
                image,
                command,
                args,
                certdir,
                docker_host,
                tls_verify,
                cert_path,
                other_env,
                mounts,
                privileged,
                sidecar,
                resources,
                unknown,
            },
        )
}

impl ContainerSketch {
    fn build(
        &self,
        name: &str,
        init: bool,
        at: Vec<Step>,
        builder: &mut Builder,
        volumes: &mut Vec<Value>,
    ) -> Value {
        let mut c = Map::new();
        c.insert("name".into(), json!(name));
        c.insert("image".into(), json!(self.image));
        if let Some(command) = &commands()[self.command] {
            c.insert("command".into(), command.clone());
        }
        if let Some(args) = &args_options()[self.args] {
            c.insert("args".into(), args.clone());
        }
        let mut env = Vec::new();
        if self.other_env {
            env.push(json!({"name": "JAVA_OPTS", "value": "-Xmx256m"}));
        }
        if let Some(certdir) = CERTDIRS[self.certdir] {
            env.push(json!({"name": "DOCKER_TLS_CERTDIR", "value": certdir}));
        }
        if let Some(host) = self.docker_host {
            env.push(docker_hosts()[host].clone());
            if self.tls_verify {
                env.push(json!({"name": "DOCKER_TLS_VERIFY", "value": "1"}));
            }
            if self.cert_path {
                env.push(json!({"name": "DOCKER_CERT_PATH", "value": "/certs/client"}));
            }
        }
        if !env.is_empty() {
            c.insert("env".into(), Value::Array(env));
        }
        let mut mounts = Vec::new();
        for (bit, (volume, path, definition)) in mount_kinds().into_iter().enumerate() {
            if self.mounts & (1 << bit) != 0 {
                mounts.push(json!({"name": volume, "mountPath": path}));
                if !volumes.iter().any(|v| v["name"] == volume) {
                    volumes.push(definition);
                }
            }
        }
        if !mounts.is_empty() {
            c.insert("volumeMounts".into(), Value::Array(mounts));
        }
        if self.privileged {
            c.insert("securityContext".into(), json!({"privileged": true}));
        }
        if init && self.sidecar {
            c.insert("restartPolicy".into(), json!("Always"));
        }
        if let Some(resources) = &self.resources {
            let mut r = Map::new();
            let mut requests = Map::new();
            let mut limits = Map::new();
            for (res, request, limit) in &resources.entries {
                if let Some(q) = request {
                    requests.insert(res.name().to_string(), q.clone());
                }
                if let Some(q) = limit {
                    limits.insert(res.name().to_string(), q.clone());
                }
            }
            if !requests.is_empty() || resources.empty_style == 2 {
                r.insert("requests".into(), Value::Object(requests));
            }
            if !limits.is_empty() || resources.empty_style == 2 {
                r.insert("limits".into(), Value::Object(limits));
            }
            if !r.is_empty() || resources.empty_style != 0 || resources.unknown.is_some() {
                let mut at = at.clone();
                at.push(key("resources"));
                builder.plant(&mut r, at, resources.unknown);
                c.insert("resources".into(), Value::Object(r));
            }
        }
        builder.plant(&mut c, at, self.unknown);
        Value::Object(c)
    }
}

// ------------------------------------------------------------------------------------------------
// Affinity
// ------------------------------------------------------------------------------------------------

const LABEL_KEYS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "node-role.kubernetes.io/agent",
    "disktype",
    "example.com/gpu-count",
];
const LABEL_VALUES: &[&str] = &["linux", "ssd", "zone-a", "true", "1", "worker-1"];

fn match_expression() -> impl Strategy<Value = Value> {
    (
        select(LABEL_KEYS),
        select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
        vec(select(LABEL_VALUES), 1..3),
        0u32..100,
    )
        .prop_map(|(key, operator, values, number)| match operator {
            "In" | "NotIn" => json!({"key": key, "operator": operator, "values": values}),
            "Gt" | "Lt" => {
                json!({"key": key, "operator": operator, "values": [number.to_string()]})
            }
            _ => json!({"key": key, "operator": operator}),
        })
}

fn match_field() -> impl Strategy<Value = Value> {
    (select(vec!["In", "NotIn"]), select(NODE_NAMES)).prop_map(
        |(operator, node)| json!({"key": "metadata.name", "operator": operator, "values": [node]}),
    )
}

/// A node selector term: `{}`, empty lists, expressions and/or fields.
#[derive(Clone, Debug)]
struct TermSketch {
    expressions: Option<Vec<Value>>,
    fields: Option<Vec<Value>>,
    unknown: Option<UnknownSketch>,
}

fn term() -> impl Strategy<Value = TermSketch> {
    (
        option::of(vec(match_expression(), 0..3)),
        option::of(vec(match_field(), 0..2)),
        option::weighted(0.1, unknown_value()),
    )
        .prop_map(|(expressions, fields, unknown)| TermSketch {
            expressions,
            fields,
            unknown,
        })
}

impl TermSketch {
    fn build(&self, at: Vec<Step>, builder: &mut Builder) -> Value {
        let mut t = Map::new();
        if let Some(e) = &self.expressions {
            t.insert("matchExpressions".into(), json!(e));
        }
        if let Some(f) = &self.fields {
            t.insert("matchFields".into(), json!(f));
        }
        builder.plant(&mut t, at, self.unknown);
        Value::Object(t)
    }
}

#[derive(Clone, Debug)]
enum Required {
    /// `nodeSelectorTerms: []`: invalid, on purpose.
    NoTerms,
    Terms(Vec<TermSketch>),
}

#[derive(Clone, Debug)]
struct NodeAffinitySketch {
    required: Option<Required>,
    preferred: Option<Vec<(i64, TermSketch)>>,
    unknown: Option<UnknownSketch>,
    unknown_required: Option<UnknownSketch>,
}

#[derive(Clone, Debug)]
enum AffinitySketch {
    /// `affinity: {}`
    Empty,
    Some {
        node: Option<NodeAffinitySketch>,
        pod_affinity: bool,
        pod_anti_affinity: bool,
        unknown: Option<UnknownSketch>,
    },
}

fn node_affinity() -> impl Strategy<Value = NodeAffinitySketch> {
    (
        option::of(prop_oneof![
            1 => Just(Required::NoTerms),
            6 => vec(term(), 1..4).prop_map(Required::Terms),
        ]),
        option::of(vec((1i64..=100, term()), 0..3)),
        option::weighted(0.2, unknown_value()),
        option::weighted(0.1, unknown_value()),
    )
        .prop_map(
            |(required, preferred, unknown, unknown_required)| NodeAffinitySketch {
                required,
                preferred,
                unknown,
                unknown_required,
            },
        )
}

fn affinity() -> impl Strategy<Value = AffinitySketch> {
    prop_oneof![
        1 => Just(AffinitySketch::Empty),
        5 => (
            option::weighted(0.85, node_affinity()),
            any::<bool>(),
            any::<bool>(),
            option::weighted(0.2, unknown_value()),
        )
            .prop_map(|(node, pod_affinity, pod_anti_affinity, unknown)| AffinitySketch::Some {
                node,
                pod_affinity,
                pod_anti_affinity,
                unknown,
            }),
    ]
}

impl AffinitySketch {
    /// The affinity JSON, and whether it is valid (false for `nodeSelectorTerms: []`).
    fn build(&self, at: Vec<Step>, builder: &mut Builder) -> (Value, bool) {
        let AffinitySketch::Some {
            node,
            pod_affinity,
            pod_anti_affinity,
            unknown,
        } = self
        else {
            return (json!({}), true);
        };
        let mut valid = true;
        let mut a = Map::new();
        if let Some(node) = node {
            let mut na = Map::new();
            let na_at = [at.clone(), vec![key("nodeAffinity")]].concat();
            if let Some(required) = &node.required {
                let required_at = [
                    na_at.clone(),
                    vec![key("requiredDuringSchedulingIgnoredDuringExecution")],
                ]
                .concat();
                let terms: Vec<Value> = match required {
                    Required::NoTerms => {
                        valid = false;
                        Vec::new()
                    }
                    Required::Terms(terms) => terms
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            let term_at = [
                                required_at.clone(),
                                vec![key("nodeSelectorTerms"), Step::Index(i)],
                            ]
                            .concat();
                            t.build(term_at, builder)
                        })
                        .collect(),
                };
                let mut r = Map::new();
                r.insert("nodeSelectorTerms".into(), Value::Array(terms));
                builder.plant(&mut r, required_at, node.unknown_required);
                na.insert(
                    "requiredDuringSchedulingIgnoredDuringExecution".into(),
                    Value::Object(r),
                );
            }
            if let Some(preferred) = &node.preferred {
                let list: Vec<Value> = preferred
                    .iter()
                    .enumerate()
                    .map(|(i, (weight, t))| {
                        let term_at = [
                            na_at.clone(),
                            vec![
                                key("preferredDuringSchedulingIgnoredDuringExecution"),
                                Step::Index(i),
                                key("preference"),
                            ],
                        ]
                        .concat();
                        json!({"weight": weight, "preference": t.build(term_at, builder)})
                    })
                    .collect();
                na.insert(
                    "preferredDuringSchedulingIgnoredDuringExecution".into(),
                    Value::Array(list),
                );
            }
            builder.plant(&mut na, na_at, node.unknown);
            a.insert("nodeAffinity".into(), Value::Object(na));
        }
        let pod_term = json!({"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"});
        if *pod_affinity {
            a.insert(
                "podAffinity".into(),
                json!({"requiredDuringSchedulingIgnoredDuringExecution": [pod_term]}),
            );
        }
        if *pod_anti_affinity {
            a.insert(
                "podAntiAffinity".into(),
                json!({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": pod_term}]}),
            );
        }
        builder.plant(&mut a, at, *unknown);
        (Value::Object(a), valid)
    }
}

// ------------------------------------------------------------------------------------------------
// Pod-level resources
// ------------------------------------------------------------------------------------------------

/// Pod-level cpu or memory: the request as the aggregate plus `extra_request`, and maybe a
/// limit above everything it must be above.
#[derive(Clone, Debug)]
struct PodLevelAmount {
    extra_request: Option<i128>,
    limit: Option<i128>,
    request_spelling: usize,
    limit_spelling: usize,
}

fn pod_level_amount(step: i128) -> impl Strategy<Value = PodLevelAmount> {
    (
        option::of(prop_oneof![
            Just(0i128),
            (0i128..=8).prop_map(move |k| k * step)
        ]),
        option::of((0i128..=8).prop_map(move |k| k * step)),
        0usize..64,
        0usize..64,
    )
        .prop_map(
            |(extra_request, limit, request_spelling, limit_spelling)| PodLevelAmount {
                extra_request,
                limit,
                request_spelling,
                limit_spelling,
            },
        )
}

/// `AggregateContainerRequests`/`Limits` over (init?, sidecar?, value) triples, in order.
fn aggregate(containers: &[(bool, bool, i128)]) -> i128 {
    let mut sum: i128 = containers
        .iter()
        .filter(|(init, _, _)| !init)
        .map(|c| c.2)
        .sum();
    let mut sidecars = 0;
    let mut init_peak = 0;
    for (_, sidecar, value) in containers.iter().filter(|(init, _, _)| *init) {
        if *sidecar {
            sum += value;
            sidecars += value;
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(value + sidecars);
        }
    }
    sum.max(init_peak)
}

// ------------------------------------------------------------------------------------------------
// The pod
// ------------------------------------------------------------------------------------------------

fn tolerations() -> Vec<Value> {
    vec![
        json!({"operator": "Exists"}),
        json!({"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}),
        json!({"key": "virtual-kubelet.io/provider", "operator": "Exists"}),
        json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        json!({"key": "example.com/maint", "value": "", "effect": "NoSchedule"}),
        json!({"effect": "NoSchedule", "operator": "Exists"}),
    ]
}

fn label_pool() -> Vec<(&'static str, &'static str)> {
    vec![
        ("jenkins/label", "build-agent_x"),
        ("jenkins/label", ""),
        ("kube-cert-agent.pinniped.dev", "v2"),
        // The default config's one preset: twice, so that it selects a fair share of cases.
        ("kube-cert-agent.pinniped.dev", "v3"),
        ("app", "web"),
        ("jenkins", "slave"),
        ("tier", "ci"),
    ]
}

fn annotation_pool() -> Vec<(&'static str, &'static str)> {
    vec![
        ("podmend.io/agent", "true"),
        ("podmend.io/agent", "false"),
        ("podmend.io/dind-policy", "rm"),
        ("podmend.io/dind-policy", "deny"),
        ("podmend.io/dind-policy", "reap"),
        ("podmend.io/dind-policy", "audit"),
        ("podmend.io/dind-policy", "off"),
        ("podmend.io/dind-policy", "Bogus"),
        ("podmend.io/skip", "node-affinity"),
        ("podmend.io/skip", "agent-requests, dind-rm"),
        ("podmend.io/skip", "all"),
        ("podmend.io/mutated", "node-affinity"),
        ("example.com/note", "a note"),
    ]
}

/// A map from up to three pool entries (the first of a key wins); `None`, `{}` or filled.
fn string_map(
    pool: Vec<(&'static str, &'static str)>,
) -> impl Strategy<Value = Option<Vec<(&'static str, &'static str)>>> {
    option::of(vec(select(pool), 0..4))
}

fn to_map(entries: &[(&str, &str)]) -> Map<String, Value> {
    let mut map = Map::new();
    for (k, v) in entries {
        map.entry(k.to_string()).or_insert_with(|| json!(v));
    }
    map
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pod,
    Deployment,
    CronJob,
}

#[derive(Clone, Debug)]
struct PodSketch {
    kind: Kind,
    generate_name: bool,
    containers: Vec<ContainerSketch>,
    init_containers: Option<Vec<ContainerSketch>>,
    node_name: Option<&'static str>,
    node_selector: Option<Vec<(&'static str, &'static str)>>,
    tolerations: Option<Vec<Value>>,
    affinity: Option<AffinitySketch>,
    scheduling_gate: bool,
    pod_cpu: Option<PodLevelAmount>,
    pod_memory: Option<PodLevelAmount>,
    restart_policy: usize,
    labels: Option<Vec<(&'static str, &'static str)>>,
    annotations: Option<Vec<(&'static str, &'static str)>>,
    mirror: bool,
    /// A Pod's controller: none, a DaemonSet (node infrastructure), a Job.
    owner: usize,
    unknown_object: Option<UnknownSketch>,
    unknown_spec: Option<UnknownSketch>,
}

/// The controlling owners a generated Pod may have.
const OWNERS: &[Option<(&str, &str)>] = &[
    None,
    Some(("apps/v1", "DaemonSet")),
    Some(("batch/v1", "Job")),
];

/// Random objects with a pod spec: mostly Pods, sometimes a Deployment or CronJob template.
pub fn pod_case() -> impl Strategy<Value = PodCase> {
    let kind =
        prop_oneof![6 => Just(Kind::Pod), 2 => Just(Kind::Deployment), 1 => Just(Kind::CronJob)];
    let placement = (
        option::weighted(0.5, select(NODE_NAMES)),
        option::weighted(
            0.2,
            vec(select(vec!["linux", "ssd"]), 0..3).prop_map(|values| {
                values
                    .into_iter()
                    .map(|v| match v {
                        "linux" => ("kubernetes.io/os", "linux"),
                        _ => ("disktype", "ssd"),
                    })
                    .collect::<Vec<_>>()
            }),
        ),
        option::weighted(0.4, vec(select(tolerations()), 0..4)),
        option::weighted(0.5, affinity()),
        any::<bool>(),
    );
    let resources = (
        option::weighted(0.2, pod_level_amount(250)),
        option::weighted(0.2, pod_level_amount(64 * MI * 1000)),
        0usize..4,
    );
    let metadata = (
        string_map(label_pool()),
        string_map(annotation_pool()),
        (
            prop::bool::weighted(0.05),
            prop_oneof![8 => Just(0), 1 => 1..OWNERS.len()],
        ),
        option::weighted(0.2, unknown_value()),
        option::weighted(0.2, unknown_value()),
    );
    (
        kind,
        prop::bool::weighted(0.2),
        vec(container(), 1..4),
        option::weighted(0.5, vec(container(), 0..4)),
        placement,
        resources,
        metadata,
    )
        .prop_map(
            |(
                kind,
                generate_name,
                containers,
                init_containers,
                (node_name, node_selector, tolerations, affinity, scheduling_gate),
                (pod_cpu, pod_memory, restart_policy),
                (labels, annotations, (mirror, owner), unknown_object, unknown_spec),
            )| {
                PodSketch {
                    kind,
                    generate_name,
                    containers,
                    init_containers,
                    node_name,
                    node_selector,
                    tolerations,
                    affinity,
                    scheduling_gate,
                    pod_cpu,
                    pod_memory,
                    restart_policy,
                    labels,
                    annotations,
                    mirror,
                    owner,
                    unknown_object,
                    unknown_spec,
                }
                .build()
            },
        )
}

impl PodSketch {
    fn build(&self) -> PodCase {
        let mut builder = Builder {
            unknown: Vec::new(),
        };
        let kind_name = match self.kind {
            Kind::Pod => "Pod",
            Kind::Deployment => "Deployment",
            Kind::CronJob => "CronJob",
        };
        let spec_at = PodCase::spec_steps(kind_name);
        let mut spec = Map::new();
        let mut volumes = Vec::new();
        let mut index = 0;
        let mut name_of = |base: &str| {
            index += 1;
            format!("{base}-{index}")
        };
        // (init, sidecar, sketch) in pod order, for the pod-level totals.
        let mut all: Vec<(bool, bool, &ContainerSketch)> = Vec::new();
        if let Some(init) = &self.init_containers {
            let list: Vec<Value> = init
                .iter()
                .map(|c| {
                    let name = name_of(c.base);
                    let at = [
                        spec_at.clone(),
                        vec![key("initContainers"), Step::Named(name.clone())],
                    ]
                    .concat();
                    all.push((true, c.sidecar, c));
                    c.build(&name, true, at, &mut builder, &mut volumes)
                })
                .collect();
            spec.insert("initContainers".into(), Value::Array(list));
        }
        let list: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let name = name_of(c.base);
                let at = [
                    spec_at.clone(),
                    vec![key("containers"), Step::Named(name.clone())],
                ]
                .concat();
                all.push((false, false, c));
                c.build(&name, false, at, &mut builder, &mut volumes)
            })
            .collect();
        spec.insert("containers".into(), Value::Array(list));
        if !volumes.is_empty() {
            spec.insert("volumes".into(), Value::Array(volumes));
        }
        if let Some(node) = self.node_name {
            spec.insert("nodeName".into(), json!(node));
        } else if self.scheduling_gate {
            spec.insert(
                "schedulingGates".into(),
                json!([{"name": "example.com/gate"}]),
            );
        }
        if let Some(selector) = &self.node_selector {
            spec.insert("nodeSelector".into(), Value::Object(to_map(selector)));
        }
        if let Some(tolerations) = &self.tolerations {
            spec.insert("tolerations".into(), json!(tolerations));
        }
        let mut api_valid = true;
        if let Some(affinity) = &self.affinity {
            let (value, valid) = affinity.build(
                [spec_at.clone(), vec![key("affinity")]].concat(),
                &mut builder,
            );
            api_valid = valid;
            spec.insert("affinity".into(), value);
        }
        let restart_policy = match self.kind {
            Kind::Pod => {
                [None, Some("Always"), Some("OnFailure"), Some("Never")][self.restart_policy]
            }
            Kind::Deployment => [None, Some("Always")][self.restart_policy % 2],
            Kind::CronJob => [Some("Never"), Some("OnFailure")][self.restart_policy % 2],
        };
        if let Some(policy) = restart_policy {
            spec.insert("restartPolicy".into(), json!(policy));
        }
        let pod_level = self.pod_level_resources(&all);
        if !pod_level.is_empty() {
            spec.insert("resources".into(), Value::Object(pod_level));
        }
        builder.plant(&mut spec, spec_at.clone(), self.unknown_spec);

        let name = "agent-7x2k";
        let mut metadata = Map::new();
        if self.generate_name {
            metadata.insert("generateName".into(), json!("agent-"));
        } else {
            metadata.insert("name".into(), json!(name));
        }
        metadata.insert("namespace".into(), json!(NAMESPACE));
        let mut labels = self.labels.as_deref().map(to_map);
        let mut annotations = self.annotations.as_deref().map(to_map);
        // A mirror pod always names its node (ValidatePodSpecificAnnotations).
        if self.mirror && self.kind == Kind::Pod && self.node_name.is_some() {
            annotations.get_or_insert_with(Map::new).insert(
                "kubernetes.io/config.mirror".into(),
                json!("3b3a7dd6c5e4b1e9f0e6c2a8d1f4b5c7"),
            );
        }
        let spec = Value::Object(spec);
        let mut object = match self.kind {
            Kind::Pod => {
                if let Some(labels) = labels {
                    metadata.insert("labels".into(), Value::Object(labels));
                }
                if let Some(annotations) = annotations {
                    metadata.insert("annotations".into(), Value::Object(annotations));
                }
                if let Some((api_version, kind)) = OWNERS[self.owner] {
                    metadata.insert(
                        "ownerReferences".into(),
                        json!([{"apiVersion": api_version, "kind": kind, "name": "owner",
                            "uid": "5f0c3a9e-1b2d-4c6e-8f7a-9b0c1d2e3f4a", "controller": true}]),
                    );
                }
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
            }
            Kind::Deployment | Kind::CronJob => {
                let labels = labels.get_or_insert_with(Map::new);
                labels.insert("app".into(), json!("web"));
                let mut template_metadata = Map::new();
                template_metadata.insert("labels".into(), Value::Object(labels.clone()));
                if let Some(annotations) = annotations {
                    template_metadata.insert("annotations".into(), Value::Object(annotations));
                }
                let template = json!({"metadata": template_metadata, "spec": spec});
                if self.kind == Kind::Deployment {
                    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
                        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": template}})
                } else {
                    json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": metadata,
                        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}})
                }
            }
        };
        if let Some(map) = object.as_object_mut() {
            builder.plant(map, Vec::new(), self.unknown_object);
        }
        PodCase {
            object,
            unknown_fields: builder.unknown,
            api_valid,
        }
    }

    /// Pod-level requests at or above the containers' aggregate (after the request := limit
    /// defaulting), limits at or above every container's limit and the pod request. Once
    /// `spec.resources` is set, every supported resource the containers request needs a pod
    /// request (an absent one counts as 0), hugepages included: pods with hugepages get none.
    fn pod_level_resources(&self, all: &[(bool, bool, &ContainerSketch)]) -> Map<String, Value> {
        let chosen = [(Res::Cpu, &self.pod_cpu), (Res::Memory, &self.pod_memory)];
        let huge_pages = all.iter().any(|(_, _, c)| {
            c.resources.as_ref().is_some_and(|r| {
                r.entries
                    .iter()
                    .any(|(res, _, _)| matches!(res, Res::HugePages2Mi | Res::HugePages1Gi))
            })
        });
        if huge_pages || chosen.iter().all(|(_, amount)| amount.is_none()) {
            return Map::new();
        }
        let every_container_limits = |res: Res| {
            all.iter().all(|(_, _, c)| {
                c.resources
                    .as_ref()
                    .is_some_and(|r| r.effective(res).1.is_some())
            })
        };
        let any_pod_limit = chosen
            .iter()
            .any(|(_, a)| a.as_ref().is_some_and(|a| a.limit.is_some()));
        let mut requests = Map::new();
        let mut limits = Map::new();
        for (res, amount) in chosen {
            let effective = |(init, sidecar, c): &(bool, bool, &ContainerSketch)| {
                let (request, limit) = c.resources.as_ref().map_or((0, None), |r| r.effective(res));
                ((*init, *sidecar, request), limit.unwrap_or(0))
            };
            let (requests_of, limits_of): (Vec<_>, Vec<_>) = all.iter().map(effective).unzip();
            let aggregate_request = aggregate(&requests_of);
            let max_limit = limits_of.into_iter().max().unwrap_or(0);
            // With no pod limit at all, defaulting gives the pod the containers' aggregate
            // limit when every container has one: the request must stay within it.
            let extra = amount.as_ref().and_then(|a| a.extra_request);
            let extra = if !any_pod_limit && every_container_limits(res) {
                extra.map(|_| 0)
            } else {
                extra
            };
            let request = match extra {
                Some(extra) => Some(aggregate_request + extra),
                None => (aggregate_request > 0).then_some(aggregate_request),
            };
            let spelling = amount.as_ref().map_or(0, |a| a.request_spelling);
            if let Some(request) = request {
                requests.insert(res.name().into(), spell(request, spelling));
            }
            if let Some(PodLevelAmount {
                limit: Some(extra),
                limit_spelling,
                ..
            }) = amount
            {
                let floor = aggregate_request.max(max_limit).max(request.unwrap_or(0));
                limits.insert(res.name().into(), spell(floor + extra, *limit_spelling));
            }
        }
        let mut resources = Map::new();
        if !requests.is_empty() {
            resources.insert("requests".into(), Value::Object(requests));
        }
        if !limits.is_empty() {
            resources.insert("limits".into(), Value::Object(limits));
        }
        resources
    }
}
