//! Runs the rule registry on one object and computes the JSON Patch. Knows which objects,
//! operations and annotations are acted on; knows nothing of HTTP. `serve` calls
//! [`Engine::review_raw`] with the request's objects sketched, `audit` [`Engine::review`]
//! with parsed manifests; both decide the same.
//!
//! A review reads top to bottom:
//! - [`scope`]: whether podmend acts on the request (kind, subresource, operation), then on
//!   the object (namespace, mirror pods, Deployment-owned ReplicaSets, unchanged templates,
//!   the skip annotation), and the pod spec with its labels and annotations;
//! - [`run`]: the rules whose cheap look finds something repair a typed copy of the spec (of
//!   the parts they read, when each names them), each with its finding and patch;
//! - [`patch`]: the patch enforce-mode rules apply and the whole repair, with the
//!   `podmend.io/mutated` annotation, checked to apply to the object as sent;
//! - [`diff`]: the name-aware JSON diff the patches are computed with, and [`spec_diff`]:
//!   that diff of two pod specs, serializing only the fields that differ;
//! - [`status`]: `UPDATE pods/status` for the status rules;
//! - [`document`]: the raw object sketched (only what scope and the rules' cheap look read),
//!   read in the parts the rules that may act read of it (when each names them,
//!   [`Rule::reads`](crate::rules::Rule::reads)), or parsed (without managedFields).
//!
//! The patch is the diff of two serializations of the same typed pod spec (before and after
//! the rules; only the fields that differ are serialized), so a field our Kubernetes types do
//! not know is in neither and is never removed.
//! Lists of named items (containers, volumes) are diffed by name, so such a field also stays
//! on its own container when a container is inserted before it.

mod diff;
pub mod document;
mod patch;
mod run;
#[cfg(debug_assertions)]
mod same_cluster;
mod scope;
mod spec_diff;
mod status;

use std::borrow::Cow;

use json_patch::PatchOperation;
use serde_json::Value;

use crate::cluster::ClusterView;
use crate::config::{Config, Mode};
use crate::rules::{self, Rule, StatusRule};
use crate::target::Target;
use document::{Sketch, View};
use scope::Route;

/// Lists rules (or `all`) podmend must leave alone on this object.
pub const SKIP_ANNOTATION: &str = "podmend.io/skip";
/// What podmend's own annotations start with: the only ones a rule's `may_apply` reads.
pub const PODMEND_ANNOTATIONS: &str = "podmend.io/";
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

/// One object under review, as the API server describes it, its objects parsed (`audit`
/// reads manifests into JSON trees).
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

/// The same as the webhook decodes it: the objects sketched as the request was read (only
/// what scope and the rules' cheap look read, see [`document`]), and read whole only when a
/// review needs more.
#[derive(Clone, Copy)]
pub struct RawSubject<'a> {
    pub operation: Operation,
    pub group: &'a str,
    pub kind: &'a str,
    pub sub_resource: &'a str,
    pub namespace: &'a str,
    /// Sketches of the objects.
    pub object: Option<&'a Sketch<'a>>,
    pub old_object: Option<&'a Sketch<'a>>,
    /// The request, to read its objects whole.
    pub whole: &'a dyn WholeObjects,
}

/// A request that can read its objects whole (`object`, `oldObject`), without
/// `metadata.managedFields`, `None` for one it does not have.
pub trait WholeObjects {
    fn read_whole(&self) -> Result<(Option<Value>, Option<Value>), serde_json::Error>;
    /// Only the parts of `object` that `keep` keeps (what a review of a created object reads
    /// when its rules name what they read); `None` when the request has no object.
    fn read_object(&self, keep: document::Union) -> Result<Option<Value>, serde_json::Error>;
}

impl<'a> RawSubject<'a> {
    /// This request with parsed objects.
    fn with<'b>(&self, object: Option<&'b Value>, old_object: Option<&'b Value>) -> Subject<'b>
    where
        'a: 'b,
    {
        Subject {
            operation: self.operation,
            group: self.group,
            kind: self.kind,
            sub_resource: self.sub_resource,
            namespace: self.namespace,
            object,
            old_object,
        }
    }
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
    UndecodablePodSpec(Box<str>),
    /// Reading the whole object failed although the request decoded. `admission::decode`
    /// refuses what would fail here (too deep, not UTF-8, not JSON): a safety net.
    UnreadableObject(Box<str>),
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
            Skip::UnreadableObject(_) => "unreadable-object",
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

