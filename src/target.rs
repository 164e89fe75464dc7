//! The one table from workload kind to where its pod spec lives. Rules never see kinds;
//! the engine uses this table to find the pod spec, its metadata, and when to act.

use crate::engine::document::Tree;

/// A kind that carries a pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Pod,
    PodTemplate,
    ReplicationController,
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
}

/// Where a kind keeps its pod spec and the metadata that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub kind: WorkloadKind,
    /// API group (`""` for core).
    pub group: &'static str,
    pub name: &'static str,
    /// The resource (plural) webhook rules and API paths name it by.
    pub resource: &'static str,
    /// JSON Pointer to the pod spec.
    pub spec: &'static str,
    /// JSON Pointer to the metadata whose labels the pods get (the pod's own, or the template's).
    pub metadata: &'static str,
    /// JSON Pointer to the pod template (`None` for a Pod).
    pub template: Option<&'static str>,
}

impl Target {
    /// A pod template rather than a Pod: acts in the rules' `templates` mode.
    pub fn is_template(&self) -> bool {
        self.template.is_some()
    }
}

/// The value at JSON Pointer `pointer` in `object` (a parsed object or a sketch), as
/// `Value::pointer` finds it. That one allocates per segment to unescape `~0`/`~1`; this
/// table's pointers have no escapes, and the engine looks several of them up in every review.
pub fn at<'v, T: Tree>(object: &'v T, pointer: &str) -> Option<&'v T> {
    if pointer.is_empty() {
        return Some(object);
    }
    let escaped = pointer.bytes().any(|byte| byte == b'~');
    let mut rest = pointer.strip_prefix('/')?;
    let mut value = object;
    loop {
        // Split at the next `/` by hand: `str::split`'s searcher was most of a short lookup.
        let (segment, next) = match rest.bytes().position(|byte| byte == b'/') {
            Some(slash) => (rest.get(..slash)?, rest.get(slash + 1..)),
            None => (rest, None),
        };
        value = if escaped {
            value.child(&segment.replace("~1", "/").replace("~0", "~"))?
        } else {
            value.child(segment)?
        };
        match next {
            Some(next) => rest = next,
            None => return Some(value),
        }
    }
}

const TEMPLATE_SPEC: &str = "/spec/template/spec";
const TEMPLATE_METADATA: &str = "/spec/template/metadata";
const TEMPLATE: Option<&str> = Some("/spec/template");

/// Every kind podmend handles.
pub const TARGETS: &[Target] = &[
    Target {
        kind: WorkloadKind::Pod,
        group: "",
        name: "Pod",
        resource: "pods",
        spec: "/spec",
        metadata: "/metadata",
        template: None,
    },
    // A PodTemplate object holds its template at the top level, not under `spec`.
    Target {
        kind: WorkloadKind::PodTemplate,
        group: "",
        name: "PodTemplate",
        resource: "podtemplates",
        spec: "/template/spec",
        metadata: "/template/metadata",
        template: Some("/template"),
    },
    Target {
        kind: WorkloadKind::ReplicationController,
        group: "",
        name: "ReplicationController",
        resource: "replicationcontrollers",
        spec: TEMPLATE_SPEC,
        metadata: TEMPLATE_METADATA,
        template: TEMPLATE,
    },
    Target {
        kind: WorkloadKind::Deployment,
        group: "apps",
        name: "Deployment",
        resource: "deployments",
        spec: TEMPLATE_SPEC,
        metadata: TEMPLATE_METADATA,
        template: TEMPLATE,
    },
    Target {
        kind: WorkloadKind::ReplicaSet,
        group: "apps",
        name: "ReplicaSet",
        resource: "replicasets",
        spec: TEMPLATE_SPEC,
        metadata: TEMPLATE_METADATA,
        template: TEMPLATE,
    },
    Target {
        kind: WorkloadKind::StatefulSet,
        group: "apps",
        name: "StatefulSet",
        resource: "statefulsets",
        spec: TEMPLATE_SPEC,
        metadata: TEMPLATE_METADATA,
        template: TEMPLATE,
    },
    Target {
        kind: WorkloadKind::DaemonSet,
        group: "apps",
        name: "DaemonSet",
        resource: "daemonsets",
        spec: TEMPLATE_SPEC,
        metadata: TEMPLATE_METADATA,
        template: TEMPLATE,
    },
    Target {
        kind: WorkloadKind::Job,
        group: "batch",
        name: "Job",
        resource: "jobs",
        spec: TEMPLATE_SPEC,
        metadata: TEMPLATE_METADATA,
        template: TEMPLATE,
    },
    Target {
        kind: WorkloadKind::CronJob,
        group: "batch",
        name: "CronJob",
        resource: "cronjobs",
        spec: "/spec/jobTemplate/spec/template/spec",
        metadata: "/spec/jobTemplate/spec/template/metadata",
        template: Some("/spec/jobTemplate/spec/template"),
    },
];

