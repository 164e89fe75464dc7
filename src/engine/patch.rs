//! Computing the patches of a review: the enforce-mode patch the webhook sends and the whole
//! repair `audit` shows, each with the `podmend.io/mutated` annotation, checked to apply to
//! the object as it was sent.

use std::borrow::Cow;
use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::{Pointer, PointerBuf};
use serde::Serialize;
use serde_json::{Map, Value};

use super::document::scan;
use super::document::{Sketch, Tree, View};
use super::run::{Ran, State};
use super::scope::InScope;
use super::spec_diff::{self, Seen};
use super::{Finding, MUTATED_ANNOTATION, Outcome, Skip};
use crate::config::Mode;
use crate::target::{self, Target};

mod apply;

/// The patch enforce-mode rules apply and the repair of every rule, from what the rules did.
/// The rules' own patches make the whole repair, unless two changed one field: no second diff.
/// The repair is `None` when it is the patch: every rule that changed something enforces.
pub(super) fn spec_patches<T: Tree>(
    scope: &InScope<'_, T>,
    ran: &Ran,
) -> (Vec<PatchOperation>, Option<Vec<PatchOperation>>) {
    let annotated = |state: &State, diff: &dyn Fn() -> Vec<PatchOperation>, rules: Vec<&str>| {
        if !state.touched {
            return Vec::new();
        }
        let mut patch = diff();
        if !patch.is_empty() {
            patch.push(mutated_annotation_op(
                scope.object,
                scope.target.metadata,
                &scope.meta.annotations,
                &rules,
            ));
        }
        patch
    };
    let repair = annotated(
        &ran.repaired,
        &|| repair_patch(ran),
        changed_by(&ran.findings, false),
    );
    match &ran.applied {
        None => (repair, None),
        // A rule that only warns changed something: the rules' patches were diffed on the
        // repaired state, not on what enforce-mode rules apply, so that is diffed whole.
        Some(enforced) => {
            let diff = || {
                let since = spec_diff::since(&ran.original, &enforced.spec, &Seen::default());
                prefixed(&ran.spec_pointer, since)
            };
            let patch = annotated(enforced, &diff, changed_by(&ran.findings, true));
            (patch, Some(repair))
        }
    }
}

/// The patch of every rule's repair: the rules' own patches, put in the whole diff's order,
/// when no two changed the same field of the spec (see [`merged`]); else the diff of the
/// whole spec. Debug builds check the first is the second.
fn repair_patch(ran: &Ran) -> Vec<PatchOperation> {
    let whole = || {
        let since = spec_diff::since(&ran.original, &ran.repaired.spec, &ran.seen);
        prefixed(&ran.spec_pointer, since)
    };
    match merged(&ran.spec_pointer, &ran.findings) {
        Some(patch) => {
            debug_assert_eq!(
                patch,
                whole(),
                "the rules' patches merged differ from the diff"
            );
            patch
        }
        None => whole(),
    }
}

/// The rules' patches as one, when no two of them changed the same field of the spec at
/// `spec`: each field's operations are then the diff of the field as the spec had it to the
/// field as the repair left it, and the whole diff lists them field by field in the order a
/// spec serializes its fields (by name), whole fields removed last (see `diff::keys`).
/// `None` when two rules changed one field.
fn merged(spec: &Pointer, findings: &[Finding]) -> Option<Vec<PatchOperation>> {
    let mut changing = findings.iter().filter(|f| !f.patch.is_empty());
    if let (Some(only), None) = (changing.next(), changing.next()) {
        return Some(only.patch.clone());
    }
    // (removes the whole field, field, which rule, operation)
    let mut ops: Vec<(bool, &str, usize, &PatchOperation)> = Vec::new();
    for (rule, finding) in findings.iter().enumerate() {
        for op in &finding.patch {
            let below = op.path().as_str().strip_prefix(spec.as_str())?;
            let below = below.strip_prefix('/')?;
            let (field, rest) = below.split_at(below.find('/').unwrap_or(below.len()));
            if ops.iter().any(|&(_, f, r, _)| f == field && r != rule) {
                return None;
            }
            let removes_field = rest.is_empty() && matches!(op, PatchOperation::Remove(_));
            ops.push((removes_field, field, rule, op));
        }
    }
    // Stable: each field's operations stay in their rule's order.
    ops.sort_by_key(|&(removes_field, field, _, _)| (removes_field, field));
    Some(ops.into_iter().map(|(.., op)| op.clone()).collect())
}

