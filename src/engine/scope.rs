//! Whether podmend acts on a request, and on what. First from the request alone (the kind,
//! the subresource, the operation), then from the object: its namespace, the objects podmend
//! never touches, the pod spec with its labels and annotations, and the skip annotation.
//! Nothing here runs a rule.

use std::collections::BTreeMap;

use serde_json::Value;

use super::document::{Tree, View};
use super::{Engine, MIRROR_ANNOTATION, Operation, Outcome, SKIP_ANNOTATION, Skip, Subject};
use crate::rules::PodMeta;
use crate::target::{self, Target, WorkloadKind};

/// Where a request goes, decided before its object is read.
pub(super) enum Route {
    /// The pod spec rules, on a Pod or a pod template.
    Spec(&'static Target),
    /// The status rules, on `UPDATE pods/status`.
    Status(&'static Target),
}

/// Routes a request by what it is: a handled kind, the main resource or `pods/status` (only
/// while a status rule is on), an operation the rules act on. Anything else is skipped.
pub(super) fn route(
    engine: &Engine,
    operation: Operation,
    group: &str,
    kind: &str,
    sub_resource: &str,
) -> Result<Route, Outcome> {
    let Some(target) = target::for_kind(group, kind) else {
        return Err(Outcome::skipped(None, Skip::UnhandledKind));
    };
    let skip = |reason| Err(Outcome::skipped(Some(target), reason));
    if !sub_resource.is_empty() {
        let pod_status_update = sub_resource == "status"
            && target.kind == WorkloadKind::Pod
            && operation == Operation::Update;
        if pod_status_update && !engine.status_rules.is_empty() {
            return Ok(Route::Status(target));
        }
        return skip(Skip::SubResource);
    }
    if !acts_on(target, operation) {
        return skip(Skip::Operation);
    }
    Ok(Route::Spec(target))
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

/// What scope reads of a request: its operation and namespace, and its objects, parsed
/// (`Value`) or sketched (the webhook's first look at a created object).
pub(super) struct Objects<'a, T> {
    pub operation: Operation,
    pub namespace: &'a str,
    pub object: Option<&'a T>,
    pub old_object: Option<&'a T>,
}

impl<'a> Subject<'a> {
    /// What scope reads of this request.
    pub(super) fn objects(&self) -> Objects<'a, Value> {
        Objects {
            operation: self.operation,
            namespace: self.namespace,
            object: self.object,
            old_object: self.old_object,
        }
    }
}

/// A pod spec in scope: where it is, whose it is, and which rules the object says to skip.
pub(super) struct InScope<'a, T = Value> {
    pub target: &'static Target,
    pub object: &'a T,
    pub namespace: &'a str,
    pub raw_spec: &'a T,
    pub meta: PodMeta,
    pub skipped_rules: SkipList,
}

/// The pod spec of `request`'s object, unless podmend leaves the object alone: no object, an
/// excluded namespace, a mirror pod, a ReplicaSet its Deployment controls, a template an
/// UPDATE left as it was, no pod spec, or `podmend.io/skip: all`.
pub(super) fn pod_spec<'a, T: Tree>(
    engine: &Engine,
    target: &'static Target,
    request: &Objects<'a, T>,
) -> Result<InScope<'a, T>, Outcome> {
    let skip = |reason| Err(Outcome::skipped(Some(target), reason));
    let Some(object) = request.object.filter(|o| o.is_object()) else {
        return skip(Skip::NoObject);
    };
    let namespace = namespace_of(request.namespace, object);
    if engine.excludes(namespace) {
        return skip(Skip::ExcludedNamespace);
    }
    let object_annotations = string_map(target::at(object, "/metadata/annotations"));
    if target.kind == WorkloadKind::Pod && object_annotations.contains_key(MIRROR_ANNOTATION) {
        return skip(Skip::MirrorPod);
    }
    if target.kind == WorkloadKind::ReplicaSet && has_deployment_controller(object) {
        return skip(Skip::DeploymentOwnedReplicaSet);
    }
    if request.operation == Operation::Update {
        let template = target.template.unwrap_or(target.spec);
        let old = request.old_object.and_then(|o| target::at(o, template));
        if old.is_some() && old == target::at(object, template) {
            return skip(Skip::TemplateUnchanged);
        }
    }
    let Some(raw_spec) = target::at(object, target.spec) else {
        return skip(Skip::NoPodSpec);
    };
    let metadata = target::at(object, target.metadata);
    let meta = PodMeta {
        labels: string_map(metadata.and_then(|m| m.field("labels"))),
        annotations: string_map(metadata.and_then(|m| m.field("annotations"))),
        controller_kind: controller_kind(target, object),
    };
    let skipped_rules = SkipList::from_annotations([&object_annotations, &meta.annotations]);
    if skipped_rules.all {
        return skip(Skip::SkipAnnotation);
    }
    Ok(InScope {
        target,
        object,
        namespace,
        raw_spec,
        meta,
        skipped_rules,
    })
}

/// The request's namespace, or the object's own when the request names none.
pub(super) fn namespace_of<'a>(namespace: &'a str, object: &'a dyn View) -> &'a str {
    if namespace.is_empty() {
        object
            .field("metadata")
            .and_then(|metadata| metadata.string("namespace"))
            .unwrap_or("")
    } else {
        namespace
    }
}

/// The owners listed in an object's `metadata.ownerReferences`.
fn owners(object: &dyn View) -> impl Iterator<Item = &dyn View> {
    object
        .field("metadata")
        .and_then(|metadata| metadata.field("ownerReferences"))
        .and_then(|owners| owners.items())
        .into_iter()
        .flatten()
}

/// Whether `owner` is its object's controller.
fn is_controller(owner: &dyn View) -> bool {
    owner.field("controller").and_then(|c| c.as_bool()) == Some(true)
}

/// The kind of the controller of the pods `object` describes: a Pod's controlling owner, or
/// the workload whose template it is (none for a `PodTemplate`, which controls nothing).
pub(super) fn controller_kind(target: &Target, object: &dyn View) -> Option<String> {
    match target.kind {
        WorkloadKind::Pod => owners(object)
            .find(|owner| is_controller(*owner))
            .and_then(|owner| owner.string("kind"))
            .map(str::to_string),
        WorkloadKind::PodTemplate => None,
        _ => Some(target.name.to_string()),
    }
}

/// A ReplicaSet its Deployment controls: mutating its template makes the Deployment
/// controller create ReplicaSets without end (kubernetes#57167).
fn has_deployment_controller(object: &dyn View) -> bool {
    owners(object).any(|owner| is_controller(owner) && owner.string("kind") == Some("Deployment"))
}

/// The `podmend.io/skip` annotation: `all`, or a comma-separated list of rule ids.
#[derive(Default)]
pub(super) struct SkipList {
    pub all: bool,
    rules: Vec<String>,
}

impl SkipList {
    pub fn from_annotations<'a>(
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

    pub fn contains(&self, rule: &str) -> bool {
        self.all || self.rules.iter().any(|r| r == rule)
    }
}

/// The string entries of a JSON map (labels, annotations); other values are left out. A key
/// written twice (a sketch keeps both) counts as its last value, as serde_json reads it.
pub(super) fn string_map(value: Option<&(impl View + ?Sized)>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    if let Some(value) = value {
        value.members(&mut |key, value| match value.as_str() {
            Some(text) => {
                map.insert(key.to_string(), text.to_string());
            }
            None => {
                map.remove(key);
            }
        });
    }
    map
}
