//! The diff of two pod specs as [`diff`](super::diff) of their serializations gives it,
//! serializing only the fields that differ. A rule changes a few fields of a spec (its
//! containers, its affinity); serializing the whole spec before and after each rule, and
//! again for the whole repair, was most of a repair's cost. Fields are compared typed, and
//! each changed field is serialized once per side: a rule's diff reads the field as the rule
//! before it left it from [`Seen`], and the whole repair's diff is made of what the rules'
//! diffs read. Debug builds check every diff against the whole one.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodSpec;
use serde::Serialize;
use serde_json::Value;

use super::diff;
use super::patch::to_json;

/// The JSON of each field the rules changed in one spec, as the spec had it first (before
/// any rule) and as the last rule to change it left it.
#[derive(Default)]
pub(super) struct Seen {
    fields: Vec<SeenField>,
}

struct SeenField {
    name: &'static str,
    first: Option<Value>,
    last: Option<Value>,
}

impl Seen {
    fn get(&self, name: &str) -> Option<&SeenField> {
        self.fields.iter().find(|field| field.name == name)
    }
}

/// The diff of one rule's change, `before` to `after`, where `seen` holds what the earlier
/// rules' diffs read of the same spec; it records what this one reads.
pub(super) fn step(before: &PodSpec, after: &PodSpec, seen: &mut Seen) -> json_patch::Patch {
    let names = changed_fields(before, after);
    // A field an earlier rule changed is as that rule left it: not serialized again.
    let read_before: Vec<Option<Option<Value>>> = names
        .iter()
        .map(|name| seen.get(name).is_none().then(|| field_json(before, name)))
        .collect();
    let read_after: Vec<Option<Value>> = names.iter().map(|name| field_json(after, name)).collect();
    let patch = {
        let changed: Vec<_> = names
            .iter()
            .zip(&read_before)
            .zip(&read_after)
            .map(|((name, read), after)| {
                let before = match read {
                    Some(read) => read.as_ref(),
                    None => seen.get(name).and_then(|field| field.last.as_ref()),
                };
                (*name, before, after.as_ref())
            })
            .collect();
        diff::keys(&changed)
    };
    for ((name, read), after) in names.into_iter().zip(read_before).zip(read_after) {
        match read {
            Some(first) => seen.fields.push(SeenField {
                name,
                first,
                last: after,
            }),
            None => {
                if let Some(field) = seen.fields.iter_mut().find(|f| f.name == name) {
                    field.last = after;
                }
            }
        }
    }
    checked(before, after, patch)
}

/// The diff of a whole repair, `original` to `now`. `seen` is what the rules' diffs read on
/// the way to `now` (empty for a spec they were not diffed on): the fields it holds are not
/// serialized again.
pub(super) fn since(original: &PodSpec, now: &PodSpec, seen: &Seen) -> json_patch::Patch {
    let changed: Vec<(&str, FieldRead<'_>, FieldRead<'_>)> = changed_fields(original, now)
        .into_iter()
        .map(|name| match seen.get(name) {
            Some(field) => (
                name,
                Cow::Borrowed(&field.first),
                Cow::Borrowed(&field.last),
            ),
            None => (
                name,
                Cow::Owned(field_json(original, name)),
                Cow::Owned(field_json(now, name)),
            ),
        })
        .collect();
    let keys: Vec<_> = changed
        .iter()
        .map(|(name, first, last)| (*name, first.as_ref().as_ref(), last.as_ref().as_ref()))
        .collect();
    checked(original, now, diff::keys(&keys))
}

/// A field's JSON, as a rule's diff read it or serialized now.
type FieldRead<'a> = Cow<'a, Option<Value>>;

/// `patch`, which debug builds check is the diff of the whole specs' serializations.
fn checked(before: &PodSpec, after: &PodSpec, patch: json_patch::Patch) -> json_patch::Patch {
    debug_assert_eq!(
        patch,
        diff::diff(&to_json(before), &to_json(after)),
        "the field-wise diff differs from the whole one"
    );
    patch
}

/// A field of a pod spec as its serialization has it: `None` when it is left out.
trait FieldJson {
    fn json(&self) -> Option<Value>;
}

impl<T: Serialize> FieldJson for Option<T> {
    fn json(&self) -> Option<Value> {
        self.as_ref().map(to_json)
    }
}

impl<T: Serialize> FieldJson for Vec<T> {
    fn json(&self) -> Option<Value> {
        Some(to_json(self))
    }
}

macro_rules! pod_spec_fields {
    ($($field:ident => $name:literal,)*) => {
        /// The JSON names of a pod spec's fields, in the order it serializes them.
        #[cfg(test)]
        const FIELD_NAMES: &[&str] = &[$($name),*];

        /// The names of the fields that differ, in the order a spec serializes them.
        fn changed_fields(before: &PodSpec, after: &PodSpec) -> Vec<&'static str> {
            // Every field by name, no `..`: a field a newer k8s-openapi adds fails to build
            // here until it is listed.
            let PodSpec { $($field: _),* } = before;
            let mut changed = Vec::new();
            $(
                if before.$field != after.$field {
                    changed.push($name);
                }
            )*
            changed
        }

        /// The field named `name` as the spec's serialization has it.
        fn field_json(spec: &PodSpec, name: &str) -> Option<Value> {
            match name {
                $($name => spec.$field.json(),)*
                _ => None,
            }
        }
    };
}

