//! The second read straight into the rules' type: what [`super::reread`] builds of a pod spec
//! as a `Value`, deserialized from the sketch's nodes and its kept JSON text, with no `Value`
//! between. The `Value` cost more to build and to drop than the `PodSpec` read from it.
//!
//! Each step is `reread`'s: a part the sketch holds only in part is read with its shape, one
//! it holds whole is shaped as `keep` keeps it, and a part it lacks stops the read (`None`:
//! the caller reads the way it did before). So does any error, which that way is worded as
//! before. A key written twice is read once, with its last value, as a `Value` keeps it.

use serde::Deserialize;
use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::super::super::{Keep, Shape, Sketch, Union};
use super::{holds_fields, in_part};

/// `node`, sketched with `sketched`, with the parts `keep` keeps, as a `T`: what
/// `T::deserialize` reads of [`super::reread`]'s `Value` of it. `None` when the sketch lacks a
/// part `keep` reads, or the parts do not make a `T`.
pub fn reread_as<'de, T: Deserialize<'de>>(
    node: &'de Sketch<'de>,
    sketched: &'static Shape,
    keep: Union,
) -> Option<T> {
    T::deserialize(Node {
        node,
        read: Read::Part(sketched, keep),
    })
    .ok()
}

/// How much of a node is read: as `reread`'s `read` (the sketch may hold it in part), as its
/// `shaped` (the sketch holds it whole, `keep` keeps some of it), or all of it.
#[derive(Clone, Copy)]
enum Read {
    Part(&'static Shape, Union),
    Shaped(Union),
    Whole,
}

#[derive(Clone, Copy)]
struct Node<'de> {
    node: &'de Sketch<'de>,
    read: Read,
}

/// What a node reads as, once its shapes decided.
enum Resolved<'de> {
    /// An object's members, each read as `Members` says.
    Object(&'de [(std::borrow::Cow<'de, str>, Sketch<'de>)], Members),
    Array(&'de [Sketch<'de>], Read),
    /// A value read as it is: a scalar, or JSON text.
    Leaf(&'de Sketch<'de>),
}

/// How an object's members are read.
#[derive(Clone, Copy)]
enum Members {
    /// With the sketch's shape of each (the object is held in part).
    Part(&'static Shape, Union),
    Shaped(Union),
    Whole,
}

impl Members {
    /// How member `key` is read; `None` when it is not kept.
    fn member(self, key: &str) -> Option<Option<Read>> {
        match self {
            Members::Whole => Some(Some(Read::Whole)),
            Members::Shaped(keep) => {
                let kept = keep.field(key).filter(|kept| !kept.is_dropped())?;
                Some(Some(Read::Shaped(kept)))
            }
            Members::Part(sketched, keep) => {
                let kept = keep.field(key).filter(|kept| !kept.is_dropped())?;
                // A member the sketch kept has the shape it was kept with.
                Some(sketched.field(key).map(|shape| Read::Part(shape, kept)))
            }
        }
    }
}

fn lacks() -> serde_json::Error {
    de::Error::custom("the sketch lacks a part the rules read")
}

impl<'de> Node<'de> {
    /// `reread`'s `read` and `shaped`, one level.
    fn resolve(self) -> Result<Resolved<'de>, serde_json::Error> {
        let read = match self.read {
            Read::Part(sketched, keep) if !in_part(self.node, sketched) => Read::Shaped(keep),
            read => read,
        };
        Ok(match (self.node, read) {
            (Sketch::Raw(_), _) => Resolved::Leaf(self.node),
            (_, Read::Part(_, keep)) if keep.is_all() => return Err(lacks()),
            (Sketch::Object(members), Read::Part(sketched, keep)) => {
                if keep.keeps_object_whole() || !holds_fields(sketched, keep) {
                    return Err(lacks());
                }
                Resolved::Object(members, Members::Part(sketched, keep))
            }
            (Sketch::Array(items), Read::Part(sketched, keep)) => {
                let (Some(item), Some(kept)) = (sketched.items(), keep.items()) else {
                    return Err(lacks());
                };
                Resolved::Array(items, Read::Part(item, kept))
            }
            (_, Read::Part(..)) => return Err(lacks()),
            (_, Read::Shaped(keep)) if keep.is_all() => self.whole(),
            (Sketch::Object(members), Read::Shaped(keep)) if !keep.keeps_object_whole() => {
                Resolved::Object(members, Members::Shaped(keep))
            }
            (Sketch::Array(items), Read::Shaped(keep)) => match keep.items() {
                Some(item) => Resolved::Array(items, Read::Shaped(item)),
                None => self.whole(),
            },
            _ => self.whole(),
        })
    }

    fn whole(self) -> Resolved<'de> {
        match self.node {
            Sketch::Object(members) => Resolved::Object(members, Members::Whole),
            Sketch::Array(items) => Resolved::Array(items, Read::Whole),
            _ => Resolved::Leaf(self.node),
        }
    }
}

impl<'de> Deserializer<'de> for Node<'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.resolve()? {
            Resolved::Object(members, read) => visitor.visit_map(Fields {
                members,
                read,
                next: 0,
                value: None,
            }),
            Resolved::Array(items, read) => visitor.visit_seq(Items {
                items,
                read,
                next: 0,
            }),
            Resolved::Leaf(leaf) => match leaf {
                Sketch::Null => visitor.visit_unit(),
                Sketch::Bool(value) => visitor.visit_bool(*value),
                Sketch::Number(number) => number.deserialize_any(visitor),
                Sketch::String(text) => visitor.visit_str(text),
                Sketch::Raw(text) => {
                    serde_json::Deserializer::from_str(text).deserialize_any(visitor)
                }
                // `whole` makes no leaf of a list or an object.
                Sketch::Array(_) | Sketch::Object(_) => Err(lacks()),
            },
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.node {
            Sketch::Null => visitor.visit_none(),
            Sketch::Raw(text) => {
                serde_json::Deserializer::from_str(text).deserialize_option(visitor)
            }
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.node {
            Sketch::Raw(text) => {
                serde_json::Deserializer::from_str(text).deserialize_newtype_struct(name, visitor)
            }
            _ => visitor.visit_newtype_struct(self),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// An object's kept members; a key written twice is read at its last.
struct Fields<'de> {
    members: &'de [(std::borrow::Cow<'de, str>, Sketch<'de>)],
    read: Members,
    next: usize,
    value: Option<Node<'de>>,
}

impl<'de> MapAccess<'de> for Fields<'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        while let Some((key, node)) = self.members.get(self.next) {
            self.next += 1;
            let Some(read) = self.read.member(key) else {
                continue;
            };
            let written_again = self.members[self.next..]
                .iter()
                .any(|(later, _)| later == key);
            if written_again {
                continue;
            }
            let read = read.ok_or_else(lacks)?;
            self.value = Some(Node { node, read });
            let key: &'de str = key;
            return seed
                .deserialize(BorrowedStrDeserializer::new(key))
                .map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        seed.deserialize(self.value.take().ok_or_else(lacks)?)
    }
}

struct Items<'de> {
    items: &'de [Sketch<'de>],
    read: Read,
    next: usize,
}

impl<'de> SeqAccess<'de> for Items<'de> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        let Some(node) = self.items.get(self.next) else {
            return Ok(None);
        };
        self.next += 1;
        seed.deserialize(Node {
            node,
            read: self.read,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len() - self.next)
    }
}
