//! Running the pod spec rules on a spec in scope: which rules are active, each rule's repair
//! of a typed copy of the spec, and its finding with its own patch.
//!
//! Two states advance through the rules: what every rule would apply (the repair `audit`
//! shows) and what enforce-mode rules apply (the webhook's patch). They are one and the same
//! until a rule that only warns changes something, so nothing is cloned in the common case.

use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::PodSpec;
use serde::Deserialize;

use super::document::{self, Part, SCOPE, Shape, TEMPLATE_METADATA, Union, View};
use super::patch::{parse_pointer, prefixed};
use super::scope::InScope;
use super::{Engine, Finding, Skip, spec_diff};
use crate::cluster::ClusterView;
use crate::config::Mode;
use crate::rules::{Rule, RuleContext};
use crate::target::Target;

/// Rules that may act on a spec, each in the mode it acts in there, in registry order.
pub(super) type Active<'e> = Vec<(&'e dyn Rule, Mode)>;

/// The rules that may act on the spec: not off for its kind of target, not skipped by its
/// annotations, and whose cheap look at the raw spec found something.
pub(super) fn active<'e, T: View>(engine: &'e Engine, scope: &InScope<'_, T>) -> Active<'e> {
    engine
        .rules
        .iter()
        .map(|rule| {
            let mode = rule.modes().for_target(scope.target.is_template());
            (rule.as_ref(), mode)
        })
        .filter(|(rule, mode)| {
            *mode != Mode::Off
                && !scope.skipped_rules.contains(rule.id())
                && rule.may_apply(scope.raw_spec, &scope.meta)
        })
        .collect()
}

/// What every pod spec needs to decode, whatever the rules read: each container's name.
static SPEC_NEEDS: Shape = Shape::Fields(&[("containers", &Shape::Items(&NAME))]);
static NAME: Shape = Shape::Fields(&[("name", &Shape::All)]);

/// What `active` read of a pod spec, when each names its parts ([`Rule::reads`]): the spec
/// the rules are run on. `None` when one reads the whole spec.
pub(super) fn spec_reads(active: &[(&dyn Rule, Mode)]) -> Option<Union> {
    reads(active, &[], Part::Here)
}

/// What a review of a created `target` reads of its object once the sketch showed `active`
/// may act: what scope reads (the object's metadata and the template's), and what the rules
/// read of its pod spec. `None` when a rule reads the whole spec: the object is then read
/// whole.
pub(super) fn object_reads(active: &[(&dyn Rule, Mode)], target: &Target) -> Option<Union> {
    let scope = [
        Part::Here(&SCOPE),
        Part::Below(target.metadata, &TEMPLATE_METADATA),
    ];
    reads(active, &scope, |spec| Part::Below(target.spec, spec))
}

fn reads(
    active: &[(&dyn Rule, Mode)],
    object: &[Part],
    at_spec: impl Fn(&'static Shape) -> Part,
) -> Option<Union> {
    if active.iter().any(|(rule, _)| rule.reads().is_none()) {
        return None;
    }
    let rules = active.iter().filter_map(|(rule, _)| rule.reads());
    let spec = std::iter::once(&SPEC_NEEDS).chain(rules).map(at_spec);
    Union::of(object.iter().copied().chain(spec))
}

/// How much of a pod spec in scope was read: all of it, or already only the parts the rules
/// that may act read (the webhook's second read of a created object).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum SpecRead {
    Whole,
    InPart,
}

/// A pod spec as the rules left it.
pub(super) struct State {
    pub spec: PodSpec,
    /// Whether a rule found something in it (changed it or left a note).
    pub touched: bool,
}

/// What the rules did to the spec.
pub(super) struct Ran {
    pub findings: Vec<Finding>,
    /// The spec as decoded: what the states are diffed against.
    pub original: PodSpec,
    /// Where the spec is in the object: what every patch path starts with.
    pub spec_pointer: PointerBuf,
    /// Every rule's repair applied.
    pub repaired: State,
    /// What the rules' diffs read of `repaired`.
    pub seen: spec_diff::Seen,
    /// Enforce-mode repairs only, once a warn-mode rule changed something; `None` while
    /// the two are one.
    pub applied: Option<State>,
}