pod_spec_fields! {
    active_deadline_seconds => "activeDeadlineSeconds",
    affinity => "affinity",
    automount_service_account_token => "automountServiceAccountToken",
    containers => "containers",
    dns_config => "dnsConfig",
    dns_policy => "dnsPolicy",
    enable_service_links => "enableServiceLinks",
    ephemeral_containers => "ephemeralContainers",
    eviction_responders => "evictionResponders",
    host_aliases => "hostAliases",
    host_ipc => "hostIPC",
    host_network => "hostNetwork",
    host_pid => "hostPID",
    host_users => "hostUsers",
    hostname => "hostname",
    hostname_override => "hostnameOverride",
    image_pull_secrets => "imagePullSecrets",
    init_containers => "initContainers",
    node_name => "nodeName",
    node_selector => "nodeSelector",
    os => "os",
    overhead => "overhead",
    preemption_policy => "preemptionPolicy",
    priority => "priority",
    priority_class_name => "priorityClassName",
    readiness_gates => "readinessGates",
    resource_claims => "resourceClaims",
    resources => "resources",
    restart_policy => "restartPolicy",
    runtime_class_name => "runtimeClassName",
    scheduler_name => "schedulerName",
    scheduling_gates => "schedulingGates",
    scheduling_group => "schedulingGroup",
    security_context => "securityContext",
    service_account => "serviceAccount",
    service_account_name => "serviceAccountName",
    set_hostname_as_fqdn => "setHostnameAsFQDN",
    share_process_namespace => "shareProcessNamespace",
    subdomain => "subdomain",
    termination_grace_period_seconds => "terminationGracePeriodSeconds",
    tolerations => "tolerations",
    topology_spread_constraints => "topologySpreadConstraints",
    volumes => "volumes",
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: Value) -> PodSpec {
        serde_json::from_value(value).expect("a pod spec")
    }

    #[test]
    fn a_pod_spec_diff_is_the_whole_diff_field_by_field_with_removals_last() {
        let before = spec(json!({"activeDeadlineSeconds": 5, "nodeName": "n1",
            "containers": [{"name": "a", "image": "x"}]}));
        let after = spec(json!({
            "affinity": {"nodeAffinity": {}},
            "containers": [{"name": "a", "image": "x", "resources": {"requests": {"cpu": "10m"}}}]
        }));
        let patch = since(&before, &after, &Seen::default());
        assert_eq!(
            serde_json::to_value(&patch).expect("serializes"),
            json!([
                {"op": "add", "path": "/affinity", "value": {"nodeAffinity": {}}},
                {"op": "add", "path": "/containers/0/resources", "value": {"requests": {"cpu": "10m"}}},
                {"op": "remove", "path": "/activeDeadlineSeconds"},
                {"op": "remove", "path": "/nodeName"}
            ])
        );
        assert_eq!(patch, whole_diff(&before, &after));
        assert!(since(&after, &after, &Seen::default()).0.is_empty());
    }

    fn whole_diff(before: &PodSpec, after: &PodSpec) -> json_patch::Patch {
        diff::diff(&to_json(before), &to_json(after))
    }

    #[test]
    fn rules_that_change_the_same_fields_in_turn_diff_as_the_whole_specs_do() {
        let original = spec(json!({"nodeName": "n1", "containers": [{"name": "a"}]}));
        let mut first = original.clone();
        first.node_name = None;
        first.containers[0].image = Some("x".into());
        let mut second = first.clone();
        second.containers[0].args = Some(vec!["y".into()]);
        second.node_name = Some("n2".into());
        let mut third = second.clone();
        third.containers[0].image = None;
        let mut seen = Seen::default();
        for (before, after) in [(&original, &first), (&first, &second), (&second, &third)] {
            assert_eq!(step(before, after, &mut seen), whole_diff(before, after));
        }
        assert_eq!(
            since(&original, &third, &seen),
            whole_diff(&original, &third)
        );
        // What the rules' diffs read is what the whole repair's diff is made of.
        let containers = seen.get("containers").expect("seen");
        assert_eq!(containers.first, Some(json!([{"name": "a"}])));
        assert_eq!(containers.last, Some(json!([{"name": "a", "args": ["y"]}])));
    }

    #[test]
    fn the_fields_are_listed_in_the_order_a_pod_spec_serializes_them() {
        let every_field: PodSpec = serde_json::from_str(
            r#"{
            "activeDeadlineSeconds": 1, "affinity": {}, "automountServiceAccountToken": true,
            "containers": [], "dnsConfig": {}, "dnsPolicy": "None", "enableServiceLinks": true,
            "ephemeralContainers": [], "evictionResponders": [], "hostAliases": [],
            "hostIPC": true, "hostNetwork": true, "hostPID": true, "hostUsers": true,
            "hostname": "h", "hostnameOverride": "h", "imagePullSecrets": [],
            "initContainers": [], "nodeName": "n", "nodeSelector": {}, "os": {"name": "linux"},
            "overhead": {}, "preemptionPolicy": "Never", "priority": 1,
            "priorityClassName": "p", "readinessGates": [], "resourceClaims": [],
            "resources": {}, "restartPolicy": "Always", "runtimeClassName": "r",
            "schedulerName": "s", "schedulingGates": [], "schedulingGroup": {},
            "securityContext": {}, "serviceAccount": "s", "serviceAccountName": "s",
            "setHostnameAsFQDN": true, "shareProcessNamespace": true, "subdomain": "s",
            "terminationGracePeriodSeconds": 1, "tolerations": [],
            "topologySpreadConstraints": [], "volumes": []
            }"#,
        )
        .expect("a pod spec");
        let serialized = to_json(&every_field);
        let keys: Vec<&str> = serialized
            .as_object()
            .expect("a map")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, FIELD_NAMES);
    }
}
