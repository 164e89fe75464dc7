//! The second read of a created object, from its sketch rather than from the body: when the
//! sketch holds every part a [`Union`] reads (the deferred ones as their JSON text), those
//! parts are built from it, and the rest of the body (env, mounts, volumes, most of the
//! metadata) is not passed over a second time. A repair of a pinned agent pod read the whole
//! body twice for a few hundred bytes of it.
//!
//! The result is the [`Scanner::read_at`] of the object, value for value: the walk below takes
//! each step that read takes, on the sketch's nodes instead of the body's bytes. Debug builds
//! check it against serde_json's read on every review (`admission`).

use serde_json::Value;

use super::super::{Keep, OBJECT, Part, Shape, Sketch, Union};
use super::{Build, Scanner};

mod applies;
mod typed;

pub use applies::applies;
pub use typed::reread_as;

/// The parts of a created object that `keep` keeps, from the object's sketch; `None` when the
/// sketch lacks one of them (a field it skipped, or a value it holds only in part that `keep`
/// reads whole): the body is then read again.
pub fn reread(sketch: &Sketch<'_>, keep: Union) -> Option<Value> {
    read(sketch, &OBJECT, keep)
}

/// `node`, sketched with `sketched`, as `keep` keeps it.
fn read(node: &Sketch<'_>, sketched: &'static Shape, keep: Union) -> Option<Value> {
    if let Sketch::Raw(text) = node {
        return Scanner::new(text).shaped(keep);
    }
    if !in_part(node, sketched) {
        return Some(shaped(node, keep));
    }
    if keep.is_all() {
        return None;
    }
    match node {
        Sketch::Object(members) => {
            if keep.keeps_object_whole() || !holds_fields(sketched, keep) {
                return None;
            }
            let mut map = <Value as Build>::members(keep.fields_at_most());
            for (key, value) in members {
                if let Some(kept) = keep.field(key).filter(|kept| !kept.is_dropped()) {
                    let value = read(value, sketched.field(key)?, kept)?;
                    <Value as Build>::push(&mut map, key, value);
                }
            }
            Some(Value::Object(map))
        }
        Sketch::Array(items) => {
            let (item, kept) = (sketched.items()?, keep.items()?);
            let items = items.iter().map(|value| read(value, item, kept));
            items.collect::<Option<_>>().map(Value::Array)
        }
        // `in_part` holds only lists and objects.
        _ => None,
    }
}

/// Whether the sketch holds `node` in part, as [`Scanner::shaped`] keeps a value with
/// `sketched`: an object with its fields or entries, a list with its items' parts. Anything
/// else it holds whole (a list where fields were expected, a string, a value kept whole).
fn in_part(node: &Sketch<'_>, sketched: &'static Shape) -> bool {
    if sketched.is_all() {
        return false;
    }
    match node {
        Sketch::Object(_) => !sketched.keeps_object_whole(),
        Sketch::Array(_) => sketched.items().is_some(),
        _ => false,
    }
}

/// Whether every field `keep` may keep of an object is one the sketch kept of it with
/// `sketched` (a field it skipped may be in the body all the same).
fn holds_fields(sketched: &'static Shape, keep: Union) -> bool {
    let held = |key: &str| sketched.field(key).is_some_and(|shape| !shape.is_dropped());
    keep.parts().iter().all(|part| match *part {
        Part::Here(Shape::Fields(fields)) => fields
            .iter()
            .all(|(key, shape)| shape.is_dropped() || held(key)),
        // The same entries: both read the metadata's annotations with one shape.
        Part::Here(shape @ Shape::Entries(_)) => std::ptr::eq(shape, sketched),
        Part::Here(Shape::Dropped) => true,
        Part::Here(_) => false,
        Part::Below(pointer, _) => pointer
            .strip_prefix('/')
            .map(|below| below.split('/').next().unwrap_or(below))
            .is_some_and(held),
    })
}