    /// Whether applying the finding repairs the object: not a note, and not a change that
    /// leaves the problem in place (a Docker guard the pod's clients can go around, whose
    /// first words say so).
    pub fn repairs(&self) -> bool {
        !self.is_note()
            && !self
                .messages
                .first()
                .is_some_and(|m| m.starts_with(crate::dind::BYPASSABLE))
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
    /// [`Outcome::repair`] when it differs from `patch` (a rule that only warns changed
    /// something); `None` when the two are one, which is not copied.
    repair: Option<Vec<PatchOperation>>,
    /// The object's `metadata.name`, or its `generateName` while it has none, when the review
    /// read the object (`None` for a request routed away before): the webhook's log line.
    pub name: Option<Box<str>>,
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

    /// This outcome, with the name of the object it read.
    fn named(mut self, object: Option<&dyn View>) -> Self {
        self.name = Some(object.map_or("", document::name).into());
        self
    }

    /// Every finding's repair plus the annotation, whatever the modes: the patch the webhook
    /// sends for this object when every rule enforces. `audit` shows and applies it.
    pub fn repair(&self) -> &[PatchOperation] {
        self.repair.as_deref().unwrap_or(&self.patch)
    }

    /// The findings acted on in `mode`.
    pub fn in_mode(&self, mode: Mode) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.mode == mode)
    }
}

/// What the spec rules came to: an outcome, or patches still to check against the object.
enum Repaired {
    Done(Outcome),
    Patches(Patches),
}

/// Whether two lists name the same rules in the same modes.
fn same_rules(a: &[(&dyn Rule, Mode)], b: &[(&dyn Rule, Mode)]) -> bool {
    a.iter()
        .map(|(rule, mode)| (rule.id(), *mode))
        .eq(b.iter().map(|(rule, mode)| (rule.id(), *mode)))
}

