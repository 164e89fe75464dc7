//! Runs the rule registry on one object and computes the JSON Patch. Knows which objects,
//! operations and annotations are acted on; knows nothing of HTTP. `serve` and `audit` both
//! call [`Engine::review`].
//!
//! The patch is the diff of two serializations of the same typed pod spec (before and after
//! the rules), so a field our Kubernetes types do not know is in neither and is never removed.
//! Lists of named items (containers, volumes) are diffed by name, so such a field also stays
//! on its own container when a container is inserted before it.
//!
//! `UPDATE pods/status` goes to the status rules instead (only while one is on): they see the
//! whole Pod and the patch is the diff of its typed status, so nothing but status changes.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::{Pointer, PointerBuf};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cluster::ClusterView;
use crate::config::{Config, Mode};
use crate::rules::{self, PodMeta, Rule, RuleContext, StatusRule};
use crate::target::{self, Target, WorkloadKind};

/// Lists rules (or `all`) podmend must leave alone on this object.
pub const SKIP_ANNOTATION: &str = "podmend.io/skip";
/// Records which rules changed the object.
pub const MUTATED_ANNOTATION: &str = "podmend.io/mutated";
/// Marks a mirror (static) pod, created by a kubelet with nodeName already set.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "CREATE" => Operation::Create,
            "UPDATE" => Operation::Update,
            "DELETE" => Operation::Delete,
            "CONNECT" => Operation::Connect,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// One object under review, as the API server describes it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub operation: Operation,
    /// API group of the kind (`""` for core).
    pub group: &'a str,
    pub kind: &'a str,
    /// `""` for the main resource, else e.g. `"status"`.
    pub sub_resource: &'a str,
    pub namespace: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
}

/// Why an object was passed without looking at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    UnhandledKind,
    SubResource,
    Operation,
    NoObject,
    ExcludedNamespace,
    MirrorPod,
    DeploymentOwnedReplicaSet,
    SkipAnnotation,
    TemplateUnchanged,
    NoPodSpec,
    /// The pod spec does not decode (the API server will reject it anyway).
    UndecodablePodSpec(String),
}

impl Skip {
    pub fn as_str(&self) -> &'static str {
        match self {
            Skip::UnhandledKind => "unhandled-kind",
            Skip::SubResource => "subresource",
            Skip::Operation => "operation",
            Skip::NoObject => "no-object",
            Skip::ExcludedNamespace => "excluded-namespace",
            Skip::MirrorPod => "mirror-pod",
            Skip::DeploymentOwnedReplicaSet => "deployment-owned-replicaset",
            Skip::SkipAnnotation => "skip-annotation",
            Skip::TemplateUnchanged => "template-unchanged",
            Skip::NoPodSpec => "no-pod-spec",
            Skip::UndecodablePodSpec(_) => "undecodable-pod-spec",
        }
    }
}

/// What one rule found on one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub rule: &'static str,
    /// The mode the rule acts in for this object.
    pub mode: Mode,
    /// One short line per change.
    pub messages: Vec<String>,
    /// How to fix the source.
    pub advice: &'static str,
    /// The rule's repair as a JSON Patch on the whole object, whether or not it is applied.
    pub patch: Vec<PatchOperation>,
}

impl Finding {
    /// A finding with nothing to repair: what a rule left alone and why (a node agent, a
    /// guard that could not be injected). It is warned about and shown, never applied or
    /// denied, and does not count for `audit --fail-on`.
    pub fn is_note(&self) -> bool {
        self.patch.is_empty()
    }
}

/// The result of reviewing one object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub target: Option<&'static Target>,
    pub skipped: Option<Skip>,
    pub findings: Vec<Finding>,
    /// What `enforce` applies: every enforce-mode repair plus the `podmend.io/mutated`
    /// annotation. Empty when nothing is applied.
    pub patch: Vec<PatchOperation>,
    /// Every finding's repair plus the annotation, whatever the modes: the patch the webhook
    /// sends for this object when every rule enforces. `audit` shows and applies it.
    pub repair: Vec<PatchOperation>,
}

impl Outcome {
    fn skipped(target: Option<&'static Target>, skip: Skip) -> Self {
        Self {
            target,
            skipped: Some(skip),
            ..Self::default()
        }
    }

    /// Reviewed, and no rule could find anything.
    fn clean(target: &'static Target) -> Self {
        Self {
            target: Some(target),
            ..Self::default()
        }
    }

    /// The findings acted on in `mode`.
    pub fn in_mode(&self, mode: Mode) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.mode == mode)
    }
}

/// The rules of one configuration, ready to review objects.
pub struct Engine {
    rules: Vec<Box<dyn Rule>>,
    /// The status rules that are not off; empty (pods/status passed untouched) by default.
    status_rules: Vec<Box<dyn StatusRule>>,
    exclude_namespaces: Vec<String>,
}

impl Engine {
    pub fn new(config: &Config) -> Self {
        Self {
            rules: rules::registry(config),
            status_rules: rules::status_registry(config)
                .into_iter()
                .filter(|rule| rule.mode() != Mode::Off)
                .collect(),
            exclude_namespaces: config.exclude_namespaces.clone(),
        }
    }