/// Runs `active` on the typed spec, in registry order: on the parts of it they read when each
/// names them ([`spec_reads`]; taken here from a spec read whole). A spec that does not decode
/// is left to the API server's validation, which says what is wrong.
pub(super) fn run(
    active: Vec<(&dyn Rule, Mode)>,
    scope: &InScope<'_>,
    cluster: &dyn ClusterView,
    spec_read: SpecRead,
) -> Result<Ran, Skip> {
    let read = match spec_read {
        SpecRead::Whole => spec_reads(&active).map(|keep| document::project(scope.raw_spec, keep)),
        SpecRead::InPart => None,
    };
    let original = PodSpec::deserialize(read.as_ref().unwrap_or(scope.raw_spec))
        .map_err(|error| Skip::UndecodablePodSpec(error.to_string().into()))?;
    let cx = RuleContext {
        namespace: scope.namespace,
        cluster,
    };
    #[cfg(debug_assertions)]
    let checked = read.is_some().then(|| active.clone());
    let ran = run_rules(active, original, scope, &cx);
    #[cfg(debug_assertions)]
    if let Some(active) = checked {
        check_reads(active, &ran, scope, &cx);
    }
    Ok(ran)
}

/// Runs `active` on `original`, a spec already read in the parts they read (the webhook's,
/// from the sketch of a created object).
pub(super) fn run_read<T>(
    active: Vec<(&dyn Rule, Mode)>,
    original: PodSpec,
    scope: &InScope<'_, T>,
    cluster: &dyn ClusterView,
) -> Ran {
    let cx = RuleContext {
        namespace: scope.namespace,
        cluster,
    };
    run_rules(active, original, scope, &cx)
}

/// Debug builds (every unit, property, fixture and fuzz run): rules run on the parts of a spec
/// they name find what they find on the whole spec, where it decodes. Checked where the spec
/// was read whole (`review`, which the tests hold equal to the webhook's `review_raw`).
#[cfg(debug_assertions)]
fn check_reads(
    active: Vec<(&dyn Rule, Mode)>,
    ran: &Ran,
    scope: &InScope<'_>,
    cx: &RuleContext<'_>,
) {
    if let Ok(whole) = PodSpec::deserialize(scope.raw_spec) {
        let on_whole = run_rules(active, whole, scope, cx);
        debug_assert!(
            on_whole.findings == ran.findings,
            "a rule read a part of the pod spec its `reads` does not name:\n{:?}\n{:?}",
            on_whole.findings,
            ran.findings
        );
    }
}

/// Runs `active` on `original`.
fn run_rules<T>(
    active: Vec<(&dyn Rule, Mode)>,
    original: PodSpec,
    scope: &InScope<'_, T>,
    cx: &RuleContext<'_>,
) -> Ran {
    let mut ran = Ran::new(original, scope);
    for (rule, mode) in active {
        // The spec before this rule, copied only when needed: to diff against once a rule has
        // found something (until then it is the original), and, while the states are one, for
        // the applied state if this rule only warns and changes something (it parts them).
        let may_part = ran.applied.is_none() && mode != Mode::Enforce;
        let before = (ran.repaired.touched || may_part).then(|| ran.repaired.spec.clone());
        let messages = rule.repair(&mut ran.repaired.spec, &scope.meta, cx);
        let patch = ran.step_patch(before.as_ref());
        if messages.is_empty() && patch.is_empty() {
            continue;
        }
        let touched_before = std::mem::replace(&mut ran.repaired.touched, true);
        if !patch.is_empty() {
            ran.follow_in_applied((rule, mode), before, touched_before, scope, cx);
        }
        ran.findings.push(Finding {
            rule: rule.id(),
            mode,
            messages,
            advice: rule.info().help,
            patch,
        });
    }
    ran
}

impl Ran {
    /// Nothing run yet: both states are the spec as decoded.
    fn new<T>(original: PodSpec, scope: &InScope<'_, T>) -> Self {
        Self {
            repaired: State {
                spec: original.clone(),
                touched: false,
            },
            original,
            spec_pointer: parse_pointer(scope.target.spec),
            seen: spec_diff::Seen::default(),
            applied: None,
            findings: Vec::new(),
        }
    }

    /// The patch of the rule that just ran on `repaired`: its diff from `before` (the
    /// original while no rule has found anything), below the spec's pointer.
    fn step_patch(&mut self, before: Option<&PodSpec>) -> Vec<json_patch::PatchOperation> {
        prefixed(
            &self.spec_pointer,
            spec_diff::step(
                before.unwrap_or(&self.original),
                &self.repaired.spec,
                &mut self.seen,
            ),
        )
    }

