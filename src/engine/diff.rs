//! The name-aware JSON diff the patches are computed with: `json_patch::diff`, except that
//! lists of uniquely named items are diffed by name.
//!
//! It walks two serializations of the same typed spec, which list their fields in the same
//! order: maps are compared in step while their keys agree, without hashing, and the path is
//! a stack of borrowed segments turned into a JSON Pointer only for an operation. A
//! container's `resources`, the field `agent-requests` changes, is walked typed, as its
//! serialization would be, without building it.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::{PointerBuf, Token};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

/// `json_patch::diff`, except that a list whose items all have unique names (containers,
/// volumes, env vars) is diffed item by item by name rather than by position, when the names
/// both sides share are in the same order. Neither side holds the fields our types do not
/// know, so a positional diff of `[guard, a]` against `[a]` would rewrite `a` into the guard
/// field by field and leave `a`'s unknown fields on the guard; by name it is one `add`.
pub(super) fn diff(before: &Value, after: &Value) -> json_patch::Patch {
    let mut walk = Walk {
        at: Vec::new(),
        ops: Vec::new(),
    };
    walk.values(before, after);
    json_patch::Patch(walk.ops)
}

/// A key of a map that differs, for [`keys`].
pub(super) enum Change<'v> {
    /// Its value on both sides (`None`: absent).
    Values(&'v str, Option<&'v Value>, Option<&'v Value>),
    /// The operations below it, already computed (a list diffed item by item, see
    /// [`item_keys`]); the key itself is on both sides.
    Below(Vec<PatchOperation>),
}

/// The diff of two maps given as the keys that differ, in the order the maps list them: what
/// [`diff`] of the whole maps gives, adds and diffs in order, removes last.
pub(super) fn keys(changed: Vec<Change<'_>>) -> json_patch::Patch {
    let mut walk = Walk {
        at: Vec::new(),
        ops: Vec::new(),
    };
    let mut removed = Vec::new();
    for change in changed {
        match change {
            Change::Values(key, before, after) => walk.key(key, before, after, &mut removed),
            Change::Below(ops) => walk.ops.extend(ops),
        }
    }
    for key in removed {
        walk.at(Segment::Key(key), Walk::remove);
    }
    json_patch::Patch(walk.ops)
}

/// A key of a list's item that differs, for [`item_keys`].
pub(super) enum ItemKey<'a> {
    /// Its serialization on both sides (`None`: absent).
    Values(&'a str, Option<&'a Value>, Option<&'a Value>),
    /// A container's `resources`, on both sides with the same `claims`: walked typed.
    Resources(&'a ResourceRequirements, &'a ResourceRequirements),
}

/// [`keys`] of the map that is item `index` of the list at key `list`, given its keys that
/// differ: what [`diff`] gives for that item when the list kept its items in place.
pub(super) fn item_keys<'a>(
    (list, index): (&'a str, usize),
    changed: &[ItemKey<'a>],
) -> Vec<PatchOperation> {
    let mut walk = Walk {
        at: vec![Segment::Key(list), Segment::Index(index)],
        ops: Vec::new(),
    };
    let mut removed = Vec::new();
    for change in changed {
        match *change {
            ItemKey::Values(key, before, after) => walk.key(key, before, after, &mut removed),
            ItemKey::Resources(before, after) => {
                walk.at(Segment::Key("resources"), |walk| {
                    walk.resources(before, after)
                });
            }
        }
    }
    for key in removed {
        walk.at(Segment::Key(key), Walk::remove);
    }
    walk.ops
}

/// One step of a path: a map key or an array index.
#[derive(Clone, Copy)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

/// A diff in progress: where it is, and the operations so far.
struct Walk<'a> {
    at: Vec<Segment<'a>>,
    ops: Vec<PatchOperation>,
}

type Map = serde_json::Map<String, Value>;

impl<'a> Walk<'a> {
    fn values(&mut self, before: &'a Value, after: &'a Value) {
        match (before, after) {
            (Value::Object(before), Value::Object(after)) => self.maps(before, after),
            (Value::Array(before), Value::Array(after)) => {
                match (item_names(before), item_names(after)) {
                    (Some(before_names), Some(after_names))
                        if shared_in_same_order(&before_names, &after_names) =>
                    {
                        self.by_name(before, after, (&before_names, &after_names))
                    }
                    _ => self.by_position(before, after),
                }
            }
            _ if before == after => {}
            _ => self.replace(after.clone()),
        }
    }

