//! Applying a patch to check it, as `json_patch::patch_unsafe` does, with the same result and
//! the same error, at a fraction of the cost for the operations the diff makes.
//!
//! `json_patch` finds every path with serde_json's `pointer_mut`, which allocates twice per
//! segment to unescape it, and hashes every key: that was half of a repair's patch check.
//! Here the diff's operations (`add`, `remove` and `replace` at keys and plain array indexes)
//! are applied directly. From the first operation this is not sure of (another kind, an index
//! such as `-`, a path that is not there), `json_patch` applies the rest, on the object as the
//! operations before left it, which is the object `json_patch` would have reached: it decides,
//! and words any error as before. Debug builds apply every patch both ways and compare.

use json_patch::jsonptr::Pointer;
use json_patch::{PatchError, PatchOperation};
use serde_json::Value;

use crate::engine::document;

/// Applies `patch` to `object` as `json_patch::patch_unsafe` does.
pub(in crate::engine) fn apply(
    object: &mut Value,
    patch: &[PatchOperation],
) -> Result<(), PatchError> {
    #[cfg(debug_assertions)]
    let expected = {
        let mut copy = object.clone();
        json_patch::patch_unsafe(&mut copy, patch).map(|()| copy)
    };
    let result = apply_quickly(object, patch, Values::Copied);
    #[cfg(debug_assertions)]
    {
        let agree = match (&expected, &result) {
            (Ok(copy), Ok(())) => copy == object,
            (Err(want), Err(got)) => want.to_string() == got.to_string(),
            _ => false,
        };
        debug_assert!(
            agree,
            "a patch applied otherwise than json_patch applies it:\n{expected:?}\n{result:?}"
        );
    }
    result
}

/// Whether `patch` applies to `object`: [`apply`]'s result, with `object` left as a draft. A
/// value added at a key, which no later operation reaches into, is not copied in: `null` holds
/// its place, for what decides whether an operation applies is the paths, not the values (the
/// copies were a fifth of a repair's check). Patches with operations that read values (`test`,
/// `move`, `copy`) are applied whole. Debug builds compare the result with [`apply`]'s.
pub(in crate::engine) fn check(
    object: &mut Value,
    patch: &[PatchOperation],
) -> Result<(), PatchError> {
    #[cfg(debug_assertions)]
    let expected = apply(&mut object.clone(), patch).map_err(|error| error.to_string());
    let writes_only = patch.iter().all(|operation| {
        matches!(
            operation,
            PatchOperation::Add(_) | PatchOperation::Remove(_) | PatchOperation::Replace(_)
        )
    });
    let result = if writes_only {
        apply_quickly(object, patch, Values::HeldByPlaceholders)
    } else {
        apply(object, patch)
    };
    #[cfg(debug_assertions)]
    debug_assert_eq!(
        result
            .as_ref()
            .map(|_| ())
            .map_err(|error| error.to_string()),
        expected,
        "a patch checked otherwise than it applies"
    );
    result
}

/// What the values an operation writes become in the object.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    /// Copied in: the object is the patched one.
    Copied,
    /// Held by `null` where no later operation reaches into them ([`check`]).
    HeldByPlaceholders,
}

fn apply_quickly(
    object: &mut Value,
    patch: &[PatchOperation],
    values: Values,
) -> Result<(), PatchError> {
    for (index, operation) in patch.iter().enumerate() {
        let later = patch.get(index + 1..).unwrap_or_default();
        if quickly(object, operation, values, later).is_none() {
            let rest = patch.get(index..).unwrap_or_default();
            return json_patch::patch_unsafe(object, rest).map_err(|mut error| {
                error.operation += index;
                error
            });
        }
    }
    Ok(())
}