    /// Keeps the applied state (enforce-mode repairs only) in step with a rule that changed
    /// the repaired one, and parts the two states when that rule only warns: `before` is the
    /// repaired spec before the rule, `touched_before` whether a rule had touched it.
    fn follow_in_applied<T>(
        &mut self,
        (rule, mode): (&dyn Rule, Mode),
        before: Option<PodSpec>,
        touched_before: bool,
        scope: &InScope<'_, T>,
        cx: &RuleContext<'_>,
    ) {
        match (&mut self.applied, mode) {
            // An enforce-mode rule after the states parted: apply it to what is applied.
            (Some(enforced), Mode::Enforce) => {
                rule.repair(&mut enforced.spec, &scope.meta, cx);
                enforced.touched = true;
            }
            // A rule that only warns changed something: the states part here.
            (None, mode) if mode != Mode::Enforce => {
                self.applied = before.map(|spec| State {
                    spec,
                    touched: touched_before,
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::target::TARGETS;

    /// The rules of `rules` that name what they read, enforcing.
    fn naming(rules: &[Box<dyn Rule>]) -> Vec<(&dyn Rule, Mode)> {
        rules
            .iter()
            .filter(|rule| rule.reads().is_some())
            .map(|rule| (rule.as_ref(), Mode::Enforce))
            .collect()
    }

    #[test]
    fn every_rule_that_names_its_reads_fits_one_union_on_every_target() {
        let rules = crate::rules::registry(&Config::default());
        let naming = naming(&rules);
        assert!(
            naming.len() >= 2,
            "node-affinity and agent-requests name their reads"
        );
        assert!(spec_reads(&naming).is_some());
        for target in TARGETS {
            assert!(object_reads(&naming, target).is_some(), "{}", target.name);
        }
        // A rule that reads the whole spec: the object is read whole.
        let all: Vec<(&dyn Rule, Mode)> = rules
            .iter()
            .map(|rule| (rule.as_ref(), Mode::Enforce))
            .collect();
        assert!(object_reads(&all, &TARGETS[0]).is_none());
    }

    /// `value` at `pointer` in `object`, with the objects on the way made.
    fn put(object: &mut serde_json::Value, pointer: &str, value: serde_json::Value) {
        let mut at = object;
        for segment in pointer.split('/').skip(1) {
            at = &mut at[segment];
        }
        *at = value;
    }

    #[test]
    fn the_sketch_holds_all_the_rules_that_name_their_reads_read_on_every_target() {
        use serde_json::json;

        use crate::engine::document::scan::{self, Scanner};

        let rules = crate::rules::registry(&Config::default());
        let naming = naming(&rules);
        let container = json!({"name": "c", "image": "i", "env": [{"name": "A"}],
                               "resources": {"limits": {"cpu": "1"}}, "restartPolicy": "Always"});
        let spec = json!({"nodeName": "n", "affinity": {"nodeAffinity": {}},
                          "tolerations": [{"operator": "Exists"}], "resources": {"requests": {}},
                          "containers": [container], "initContainers": [container],
                          "volumes": [{"name": "v"}], "priority": 1});
        let metadata = json!({"name": "x", "uid": "u", "labels": {"a": "b"},
                              "annotations": {"podmend.io/agent": "true", "b": "c"},
                              "ownerReferences": [{"kind": "ReplicaSet", "controller": true}]});
        for target in TARGETS {
            let mut object = json!({"metadata": metadata});
            put(&mut object, target.metadata, metadata.clone());
            put(&mut object, target.spec, spec.clone());
            let text = object.to_string();
            let sketch = Scanner::new(&text).sketch().flatten();
            let keep = object_reads(&naming, target);
            let (Some(sketch), Some(keep)) = (sketch, keep) else {
                panic!(
                    "{}: the object sketches and the rules' reads fit a union",
                    target.name
                );
            };
            let reread = scan::reread(&sketch, keep);
            assert!(reread.is_some(), "{}: the body is read again", target.name);
            let read = Scanner::new(&text).read_at(&[], keep).flatten();
            assert_eq!(reread, read, "{}", target.name);
        }
    }
}