    /// Reviews one object: decides whether podmend acts on it, runs every rule that may
    /// apply, and computes the patches.
    pub fn review(&self, subject: &Subject<'_>, cluster: &dyn ClusterView) -> Outcome {
        let Some(target) = target::for_kind(subject.group, subject.kind) else {
            return Outcome::skipped(None, Skip::UnhandledKind);
        };
        let skip = |reason| Outcome::skipped(Some(target), reason);
        if !subject.sub_resource.is_empty() {
            let pod_status_update = subject.sub_resource == "status"
                && target.kind == WorkloadKind::Pod
                && subject.operation == Operation::Update;
            if pod_status_update && !self.status_rules.is_empty() {
                return self.review_status(target, subject, cluster);
            }
            return skip(Skip::SubResource);
        }
        if !acts_on(target, subject.operation) {
            return skip(Skip::Operation);
        }
        let Some(object) = subject.object.filter(|o| o.is_object()) else {
            return skip(Skip::NoObject);
        };
        let namespace = namespace_of(subject, object);
        if self.exclude_namespaces.iter().any(|n| n == namespace) {
            return skip(Skip::ExcludedNamespace);
        }
        let object_annotations = string_map(object.pointer("/metadata/annotations"));
        if target.kind == WorkloadKind::Pod && object_annotations.contains_key(MIRROR_ANNOTATION) {
            return skip(Skip::MirrorPod);
        }
        if target.kind == WorkloadKind::ReplicaSet && has_deployment_controller(object) {
            return skip(Skip::DeploymentOwnedReplicaSet);
        }
        if subject.operation == Operation::Update {
            let template = target.template.unwrap_or(target.spec);
            let old = subject.old_object.and_then(|o| o.pointer(template));
            if old.is_some() && old == object.pointer(template) {
                return skip(Skip::TemplateUnchanged);
            }
        }
        let Some(raw_spec) = object.pointer(target.spec) else {
            return skip(Skip::NoPodSpec);
        };
        let meta = PodMeta {
            labels: string_map(object.pointer(&format!("{}/labels", target.metadata))),
            annotations: string_map(object.pointer(&format!("{}/annotations", target.metadata))),
            controller_kind: controller_kind(target, object),
        };
        let skipped_rules = SkipList::from_annotations([&object_annotations, &meta.annotations]);
        if skipped_rules.all {
            return skip(Skip::SkipAnnotation);
        }
        let active: Vec<(&dyn Rule, Mode)> = self
            .rules
            .iter()
            .map(|rule| (rule.as_ref(), rule.modes().for_target(target.is_template())))
            .filter(|(rule, mode)| {
                *mode != Mode::Off
                    && !skipped_rules.contains(rule.id())
                    && rule.may_apply(raw_spec, &meta)
            })
            .collect();
        if active.is_empty() {
            return Outcome::clean(target);
        }
        let original = match PodSpec::deserialize(raw_spec) {
            Ok(spec) => spec,
            Err(error) => return skip(Skip::UndecodablePodSpec(error.to_string())),
        };
        let spec_pointer = parse_pointer(target.spec);
        let cx = RuleContext { namespace, cluster };
        let original_value = to_json(&original);
        // Two states advance through the rules: what every rule would apply (for `audit`),
        // and what enforce-mode rules apply. They are one and the same until a rule that
        // only warns changes something, so nothing is cloned in the common case.
        let mut repaired = State {
            spec: original,
            value: None,
        };
        let mut applied: Option<State> = None;
        let mut findings = Vec::new();
        for (rule, mode) in active {
            let mut candidate = repaired.spec.clone();
            let messages = rule.repair(&mut candidate, &meta, &cx);
            let candidate_value = to_json(&candidate);
            let patch = prefixed(
                &spec_pointer,
                diff(repaired.value(&original_value), &candidate_value),
            );
            if messages.is_empty() && patch.is_empty() {
                continue;
            }
            let previous = std::mem::replace(
                &mut repaired,
                State {
                    spec: candidate,
                    value: Some(candidate_value),
                },
            );
            if !patch.is_empty() {
                match (&mut applied, mode) {
                    // An enforce-mode rule after the states parted: apply it to what is applied.
                    (Some(enforced), Mode::Enforce) => {
                        rule.repair(&mut enforced.spec, &meta, &cx);
                        enforced.value = Some(to_json(&enforced.spec));
                    }
                    // A rule that only warns changed something: the states part here.
                    (None, mode) if mode != Mode::Enforce => applied = Some(previous),
                    _ => {}
                }
            }
            findings.push(Finding {
                rule: rule.id(),
                mode,
                messages,
                advice: rule.info().help,
                patch,
            });
        }
        // With one rule that changed something, its patch is the whole change: no second diff.
        let mut changing = findings.iter().filter(|f| !f.patch.is_empty());
        let only_change = match (changing.next(), changing.next()) {
            (Some(finding), None) => Some(&finding.patch),
            _ => None,
        };
        let annotated = |state: &State, rules: Vec<&str>| {
            let Some(value) = &state.value else {
                return Vec::new();
            };
            let mut patch = match only_change {
                Some(patch) => patch.clone(),
                None => prefixed(&spec_pointer, diff(&original_value, value)),
            };
            if !patch.is_empty() {
                patch.push(mutated_annotation_op(
                    object,
                    target.metadata,
                    &meta.annotations,
                    &rules,
                ));
            }
            patch
        };
        let changed = |enforced_only: bool| -> Vec<&str> {
            findings
                .iter()
                .filter(|f| !f.patch.is_empty() && (!enforced_only || f.mode == Mode::Enforce))
                .map(|f| f.rule)
                .collect()
        };
        let repair = annotated(&repaired, changed(false));
        // While the states are one, every rule that changed something enforces.
        let patch = match &applied {
            None => repair.clone(),
            Some(enforced) => annotated(enforced, changed(true)),
        };
        if let Err(reason) = applies(object, &patch, &repair) {
            return skip(reason);
        }
        Outcome {
            target: Some(target),
            skipped: None,
            findings,
            patch,
            repair,
        }
    }

