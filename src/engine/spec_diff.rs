//! The diff of two pod specs as [`diff`](super::diff) of their serializations gives it,
//! serializing only the fields that differ. A rule changes a few fields of a spec (its
//! containers, its affinity); serializing the whole spec before and after each rule, and
//! again for the whole repair, was most of a repair's cost. Fields are compared typed, and
//! each changed field is serialized once per side: a rule's diff reads the field as the rule
//! before it left it from [`Seen`], and the whole repair's diff is made of what the rules'
//! diffs read. Debug builds check every diff against the whole one.

use std::borrow::Cow;

use json_patch::PatchOperation;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde::Serialize;
use serde_json::Value;

use super::diff::{self, Change, ItemKey};
use super::patch::to_json;

/// The JSON of each field the rules changed in one spec, as the spec had it first (before
/// any rule) and as the last rule to change it left it.
#[derive(Default)]
pub(super) struct Seen {
    fields: Vec<SeenField>,
    /// The container lists a rule changed in place (see [`in_place`]): read afterwards, they
    /// are not as the spec had them first.
    changed_in_place: Vec<&'static str>,
    /// The operations of a container list's diff in place, while one rule alone changed it:
    /// its diff from the first spec to the last is that rule's. `None` once another did.
    only_in_place: Vec<(&'static str, Option<Vec<PatchOperation>>)>,
}

struct SeenField {
    name: &'static str,
    /// `None` when the field was first read after a rule changed it in place.
    first: Option<Option<Value>>,
    last: Option<Value>,
}

impl Seen {
    fn get(&self, name: &str) -> Option<&SeenField> {
        self.fields.iter().find(|field| field.name == name)
    }

