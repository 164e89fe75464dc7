//! The name-aware JSON diff the patches are computed with: `json_patch::diff`, except that
//! lists of uniquely named items are diffed by name.

use json_patch::PatchOperation;
use json_patch::jsonptr::PointerBuf;
use serde_json::Value;

/// `json_patch::diff`, except that a list whose items all have unique names (containers,
/// volumes, env vars) is diffed item by item by name rather than by position, when the names
/// both sides share are in the same order. Neither side holds the fields our types do not
/// know, so a positional diff of `[guard, a]` against `[a]` would rewrite `a` into the guard
/// field by field and leave `a`'s unknown fields on the guard; by name it is one `add`.
pub(super) fn diff(before: &Value, after: &Value) -> json_patch::Patch {
    let mut ops = Vec::new();
    diff_into(before, after, &mut PointerBuf::new(), &mut ops);
    json_patch::Patch(ops)
}

fn diff_into(before: &Value, after: &Value, at: &mut PointerBuf, ops: &mut Vec<PatchOperation>) {
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => diff_maps(before, after, at, ops),
        (Value::Array(before), Value::Array(after)) => {
            match (item_names(before), item_names(after)) {
                (Some(before_names), Some(after_names))
                    if shared_in_same_order(&before_names, &after_names) =>
                {
                    diff_by_name(before, after, (&before_names, &after_names), at, ops)
                }
                _ => diff_by_position(before, after, at, ops),
            }
        }
        _ if before == after => {}
        _ => ops.push(PatchOperation::Replace(json_patch::ReplaceOperation {
            path: at.clone(),
            value: after.clone(),
        })),
    }
}

type Map = serde_json::Map<String, Value>;

/// Keys of both are diffed, keys only `after` has are added, keys only `before` has removed.
fn diff_maps(before: &Map, after: &Map, at: &mut PointerBuf, ops: &mut Vec<PatchOperation>) {
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
        ops.push(remove_op(at));
        at.pop_back();
    }
}

/// Named items: the ones `after` lacks are removed (from the end), then the shared ones are
/// diffed in place and each new one is inserted where it belongs, so item `index` is always
/// where the diff says.
fn diff_by_name(
    before: &[Value],
    after: &[Value],
    (before_names, after_names): (&[&str], &[&str]),
    at: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
    for (index, name) in before_names.iter().enumerate().rev() {
        if !after_names.contains(name) {
            at.push_back(index);
            ops.push(remove_op(at));
            at.pop_back();
        }
    }
    for (index, (name, after_item)) in after_names.iter().zip(after).enumerate() {
        at.push_back(index);
        match before_names.iter().position(|n| n == name) {
            Some(old) => diff_into(&before[old], after_item, at, ops),
            None => ops.push(add_op(at, after_item)),
        }
        at.pop_back();
    }
}

/// Items by position: the shared positions diffed, then the extra items added or removed.
fn diff_by_position(
    before: &[Value],
    after: &[Value],
    at: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
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
        ops.push(remove_op(at));
        at.pop_back();
    }
}

fn remove_op(at: &PointerBuf) -> PatchOperation {
    PatchOperation::Remove(json_patch::RemoveOperation { path: at.clone() })
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ops(before: Value, after: Value) -> Value {
        serde_json::to_value(diff(&before, &after)).expect("serializes")
    }

    fn applied(before: &Value, after: &Value) -> Value {
        let mut out = before.clone();
        json_patch::patch(&mut out, &diff(before, after)).expect("applies");
        out
    }

    #[test]
    fn equal_documents_have_an_empty_diff() {
        let doc = json!({"a": [1, {"b": null}], "c": "d"});
        assert_eq!(ops(doc.clone(), doc), json!([]));
    }

    #[test]
    fn changed_added_and_removed_fields_are_replaced_added_and_removed() {
        assert_eq!(
            ops(
                json!({"keep": 1, "change": 1, "drop": 1}),
                json!({"keep": 1, "change": 2, "new": {"x": 1}})
            ),
            json!([
                {"op": "replace", "path": "/change", "value": 2},
                {"op": "add", "path": "/new", "value": {"x": 1}},
                {"op": "remove", "path": "/drop"}
            ])
        );
    }

    #[test]
    fn an_item_inserted_before_named_items_is_one_add_not_a_rewrite_of_each() {
        let before = json!({"containers": [{"name": "a", "unknown": 1}]});
        let after = json!({"containers": [{"name": "guard"}, {"name": "a", "unknown": 1}]});
        assert_eq!(
            ops(before.clone(), after.clone()),
            json!([{"op": "add", "path": "/containers/0", "value": {"name": "guard"}}])
        );
        assert_eq!(applied(&before, &after), after);
    }

    #[test]
    fn named_items_removed_and_changed_keep_their_places_right() {
        let before = json!([{"name": "a"}, {"name": "b", "v": 1}, {"name": "c"}]);
        let after = json!([{"name": "b", "v": 2}, {"name": "c"}, {"name": "d"}]);
        assert_eq!(applied(&before, &after), after);
        assert_eq!(
            ops(before, after),
            json!([
                {"op": "remove", "path": "/0"},
                {"op": "replace", "path": "/0/v", "value": 2},
                {"op": "add", "path": "/2", "value": {"name": "d"}}
            ])
        );
    }

    #[test]
    fn lists_without_unique_names_or_reordered_are_diffed_by_position() {
        for (before, after) in [
            (
                json!([{"name": "a"}, {"name": "a"}]),
                json!([{"name": "a"}]),
            ),
            (
                json!([{"name": "a"}, {"name": "b"}]),
                json!([{"name": "b"}, {"name": "a"}]),
            ),
            (json!([1, 2, 3]), json!([1, 4])),
            (json!(["x"]), json!(["x", "y", "z"])),
        ] {
            assert_eq!(applied(&before, &after), after, "{before} -> {after}");
        }
    }

    #[test]
    fn keys_with_slashes_and_tildes_are_escaped_in_paths() {
        assert_eq!(
            ops(json!({}), json!({"a/b~c": 1})),
            json!([{"op": "add", "path": "/a~1b~0c", "value": 1}])
        );
    }
}