    /// Runs the status rules on an `UPDATE pods/status`. The patch is the diff of the Pod's
    /// typed status before and after, so it names nothing outside `/status` and drops no
    /// field the types do not know; no `podmend.io/mutated` annotation is added.
    fn review_status(
        &self,
        target: &'static Target,
        subject: &Subject<'_>,
        cluster: &dyn ClusterView,
    ) -> Outcome {
        let skip = |reason| Outcome::skipped(Some(target), reason);
        let Some(object) = subject.object.filter(|o| o.is_object()) else {
            return skip(Skip::NoObject);
        };
        let namespace = namespace_of(subject, object);
        if self.exclude_namespaces.iter().any(|n| n == namespace) {
            return skip(Skip::ExcludedNamespace);
        }
        let annotations = string_map(object.pointer("/metadata/annotations"));
        if annotations.contains_key(MIRROR_ANNOTATION) {
            return skip(Skip::MirrorPod);
        }
        let skipped_rules = SkipList::from_annotations([&annotations]);
        if skipped_rules.all {
            return skip(Skip::SkipAnnotation);
        }
        let active: Vec<&dyn StatusRule> = self
            .status_rules
            .iter()
            .map(Box::as_ref)
            .filter(|rule| !skipped_rules.contains(rule.id()) && rule.may_apply(object))
            .collect();
        if active.is_empty() {
            return Outcome::clean(target);
        }
        let pod = match Pod::deserialize(object) {
            Ok(pod) => pod,
            Err(error) => return skip(Skip::UndecodablePodSpec(error.to_string())),
        };
        // The stored Pod tells whether it is being deleted or already terminal: without it
        // neither can be ruled out, so nothing is changed.
        let old = match subject.old_object.map(Pod::deserialize) {
            Some(Ok(old)) => old,
            Some(Err(error)) => {
                return skip(Skip::UndecodablePodSpec(format!(
                    "the stored Pod (oldObject) does not decode: {error}"
                )));
            }
            None => return skip(Skip::NoObject),
        };
        let cx = RuleContext { namespace, cluster };
        let original = pod.status.clone().unwrap_or_default();
        let original_value = to_json(&original);
        let (mut repaired, mut applied) = (original.clone(), original);
        let mut findings = Vec::new();
        for rule in active {
            let before = to_json(&repaired);
            let messages = rule.repair(&pod, Some(&old), &mut repaired, &cx);
            let patch = prefixed(
                &parse_pointer("/status"),
                diff(&before, &to_json(&repaired)),
            );
            if messages.is_empty() && patch.is_empty() {
                continue;
            }
            if rule.mode() == Mode::Enforce {
                rule.repair(&pod, Some(&old), &mut applied, &cx);
            }
            findings.push(Finding {
                rule: rule.id(),
                mode: rule.mode(),
                messages,
                advice: rule.info().help,
                patch,
            });
        }
        let status_patch = |status| {
            prefixed(
                &parse_pointer("/status"),
                diff(&original_value, &to_json(status)),
            )
        };
        let (patch, repair) = (status_patch(&applied), status_patch(&repaired));
        if let Err(reason) = applies(object, &patch, &repair) {
            return skip(reason);
        }
        Outcome {
            target: Some(target),
            skipped: None,
            findings,
            patch,
            repair,
        }
    }
}

/// The patches are diffs of typed objects, where a field the API requires but the object
/// lacks (a volumeMount without mountPath) reads as "": such a patch names paths the object
/// does not have, and the API server would fail the request with an internal error. Leave
/// the object to its validation, which says what is missing.
fn applies(
    object: &Value,
    patch: &[PatchOperation],
    repair: &[PatchOperation],
) -> Result<(), Skip> {
    let differs = patch != repair;
    for candidate in std::iter::once(repair).chain(differs.then_some(patch)) {
        if let Err(error) = json_patch::patch(&mut object.clone(), candidate) {
            return Err(Skip::UndecodablePodSpec(format!(
                "the repair does not apply to the object as sent: {error}"
            )));
        }
    }
    Ok(())
}