    /// One key of a map diffed by its keys that differ: diffed or added now, or kept in
    /// `removed` for the end.
    fn key(
        &mut self,
        key: &'a str,
        before: Option<&'a Value>,
        after: Option<&'a Value>,
        removed: &mut Vec<&'a str>,
    ) {
        self.at(Segment::Key(key), |walk| match (before, after) {
            (Some(before), Some(after)) => walk.values(before, after),
            (None, Some(after)) => walk.add(after),
            (Some(_), None) => removed.push(key),
            (None, None) => {}
        });
    }

    /// `value` at `segment` below where the walk is.
    fn at(&mut self, segment: Segment<'a>, walk: impl FnOnce(&mut Self)) {
        self.at.push(segment);
        walk(self);
        self.at.pop();
    }

    /// Keys of both are diffed, keys only `after` has are added, keys only `before` has
    /// removed. While both list the same keys in the same order, no key is looked up.
    fn maps(&mut self, before: &'a Map, after: &'a Map) {
        let in_step =
            before.len() == after.len() && before.keys().zip(after.keys()).all(|(b, a)| b == a);
        if in_step {
            for ((key, before_value), after_value) in before.iter().zip(after.values()) {
                self.at(Segment::Key(key), |walk| {
                    walk.values(before_value, after_value)
                });
            }
            return;
        }
        for (key, after_value) in after {
            self.at(Segment::Key(key), |walk| match before.get(key) {
                Some(before_value) => walk.values(before_value, after_value),
                None => walk.add(after_value),
            });
        }
        for key in before.keys().filter(|key| !after.contains_key(*key)) {
            self.at(Segment::Key(key), Self::remove);
        }
    }

    /// Named items: the ones `after` lacks are removed (from the end), then the shared ones
    /// are diffed in place and each new one is inserted where it belongs, so item `index` is
    /// always where the diff says.
    fn by_name(
        &mut self,
        before: &'a [Value],
        after: &'a [Value],
        (before_names, after_names): (&[&str], &[&str]),
    ) {
        for (index, name) in before_names.iter().enumerate().rev() {
            if !after_names.contains(name) {
                self.at(Segment::Index(index), Self::remove);
            }
        }
        for (index, (name, after_item)) in after_names.iter().zip(after).enumerate() {
            self.at(Segment::Index(index), |walk| {
                match before_names.iter().position(|n| n == name) {
                    Some(old) => walk.values(&before[old], after_item),
                    None => walk.add(after_item),
                }
            });
        }
    }

    /// Items by position: the shared positions diffed, then the extra items added or
    /// removed.
    fn by_position(&mut self, before: &'a [Value], after: &'a [Value]) {
        let shared = before.len().min(after.len());
        for index in 0..shared {
            self.at(Segment::Index(index), |walk| {
                walk.values(&before[index], &after[index])
            });
        }
        for (index, item) in after.iter().enumerate().skip(shared) {
            self.at(Segment::Index(index), |walk| walk.add(item));
        }
        for _ in shared..before.len() {
            self.at(Segment::Index(shared), Self::remove);
        }
    }

