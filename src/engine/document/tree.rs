//! The webhook's sketch of an object, borrowed from the request's body ([`Sketch`]), and the
//! two ways podmend reads a JSON tree whoever built it: [`View`], what scope and the rules'
//! `may_apply` read (a trait object, so a rule takes either tree), and [`Tree`], a view that
//! can be walked to a part of its own kind (the pod spec scope hands to the rules).
//!
//! Why a tree of its own: a sketch as serde_json's `Value` copied every key and string it
//! kept, and hashed every key into its map (SipHash); that was a fifth of a typical review.

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

/// A JSON value as the scanner sketches a body: strings borrowed from it (owned only where
/// serde_json read them, e.g. with escapes), an object as its members in the body's order.
/// A key written twice is kept twice, and read as serde_json's `Value` keeps it: its last
/// value ([`View::field`], [`Sketch::to_value`]).
#[derive(Debug, Clone)]
pub enum Sketch<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Sketch<'a>>),
    Object(Vec<(Cow<'a, str>, Sketch<'a>)>),
    /// A value the scanner left unbuilt ([`super::Shape::Deferred`]): its JSON text, checked
    /// as the rest of the body. Nothing reads into it but a second read of the object
    /// ([`super::scan::reread`]); as a [`View`] it is a value that is neither a string, a
    /// boolean, a list nor an object.
    Raw(&'a str),
}

impl Sketch<'_> {
    /// The `Value` serde_json reads of the same JSON.
    pub fn to_value(&self) -> Value {
        match self {
            Sketch::Null => Value::Null,
            Sketch::Bool(value) => Value::Bool(*value),
            Sketch::Number(number) => Value::Number(number.clone()),
            Sketch::String(text) => Value::String(text.to_string()),
            Sketch::Array(items) => Value::Array(items.iter().map(Sketch::to_value).collect()),
            Sketch::Object(members) => {
                let mut map = Map::with_capacity(members.len());
                for (key, value) in members {
                    map.insert(key.to_string(), value.to_value());
                }
                Value::Object(map)
            }
            // The scanner checked the text as JSON serde_json reads.
            Sketch::Raw(text) => serde_json::from_str(text).unwrap_or(Value::Null),
        }
    }
}

impl From<Value> for Sketch<'_> {
    /// A sketch serde_json read: it owns its strings.
    fn from(value: Value) -> Self {
        match value {
            Value::Null => Sketch::Null,
            Value::Bool(value) => Sketch::Bool(value),
            Value::Number(number) => Sketch::Number(number),
            Value::String(text) => Sketch::String(Cow::Owned(text)),
            Value::Array(items) => Sketch::Array(items.into_iter().map(Sketch::from).collect()),
            Value::Object(map) => Sketch::Object(
                map.into_iter()
                    .map(|(key, value)| (Cow::Owned(key), Sketch::from(value)))
                    .collect(),
            ),
        }
    }
}

/// Equal when serde_json's `Value`s of the two are: a key written twice counts once, with its
/// last value, and members compare in any order. Only the debug builds' checks compare
/// sketches, so the copies cost nothing that matters.
impl PartialEq for Sketch<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

/// What podmend reads of a JSON value, whoever built it: serde_json's `Value` (a parsed
/// object, `audit`'s manifests) or the webhook's [`Sketch`].
pub trait View {
    /// An object's field `key` (its last value when the key is written twice); `None` when
    /// there is none or this is not an object.
    fn field(&self, key: &str) -> Option<&dyn View>;
    /// How many items a list has; `None` for anything but a list.
    fn list_len(&self) -> Option<usize>;
    /// A list's item at `index`.
    fn item(&self, index: usize) -> Option<&dyn View>;
    fn as_str(&self) -> Option<&str>;
    fn as_bool(&self) -> Option<bool>;
    fn is_object(&self) -> bool;
    /// Calls `each` with an object's members, in order; a key written twice comes twice, its
    /// last value last. Nothing for anything but an object.
    fn members(&self, each: &mut dyn FnMut(&str, &dyn View));
}

impl<'v> dyn View + 'v {
    /// A list's items; `None` for anything but a list.
    pub fn items(&self) -> Option<impl Iterator<Item = &dyn View>> {
        let len = self.list_len()?;
        Some((0..len).filter_map(move |index| self.item(index)))
    }

    /// An object's field `key`, when it is a string.
    pub fn string(&self, key: &str) -> Option<&str> {
        self.field(key)?.as_str()
    }
}

/// A [`View`] that can be walked to a part of its own kind, and compared.
pub trait Tree: View + PartialEq {
    /// An object's field, or a list's item, named by one (unescaped) JSON Pointer segment.
    fn child(&self, segment: &str) -> Option<&Self>;
}