/// The request's namespace, or the object's own when the request names none.
fn namespace_of<'a>(subject: &Subject<'a>, object: &'a Value) -> &'a str {
    if subject.namespace.is_empty() {
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
    } else {
        subject.namespace
    }
}

/// A pod spec as the rules left it, with its JSON form once a rule has changed it
/// (`None`: unchanged, the original's).
struct State {
    spec: PodSpec,
    value: Option<Value>,
}

impl State {
    fn value<'a>(&'a self, original: &'a Value) -> &'a Value {
        self.value.as_ref().unwrap_or(original)
    }
}

/// Pods are repaired on CREATE only (their spec is immutable after); a Job's template is
/// immutable too; other templates may be repaired whenever they are written.
fn acts_on(target: &Target, operation: Operation) -> bool {
    match operation {
        Operation::Create => true,
        Operation::Update => !matches!(target.kind, WorkloadKind::Pod | WorkloadKind::Job),
        Operation::Delete | Operation::Connect => false,
    }
}

/// The kind of the controller of the pods `object` describes: a Pod's controlling owner, or
/// the workload whose template it is (none for a `PodTemplate`, which controls nothing).
fn controller_kind(target: &Target, object: &Value) -> Option<String> {
    match target.kind {
        WorkloadKind::Pod => object
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)?
            .iter()
            .find(|owner| owner.get("controller").and_then(Value::as_bool) == Some(true))?
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string),
        WorkloadKind::PodTemplate => None,
        _ => Some(target.name.to_string()),
    }
}

/// A ReplicaSet its Deployment controls: mutating its template makes the Deployment
/// controller create ReplicaSets without end (kubernetes#57167).
fn has_deployment_controller(object: &Value) -> bool {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|owners| {
            owners.iter().any(|owner| {
                owner.get("controller").and_then(Value::as_bool) == Some(true)
                    && owner.get("kind").and_then(Value::as_str) == Some("Deployment")
            })
        })
}

/// The `podmend.io/skip` annotation: `all`, or a comma-separated list of rule ids.
#[derive(Default)]
struct SkipList {
    all: bool,
    rules: Vec<String>,
}

impl SkipList {
    fn from_annotations<'a>(
        sources: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
    ) -> Self {
        let mut list = SkipList::default();
        for annotations in sources {
            let Some(value) = annotations.get(SKIP_ANNOTATION) else {
                continue;
            };
            for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if item == "all" {
                    list.all = true;
                } else {
                    list.rules.push(item.to_string());
                }
            }
        }
        list
    }

    fn contains(&self, rule: &str) -> bool {
        self.all || self.rules.iter().any(|r| r == rule)
    }
}

/// The `add` operation that records the rules that changed the object, keeping rules
/// recorded by an earlier pass (a template's repair carried into its pods).
fn mutated_annotation_op(
    object: &Value,
    metadata_pointer: &str,
    annotations: &BTreeMap<String, String>,
    changed_by: &[&str],
) -> PatchOperation {
    let mut rules: Vec<String> = annotations
        .get(MUTATED_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for rule in changed_by {
        if !rules.iter().any(|r| r == rule) {
            rules.push((*rule).to_string());
        }
    }
    let value = Value::String(rules.join(","));
    let metadata = object.pointer(metadata_pointer);
    let (path, value) = match metadata {
        Some(meta) if meta.get("annotations").is_some_and(Value::is_object) => {
            let mut path = parse_pointer(metadata_pointer);
            path.push_back("annotations");
            path.push_back(MUTATED_ANNOTATION);
            (path, value)
        }
        Some(meta) if meta.is_object() => {
            let mut path = parse_pointer(metadata_pointer);
            path.push_back("annotations");
            (path, single_entry(MUTATED_ANNOTATION, value))
        }
        _ => (
            parse_pointer(metadata_pointer),
            single_entry("annotations", single_entry(MUTATED_ANNOTATION, value)),
        ),
    };
    PatchOperation::Add(json_patch::AddOperation { path, value })
}

fn single_entry(key: &str, value: Value) -> Value {
    let mut map = Map::new();
    map.insert(key.to_string(), value);
    Value::Object(map)
}

/// `json_patch::diff`, except that a list whose items all have unique names (containers,
/// volumes, env vars) is diffed item by item by name rather than by position, when the names
/// both sides share are in the same order. Neither side holds the fields our types do not
/// know, so a positional diff of `[guard, a]` against `[a]` would rewrite `a` into the guard
/// field by field and leave `a`'s unknown fields on the guard; by name it is one `add`.
fn diff(before: &Value, after: &Value) -> json_patch::Patch {
    let mut ops = Vec::new();
    diff_into(before, after, &mut PointerBuf::new(), &mut ops);
    json_patch::Patch(ops)
}

fn diff_into(before: &Value, after: &Value, at: &mut PointerBuf, ops: &mut Vec<PatchOperation>) {
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => {
            for (key, after_value) in after {
                at.push_back(key);
                match before.get(key) {
                    Some(before_value) => diff_into(before_value, after_value, at, ops),
                    None => ops.push(add_op(at, after_value)),
                }
                at.pop_back();
            }
            for key in before.keys().filter(|key| !after.contains_key(*key)) {
                at.push_back(key);
                ops.push(PatchOperation::Remove(json_patch::RemoveOperation {
                    path: at.clone(),
                }));
                at.pop_back();
            }
        }
        (Value::Array(before), Value::Array(after)) => {
            match (item_names(before), item_names(after)) {
                (Some(before_names), Some(after_names))
                    if shared_in_same_order(&before_names, &after_names) =>
                {
                    for (index, name) in before_names.iter().enumerate().rev() {
                        if !after_names.contains(name) {
                            at.push_back(index);
                            ops.push(PatchOperation::Remove(json_patch::RemoveOperation {
                                path: at.clone(),
                            }));
                            at.pop_back();
                        }
                    }
                    // Removals done, the shared items are in place in order; each new item is
                    // inserted where it belongs, so item `index` is always where the diff says.
                    for (index, (name, after_item)) in after_names.iter().zip(after).enumerate() {
                        at.push_back(index);
                        match before_names.iter().position(|n| n == name) {
                            Some(old) => diff_into(&before[old], after_item, at, ops),
                            None => ops.push(add_op(at, after_item)),
                        }
                        at.pop_back();
                    }
                }
                _ => {
                    let shared = before.len().min(after.len());
                    for index in 0..shared {
                        at.push_back(index);
                        diff_into(&before[index], &after[index], at, ops);
                        at.pop_back();
                    }
                    for (index, item) in after.iter().enumerate().skip(shared) {
                        at.push_back(index);
                        ops.push(add_op(at, item));
                        at.pop_back();
                    }
                    for _ in shared..before.len() {
                        at.push_back(shared);
                        ops.push(PatchOperation::Remove(json_patch::RemoveOperation {
                            path: at.clone(),
                        }));
                        at.pop_back();
                    }
                }
            }
        }
        _ if before == after => {}
        _ => ops.push(PatchOperation::Replace(json_patch::ReplaceOperation {
            path: at.clone(),
            value: after.clone(),
        })),
    }
}