/// One operation, applied; `None`, with `object` untouched, for one left to `json_patch`.
/// `later`: the operations after it, which a placeholder must not be in the way of.
fn quickly(
    object: &mut Value,
    operation: &PatchOperation,
    values: Values,
    later: &[PatchOperation],
) -> Option<()> {
    match operation {
        PatchOperation::Add(add) => {
            let (parent, last) = add.path.split_back()?;
            match walk(object, parent)? {
                Value::Object(map) => {
                    // At a key, the value stays where it is put whatever comes later: only an
                    // operation whose path goes through it could tell a placeholder from it.
                    let held = values == Values::HeldByPlaceholders
                        && !later.iter().any(|op| reaches_into(op, &add.path));
                    let value = if held { Value::Null } else { add.value.clone() };
                    map.insert(last.decoded().into_owned(), value);
                }
                Value::Array(items) => {
                    let at =
                        document::array_index(last.encoded()).filter(|at| *at <= items.len())?;
                    items.insert(at, add.value.clone());
                }
                _ => return None,
            }
        }
        PatchOperation::Remove(remove) => {
            let (parent, last) = remove.path.split_back()?;
            match walk(object, parent)? {
                Value::Object(map) => {
                    map.remove(last.decoded().as_ref())?;
                }
                Value::Array(items) => {
                    let at =
                        document::array_index(last.encoded()).filter(|at| *at < items.len())?;
                    items.remove(at);
                }
                _ => return None,
            }
        }
        PatchOperation::Replace(replace) => {
            *walk(object, &replace.path)? = replace.value.clone();
        }
        _ => return None,
    }
    Some(())
}

/// Whether `operation`'s path goes through `at` to something inside it (`starts_with` compares
/// whole tokens: `/spec/xy` is not inside `/spec/x`).
fn reaches_into(operation: &PatchOperation, at: &Pointer) -> bool {
    let path = operation.path();
    path != at && path.starts_with(at)
}