/// What a created object's sketch shows.
enum Sketched<'e, 's> {
    /// Skipped by scope, or in scope with no rule that may act: the outcome.
    Decided(Outcome),
    /// These rules may act on the pod spec in scope: more of the object is needed.
    MayAct(Vec<(&'e dyn Rule, Mode)>, scope::InScope<'s, Sketch<'s>>),
}

/// A repair's findings and patches, before they are checked to apply.
struct Patches {
    findings: Vec<Finding>,
    patch: Vec<PatchOperation>,
    /// The repair, when it differs from `patch`.
    repair: Option<Vec<PatchOperation>>,
}

impl Patches {
    fn finish(self, target: &'static Target, object: Cow<'_, Value>) -> Outcome {
        patch::finish(target, object, self.findings, self.patch, self.repair)
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
        let route = scope::route(
            self,
            subject.operation,
            subject.group,
            subject.kind,
            subject.sub_resource,
        );
        let outcome = match route {
            Err(outcome) => return outcome,
            Ok(Route::Status(target)) => status::review(self, target, subject, cluster),
            Ok(Route::Spec(target)) => self.review_spec(target, subject, cluster),
        };
        outcome.named(subject.object.map(|object| object as &dyn View))
    }

    /// Reviews a request as the webhook decodes it, as [`review`](Self::review) would once its
    /// objects are parsed, reading them whole only when it needs to: not for a request routed
    /// away (a DELETE, another subresource, an unhandled kind), nor for a created object
    /// whose sketch shows no rule may act on it, which is what most pods are. A created object
    /// whose rules that may act each name what they read is repaired from its sketch alone
    /// when the sketch holds all they read and change (a pinned agent pod): the object is not
    /// read again. Debug builds then review it as before as well, and compare.
    pub fn review_raw(&self, subject: &RawSubject<'_>, cluster: &dyn ClusterView) -> Outcome {
        let route = scope::route(
            self,
            subject.operation,
            subject.group,
            subject.kind,
            subject.sub_resource,
        );
        let (target, spec) = match route {
            Err(outcome) => return outcome,
            Ok(Route::Spec(target)) => (target, true),
            Ok(Route::Status(target)) => (target, false),
        };
        // Debug builds review a repair twice and compare; the caches may change in between.
        #[cfg(debug_assertions)]
        let remembered = same_cluster::Remembered::new(cluster);
        #[cfg(debug_assertions)]
        let cluster: &dyn ClusterView = &remembered;
        // The rules the sketch shows may act: the whole object shows the same (the sketch
        // holds every field `may_apply` reads), so they are not looked for again.
        let mut sketched_active = None;
        if spec
            && subject.operation == Operation::Create
            && let Some(sketch) = subject.object
        {
            let sketched = scope::Objects {
                operation: subject.operation,
                namespace: subject.namespace,
                object: Some(sketch),
                old_object: None,
            };
            match self.decided_by_sketch(target, &sketched) {
                Sketched::Decided(outcome) => return outcome.named(Some(sketch)),
                Sketched::MayAct(active, in_scope) => {
                    if let Some(outcome) = self.repair_sketched(&active, &in_scope, cluster) {
                        let outcome = outcome.named(Some(sketch));
                        #[cfg(debug_assertions)]
                        {
                            let read =
                                self.review_read(subject, (target, spec), Some(active), cluster);
                            debug_assert_eq!(
                                outcome, read,
                                "the repair from the sketch differs from the repair of the object read again"
                            );
                        }
                        return outcome;
                    }
                    sketched_active = Some(active);
                }
            }
        }
        self.review_read(subject, (target, spec), sketched_active, cluster)
    }

    /// [`review_raw`](Self::review_raw) once the sketch did not settle it: the object read
    /// (in the parts the rules in `sketched_active` read, when the sketch showed them and each
    /// names them), and reviewed by the spec rules (`spec`) or the status rules.
    fn review_read(
        &self,
        subject: &RawSubject<'_>,
        (target, spec): (&'static Target, bool),
        sketched_active: Option<run::Active<'_>>,
        cluster: &dyn ClusterView,
    ) -> Outcome {
        // A created object whose rules each name what they read is read no further: most of
        // a large pod is never built.
        let reads = sketched_active
            .as_deref()
            .and_then(|active| run::object_reads(active, target));
        let read = match reads {
            Some(keep) => subject.whole.read_object(keep).map(|object| (object, None)),
            None => subject.whole.read_whole(),
        };
        let (object, old) = match read {
            Ok(objects) => objects,
            Err(error) => {
                return Outcome::skipped(
                    Some(target),
                    Skip::UnreadableObject(error.to_string().into()),
                );
            }
        };
        let parsed = subject.with(object.as_ref(), old.as_ref());
        if !spec {
            let object = object.as_ref().map(|object| object as &dyn View);
            return status::review(self, target, &parsed, cluster).named(object);
        }
        let name = object
            .as_ref()
            .map_or("", |object| document::name(object))
            .into();
        let spec_read = match reads {
            Some(_) => run::SpecRead::InPart,
            None => run::SpecRead::Whole,
        };
        let sketched = sketched_active.map(|active| (active, spec_read));
        let outcome = match self.repair_spec(target, &parsed, cluster, sketched) {
            Repaired::Done(outcome) => outcome,
            // The object was parsed for this review: it is patched in place to check.
            Repaired::Patches(patches) => {
                patches.finish(target, Cow::Owned(object.unwrap_or(Value::Null)))
            }
        };
        Outcome {
            name: Some(name),
            ..outcome
        }
    }

    /// The outcome of a created object when its sketch settles it: skipped by scope, or in
    /// scope with no rule that may act. Otherwise the rules that may act, for which the whole
    /// object is needed.
    fn decided_by_sketch<'s>(
        &self,
        target: &'static Target,
        sketched: &scope::Objects<'s, Sketch<'s>>,
    ) -> Sketched<'_, 's> {
        let in_scope = match scope::pod_spec(self, target, sketched) {
            Ok(in_scope) => in_scope,
            Err(outcome) => return Sketched::Decided(outcome),
        };
        let active = run::active(self, &in_scope);
        if active.is_empty() {
            return Sketched::Decided(Outcome::clean(target));
        }
        Sketched::MayAct(active, in_scope)
    }

    /// The repair of a created object by rules that each name what they read, from its
    /// sketch alone: the spec read from it in those parts, the patches checked on it. The
    /// object is never read again. `None` when the sketch lacks a part this needs, the spec
    /// does not decode from it, or the check cannot tell: the caller reads the object, and
    /// decides (and words any error) as before.
    fn repair_sketched(
        &self,
        active: &run::Active<'_>,
        in_scope: &scope::InScope<'_, Sketch<'_>>,
        cluster: &dyn ClusterView,
    ) -> Option<Outcome> {
        let keep = run::spec_reads(active)?;
        let sketched = document::sketched_at(in_scope.target.spec)?;
        let original = document::scan::reread_as(in_scope.raw_spec, sketched, keep)?;
        let ran = run::run_read(active.clone(), original, in_scope, cluster);
        let (patch, repair) = patch::spec_patches(in_scope, &ran);
        patch::finish_sketched(
            in_scope.target,
            in_scope.object,
            ran.findings,
            patch,
            repair,
        )
    }

    /// The pod spec rules on a Pod or a pod template.
    fn review_spec(
        &self,
        target: &'static Target,
        subject: &Subject<'_>,
        cluster: &dyn ClusterView,
    ) -> Outcome {
        match self.repair_spec(target, subject, cluster, None) {
            Repaired::Done(outcome) => outcome,
            Repaired::Patches(patches) => {
                // Only a repaired object gets here, and it has an object.
                let object = subject
                    .object
                    .map_or(Cow::Owned(Value::Null), Cow::Borrowed);
                patches.finish(target, object)
            }
        }
    }

    /// The rules on a spec in scope, up to the patches, which are not yet checked against
    /// the object: `finish` does, with an object the caller may own. `sketched`: the rules that
    /// may act, when the object's sketch already showed them, and how much of the spec the
    /// object was read with.
    fn repair_spec(
        &self,
        target: &'static Target,
        subject: &Subject<'_>,
        cluster: &dyn ClusterView,
        sketched: Option<(run::Active<'_>, run::SpecRead)>,
    ) -> Repaired {
        let in_scope = match scope::pod_spec(self, target, &subject.objects()) {
            Ok(in_scope) => in_scope,
            Err(outcome) => return Repaired::Done(outcome),
        };
        let (active, spec_read) = match sketched {
            Some((sketched, spec_read)) => {
                debug_assert!(
                    same_rules(&sketched, &run::active(self, &in_scope)),
                    "the sketch and the whole object disagree on the rules that may act"
                );
                (sketched, spec_read)
            }
            None => (run::active(self, &in_scope), run::SpecRead::Whole),
        };
        if active.is_empty() {
            return Repaired::Done(Outcome::clean(target));
        }
        let ran = match run::run(active, &in_scope, cluster, spec_read) {
            Ok(ran) => ran,
            Err(reason) => return Repaired::Done(Outcome::skipped(Some(target), reason)),
        };
        let (patch, repair) = patch::spec_patches(&in_scope, &ran);
        Repaired::Patches(Patches {
            findings: ran.findings,
            patch,
            repair,
        })
    }

    /// Whether `namespace` is one podmend never acts in.
    fn excludes(&self, namespace: &str) -> bool {
        self.exclude_namespaces.iter().any(|n| n == namespace)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::scope::controller_kind;
    use super::*;
    use crate::cluster::StaticCluster;
    use crate::target;

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

    #[test]
    fn an_outcome_names_the_object_it_read_by_its_generate_name_until_it_has_a_name() {
        let (e, c) = (engine(), StaticCluster::offline());
        let spec = json!({"containers": [{"name": "c", "image": "nginx"}]});
        let unnamed = json!({"metadata": {"generateName": "web-", "name": ""}, "spec": spec});
        let review = |object: &Value| e.review(&create("", "Pod", object), &c).name;
        assert_eq!(review(&unnamed).as_deref(), Some("web-"));
        assert_eq!(review(&pod(spec)).as_deref(), Some("p"));
        // Routed away before the object is read: the request names it.
        let delete = Subject {
            operation: Operation::Delete,
            ..create("", "Pod", &unnamed)
        };
        assert_eq!(e.review(&delete, &c).name, None);
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
            "spec": {"template": {"metadata": {"labels": {"kube-cert-agent.pinniped.dev": "v3"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]}}}});
        let warned = engine().review(&create("apps", "Deployment", &object), &cluster());
        let mut config = Config::default();
        config.rules.node_affinity.templates = Mode::Enforce;
        config.rules.agent_requests.templates = Mode::Enforce;
        let enforced =
            Engine::new(&config).review(&create("apps", "Deployment", &object), &cluster());
        assert!(warned.patch.is_empty());
        assert_eq!(warned.repair(), enforced.patch);
        assert_eq!(enforced.repair(), enforced.patch);
        let patched = apply(&object, warned.repair());
        assert_eq!(
            patched["spec"]["template"]["metadata"]["annotations"][MUTATED_ANNOTATION],
            "node-affinity,agent-requests"
        );
    }

    #[test]
    fn a_warn_mode_repair_stays_out_of_the_patch_after_a_finding_that_changed_nothing() {
        // dind-rm leaves a DaemonSet's pod alone with a note (a finding, no change); then
        // agent-requests, in warn mode here, repairs the agent's requests: the repair `audit`
        // shows, but nothing the webhook applies.
        let mut config = Config::default();
        config.rules.agent_requests.mode = Mode::Warn;
        let object = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns",
                "annotations": {"podmend.io/agent": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d",
                    "uid": "u", "controller": true}]},
            "spec": {
                "containers": [{"name": "a", "image": "docker:24",
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
                    "volumeMounts": [{"name": "sock", "mountPath": "/var/run/docker.sock"}]}],
                "volumes": [{"name": "sock", "hostPath": {"path": "/var/run/docker.sock"}}]}});
        let outcome = Engine::new(&config).review(&create("", "Pod", &object), &cluster());
        let rules: Vec<_> = outcome.findings.iter().map(|f| (f.rule, f.mode)).collect();
        assert_eq!(
            rules,
            [("dind-rm", Mode::Enforce), ("agent-requests", Mode::Warn)],
            "{:#?}",
            outcome.findings
        );
        assert!(outcome.findings[0].patch.is_empty());
        assert!(!outcome.findings[1].patch.is_empty());
        assert!(outcome.patch.is_empty(), "{:#?}", outcome.patch);
        assert!(!outcome.repair().is_empty());
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
            "metadata": {"name": "p", "labels": {"kube-cert-agent.pinniped.dev": "v3"}, "annotations": {SKIP_ANNOTATION: "node-affinity"}},
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
    fn a_field_no_rule_that_may_act_reads_is_never_decoded() {
        // Only node-affinity may act, and it reads nodeName, affinity and tolerations: a
        // broken volume list (which the API server's own decoding refuses before admission)
        // is not built, and the repair is the one the same pod gets with valid volumes.
        let broken = pod(json!({"nodeName": "n1", "volumes": "not a list",
            "containers": [{"name": "a", "ports": 80}]}));
        let valid = pod(json!({"nodeName": "n1", "containers": [{"name": "a"}]}));
        let review = |object| engine().review(&create("", "Pod", object), &cluster());
        let (repaired, expected) = (review(&broken), review(&valid));
        assert_eq!(repaired.skipped, None);
        assert_eq!(repaired.patch, expected.patch);
        assert!(!repaired.patch.is_empty());
    }

    /// What the sketch path makes of `object` created: `repair_sketched`'s outcome (`None`
    /// when it leaves the object to be read again), beside `review`'s.
    fn repaired_from_sketch(object: &Value, cluster: &StaticCluster) -> (Option<Outcome>, Outcome) {
        let engine = engine();
        let text = object.to_string();
        let sketch = document::scan::Scanner::new(&text)
            .sketch()
            .flatten()
            .expect("the scanner sketches the pod");
        let target = target::for_kind("", "Pod").expect("pods are handled");
        let sketched = scope::Objects {
            operation: Operation::Create,
            namespace: "ns",
            object: Some(&sketch),
            old_object: None,
        };
        let Sketched::MayAct(active, in_scope) = engine.decided_by_sketch(target, &sketched) else {
            panic!("a rule may act on the pod");
        };
        let fast = engine
            .repair_sketched(&active, &in_scope, cluster)
            .map(|outcome| outcome.named(Some(&sketch)));
        let whole = engine.review(&create("", "Pod", object), cluster);
        (fast, whole)
    }

    #[test]
    fn a_pinned_agent_pod_is_repaired_from_its_sketch_as_from_the_whole_object() {
        let object = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent", "namespace": "ns",
                         "annotations": {"podmend.io/agent": "true", "other": "x"}},
            "spec": {"nodeName": "n1", "futureField": 1,
                     "containers": [{"name": "a", "image": "x", "env": [{"name": "E"}],
                                     "resources": {"requests": {"cpu": "100m"},
                                                   "limits": {"cpu": "1"}}}]}});
        let (fast, whole) = repaired_from_sketch(&object, &cluster());
        let fast = fast.expect("the sketch holds all the repair reads and changes");
        assert_eq!(fast, whole);
        let rules: Vec<_> = fast.findings.iter().map(|f| f.rule).collect();
        assert_eq!(rules, ["node-affinity", "agent-requests"]);
    }

    #[test]
    fn a_repair_that_would_move_a_lists_items_is_checked_on_the_object_read_again() {
        use k8s_openapi::api::core::v1::Taint;
        // The node's taint is tolerated at /spec/tolerations/1: an `add` into a list, whose
        // other items the sketch path does not hold.
        let taint = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        let cluster = StaticCluster::empty().with_node("n1", vec![taint]);
        let object = pod(
            json!({"nodeName": "n1", "tolerations": [{"operator": "Exists",
            "key": "other"}], "containers": [{"name": "a", "image": "x"}]}),
        );
        let (fast, whole) = repaired_from_sketch(&object, &cluster);
        assert_eq!(fast, None);
        assert!(
            whole
                .patch
                .iter()
                .any(|op| op.path().as_str() == "/spec/tolerations/1")
        );
    }

    /// A rule that reads `hostNetwork` but names only `nodeName` as what it reads.
    struct MisdeclaredReads;

    static ONLY_NODE_NAME: document::Shape =
        document::Shape::Fields(&[("nodeName", &document::Shape::All)]);

    impl Rule for MisdeclaredReads {
        fn info(&self) -> &'static rules::RuleInfo {
            &rules::node_affinity::INFO
        }
        fn modes(&self) -> rules::Modes {
            rules::Modes {
                pods: Mode::Enforce,
                templates: Mode::Enforce,
            }
        }
        fn may_apply(&self, _: &dyn View, _: &rules::PodMeta) -> bool {
            true
        }
        fn reads(&self) -> Option<&'static document::Shape> {
            Some(&ONLY_NODE_NAME)
        }
        fn repair(
            &self,
            spec: &mut k8s_openapi::api::core::v1::PodSpec,
            _: &rules::PodMeta,
            _: &rules::RuleContext<'_>,
        ) -> Vec<String> {
            if spec.host_network == Some(true) {
                return Vec::new();
            }
            spec.node_name = None;
            vec!["removed nodeName".to_string()]
        }
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "its `reads` does not name")]
    fn debug_builds_catch_a_rule_that_reads_more_than_it_names() {
        let engine = Engine {
            rules: vec![Box::new(MisdeclaredReads)],
            status_rules: Vec::new(),
            exclude_namespaces: Vec::new(),
        };
        let object =
            pod(json!({"nodeName": "n1", "hostNetwork": true, "containers": [{"name": "a"}]}));
        engine.review(&create("", "Pod", &object), &cluster());
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
        assert_eq!(outcome.repair().len(), 1);
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