fn add_op(at: &PointerBuf, value: &Value) -> PatchOperation {
    PatchOperation::Add(json_patch::AddOperation {
        path: at.clone(),
        value: value.clone(),
    })
}

/// The `name` of every item, when every item is an object with a name no other item has.
fn item_names(items: &[Value]) -> Option<Vec<&str>> {
    let names: Vec<&str> = items
        .iter()
        .map(|item| item.get("name")?.as_str())
        .collect::<Option<_>>()?;
    let unique = names
        .iter()
        .enumerate()
        .all(|(i, name)| !names[..i].contains(name));
    unique.then_some(names)
}

fn shared_in_same_order(before: &[&str], after: &[&str]) -> bool {
    let shared_before = before.iter().filter(|name| after.contains(name));
    let shared_after = after.iter().filter(|name| before.contains(name));
    shared_before.eq(shared_after)
}

fn prefixed(prefix: &Pointer, patch: json_patch::Patch) -> Vec<PatchOperation> {
    patch
        .0
        .into_iter()
        .map(|mut op| {
            let path = match &mut op {
                PatchOperation::Add(o) => &mut o.path,
                PatchOperation::Remove(o) => &mut o.path,
                PatchOperation::Replace(o) => &mut o.path,
                PatchOperation::Move(o) => &mut o.path,
                PatchOperation::Copy(o) => &mut o.path,
                PatchOperation::Test(o) => &mut o.path,
            };
            *path = prefix.concat(path);
            op
        })
        .collect()
}

/// Pointers in the target table are constants; an invalid one is a programming error that
/// the target tests catch, so fall back to the root rather than panic.
fn parse_pointer(text: &str) -> PointerBuf {
    PointerBuf::parse(text).unwrap_or_default()
}