    /// Two `resources` with the same `claims` (the caller compares them), as [`Self::maps`]
    /// walks their serializations: `claims`, `limits`, `requests`, each when set.
    fn resources(&mut self, before: &'a ResourceRequirements, after: &'a ResourceRequirements) {
        debug_assert!(before.claims == after.claims, "claims are diffed as JSON");
        let maps = |r: &'a ResourceRequirements| {
            [
                ("limits", r.limits.as_ref()),
                ("requests", r.requests.as_ref()),
            ]
        };
        let pairs = maps(before).into_iter().zip(maps(after));
        for ((key, before_map), (_, after_map)) in pairs.clone() {
            match (before_map, after_map) {
                (Some(b), Some(a)) => self.at(Segment::Key(key), |walk| walk.quantities(b, a)),
                (None, Some(a)) => self.at(Segment::Key(key), |walk| walk.add_quantities(a)),
                _ => {}
            }
        }
        // A map only `before` has is removed after the others, as `maps` removes keys.
        for ((key, before_map), (_, after_map)) in pairs {
            if before_map.is_some() && after_map.is_none() {
                self.at(Segment::Key(key), Self::remove);
            }
        }
    }

    /// Two maps of quantities, as [`Self::maps`] walks their serializations (objects of
    /// strings, keys in order).
    fn quantities(
        &mut self,
        before: &'a BTreeMap<String, Quantity>,
        after: &'a BTreeMap<String, Quantity>,
    ) {
        // In step or not, each key of `after` in order is diffed or added, then the keys only
        // `before` has are removed.
        for (key, after_value) in after {
            self.at(Segment::Key(key), |walk| match before.get(key) {
                Some(b) if b == after_value => {}
                Some(_) => walk.replace(Value::String(after_value.0.clone())),
                None => walk.push_add(Value::String(after_value.0.clone())),
            });
        }
        for key in before.keys().filter(|key| !after.contains_key(*key)) {
            self.at(Segment::Key(key), Self::remove);
        }
    }

    /// A map of quantities added whole.
    fn add_quantities(&mut self, quantities: &BTreeMap<String, Quantity>) {
        let map = quantities
            .iter()
            .map(|(key, value)| (key.clone(), Value::String(value.0.clone())))
            .collect();
        self.push_add(Value::Object(map));
    }

    fn replace(&mut self, value: Value) {
        let path = self.path();
        self.ops
            .push(PatchOperation::Replace(json_patch::ReplaceOperation {
                path,
                value,
            }));
    }

    fn push_add(&mut self, value: Value) {
        let path = self.path();
        self.ops.push(PatchOperation::Add(json_patch::AddOperation {
            path,
            value,
        }));
    }

    fn add(&mut self, value: &Value) {
        self.push_add(value.clone());
    }

    fn remove(&mut self) {
        let path = self.path();
        self.ops
            .push(PatchOperation::Remove(json_patch::RemoveOperation { path }));
    }

    /// Where the walk is, as a JSON Pointer: the segments escaped into one string sized once
    /// (`PointerBuf::push_back` grew the string and made a token per segment, a tenth of a
    /// repair's diff).
    fn path(&self) -> PointerBuf {
        let size = self.at.iter().map(Segment::size).sum();
        let mut text = String::with_capacity(size);
        for segment in &self.at {
            text.push('/');
            match *segment {
                Segment::Key(key) => push_escaped(&mut text, key),
                Segment::Index(index) => push_index(&mut text, index),
            }
        }
        let tokens = || {
            PointerBuf::from_tokens(self.at.iter().map(|segment| match *segment {
                Segment::Key(key) => Token::new(key),
                Segment::Index(index) => Token::from(index),
            }))
        };
        // Escaped as RFC 6901 asks, so it parses; made token by token should it not.
        let path = PointerBuf::parse(text).unwrap_or_else(|_| tokens());
        debug_assert_eq!(path, tokens(), "a path escaped otherwise than jsonptr does");
        path
    }
}

impl Segment<'_> {
    /// About the bytes it takes in a pointer.
    fn size(&self) -> usize {
        match self {
            Segment::Key(key) => key.len() + 1,
            Segment::Index(_) => 4,
        }
    }
}

/// `key` as a pointer's token: `~` as `~0`, `/` as `~1`.
fn push_escaped(text: &mut String, key: &str) {
    if !key.contains(['~', '/']) {
        text.push_str(key);
        return;
    }
    for c in key.chars() {
        match c {
            '~' => text.push_str("~0"),
            '/' => text.push_str("~1"),
            c => text.push(c),
        }
    }
}

/// `index` in decimal digits, without the formatting machinery.
fn push_index(text: &mut String, mut index: usize) {
    let mut digits = [0u8; 20];
    let mut count = 0;
    loop {
        digits[count] = b'0' + (index % 10) as u8;
        count += 1;
        index /= 10;
        if index == 0 {
            break;
        }
    }
    for &digit in digits[..count].iter().rev() {
        text.push(char::from(digit));
    }
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

    #[test]
    fn indexes_are_written_in_decimal_in_paths() {
        let before: Vec<usize> = (0..=120).collect();
        let mut after = before.clone();
        for index in [0, 9, 10, 99, 100, 120] {
            after[index] += 1000;
        }
        let paths: Vec<String> = diff(&json!({"~/": before}), &json!({"~/": after}))
            .0
            .iter()
            .map(|op| op.path().to_string())
            .collect();
        let expected = ["0", "9", "10", "99", "100", "120"].map(|i| format!("/~0~1/{i}"));
        assert_eq!(paths, expected);
        let mut path = String::new();
        push_index(&mut path, usize::MAX);
        assert_eq!(path, usize::MAX.to_string());
    }
}