impl View for Value {
    fn field(&self, key: &str) -> Option<&dyn View> {
        super::get(self, key).map(|value| value as &dyn View)
    }
    fn list_len(&self) -> Option<usize> {
        self.as_array().map(Vec::len)
    }
    fn item(&self, index: usize) -> Option<&dyn View> {
        self.as_array()?.get(index).map(|value| value as &dyn View)
    }
    fn as_str(&self) -> Option<&str> {
        Value::as_str(self)
    }
    fn as_bool(&self) -> Option<bool> {
        Value::as_bool(self)
    }
    fn is_object(&self) -> bool {
        Value::is_object(self)
    }
    fn members(&self, each: &mut dyn FnMut(&str, &dyn View)) {
        for (key, value) in self.as_object().into_iter().flatten() {
            each(key, value);
        }
    }
}

impl Tree for Value {
    fn child(&self, segment: &str) -> Option<&Self> {
        match self {
            Value::Object(map) => super::field(map, segment),
            Value::Array(items) => items.get(super::array_index(segment)?),
            _ => None,
        }
    }
}

impl Sketch<'_> {
    /// An object's member `key`: its last, as serde_json keeps a key written twice.
    fn member(&self, key: &str) -> Option<&Self> {
        match self {
            Sketch::Object(members) => members
                .iter()
                .rev()
                .find(|(name, _)| name.as_ref() == key)
                .map(|(_, value)| value),
            _ => None,
        }
    }

    fn list(&self) -> Option<&[Self]> {
        match self {
            Sketch::Array(items) => Some(items),
            _ => None,
        }
    }
}

impl View for Sketch<'_> {
    fn field(&self, key: &str) -> Option<&dyn View> {
        self.member(key).map(|value| value as &dyn View)
    }
    fn list_len(&self) -> Option<usize> {
        self.list().map(<[_]>::len)
    }
    fn item(&self, index: usize) -> Option<&dyn View> {
        self.list()?.get(index).map(|value| value as &dyn View)
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            Sketch::String(text) => Some(text),
            _ => None,
        }
    }
    fn as_bool(&self) -> Option<bool> {
        match self {
            Sketch::Bool(value) => Some(*value),
            _ => None,
        }
    }
    fn is_object(&self) -> bool {
        matches!(self, Sketch::Object(_))
    }
    fn members(&self, each: &mut dyn FnMut(&str, &dyn View)) {
        if let Sketch::Object(members) = self {
            for (key, value) in members {
                each(key, value);
            }
        }
    }
}

impl Tree for Sketch<'_> {
    fn child(&self, segment: &str) -> Option<&Self> {
        match self {
            Sketch::Object(_) => self.member(segment),
            Sketch::Array(items) => items.get(super::array_index(segment)?),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sketch(value: &Value) -> Sketch<'static> {
        Sketch::from(value.clone())
    }

    #[test]
    fn a_sketch_reads_as_the_value_it_was_made_from() {
        let value = json!({"a": [1, "two", true, null, {"b": -0.5}], "c": {"d": "e"}, "f": false});
        let sketched = sketch(&value);
        assert_eq!(sketched.to_value(), value);
        for tree in [&value as &dyn View, &sketched] {
            let list = tree.field("a").expect("a");
            assert_eq!(list.list_len(), Some(5));
            let texts: Vec<_> = list.items().expect("a list").map(|v| v.as_str()).collect();
            assert_eq!(texts, [None, Some("two"), None, None, None]);
            assert_eq!(list.item(2).and_then(|v| v.as_bool()), Some(true));
            assert!(list.item(4).is_some_and(|v| v.is_object()));
            assert_eq!(tree.field("f").and_then(|v| v.as_bool()), Some(false));
            assert!(tree.field("c").is_some_and(|v| v.items().is_none()));
            let mut members = Vec::new();
            tree.members(&mut |key, value| members.push((key.to_string(), value.is_object())));
            assert_eq!(members.len(), 3);
            assert!(members.contains(&("c".to_string(), true)));
        }
        assert_eq!(
            sketched.child("a").and_then(|a| a.child("1")),
            Some(&sketch(&json!("two")))
        );
        assert_eq!(sketched.child("a").and_then(|a| a.child("01")), None);
    }

    #[test]
    fn a_key_written_twice_reads_as_its_last_value_as_serde_json_keeps_it() {
        let twice = Sketch::Object(vec![
            (Cow::Borrowed("a"), Sketch::String(Cow::Borrowed("first"))),
            (Cow::Borrowed("b"), Sketch::Null),
            (Cow::Borrowed("a"), Sketch::String(Cow::Borrowed("last"))),
        ]);
        let read: Value =
            serde_json::from_str(r#"{"a": "first", "b": null, "a": "last"}"#).expect("json");
        assert_eq!(twice.to_value(), read);
        assert_eq!(twice.field("a").and_then(|v| v.as_str()), Some("last"));
        assert_eq!(twice, sketch(&read));
    }
}
