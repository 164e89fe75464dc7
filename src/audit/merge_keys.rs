//! Reading a YAML document as kubectl and Helm read it, merge keys (`<<: *base`) included.
//!
//! kubectl, Helm and the API server turn YAML into JSON with `sigs.k8s.io/yaml`, whose
//! `YAMLToJSON` decodes with go-yaml v2 (`yaml.Unmarshal` into `interface{}`). go-yaml v2
//! resolves a merge key while it decodes the mapping (`decoder.mapping` in `decode.go`): the
//! entries are taken in document order, and a `<<` entry (`isMerge`) writes every key of its
//! value into the mapping being built (`decoder.merge`), so whatever comes later wins, an
//! explicit key after the `<<` over the merged one, the merged one over an explicit key
//! before it. A list of mappings (`<<: [*a, *b]`) is merged from its last element to its
//! first, so that the earlier ones win. Anything else as a merge value fails the document
//! ("map merge requires map or sequence of maps as the value"). [`Merged`] reads the same
//! JSON value, so that the audit reviews the object the cluster gets and `-o yaml` writes
//! the merged fields out.
//!
//! serde does not tell a quoted `"<<"` key from a plain one, so a quoted one is merged too
//! (go-yaml keeps a quoted `"<<"` as an ordinary key); no Kubernetes field is named `<<`.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The merge key.
const MERGE_KEY: &str = "<<";

/// What a merge key's value must be, said as go-yaml says it, with what to do.
const WANT_MAP: &str = "map merge requires map or sequence of maps as the value: a merge key (<<) takes a mapping (<<: *anchor) or a list of mappings (<<: [*a, *b])";

/// A JSON value read from YAML with every merge key resolved as go-yaml v2 resolves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged(pub Value);

impl<'de> Deserialize<'de> for Merged {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MergedVisitor).map(Merged)
    }
}

struct MergedVisitor;

impl<'de> Visitor<'de> for MergedVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    /// As serde_json reads it: a float JSON cannot hold (`.nan`, `.inf`) is null.
    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_string()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Merged::deserialize(deserializer).map(|merged| merged.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Merged(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    /// Entries in document order; a merge key's mappings are written in where it stands.
    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            let Merged(value) = entries.next_value()?;
            if key == MERGE_KEY {
                merge_into(&mut map, value).map_err(de::Error::custom)?;
            } else {
                map.insert(key, value);
            }
        }
        Ok(Value::Object(map))
    }
}

/// Writes a merge key's `value` into `map`: a mapping's keys over those already there; a
/// list of mappings from its last to its first, so that the first wins.
fn merge_into(map: &mut Map<String, Value>, value: Value) -> Result<(), &'static str> {
    let sources = match value {
        Value::Object(source) => vec![source],
        Value::Array(items) => items
            .into_iter()
            .rev()
            .map(|item| match item {
                Value::Object(source) => Ok(source),
                _ => Err(WANT_MAP),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(WANT_MAP),
    };
    for source in sources {
        map.extend(source);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(yaml: &str) -> Result<Value, String> {
        serde_yaml_ng::from_str::<Merged>(yaml)
            .map(|merged| merged.0)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_merged_mapping_fills_in_what_the_mapping_does_not_say() {
        let yaml = "base: &base {image: builder, tag: '1'}\nc:\n  <<: *base\n  name: c\n";
        assert_eq!(
            read(yaml).unwrap()["c"],
            json!({"image": "builder", "tag": "1", "name": "c"})
        );
    }

    #[test]
    fn later_entries_win_in_document_order_as_in_go_yaml_v2() {
        let yaml = "base: &base {a: merged, b: merged}\nafter: {<<: *base, a: own}\nbefore: {a: own, <<: *base}\n";
        let value = read(yaml).unwrap();
        assert_eq!(value["after"], json!({"a": "own", "b": "merged"}));
        assert_eq!(value["before"], json!({"a": "merged", "b": "merged"}));
    }

    #[test]
    fn in_a_list_of_mappings_the_first_wins() {
        let yaml = "x: &x {a: x, b: x}\ny: &y {a: y, c: y}\nm: {<<: [*x, *y]}\n";
        assert_eq!(
            read(yaml).unwrap()["m"],
            json!({"a": "x", "c": "y", "b": "x"})
        );
    }

    #[test]
    fn merges_inside_a_merged_mapping_are_resolved_too() {
        let yaml = "a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nc: {<<: *b}\n";
        assert_eq!(read(yaml).unwrap()["c"], json!({"x": 1, "y": 2}));
    }

    #[test]
    fn a_merge_of_something_other_than_mappings_is_an_error_saying_what_it_takes() {
        for yaml in ["a: {<<: 1}\n", "a: {<<: [{x: 1}, 2]}\n", "a: {<<: null}\n"] {
            let error = read(yaml).unwrap_err();
            assert!(
                error.contains("a merge key (<<) takes a mapping"),
                "{error}"
            );
        }
    }
}