/// A value the sketch holds whole, as `keep` keeps it: [`Scanner::shaped`] on a node.
fn shaped(node: &Sketch<'_>, keep: Union) -> Value {
    if keep.is_all() {
        return node.to_value();
    }
    match node {
        Sketch::Object(members) if !keep.keeps_object_whole() => {
            let mut map = <Value as Build>::members(keep.fields_at_most());
            for (key, value) in members {
                if let Some(kept) = keep.field(key).filter(|kept| !kept.is_dropped()) {
                    <Value as Build>::push(&mut map, key, shaped(value, kept));
                }
            }
            Value::Object(map)
        }
        Sketch::Array(items) => match keep.items() {
            Some(item) => Value::Array(items.iter().map(|value| shaped(value, item)).collect()),
            None => node.to_value(),
        },
        _ => node.to_value(),
    }
}

#[cfg(test)]
mod tests {
    use json_patch::PatchOperation;
    use k8s_openapi::api::core::v1::PodSpec;
    use serde::Deserialize;
    use serde_json::json;

    use super::super::super::{SCOPE, TEMPLATE_METADATA, Tree};
    use super::*;

    static PLACEMENT: Shape = Shape::Fields(&[
        ("nodeName", &Shape::All),
        ("affinity", &Shape::All),
        ("tolerations", &Shape::All),
    ]);
    static LABELS: Shape = Shape::Fields(&[("labels", &Shape::All)]);
    static RESOURCES: Shape = Shape::Fields(&[("resources", &Shape::All)]);
    static CONTAINERS: Shape = Shape::Fields(&[("containers", &Shape::Items(&RESOURCES))]);
    static ENV: Shape = Shape::Fields(&[("env", &Shape::All)]);
    static CONTAINERS_ENV: Shape = Shape::Fields(&[("containers", &Shape::Items(&ENV))]);