    /// The diff in place of the container list `name`, when one rule alone changed it.
    fn only_in_place(&self, name: &str) -> Option<&Vec<PatchOperation>> {
        self.only_in_place
            .iter()
            .find(|(list, _)| *list == name)
            .and_then(|(_, ops)| ops.as_ref())
    }
}

/// How one rule's diff reads a changed field.
enum Read {
    /// Diffed container by container (see [`in_place`]): its operations.
    InPlace(Vec<PatchOperation>),
    /// Serialized: before (`None` when an earlier rule's diff read it as it is now), after.
    Whole(Option<Option<Value>>, Option<Value>),
}

/// The diff of one rule's change, `before` to `after`, where `seen` holds what the earlier
/// rules' diffs read of the same spec; it records what this one reads.
pub(super) fn step(before: &PodSpec, after: &PodSpec, seen: &mut Seen) -> json_patch::Patch {
    let names = changed_fields(before, after);
    let mut reads: Vec<Read> = names
        .iter()
        .map(|name| match seen.get(name) {
            // A field an earlier rule's diff read is as that rule left it: not read again.
            Some(_) => Read::Whole(None, field_json(after, name)),
            None => match in_place(before, after, name) {
                Some(ops) => Read::InPlace(ops),
                None => Read::Whole(Some(field_json(before, name)), field_json(after, name)),
            },
        })
        .collect();
    let patch = {
        let changed = names
            .iter()
            .zip(&mut reads)
            .map(|(name, read)| match read {
                Read::InPlace(ops) => Change::Below(ops.clone()),
                Read::Whole(read, after) => {
                    let before = match read {
                        Some(read) => read.as_ref(),
                        None => seen.get(name).and_then(|field| field.last.as_ref()),
                    };
                    Change::Values(name, before, after.as_ref())
                }
            })
            .collect();
        diff::keys(changed)
    };
    for (name, read) in names.into_iter().zip(reads) {
        seen.record(name, read);
    }
    checked(before, after, patch)
}

impl Seen {
    /// Keeps what one rule's diff read of the field `name`.
    fn record(&mut self, name: &'static str, read: Read) {
        let changed_before = self.get(name).is_some() || self.changed_in_place.contains(&name);
        let only = self
            .only_in_place
            .iter_mut()
            .find(|(list, _)| *list == name);
        match read {
            Read::InPlace(ops) => {
                match only {
                    Some((_, only)) => *only = None,
                    None => self
                        .only_in_place
                        .push((name, (!changed_before).then_some(ops))),
                }
                if !self.changed_in_place.contains(&name) {
                    self.changed_in_place.push(name);
                }
            }
            Read::Whole(Some(first), last) => {
                if let Some((_, only)) = only {
                    *only = None;
                }
                let first = (!self.changed_in_place.contains(&name)).then_some(first);
                self.fields.push(SeenField { name, first, last });
            }
            Read::Whole(None, last) => {
                if let Some((_, only)) = only {
                    *only = None;
                }
                if let Some(field) = self.fields.iter_mut().find(|f| f.name == name) {
                    field.last = last;
                }
            }
        }
    }
}

/// The diff of a whole repair, `original` to `now`. `seen` is what the rules' diffs read on
/// the way to `now` (empty for a spec they were not diffed on): the fields it holds as the
/// spec had them first are not serialized again.
pub(super) fn since(original: &PodSpec, now: &PodSpec, seen: &Seen) -> json_patch::Patch {
    let names = changed_fields(original, now);
    let in_place: Vec<_> = names
        .iter()
        .map(|name| match seen.only_in_place(name) {
            Some(ops) => Some(ops.clone()),
            None => in_place(original, now, name),
        })
        .collect();
    let wholes: Vec<Option<(FieldRead<'_>, FieldRead<'_>)>> = names
        .iter()
        .zip(&in_place)
        .map(|(name, in_place)| match (in_place, seen.get(name)) {
            (Some(_), _) => None,
            (
                None,
                Some(SeenField {
                    first: Some(first),
                    last,
                    ..
                }),
            ) => Some((Cow::Borrowed(first), Cow::Borrowed(last))),
            (None, _) => Some((
                Cow::Owned(field_json(original, name)),
                Cow::Owned(field_json(now, name)),
            )),
        })
        .collect();
    let changed = names
        .iter()
        .zip(in_place)
        .zip(&wholes)
        .map(|((name, in_place), whole)| match (in_place, whole) {
            (Some(ops), _) => Change::Below(ops),
            (None, Some((first, last))) => {
                Change::Values(name, first.as_ref().as_ref(), last.as_ref().as_ref())
            }
            // Every field not diffed in place was read whole above.
            (None, None) => Change::Below(Vec::new()),
        })
        .collect();
    checked(original, now, diff::keys(changed))
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

/// The diff of the container list `name` container by container, serializing only the
/// fields that differ, when the rule kept every container in its place (the same names in
/// the same order): as `agent-requests` changes resources. The whole diff pairs the same
/// items then, by name or by position. `None` for any other field or change.
fn in_place(before: &PodSpec, after: &PodSpec, name: &'static str) -> Option<Vec<PatchOperation>> {
    let (before, after): (&[Container], &[Container]) = match name {
        "containers" => (&before.containers, &after.containers),
        "initContainers" => (
            before.init_containers.as_deref()?,
            after.init_containers.as_deref()?,
        ),
        _ => return None,
    };
    let kept_in_place =
        before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.name == a.name);
    if !kept_in_place {
        return None;
    }
    let mut ops = Vec::new();
    for (index, (before, after)) in before.iter().zip(after).enumerate() {
        if before == after {
            continue;
        }
        let fields = changed_container_fields(before, after);
        // `resources` set on both sides with the same claims (what `agent-requests` leaves)
        // is walked typed; every other field is serialized.
        let typed = |field: &str| {
            field == "resources"
                && matches!((&before.resources, &after.resources),
                    (Some(b), Some(a)) if b.claims == a.claims)
        };
        let reads: Vec<_> = fields
            .iter()
            .map(|&field| {
                let json = |c| container_field_json(c, field);
                (field, (!typed(field)).then(|| (json(before), json(after))))
            })
            .collect();
        let changed: Vec<_> = reads
            .iter()
            .map(
                |(field, read)| match (read, &before.resources, &after.resources) {
                    (Some((b, a)), ..) => ItemKey::Values(field, b.as_ref(), a.as_ref()),
                    (None, Some(b), Some(a)) => ItemKey::Resources(b, a),
                    // Only `resources`, set on both sides, is read typed.
                    (None, ..) => ItemKey::Values(field, None, None),
                },
            )
            .collect();
        ops.extend(diff::item_keys((name, index), &changed));
    }
    Some(ops)
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

impl FieldJson for String {
    fn json(&self) -> Option<Value> {
        Some(Value::String(self.clone()))
    }
}

impl<T: Serialize> FieldJson for Vec<T> {
    fn json(&self) -> Option<Value> {
        Some(to_json(self))
    }
}

/// For a struct of the API, given every field with its JSON name in the order the struct
/// serializes them: the names (tests check the order), the names of the fields that differ,
/// and one field's JSON by its name.
macro_rules! struct_fields {
    (
        $ty:ident: $names:ident, $changed:ident, $json:ident;
        $($field:ident => $name:literal,)*
    ) => {
        /// The JSON names of the fields, in the order they serialize.
        #[cfg(test)]
        const $names: &[&str] = &[$($name),*];

        /// The names of the fields that differ, in the order they serialize.
        fn $changed(before: &$ty, after: &$ty) -> Vec<&'static str> {
            // Every field by name, no `..`: a field a newer k8s-openapi adds fails to build
            // here until it is listed.
            let $ty { $($field: _),* } = before;
            let mut changed = Vec::new();
            $(
                if before.$field != after.$field {
                    changed.push($name);
                }
            )*
            changed
        }

        /// The field named `name` as the serialization has it.
        fn $json(value: &$ty, name: &str) -> Option<Value> {
            match name {
                $($name => value.$field.json(),)*
                _ => None,
            }
        }
    };
}

struct_fields! {
    PodSpec: FIELD_NAMES, changed_fields, field_json;
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

struct_fields! {
    Container: CONTAINER_FIELD_NAMES, changed_container_fields, container_field_json;
    args => "args",
    command => "command",
    env => "env",
    env_from => "envFrom",
    image => "image",
    image_pull_policy => "imagePullPolicy",
    lifecycle => "lifecycle",
    liveness_probe => "livenessProbe",
    name => "name",
    ports => "ports",
    readiness_probe => "readinessProbe",
    resize_policy => "resizePolicy",
    resources => "resources",
    restart_policy => "restartPolicy",
    restart_policy_rules => "restartPolicyRules",
    security_context => "securityContext",
    startup_probe => "startupProbe",
    stdin => "stdin",
    stdin_once => "stdinOnce",
    termination_message_path => "terminationMessagePath",
    termination_message_policy => "terminationMessagePolicy",
    tty => "tty",
    volume_devices => "volumeDevices",
    volume_mounts => "volumeMounts",
    working_dir => "workingDir",
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
        let original = spec(json!({"nodeName": "n1", "containers": [{"name": "a"}],
            "tolerations": [{"key": "k1"}]}));
        let mut first = original.clone();
        first.node_name = None;
        first.containers[0].image = Some("x".into());
        first.tolerations = Some(vec![toleration("k1"), toleration("k2")]);
        let mut second = first.clone();
        second.containers[0].args = Some(vec!["y".into()]);
        second.node_name = Some("n2".into());
        let mut third = second.clone();
        third.containers[0].image = None;
        third.tolerations = Some(vec![toleration("k2")]);
        let mut seen = Seen::default();
        for (before, after) in [(&original, &first), (&first, &second), (&second, &third)] {
            assert_eq!(step(before, after, &mut seen), whole_diff(before, after));
        }
        assert_eq!(
            since(&original, &third, &seen),
            whole_diff(&original, &third)
        );
        // What the rules' diffs read is what the whole repair's diff is made of.
        let tolerations = seen.get("tolerations").expect("seen");
        assert_eq!(tolerations.first, Some(Some(json!([{"key": "k1"}]))));
        assert_eq!(tolerations.last, Some(json!([{"key": "k2"}])));
        // The containers stayed in place: diffed one by one, never read whole.
        assert!(seen.get("containers").is_none());
        assert_eq!(seen.changed_in_place, ["containers"]);
        // Three rules changed them: the whole repair's diff is not any one rule's.
        assert!(seen.only_in_place("containers").is_none());
    }

    #[test]
    fn a_container_list_one_rule_alone_changed_in_place_is_not_diffed_again() {
        // As node-affinity then agent-requests repair a pinned agent pod.
        let original = spec(json!({"nodeName": "n1",
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]}));
        let mut affinity = original.clone();
        affinity.node_name = None;
        affinity.affinity = Some(Default::default());
        let mut requests = affinity.clone();
        requests.containers[0].resources = Some(Default::default());
        let mut seen = Seen::default();
        let first = step(&original, &affinity, &mut seen);
        let second = step(&affinity, &requests, &mut seen);
        assert_eq!(seen.only_in_place("containers"), Some(&second.0));
        let whole = since(&original, &requests, &seen);
        assert_eq!(whole, whole_diff(&original, &requests));
        assert_eq!(whole.0.len(), first.0.len() + second.0.len());
    }

