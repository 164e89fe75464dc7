//! `UPDATE pods/status` (only while a status rule is on): the status rules see the whole Pod
//! and the stored one, and may change only its status. The patch is the diff of the Pod's
//! typed status before and after, so it names nothing outside `/status` and drops no field the
//! types do not know; no `podmend.io/mutated` annotation is added.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::Deserialize;
use serde_json::Value;

use super::patch::{finish, parse_pointer, prefixed, to_json};
use super::scope::{SkipList, namespace_of, string_map};
use super::{Engine, Finding, MIRROR_ANNOTATION, Outcome, Skip, Subject, diff};
use crate::cluster::ClusterView;
use crate::config::Mode;
use crate::rules::{RuleContext, StatusRule};
use crate::target::Target;

/// Reviews a status write with the engine's status rules.
pub(super) fn review(
    engine: &Engine,
    target: &'static Target,
    subject: &Subject<'_>,
    cluster: &dyn ClusterView,
) -> Outcome {
    let skip = |reason| Outcome::skipped(Some(target), reason);
    let Some(object) = subject.object.filter(|o| o.is_object()) else {
        return skip(Skip::NoObject);
    };
    let namespace = namespace_of(subject.namespace, object);
    let active = match active_rules(engine, namespace, object) {
        Ok(active) => active,
        Err(reason) => return skip(reason),
    };
    if active.is_empty() {
        return Outcome::clean(target);
    }
    let (pod, old) = match pods(object, subject.old_object) {
        Ok(pods) => pods,
        Err(reason) => return skip(reason),
    };
    let cx = RuleContext { namespace, cluster };
    let original = pod.status.clone().unwrap_or_default();
    let (mut repaired, mut applied) = (original.clone(), original.clone());
    let mut findings = Vec::new();
    for rule in active {
        let before = to_json(&repaired);
        let messages = rule.repair(&pod, Some(&old), &mut repaired, &cx);
        let patch = status_patch(&before, &repaired);
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
    let original_value = to_json(&original);
    let patch = status_patch(&original_value, &applied);
    let repair = status_patch(&original_value, &repaired);
    finish(target, Cow::Borrowed(object), findings, patch, Some(repair))
}

/// The status rules that may act on `object`, or why none may: its namespace is excluded,
/// it is a mirror pod, or its annotations skip podmend.
fn active_rules<'e>(
    engine: &'e Engine,
    namespace: &str,
    object: &Value,
) -> Result<Vec<&'e dyn StatusRule>, Skip> {
    if engine.excludes(namespace) {
        return Err(Skip::ExcludedNamespace);
    }
    let annotations = string_map(crate::target::at(object, "/metadata/annotations"));
    if annotations.contains_key(MIRROR_ANNOTATION) {
        return Err(Skip::MirrorPod);
    }
    let skipped_rules = SkipList::from_annotations([&annotations]);
    if skipped_rules.all {
        return Err(Skip::SkipAnnotation);
    }
    Ok(engine
        .status_rules
        .iter()
        .map(Box::as_ref)
        .filter(|rule| !skipped_rules.contains(rule.id()) && rule.may_apply(object))
        .collect())
}

/// The Pod as sent and as stored. The stored one tells whether it is being deleted or
/// already terminal: without it neither can be ruled out, so nothing is changed.
fn pods(object: &Value, old_object: Option<&Value>) -> Result<(Pod, Pod), Skip> {
    let pod = Pod::deserialize(object)
        .map_err(|error| Skip::UndecodablePodSpec(error.to_string().into()))?;
    let old = match old_object.map(Pod::deserialize) {
        Some(Ok(old)) => old,
        Some(Err(error)) => {
            return Err(Skip::UndecodablePodSpec(
                format!("the stored Pod (oldObject) does not decode: {error}").into(),
            ));
        }
        None => return Err(Skip::NoObject),
    };
    Ok((pod, old))
}

/// The patch from `before` to `after`, under `/status`.
fn status_patch(before: &Value, after: &PodStatus) -> Vec<json_patch::PatchOperation> {
    prefixed(
        &parse_pointer("/status"),
        diff::diff(before, &to_json(after)),
    )
}