/// The rules whose finding changed something (enforce-mode ones only, if asked).
fn changed_by(findings: &[Finding], enforced_only: bool) -> Vec<&'static str> {
    findings
        .iter()
        .filter(|f| !f.patch.is_empty() && (!enforced_only || f.mode == Mode::Enforce))
        .map(|f| f.rule)
        .collect()
}

/// The outcome of a review that ran rules, unless its patches do not apply to the object
/// as sent (see [`applies`]). An object the caller owns is patched in place, not copied.
/// `repair`: the whole repair, when it may differ from `patch`; kept only if it does.
pub(super) fn finish(
    target: &'static Target,
    object: Cow<'_, Value>,
    findings: Vec<Finding>,
    patch: Vec<PatchOperation>,
    repair: Option<Vec<PatchOperation>>,
) -> Outcome {
    let repair = repair.filter(|repair| *repair != patch);
    if let Err(reason) = applies(object, &patch, repair.as_deref()) {
        return Outcome::skipped(Some(target), reason);
    }
    repaired(target, findings, patch, repair)
}

/// The outcome of a review whose patches were checked to apply.
fn repaired(
    target: &'static Target,
    findings: Vec<Finding>,
    patch: Vec<PatchOperation>,
    repair: Option<Vec<PatchOperation>>,
) -> Outcome {
    Outcome {
        target: Some(target),
        skipped: None,
        findings,
        patch,
        repair,
        name: None,
    }
}

/// [`finish`], for a created object read from its sketch: the patches are checked on the
/// sketch ([`scan::applies`]). `None` when that cannot tell (or a patch does not apply): the
/// object is then read to check them, and any error is worded as before.
pub(super) fn finish_sketched(
    target: &'static Target,
    sketch: &Sketch<'_>,
    findings: Vec<Finding>,
    patch: Vec<PatchOperation>,
    repair: Option<Vec<PatchOperation>>,
) -> Option<Outcome> {
    let repair = repair.filter(|repair| *repair != patch);
    scan::applies(sketch, &patch)?;
    if let Some(repair) = &repair {
        scan::applies(sketch, repair)?;
    }
    Some(repaired(target, findings, patch, repair))
}

/// The patches are diffs of typed objects, where a field the API requires but the object
/// lacks (a volumeMount without mountPath) reads as "": such a patch names paths the object
/// does not have, and the API server would fail the request with an internal error. Leave
/// the object to its validation, which says what is missing.
fn applies(
    object: Cow<'_, Value>,
    patch: &[PatchOperation],
    repair: Option<&[PatchOperation]>,
) -> Result<(), Skip> {
    // The object is a copy or the review's own read, dropped after: nothing to undo on a
    // failure, and the values the patch adds need not be in it (`apply::check`).
    let check = |mut object: Value, candidate: &[PatchOperation]| {
        apply::check(&mut object, candidate).map_err(|error| {
            Skip::UndecodablePodSpec(
                format!("the repair does not apply to the object as sent: {error}").into(),
            )
        })
    };
    if let Some(repair) = repair {
        check(object.as_ref().clone(), repair)?;
    }
    check(object.into_owned(), patch)
}

/// The `add` operation that records the rules that changed the object, keeping rules
/// recorded by an earlier pass (a template's repair carried into its pods).
fn mutated_annotation_op<T: Tree>(
    object: &T,
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
    let metadata = target::at(object, metadata_pointer).map(|meta| meta as &dyn View);
    let (path, value) = match metadata {
        Some(meta) if meta.field("annotations").is_some_and(|a| a.is_object()) => {
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

/// `patch` with `prefix` put before every path (a spec's patch made one of the object).
pub(super) fn prefixed(prefix: &Pointer, patch: json_patch::Patch) -> Vec<PatchOperation> {
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
pub(super) fn parse_pointer(text: &str) -> PointerBuf {
    PointerBuf::parse(text).unwrap_or_default()
}

pub(super) fn to_json(typed: &impl Serialize) -> Value {
    // Serializing a k8s-openapi type into a Value cannot fail (string keys, no custom errors).
    serde_json::to_value(typed).unwrap_or(Value::Null)
}