    fn sketch(text: &str) -> Sketch<'_> {
        Scanner::new(text)
            .sketch()
            .flatten()
            .expect("the scanner sketches the object")
    }

    fn union(parts: &[Part]) -> Union {
        Union::of(parts.iter().copied()).expect("few parts")
    }

    /// The read from the body, which a reread must equal.
    fn read_again(text: &str, keep: Union) -> Option<Value> {
        Scanner::new(text).read_at(&[], keep).flatten()
    }

    #[test]
    fn a_reread_builds_from_the_sketch_what_a_read_of_the_body_builds() {
        let text = json!({
            "metadata": {"name": "agent", "labels": {"app": "a"}, "uid": "u",
                         "annotations": {"podmend.io/agent": "true", "other": "x"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "node-1", "tolerations": [{"operator": "Exists"}],
                     "affinity": {"podAntiAffinity": {}},
                     "containers": [{"name": "c", "env": [{"name": "A", "value": "1"}],
                                     "resources": {"requests": {"cpu": "1"}}},
                                    {"name": "d", "resources": {"limits": {"memory": "1Gi"}}}],
                     "volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}
        })
        .to_string();
        let sketched = sketch(&text);
        let keep = union(&[
            Part::Here(&SCOPE),
            Part::Below("/metadata", &TEMPLATE_METADATA),
            Part::Below("/spec", &CONTAINERS),
            Part::Below("/spec", &PLACEMENT),
        ]);
        let reread = reread(&sketched, keep);
        assert!(reread.is_some(), "the sketch holds every part read");
        assert_eq!(reread, read_again(&text, keep));
        assert_eq!(
            reread
                .as_ref()
                .and_then(|o| o.pointer("/spec/containers/1/resources/limits/memory")),
            Some(&json!("1Gi"))
        );
    }

    #[test]
    fn a_part_the_sketch_skipped_is_read_from_the_body_again() {
        let text = json!({"spec": {"containers": [{"name": "c", "env": []}]}}).to_string();
        let sketched = sketch(&text);
        let keep = union(&[Part::Below("/spec", &CONTAINERS_ENV)]);
        assert_eq!(reread(&sketched, keep), None);
        let labels = union(&[Part::Below("/spec", &LABELS)]);
        assert_eq!(reread(&sketched, labels), None);
        let uid = union(&[Part::Here(&METADATA_UID)]);
        assert_eq!(reread(&sketch(r#"{"metadata": {"uid": "u"}}"#), uid), None);
    }

    static UID: Shape = Shape::Fields(&[("uid", &Shape::All)]);
    static METADATA_UID: Shape = Shape::Fields(&[("metadata", &UID)]);

    #[test]
    fn values_where_the_shapes_expect_others_are_reread_as_the_body_reads_them() {
        // A list where fields are expected, an object where items are, and deferred text that
        // is not an object: each kept as a read of the body keeps it.
        for text in [
            r#"{"spec": {"containers": {"name": "c"}, "tolerations": "none"}}"#,
            r#"{"spec": [1, 2], "metadata": "m"}"#,
            r#"{"spec": {"containers": [{"name": "c", "resources": [1]}, "x"]}}"#,
            r#"{"spec": {"containers": [], "affinity": null}, "metadata": {"labels": null}}"#,
        ] {
            let keep = union(&[
                Part::Here(&SCOPE),
                Part::Below("/spec", &CONTAINERS),
                Part::Below("/spec", &Shape::Fields(&[("affinity", &Shape::All)])),
            ]);
            let sketched = sketch(text);
            assert_eq!(reread(&sketched, keep), read_again(text, keep), "{text}");
        }
    }

    #[test]
    fn a_key_written_twice_is_reread_as_its_last_value() {
        let text = r#"{"spec": {"containers": [{"name": "c", "resources": {"a": 1},
                       "resources": {"b": 2}}], "tolerations": [], "tolerations": [1]}}"#;
        let keep = union(&[
            Part::Below("/spec", &CONTAINERS),
            Part::Below("/spec", &Shape::Fields(&[("tolerations", &Shape::All)])),
        ]);
        let reread = reread(&sketch(text), keep);
        assert_eq!(reread, read_again(text, keep));
        assert_eq!(
            reread
                .as_ref()
                .and_then(|o| o.pointer("/spec/containers/0/resources")),
            Some(&json!({"b": 2}))
        );
    }
    /// The pod spec of `text`'s object as `reread_as` reads it from the sketch, and as the
    /// read of the body's `Value` deserializes.
    fn spec_both_ways(text: &str, spec_parts: &[&'static Shape]) -> (Option<PodSpec>, PodSpec) {
        let sketched = sketch(text);
        let spec = sketched.child("spec").expect("a spec");
        let shape = super::super::super::sketched_at("/spec").expect("the sketch's spec");
        let here = union(&spec_parts.iter().map(|s| Part::Here(s)).collect::<Vec<_>>());
        let below = union(
            &spec_parts
                .iter()
                .map(|s| Part::Below("/spec", s))
                .collect::<Vec<_>>(),
        );
        let value = read_again(text, below).expect("an object");
        let typed = PodSpec::deserialize(&value["spec"]).expect("a pod spec");
        (reread_as(spec, shape, here), typed)
    }

    #[test]
    fn a_spec_read_into_its_type_from_the_sketch_is_the_one_its_value_gives() {
        let texts = [
            r#"{"spec": {"nodeName": "n", "tolerations": [{"operator": "Exists"}],
                "affinity": {"nodeAffinity": {}}, "priority": 3,
                "containers": [{"name": "c", "env": [{"name": "A"}],
                                "resources": {"requests": {"cpu": "1"}}, "resources": {}},
                               {"name": "d", "resources": {"limits": {"memory": "1Gi"}}}]}}"#,
            r#"{"spec": {"containers": [], "affinity": null, "nodeName": "a", "nodeName": "b"}}"#,
        ];
        for text in texts {
            let (read, typed) = spec_both_ways(text, &[&CONTAINERS, &PLACEMENT]);
            assert_eq!(read.as_ref(), Some(&typed), "{text}");
        }
        let (read, _) = spec_both_ways(texts[0], &[&CONTAINERS]);
        assert_eq!(
            read.and_then(|spec| spec.containers[1].resources.clone())
                .and_then(|r| r.limits)
                .map(|limits| limits["memory"].0.clone()),
            Some("1Gi".to_string())
        );
    }

    #[test]
    fn a_spec_the_sketch_holds_in_part_or_that_does_not_decode_is_not_read_into_its_type() {
        let text = r#"{"spec": {"containers": [{"name": "c", "env": []}]}}"#;
        let sketched = sketch(text);
        let spec = sketched.child("spec").expect("a spec");
        let shape = super::super::super::sketched_at("/spec").expect("the sketch's spec");
        let env = union(&[Part::Here(&ENV_OF_CONTAINERS)]);
        assert_eq!(reread_as::<PodSpec>(spec, shape, env), None);
        let broken = r#"{"spec": {"containers": [{"name": 7}]}}"#;
        let sketched = sketch(broken);
        let spec = sketched.child("spec").expect("a spec");
        let names = union(&[Part::Here(&CONTAINER_NAMES)]);
        assert_eq!(reread_as::<PodSpec>(spec, shape, names), None);
    }

    static ENV_OF_CONTAINERS: Shape = Shape::Fields(&[("containers", &Shape::Items(&ENV))]);
    static NAME: Shape = Shape::Fields(&[("name", &Shape::All)]);
    static CONTAINER_NAMES: Shape = Shape::Fields(&[("containers", &Shape::Items(&NAME))]);

    fn operation(op: &str, path: &str) -> PatchOperation {
        serde_json::from_value(json!({"op": op, "path": path, "value": 1})).expect("an operation")
    }

    #[test]
    fn a_patch_of_independent_operations_is_decided_on_the_sketch() {
        let text = r#"{"metadata": {"name": "p", "annotations": {"podmend.io/agent": "true",
            "other": "x"}}, "spec": {"nodeName": "n", "tolerations": [{"key": "a"}],
            "containers": [{"name": "c", "image": "i"}, {"name": "d",
            "resources": {"requests": {"cpu": "1"}}}]}}"#;
        let sketched = sketch(text);
        let decide = |ops: &[(&str, &str)]| {
            let patch: Vec<_> = ops.iter().map(|(op, path)| operation(op, path)).collect();
            applies(&sketched, &patch)
        };
        let repair = [
            ("add", "/metadata/annotations/podmend.io~1mutated"),
            ("remove", "/spec/nodeName"),
            ("add", "/spec/affinity"),
            ("replace", "/spec/containers/1/resources/requests/cpu"),
            ("replace", "/spec/tolerations/0"),
        ];
        assert_eq!(decide(&repair), Some(()));
        // Operations that do not apply, or that this cannot tell of, are left to the object.
        for undecided in [
            &[("remove", "/spec/affinity")][..],
            &[("replace", "/spec/containers/0/resources/requests/cpu")],
            &[("replace", "/spec/containers/1/resources/limits/cpu")],
            &[("remove", "/spec/containers/1/resources/requests/memory")],
            &[("add", "/spec/containers/2/resources")],
            &[("add", "/spec/tolerations/1")],
            &[("remove", "/spec/tolerations/0")],
            &[("add", "/spec/containers/0/env")],
            &[("add", "/metadata/uid")],
            &[
                ("add", "/spec/affinity"),
                ("add", "/spec/affinity/nodeAffinity"),
            ],
            &[("replace", "/spec/nodeName"), ("remove", "/spec/nodeName")],
            &[("test", "/spec/nodeName")],
        ] {
            assert_eq!(decide(undecided), None, "{undecided:?}");
        }
    }
}