/// The value at `pointer`, as serde_json's `pointer_mut` finds it.
fn walk<'v>(value: &'v mut Value, pointer: &Pointer) -> Option<&'v mut Value> {
    pointer
        .tokens()
        .try_fold(value, |value, token| match value {
            Value::Object(map) => document::field_mut(map, &token.decoded()),
            Value::Array(items) => items.get_mut(document::array_index(token.encoded())?),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `patch` applied here and by json_patch to `object`: the same document, or the same error.
    fn agree(object: &Value, patch: Value) {
        let patch: Vec<PatchOperation> = serde_json::from_value(patch).expect("a patch");
        let mut here = object.clone();
        let mut there = object.clone();
        let result = apply_quickly(&mut here, &patch, Values::Copied).map_err(|e| e.to_string());
        let expected = json_patch::patch_unsafe(&mut there, &patch).map_err(|e| e.to_string());
        assert_eq!(result, expected, "{patch:?}");
        if result.is_ok() {
            assert_eq!(here, there, "{patch:?}");
        }
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "annotations": {"a/b": "1", "t~x": "2"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "resources": {}},
                {"name": "side"}]}})
    }

    #[test]
    fn the_diffs_operations_apply_as_json_patch_applies_them() {
        let patch = json!([
            {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {}}},
            {"op": "add", "path": "/spec/affinity/nodeAffinity/x", "value": 1},
            {"op": "remove", "path": "/spec/nodeName"},
            {"op": "add", "path": "/spec/containers/0/resources/requests",
                "value": {"cpu": "10m"}},
            {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu",
                "value": "20m"},
            {"op": "add", "path": "/spec/containers/1", "value": {"name": "guard"}},
            {"op": "add", "path": "/spec/containers/3", "value": {"name": "last"}},
            {"op": "remove", "path": "/spec/containers/0"},
            {"op": "add", "path": "/metadata/annotations/podmend.io~1mutated", "value": "r"},
            {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "3"},
            {"op": "remove", "path": "/metadata/annotations/t~0x"},
            {"op": "replace", "path": "", "value": {"whole": true}}
        ]);
        agree(&pod(), patch.clone());
        // Each of them quickly, none left to json_patch.
        let operations: Vec<PatchOperation> = serde_json::from_value(patch).expect("a patch");
        let mut object = pod();
        for operation in &operations {
            let quick = quickly(&mut object, operation, Values::Copied, &[]);
            assert!(quick.is_some(), "{operation:?}");
        }
    }

    /// `check`'s result and `apply`'s, as strings, for `patch` on `object`.
    fn checked_and_applied(object: &Value, patch: Value) -> (Result<(), String>, Value) {
        let patch: Vec<PatchOperation> = serde_json::from_value(patch).expect("a patch");
        let mut draft = object.clone();
        let checked = check(&mut draft, &patch).map_err(|e| e.to_string());
        let applied = apply(&mut object.clone(), &patch).map_err(|e| e.to_string());
        assert_eq!(checked, applied, "{patch:?}");
        (checked, draft)
    }

    #[test]
    fn a_check_finds_what_applying_finds_with_placeholders_for_values_nothing_reaches_into() {
        let (result, draft) = checked_and_applied(
            &pod(),
            json!([
                {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {}}},
                {"op": "add", "path": "/spec/tolerations", "value": [{"key": "k"}]},
                {"op": "add", "path": "/spec/tolerations/1", "value": {"key": "j"}},
                {"op": "add", "path": "/spec/containers/0/resources/requests",
                    "value": {"cpu": "0"}},
                {"op": "add", "path": "/metadata/annotations/podmend.io~1mutated", "value": "r"}
            ]),
        );
        assert_eq!(result, Ok(()));
        // Nothing reaches into the affinity, the requests or the annotation: placeholders.
        // The tolerations are reached into (an item added at 1): copied.
        assert_eq!(draft["spec"]["affinity"], Value::Null);
        assert_eq!(
            draft["spec"]["containers"][0]["resources"]["requests"],
            Value::Null
        );
        assert_eq!(
            draft["metadata"]["annotations"]["podmend.io/mutated"],
            Value::Null
        );
        assert_eq!(
            draft["spec"]["tolerations"],
            json!([{"key": "k"}, {"key": "j"}])
        );
        for patch in [
            // Into an added value: it is there to go into, or, a string, it is not.
            json!([{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {}}},
                {"op": "add", "path": "/spec/affinity/nodeAffinity/x", "value": 1}]),
            json!([{"op": "add", "path": "/spec/x", "value": {"y": 1}},
                {"op": "remove", "path": "/spec/x/y"},
                {"op": "replace", "path": "/spec/x", "value": 2}]),
            json!([{"op": "add", "path": "/spec/x", "value": "s"},
                {"op": "add", "path": "/spec/x/y", "value": 1}]),
            // A key that only starts like the added one is not inside it.
            json!([{"op": "add", "path": "/spec/x", "value": {}},
                {"op": "add", "path": "/spec/xy/z", "value": 1}]),
            // Operations that read values: applied whole.
            json!([{"op": "add", "path": "/spec/x", "value": "v"},
                {"op": "test", "path": "/spec/x", "value": "v"}]),
            json!([{"op": "add", "path": "/spec/x", "value": "v"},
                {"op": "test", "path": "/spec/x", "value": "w"}]),
        ] {
            // It asserts that the two agree, whether they apply or fail.
            let _ = checked_and_applied(&pod(), patch);
        }
    }

    #[test]
    fn what_is_left_to_json_patch_is_applied_and_worded_by_it() {
        for patch in [
            // An index past the end, a missing key, a key below a string: each fails, at
            // its own operation.
            json!([{"op": "add", "path": "/spec/nodeName", "value": "n2"},
                {"op": "add", "path": "/spec/containers/5", "value": {}}]),
            json!([{"op": "remove", "path": "/spec/containers/0/absent"}]),
            json!([{"op": "replace", "path": "/spec/absent", "value": 1}]),
            json!([{"op": "add", "path": "/spec/nodeName/x", "value": 1}]),
            json!([{"op": "remove", "path": "/spec/containers/2"}]),
            // What the diff does not make: `-`, indexes written otherwise, other operations.
            json!([{"op": "add", "path": "/spec/containers/-", "value": {"name": "end"}},
                {"op": "replace", "path": "/spec/containers/2/name", "value": "e"}]),
            json!([{"op": "add", "path": "/spec/containers/01", "value": {}}]),
            json!([{"op": "replace", "path": "/spec/containers/+1/name", "value": "x"}]),
            json!([{"op": "test", "path": "/spec/nodeName", "value": "n1"},
                {"op": "move", "from": "/spec/nodeName", "path": "/spec/host"},
                {"op": "copy", "from": "/spec/host", "path": "/spec/nodeName"}]),
            json!([{"op": "test", "path": "/spec/nodeName", "value": "other"}]),
            json!([{"op": "add", "path": "", "value": []}]),
        ] {
            agree(&pod(), patch);
        }
    }
}