/// The target for an API group and kind, if podmend handles it.
pub fn for_kind(group: &str, kind: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.group == group && t.name == kind)
}

/// The target for an object's `apiVersion` (`"apps/v1"`, `"v1"`) and kind.
pub fn for_api_version(api_version: &str, kind: &str) -> Option<&'static Target> {
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    for_kind(group, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_its_pod_spec_path() {
        let expected = [
            ("", "Pod", "/spec"),
            ("", "PodTemplate", "/template/spec"),
            ("", "ReplicationController", "/spec/template/spec"),
            ("apps", "Deployment", "/spec/template/spec"),
            ("apps", "ReplicaSet", "/spec/template/spec"),
            ("apps", "StatefulSet", "/spec/template/spec"),
            ("apps", "DaemonSet", "/spec/template/spec"),
            ("batch", "Job", "/spec/template/spec"),
            ("batch", "CronJob", "/spec/jobTemplate/spec/template/spec"),
        ];
        for (group, kind, spec) in expected {
            assert_eq!(for_kind(group, kind).map(|t| t.spec), Some(spec), "{kind}");
        }
    }

    #[test]
    fn a_pointer_finds_what_serde_jsons_own_look_up_finds_in_a_value_or_a_sketch() {
        let object = serde_json::json!({
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "a/b": 1, "m~n": 2, "": 3},
            "0": {"01": true},
        });
        let pointers = [
            "",
            "/",
            "/spec",
            "/spec/containers/1/name",
            "/spec/containers/2",
            "/spec/containers/01",
            "/spec/containers/-",
            "/spec/containers/x",
            "/spec/a~1b",
            "/spec/m~0n",
            "/spec/",
            "/0/01",
            "/spec/containers/0/name/more",
            "spec",
            "/nope/x",
        ];
        let sketch = crate::engine::document::Sketch::from(object.clone());
        for pointer in pointers {
            assert_eq!(at(&object, pointer), object.pointer(pointer), "{pointer:?}");
            let in_sketch = at(&sketch, pointer).map(|found| found.to_value());
            assert_eq!(in_sketch.as_ref(), object.pointer(pointer), "{pointer:?}");
        }
        for target in TARGETS {
            for pointer in [target.spec, target.metadata] {
                assert!(
                    !pointer.contains('~'),
                    "{pointer} is unescaped at every look-up"
                );
            }
        }
    }

    #[test]
    fn kinds_of_other_groups_are_not_handled() {
        assert!(for_kind("", "ConfigMap").is_none());
        assert!(for_kind("example.com", "Deployment").is_none());
        assert!(for_api_version("example.com/v1", "Pod").is_none());
    }

    #[test]
    fn api_versions_resolve_to_their_group() {
        assert_eq!(
            for_api_version("apps/v1", "Deployment").map(|t| t.kind),
            Some(WorkloadKind::Deployment)
        );
        assert_eq!(
            for_api_version("v1", "Pod").map(|t| t.kind),
            Some(WorkloadKind::Pod)
        );
        assert_eq!(
            for_api_version("batch/v1", "CronJob").map(|t| t.kind),
            Some(WorkloadKind::CronJob)
        );
    }
}