fn to_json(typed: &impl Serialize) -> Value {
    // Serializing a k8s-openapi type into a Value cannot fail (string keys, no custom errors).
    serde_json::to_value(typed).unwrap_or(Value::Null)
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::StaticCluster;

    fn engine() -> Engine {
        Engine::new(&Config::default())
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn create<'a>(group: &'a str, kind: &'a str, object: &'a Value) -> Subject<'a> {
        Subject {
            operation: Operation::Create,
            group,
            kind,
            sub_resource: "",
            namespace: "ns",
            object: Some(object),
            old_object: None,
        }
    }

    fn apply(object: &Value, patch: &[PatchOperation]) -> Value {
        let mut out = object.clone();
        json_patch::patch(&mut out, patch).expect("patch applies");
        out
    }

    fn cluster() -> StaticCluster {
        StaticCluster::empty().with_node("n1", vec![])
    }

    #[test]
    fn fields_unknown_to_the_types_survive_the_patch() {
        let object = pod(json!({
            "nodeName": "n1",
            "inventedSpecField": {"keep": true},
            "containers": [{"name": "a", "image": "x", "inventedContainerField": [1, 2]}]
        }));
        let outcome = engine().review(&create("", "Pod", &object), &cluster());
        assert!(!outcome.patch.is_empty());
        let patched = apply(&object, &outcome.patch);
        assert_eq!(patched["spec"]["inventedSpecField"], json!({"keep": true}));
        assert_eq!(
            patched["spec"]["containers"][0]["inventedContainerField"],
            json!([1, 2])
        );
        assert!(patched["spec"].get("nodeName").is_none());
        assert!(outcome.patch.iter().all(
            |op| !matches!(op, PatchOperation::Remove(r) if r.path.as_str() != "/spec/nodeName")
        ));
    }

    #[test]
    fn rules_see_the_kind_of_the_pods_controller() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "1"},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "2", "controller": true}]},
            "spec": {"containers": [{"name": "a", "image": "a"}]}});
        let target =
            |kind| target::for_kind(if kind == "Pod" { "" } else { "apps" }, kind).expect("kind");
        assert_eq!(
            controller_kind(target("Pod"), &pod),
            Some("DaemonSet".to_string())
        );
        let bare = json!({"metadata": {"name": "p"}});
        assert_eq!(controller_kind(target("Pod"), &bare), None);
        assert_eq!(
            controller_kind(target("DaemonSet"), &json!({})),
            Some("DaemonSet".to_string())
        );
        assert_eq!(
            controller_kind(
                target::for_kind("", "PodTemplate").expect("kind"),
                &json!({})
            ),
            None
        );
    }

    #[test]
    fn a_guard_inserted_before_an_init_container_leaves_its_unknown_fields_on_it() {
        let object = pod(json!({
            "initContainers": [{"name": "setup", "image": "busybox", "futureField": {"keep": 1},
                "volumeMounts": [{"name": "host-docker", "mountPath": "/var/run/docker.sock"}]}],
            "containers": [{"name": "app", "image": "busybox", "futureField": [2]}],
            "volumes": [{"name": "host-docker", "hostPath": {"path": "/var/run/docker.sock"}}]
        }));
        let outcome = engine().review(&create("", "Pod", &object), &cluster());
        let patched = apply(&object, &outcome.patch);
        let init = patched["spec"]["initContainers"]
            .as_array()
            .expect("init containers");
        assert_eq!(init.len(), 2, "{patched:#}");
        assert_eq!(init[0]["name"], crate::dind::GUARD_CONTAINER);
        assert!(init[0].get("futureField").is_none(), "{patched:#}");
        assert_eq!(init[1]["name"], "setup");
        assert_eq!(init[1]["futureField"], json!({"keep": 1}));
        assert_eq!(patched["spec"]["containers"][0]["futureField"], json!([2]));
        // The guard is one `add`, not the setup container rewritten field by field.
        let json = serde_json::to_value(&outcome.patch).expect("serializes");
        assert!(
            json.as_array()
                .expect("array")
                .iter()
                .any(|op| op["op"] == "add" && op["path"] == "/spec/initContainers/0"),
            "{json:#}"
        );
    }

    #[test]
    fn the_mutated_annotation_records_the_rules_that_changed_the_object() {
        let object = pod(json!({"nodeName": "n1", "containers": [{"name": "a"}]}));
        let outcome = engine().review(&create("", "Pod", &object), &cluster());
        let patched = apply(&object, &outcome.patch);
        assert_eq!(
            patched["metadata"]["annotations"][MUTATED_ANNOTATION],
            "node-affinity"
        );
    }

    #[test]
    fn a_second_pass_over_the_output_changes_nothing() {
        let object = pod(json!({"nodeName": "n1", "containers": [{"name": "a"}]}));
        let first = engine().review(&create("", "Pod", &object), &cluster());
        let patched = apply(&object, &first.patch);
        let second = engine().review(&create("", "Pod", &patched), &cluster());
        assert!(second.patch.is_empty());
        assert!(second.findings.is_empty());
    }

    #[test]
    fn templates_are_warned_about_but_not_changed_by_default() {
        let object = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}});
        let outcome = engine().review(&create("apps", "Deployment", &object), &cluster());
        assert!(outcome.patch.is_empty());
        assert_eq!(outcome.findings.len(), 1);
        assert_eq!(outcome.findings[0].mode, Mode::Warn);
        // The audit still gets the repair, on the template's path.
        assert!(outcome.findings[0].patch.iter().any(|op| matches!(op, PatchOperation::Remove(r) if r.path.as_str() == "/spec/template/spec/nodeName")));
    }

    #[test]
    fn the_repair_patch_applies_every_finding_whatever_its_mode() {
        let object = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"metadata": {"labels": {"jenkins/label": "x"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]}}}});
        let warned = engine().review(&create("apps", "Deployment", &object), &cluster());
        let mut config = Config::default();
        config.rules.node_affinity.templates = Mode::Enforce;
        config.rules.agent_requests.templates = Mode::Enforce;
        let enforced =
            Engine::new(&config).review(&create("apps", "Deployment", &object), &cluster());
        assert!(warned.patch.is_empty());
        assert_eq!(warned.repair, enforced.patch);
        assert_eq!(enforced.repair, enforced.patch);
        let patched = apply(&object, &warned.repair);
        assert_eq!(
            patched["spec"]["template"]["metadata"]["annotations"][MUTATED_ANNOTATION],
            "node-affinity,agent-requests"
        );
    }

    #[test]
    fn templates_in_enforce_mode_get_the_annotation_on_the_template() {
        let mut config = Config::default();
        config.rules.node_affinity.templates = Mode::Enforce;
        let object = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
            "spec": {"jobTemplate": {"spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}}}});
        let outcome = Engine::new(&config).review(&create("batch", "CronJob", &object), &cluster());
        let patched = apply(&object, &outcome.patch);
        let template = &patched["spec"]["jobTemplate"]["spec"]["template"];
        assert_eq!(
            template["metadata"]["annotations"][MUTATED_ANNOTATION],
            "node-affinity"
        );
        assert!(template["spec"].get("nodeName").is_none());
    }

    #[test]
    fn objects_podmend_must_not_touch_are_skipped_with_a_reason() {
        let node_pod = pod(json!({"nodeName": "n1", "containers": [{"name": "a"}]}));
        let mut mirror = node_pod.clone();
        mirror["metadata"]["annotations"] = json!({MIRROR_ANNOTATION: "abc"});
        let mut skip_all = node_pod.clone();
        skip_all["metadata"]["annotations"] = json!({SKIP_ANNOTATION: "all"});
        let owned_rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": true}]},
            "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}});
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        let e = engine();
        let c = cluster();
        let review = |subject: Subject<'_>| e.review(&subject, &c).skipped;

        assert_eq!(review(create("", "Pod", &mirror)), Some(Skip::MirrorPod));
        assert_eq!(
            review(create("", "Pod", &skip_all)),
            Some(Skip::SkipAnnotation)
        );
        assert_eq!(
            review(create("apps", "ReplicaSet", &owned_rs)),
            Some(Skip::DeploymentOwnedReplicaSet)
        );
        assert_eq!(
            review(create("", "ConfigMap", &cm)),
            Some(Skip::UnhandledKind)
        );
        assert_eq!(
            review(Subject {
                operation: Operation::Update,
                old_object: Some(&node_pod),
                ..create("", "Pod", &node_pod)
            }),
            Some(Skip::Operation)
        );
        assert_eq!(
            review(Subject {
                operation: Operation::Delete,
                object: None,
                ..create("", "Pod", &node_pod)
            }),
            Some(Skip::Operation)
        );
        assert_eq!(
            review(Subject {
                sub_resource: "status",
                ..create("", "Pod", &node_pod)
            }),
            Some(Skip::SubResource)
        );
        let job = json!({"kind": "Job", "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}});
        assert_eq!(
            review(Subject {
                operation: Operation::Update,
                old_object: Some(&cm),
                ..create("batch", "Job", &job)
            }),
            Some(Skip::Operation)
        );
    }

    #[test]
    fn a_skip_annotation_naming_one_rule_skips_only_that_rule() {
        let object = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"jenkins/label": "x"}, "annotations": {SKIP_ANNOTATION: "node-affinity"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]}});
        let outcome = engine().review(&create("", "Pod", &object), &cluster());
        let rules: Vec<&str> = outcome.findings.iter().map(|f| f.rule).collect();
        assert_eq!(rules, vec!["agent-requests"]);
    }

    #[test]
    fn an_update_that_leaves_the_template_unchanged_is_not_reviewed() {
        let object = json!({"kind": "Deployment", "metadata": {"name": "d", "labels": {"new": "x"}},
            "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}});
        let mut old = object.clone();
        old["metadata"]["labels"] = json!({});
        let subject = Subject {
            operation: Operation::Update,
            old_object: Some(&old),
            ..create("apps", "Deployment", &object)
        };
        assert_eq!(
            engine().review(&subject, &cluster()).skipped,
            Some(Skip::TemplateUnchanged)
        );
    }

    #[test]
    fn excluded_namespaces_are_skipped() {
        let config = Config {
            exclude_namespaces: vec!["ns".to_string()],
            ..Config::default()
        };
        let object = pod(json!({"nodeName": "n1", "containers": [{"name": "a"}]}));
        let outcome = Engine::new(&config).review(&create("", "Pod", &object), &cluster());
        assert_eq!(outcome.skipped, Some(Skip::ExcludedNamespace));
    }

    #[test]
    fn a_pod_spec_that_does_not_decode_is_skipped_not_panicked_on() {
        let object = pod(json!({"nodeName": "n1", "containers": "not a list"}));
        let outcome = engine().review(&create("", "Pod", &object), &cluster());
        assert!(matches!(outcome.skipped, Some(Skip::UndecodablePodSpec(_))));
    }

    #[test]
    fn annotation_keys_with_slashes_are_escaped_in_the_patch_path() {
        let object = json!({"kind": "Pod", "metadata": {"annotations": {"a": "b"}}, "spec": {"nodeName": "n1", "containers": [{"name": "a"}]}});
        let outcome = engine().review(&create("", "Pod", &object), &cluster());
        let json = serde_json::to_value(&outcome.patch).expect("serializes");
        assert!(
            json.as_array()
                .expect("array")
                .iter()
                .any(|op| op["path"] == "/metadata/annotations/podmend.io~1mutated"),
            "{json}"
        );
    }

    /// A pod on a virtual-kubelet node, Pending while its one container runs, with a field
    /// the types do not know in its status.
    fn pending_virtual_pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent", "namespace": "ns"},
            "spec": {"nodeName": "vk", "containers": [{"name": "jnlp", "image": "x"}]},
            "status": {"phase": "Pending", "inventedStatusField": {"keep": true},
                "containerStatuses": [{"name": "jnlp", "image": "x", "imageID": "", "ready": true,
                    "restartCount": 0, "started": true, "state": {"running": {}}}]}})
    }

    fn status_update<'a>(object: &'a Value) -> Subject<'a> {
        Subject {
            operation: Operation::Update,
            sub_resource: "status",
            old_object: Some(object),
            ..create("", "Pod", object)
        }
    }

    fn virtual_node_phase(mode: Mode) -> Engine {
        let mut config = Config::default();
        config.rules.virtual_node_phase.mode = mode;
        Engine::new(&config)
    }

    fn virtual_cluster() -> StaticCluster {
        StaticCluster::empty().with_labeled_node("vk", &[("type", "virtual-kubelet")])
    }

    #[test]
    fn a_status_update_is_passed_untouched_while_virtual_node_phase_is_off() {
        let object = pending_virtual_pod();
        let outcome = engine().review(&status_update(&object), &virtual_cluster());
        assert_eq!(outcome.skipped, Some(Skip::SubResource));
        assert!(outcome.patch.is_empty());
    }

    #[test]
    fn a_status_update_patch_replaces_only_the_phase_and_adds_no_annotation() {
        let object = pending_virtual_pod();
        let outcome =
            virtual_node_phase(Mode::Enforce).review(&status_update(&object), &virtual_cluster());
        let json = serde_json::to_value(&outcome.patch).expect("serializes");
        assert_eq!(
            json,
            json!([{"op": "replace", "path": "/status/phase", "value": "Running"}])
        );
        let patched = apply(&object, &outcome.patch);
        assert_eq!(
            patched["status"]["inventedStatusField"],
            json!({"keep": true})
        );
        // Idempotent: the API server's reinvocation finds nothing more to do.
        let again =
            virtual_node_phase(Mode::Enforce).review(&status_update(&patched), &virtual_cluster());
        assert!(again.patch.is_empty() && again.findings.is_empty());
    }

    #[test]
    fn a_status_update_in_warn_mode_finds_and_changes_nothing() {
        let object = pending_virtual_pod();
        let outcome =
            virtual_node_phase(Mode::Warn).review(&status_update(&object), &virtual_cluster());
        assert!(outcome.patch.is_empty());
        assert_eq!(outcome.findings.len(), 1);
        assert_eq!(outcome.findings[0].mode, Mode::Warn);
        assert_eq!(outcome.repair.len(), 1);
    }

    #[test]
    fn a_status_update_honours_the_skip_annotation_and_the_excluded_namespaces() {
        let mut object = pending_virtual_pod();
        object["metadata"]["annotations"] = json!({"podmend.io/skip": "virtual-node-phase"});
        let outcome =
            virtual_node_phase(Mode::Enforce).review(&status_update(&object), &virtual_cluster());
        assert!(outcome.patch.is_empty() && outcome.findings.is_empty());

        let mut config = Config::default();
        config.rules.virtual_node_phase.mode = Mode::Enforce;
        config.exclude_namespaces = vec!["ns".to_string()];
        let object = pending_virtual_pod();
        let outcome = Engine::new(&config).review(&status_update(&object), &virtual_cluster());
        assert_eq!(outcome.skipped, Some(Skip::ExcludedNamespace));
    }

    #[test]
    fn a_status_update_without_a_stored_pod_it_can_read_is_left_alone() {
        let object = pending_virtual_pod();
        let engine = virtual_node_phase(Mode::Enforce);
        let missing = Subject {
            old_object: None,
            ..status_update(&object)
        };
        let outcome = engine.review(&missing, &virtual_cluster());
        assert_eq!(outcome.skipped, Some(Skip::NoObject));
        let broken = json!({"metadata": {"deletionTimestamp": 7}});
        let unreadable = Subject {
            old_object: Some(&broken),
            ..status_update(&object)
        };
        let outcome = engine.review(&unreadable, &virtual_cluster());
        assert!(matches!(outcome.skipped, Some(Skip::UndecodablePodSpec(_))));
        assert!(outcome.patch.is_empty());
    }

    #[test]
    fn other_subresources_and_operations_stay_skipped_with_virtual_node_phase_on() {
        let object = pending_virtual_pod();
        let engine = virtual_node_phase(Mode::Enforce);
        let binding = Subject {
            sub_resource: "binding",
            ..status_update(&object)
        };
        assert_eq!(
            engine.review(&binding, &virtual_cluster()).skipped,
            Some(Skip::SubResource)
        );
        let create_status = Subject {
            operation: Operation::Create,
            ..status_update(&object)
        };
        assert_eq!(
            engine.review(&create_status, &virtual_cluster()).skipped,
            Some(Skip::SubResource)
        );
    }
}