    fn toleration(key: &str) -> k8s_openapi::api::core::v1::Toleration {
        k8s_openapi::api::core::v1::Toleration {
            key: Some(key.into()),
            ..Default::default()
        }
    }

    #[test]
    fn containers_a_rule_keeps_in_place_are_diffed_one_by_one_field_by_field() {
        let before = spec(json!({
            "containers": [{"name": "a", "image": "x"},
                {"name": "b", "image": "y", "resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"name": "i", "image": "z", "tty": true}]
        }));
        let mut after = before.clone();
        after.containers[1].resources = None;
        after.containers[1].args = Some(vec!["go".into()]);
        let init = &mut after.init_containers.as_mut().expect("init containers")[0];
        init.image = Some("w".into());
        init.tty = None;
        let patch = step(&before, &after, &mut Seen::default());
        assert_eq!(
            serde_json::to_value(&patch).expect("serializes"),
            json!([
                {"op": "add", "path": "/containers/1/args", "value": ["go"]},
                {"op": "remove", "path": "/containers/1/resources"},
                {"op": "replace", "path": "/initContainers/0/image", "value": "w"},
                {"op": "remove", "path": "/initContainers/0/tty"}
            ])
        );
        assert_eq!(patch, whole_diff(&before, &after));
        assert_eq!(since(&before, &after, &Seen::default()), patch);
    }

    #[test]
    fn a_containers_resources_walked_typed_diff_as_their_serializations_do() {
        let resources = |value: Value| {
            spec(json!({"containers": [{"name": "a", "image": "x", "resources": value}]}))
        };
        let claims = json!([{"name": "gpu"}]);
        let cases = [
            // A quantity changed, added, removed; in step and out of step.
            (
                json!({"requests": {"cpu": "1", "memory": "1Gi"}}),
                json!({"requests": {"cpu": "0", "memory": "1Gi"}}),
            ),
            (
                json!({"requests": {"cpu": "1"}}),
                json!({"requests": {"cpu": "1", "memory": "0"}}),
            ),
            (
                json!({"requests": {"cpu": "1", "memory": "1Gi"}}),
                json!({"requests": {"memory": "0"}}),
            ),
            (
                json!({"requests": {"b": "1", "c": "2"}}),
                json!({"requests": {"a": "0", "c": "3"}}),
            ),
            // A map added, removed, both; maps emptied.
            (
                json!({"limits": {"cpu": "1"}}),
                json!({"limits": {"cpu": "1"}, "requests": {"cpu": "0"}}),
            ),
            (
                json!({"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}),
                json!({"limits": {"cpu": "2"}}),
            ),
            (
                json!({"requests": {"cpu": "1"}}),
                json!({"limits": {"cpu": "1"}}),
            ),
            (
                json!({"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}),
                json!({"limits": {}, "requests": {}}),
            ),
            // The same claims on both sides; other claims are serialized.
            (
                json!({"claims": claims, "requests": {"cpu": "1"}}),
                json!({"claims": claims, "limits": {"cpu": "1"}}),
            ),
            (
                json!({"claims": claims}),
                json!({"claims": [], "requests": {"cpu": "0"}}),
            ),
        ];
        for (before, after) in cases {
            let (before_spec, after_spec) = (resources(before.clone()), resources(after.clone()));
            let patch = step(&before_spec, &after_spec, &mut Seen::default());
            assert_eq!(
                patch,
                whole_diff(&before_spec, &after_spec),
                "{before} -> {after}"
            );
            assert!(!patch.0.is_empty(), "{before} -> {after}");
        }
    }
    #[test]
    fn containers_with_the_same_name_twice_are_diffed_in_place_as_the_whole_diff_pairs_them() {
        let before = spec(json!({"containers": [{"name": "a"}, {"name": "a"}]}));
        let mut after = before.clone();
        after.containers[1].image = Some("x".into());
        let patch = since(&before, &after, &Seen::default());
        assert_eq!(patch, whole_diff(&before, &after));
        assert_eq!(patch.0.len(), 1);
    }

    #[test]
    fn containers_changed_in_place_and_then_reshaped_diff_from_the_spec_as_it_was_first() {
        let original = spec(json!({"containers": [{"name": "a"}]}));
        let mut in_place = original.clone();
        in_place.containers[0].image = Some("x".into());
        let mut reshaped = in_place.clone();
        reshaped
            .containers
            .insert(0, in_place.containers[0].clone());
        reshaped.containers[0].name = "guard".into();
        let mut changed_again = reshaped.clone();
        changed_again.containers[1].args = Some(vec!["y".into()]);
        // In place, then inserted before, then in place again; and the other way round.
        let orders = [
            [&original, &in_place, &reshaped, &changed_again],
            [&original, &reshaped, &changed_again, &changed_again],
        ];
        for specs in orders {
            let mut seen = Seen::default();
            for pair in specs.windows(2) {
                assert_eq!(
                    step(pair[0], pair[1], &mut seen),
                    whole_diff(pair[0], pair[1])
                );
            }
            assert_eq!(
                since(&original, &changed_again, &seen),
                whole_diff(&original, &changed_again)
            );
        }
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

    #[test]
    fn a_pod_spec_serializes_its_fields_in_the_byte_order_of_their_names() {
        // The repair's patch merges the rules' patches in this order (`patch::merged`).
        assert!(FIELD_NAMES.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn the_container_fields_are_listed_in_the_order_a_container_serializes_them() {
        let every_field: Container = serde_json::from_value(json!({
            "args": [], "command": [], "env": [], "envFrom": [], "image": "i",
            "imagePullPolicy": "Always", "lifecycle": {}, "livenessProbe": {}, "name": "n",
            "ports": [], "readinessProbe": {}, "resizePolicy": [], "resources": {},
            "restartPolicy": "Always", "restartPolicyRules": [], "securityContext": {},
            "startupProbe": {}, "stdin": true, "stdinOnce": true,
            "terminationMessagePath": "p", "terminationMessagePolicy": "File", "tty": true,
            "volumeDevices": [], "volumeMounts": [], "workingDir": "w"
        }))
        .expect("a container");
        let serialized = to_json(&every_field);
        let keys: Vec<&str> = serialized
            .as_object()
            .expect("a map")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, CONTAINER_FIELD_NAMES);
    }
}
