//! An object as the webhook receives it, read where it sits in the request's JSON, three ways:
//!
//! - [`sketch`]: a copy that holds only what deciding scope and the rules' `may_apply` read
//!   (names, namespace, labels, podmend's annotations, owners' kinds; nodeName, each
//!   container's name, image, command and args; volumes' host paths), for all the places a pod
//!   spec can be. Most reviews end there, without the object ever being built: that is most
//!   of a review's cost. The webhook first tries [`scan`], which builds the same sketch
//!   without serde's visitors as a [`Sketch`] borrowed from the body, and reads with
//!   serde_json only the bodies it declines. Scope and the rules read either tree, or a whole
//!   object, through [`View`].
//! - [`read_at`] with a [`Union`] of shapes: scope's fields and what the rules that may act
//!   read of the pod spec ([`crate::rules::Rule::reads`]), when each names its parts: a pinned
//!   agent pod is repaired without its env, probes, volumes or mounts ever being built. The
//!   webhook builds those parts from the sketch, which keeps what the rules read beyond
//!   `may_apply` as JSON text ([`Shape::Deferred`], [`scan::reread`]); a part it lacks is read
//!   from the body with [`scan`], and with serde_json what the scanner declines. Where the
//!   sketch holds them all, the pod spec is read from it straight into the rules' type
//!   ([`scan::reread_as`]), and the repair's patch is checked on it ([`scan::applies`]).
//!   [`project`] takes the same parts of an object already parsed (`audit`'s).
//! - [`parse`]: the whole object, without `metadata.managedFields` (the API server's record of
//!   field owners: often the largest part of an object, never read by a rule).
//!
//! The sketch's shape must cover every field scope and `may_apply` read; the engine's tests
//! check, for every fixture and generated pod, that a sketch decides as the whole object does.

use std::borrow::Cow;

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{MIRROR_ANNOTATION, PODMEND_ANNOTATIONS};

pub mod scan;
pub mod tree;

pub use tree::{Sketch, Tree, View};

/// The whole object, without `metadata.managedFields`, read where it sits in a document (a
/// request's `object`, through serde's `deserialize_with`); `null` is no object.
pub fn parse<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Ok(Some(Pruned(Level::Object).deserialize(deserializer)?).filter(|v| !v.is_null()))
}

/// The object with only the fields of [`OBJECT`] (see the module's doc), read where it sits
/// in a document, so that the document is read once; `null` is no object.
pub fn sketch<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Ok(Some(Shaped(&OBJECT).deserialize(deserializer)?).filter(|v| !v.is_null()))
}

/// `metadata.name`, or `generateName` while the object has no name (a pod its controller
/// creates is named by the API server after admission); empty when it has neither. A sketch
/// keeps both.
pub fn name(object: &dyn View) -> &str {
    let metadata = object.field("metadata");
    let field = |key| metadata?.string(key).filter(|n| !n.is_empty());
    field("name")
        .or_else(|| field("generateName"))
        .unwrap_or_default()
}

/// Up to this many fields, a map is searched by comparing keys: what a sketch holds and most
/// of an object's levels.
const COMPARED_FIELDS: usize = 16;

/// `map`'s field `key`, as `Map::get` finds it. A small map is searched by comparing its
/// keys, which costs less than hashing the key once (serde_json's maps hash with SipHash).
pub fn field<'v>(map: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    if map.len() > COMPARED_FIELDS {
        return map.get(key);
    }
    map.iter()
        .find(|(name, _)| name.as_str() == key)
        .map(|(_, value)| value)
}

/// [`field`], to change it.
pub fn field_mut<'v>(map: &'v mut Map<String, Value>, key: &str) -> Option<&'v mut Value> {
    if map.len() > COMPARED_FIELDS {
        return map.get_mut(key);
    }
    map.iter_mut()
        .find(|(name, _)| name.as_str() == key)
        .map(|(_, value)| value)
}

/// `value`'s field `key` when it is an object: [`field`].
pub fn get<'v>(value: &'v Value, key: &str) -> Option<&'v Value> {
    value.as_object().and_then(|map| field(map, key))
}

/// The shape the sketch keeps at `pointer` (one of the target table's, which have no
/// escapes): a pod spec's, to read it from the sketch.
pub fn sketched_at(pointer: &str) -> Option<&'static Shape> {
    let mut keys = pointer.split('/').skip(1);
    keys.try_fold(&OBJECT, |shape: &'static Shape, key| shape.field(key))
}

/// An array index as RFC 6901 writes it: digits without a leading zero, which both
/// serde_json's `pointer` and `jsonptr` read as that index. `None` for anything else (`-`,
/// `+1`, `01`, `""`).
pub fn array_index(segment: &str) -> Option<usize> {
    let digits = !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = segment.len() > 1 && segment.starts_with('0');
    if !digits || leading_zero {
        return None;
    }
    segment.parse().ok()
}

/// Which fields of a JSON value a sketch keeps.
pub enum Shape {
    /// The whole value.
    All,
    /// These fields of an object, each with its own shape; the others are skipped.
    Fields(&'static [(&'static str, &'static Shape)]),
    /// Every item of an array, each with this shape.
    Items(&'static Shape),
    /// The entries of an object whose keys pass, each whole; the others are skipped.
    Entries(fn(&str) -> bool),
    /// Passed over unbuilt and uncounted, as [`parse`] passes over it: `metadata.managedFields`,
    /// which no path of podmend builds. serde_json passes over it without recursing, so its
    /// nesting cannot overflow the stack; counting it refused what the whole parse accepts.
    Dropped,
    /// The whole value, left unbuilt by the scanner's sketch: it keeps the value's JSON text
    /// ([`Sketch::Raw`]), so that a second read builds it from there without passing over the
    /// rest of the body again. What the rules that may act read beyond what `may_apply` reads
    /// (a container's resources, the pod's affinity). serde_json's sketch builds it whole.
    Deferred,
}

impl Shape {
    /// The shape of an object's field `key`; `None` when the sketch skips it.
    fn field(&self, key: &str) -> Option<&'static Shape> {
        match self {
            Shape::Fields(fields) => fields
                .iter()
                .find(|(name, _)| *name == key)
                .map(|(_, shape)| *shape),
            Shape::Entries(keep) => keep(key).then_some(&ALL),
            Shape::All | Shape::Items(_) | Shape::Deferred => Some(&ALL),
            Shape::Dropped => None,
        }
    }
}

static ALL: Shape = Shape::All;
static DROPPED: Shape = Shape::Dropped;
static DEFERRED: Shape = Shape::Deferred;

/// The field of an object's metadata both reads leave out unbuilt.
const MANAGED_FIELDS: &str = "managedFields";

/// What a container shows before a rule decides to look closer, and what `agent-requests`
/// reads once it does (deferred).
static CONTAINER: Shape = Shape::Fields(&[
    ("name", &ALL),
    ("image", &ALL),
    ("command", &ALL),
    ("args", &ALL),
    ("resources", &DEFERRED),
    ("restartPolicy", &DEFERRED),
]);
static CONTAINERS: Shape = Shape::Items(&CONTAINER);
static HOST_PATH: Shape = Shape::Fields(&[("path", &ALL)]);
/// A volume's host path: `dind-rm` looks for the node's Docker socket (not its name).
static VOLUME: Shape = Shape::Fields(&[("hostPath", &HOST_PATH)]);
static VOLUMES: Shape = Shape::Items(&VOLUME);

/// A pod spec's fields the rules' `may_apply` read, and (deferred) those the rules that name
/// their reads read beyond them (`node-affinity`, `agent-requests`): a repair of a created
/// pod then never reads the body again. A test of `engine::run`
/// (`the_sketch_holds_all_the_rules_that_name_their_reads_read_on_every_target`) keeps the two
/// lists in step.
static POD_SPEC: Shape = Shape::Fields(&[
    ("nodeName", &ALL),
    ("containers", &CONTAINERS),
    ("initContainers", &CONTAINERS),
    ("volumes", &VOLUMES),
    ("affinity", &DEFERRED),
    ("tolerations", &DEFERRED),
    ("resources", &DEFERRED),
    ("schedulerName", &DEFERRED),
    ("schedulingGates", &DEFERRED),
    ("topologySpreadConstraints", &DEFERRED),
    ("priorityClassName", &DEFERRED),
]);

/// The annotations scope and `may_apply` read: podmend's own, and the mirror pod's. The others
/// are skipped: kubectl's `last-applied-configuration` alone is often the largest part of an
/// object.
static ANNOTATIONS: Shape = Shape::Entries(read_by_rules);

fn read_by_rules(annotation: &str) -> bool {
    annotation.starts_with(PODMEND_ANNOTATIONS) || annotation == MIRROR_ANNOTATION
}

/// A template: the labels and annotations it gives its pods, and their spec.
pub static TEMPLATE_METADATA: Shape =
    Shape::Fields(&[("labels", &ALL), ("annotations", &ANNOTATIONS)]);
static TEMPLATE: Shape = Shape::Fields(&[("metadata", &TEMPLATE_METADATA), ("spec", &POD_SPEC)]);
static JOB_SPEC: Shape = Shape::Fields(&[("template", &TEMPLATE)]);
static JOB_TEMPLATE: Shape = Shape::Fields(&[("spec", &JOB_SPEC)]);

/// A Pod's `spec` and a workload's: the pod spec fields (a Pod's), the template (a
/// Deployment's, …) and the job template (a CronJob's); each object has only its own.
static SPEC: Shape = Shape::Fields(&[
    ("nodeName", &ALL),
    ("containers", &CONTAINERS),
    ("initContainers", &CONTAINERS),
    ("volumes", &VOLUMES),
    ("affinity", &DEFERRED),
    ("tolerations", &DEFERRED),
    ("resources", &DEFERRED),
    ("schedulerName", &DEFERRED),
    ("schedulingGates", &DEFERRED),
    ("topologySpreadConstraints", &DEFERRED),
    ("priorityClassName", &DEFERRED),
    ("template", &TEMPLATE),
    ("jobTemplate", &JOB_TEMPLATE),
]);

/// What scope reads of an owner: whether it is the controller, and its kind.
static OWNER: Shape = Shape::Fields(&[("kind", &ALL), ("controller", &ALL)]);

static METADATA: Shape = Shape::Fields(&[
    ("name", &ALL),
    ("generateName", &ALL),
    ("namespace", &ALL),
    ("labels", &ALL),
    ("annotations", &ANNOTATIONS),
    ("ownerReferences", &Shape::Items(&OWNER)),
    (MANAGED_FIELDS, &DROPPED),
]);

/// What scope reads of an object once the rules that may act are known: its metadata (a
/// template's own is [`TEMPLATE_METADATA`], at the target's metadata pointer).
pub static SCOPE: Shape = Shape::Fields(&[("metadata", &METADATA)]);

/// The object: its metadata, its spec, and a PodTemplate's top-level `template`.
pub static OBJECT: Shape = Shape::Fields(&[
    ("metadata", &METADATA),
    ("spec", &SPEC),
    ("template", &TEMPLATE),
]);

/// What a read keeps of one JSON value: a [`Shape`], or several read as one ([`Union`]).
trait Keep: Copy {
    /// The whole value.
    fn is_all(self) -> bool;
    /// Passed over unbuilt and uncounted ([`Shape::Dropped`]).
    fn is_dropped(self) -> bool;
    /// Whole, but kept as its JSON text where the tree can ([`Shape::Deferred`]).
    fn is_deferred(self) -> bool;
    /// What to keep of an object's field `key`; `None` when it is skipped.
    fn field(self, key: &str) -> Option<Self>;
    /// What to keep of each item of a list; `None` when no list is expected here (it is then
    /// kept whole, as the whole object has it).
    fn items(self) -> Option<Self>;
    /// Whether an object met here is kept whole: a list or everything was expected.
    fn keeps_object_whole(self) -> bool;
    /// Whether what is skipped is counted for nesting and checked: on the first read of a
    /// body (the sketch), which refuses one too deep or not JSON; not on a second read of the
    /// same body, which only passes over it.
    fn counts_skipped(self) -> bool;
    /// How many fields an object kept here has at most, as far as the shapes tell (0 when
    /// they do not): its map is made that large at once rather than grown and rehashed as
    /// fields come. Only a hint: a map still grows past it.
    fn fields_at_most(self) -> usize;
}

impl Keep for &'static Shape {
    /// Deferred too: a tree that cannot keep JSON text (serde_json's) builds it whole.
    fn is_all(self) -> bool {
        matches!(self, Shape::All | Shape::Deferred)
    }
    fn is_dropped(self) -> bool {
        matches!(self, Shape::Dropped)
    }
    fn is_deferred(self) -> bool {
        matches!(self, Shape::Deferred)
    }
    fn field(self, key: &str) -> Option<Self> {
        Shape::field(self, key)
    }
    fn items(self) -> Option<Self> {
        match self {
            Shape::Items(item) => Some(item),
            _ => None,
        }
    }
    fn keeps_object_whole(self) -> bool {
        matches!(self, Shape::Items(_) | Shape::All | Shape::Deferred)
    }
    fn counts_skipped(self) -> bool {
        true
    }
    fn fields_at_most(self) -> usize {
        match self {
            Shape::Fields(fields) => fields.len(),
            Shape::All | Shape::Items(_) | Shape::Entries(_) | Shape::Dropped | Shape::Deferred => {
                0
            }
        }
    }
}

/// The most shapes one [`Union`] reads as one: scope's two, the fields every pod spec needs
/// to decode, and one per rule, with room to spare.
pub const UNION_PARTS: usize = 8;

/// Several shapes read as one: a field is kept when one of them keeps it. A part may stand
/// below the value read, at a JSON Pointer (a pod spec's place in its object). A union reads
/// a body the sketch read first, or a value already parsed, both with their nesting checked:
/// what it skips is passed over uncounted, as fast as serde_json can, and by the scanner
/// unchecked.
#[derive(Clone, Copy)]
pub struct Union {
    parts: [Part; UNION_PARTS],
    len: usize,
}

/// One shape of a [`Union`].
#[derive(Clone, Copy)]
pub enum Part {
    /// This shape, at the value read.
    Here(&'static Shape),
    /// This shape, at the end of this JSON Pointer below the value read (one of the target
    /// table's, which have no escapes).
    Below(&'static str, &'static Shape),
}

impl Part {
    fn field(self, key: &str) -> Option<Part> {
        match self {
            Part::Here(shape) => shape.field(key).map(Part::Here),
            Part::Below(pointer, shape) => {
                let below = pointer.strip_prefix('/')?.strip_prefix(key)?;
                // A key with a `/` is no segment of the pointer, only two of them run together.
                if key.contains('/') {
                    None
                } else if below.is_empty() {
                    Some(Part::Here(shape))
                } else if below.starts_with('/') {
                    Some(Part::Below(below, shape))
                } else {
                    None
                }
            }
        }
    }

    fn here(self) -> Option<&'static Shape> {
        match self {
            Part::Here(shape) => Some(shape),
            Part::Below(..) => None,
        }
    }
}

impl Union {
    /// These parts read as one; `None` for more than [`UNION_PARTS`] of them.
    pub fn of(parts: impl IntoIterator<Item = Part>) -> Option<Self> {
        let mut union = Union {
            parts: [Part::Here(&DROPPED); UNION_PARTS],
            len: 0,
        };
        for part in parts {
            union.push(part).ok()?;
        }
        Some(union)
    }

    fn push(&mut self, part: Part) -> Result<(), ()> {
        let slot = self.parts.get_mut(self.len).ok_or(())?;
        *slot = part;
        self.len += 1;
        Ok(())
    }

    fn parts(&self) -> &[Part] {
        &self.parts[..self.len]
    }

    /// Each part's own, where it has one; `None` when none has.
    fn map(self, each: impl Fn(Part) -> Option<Part>) -> Option<Self> {
        let mut out = Union {
            parts: self.parts,
            len: 0,
        };
        for part in self.parts().iter().filter_map(|part| each(*part)) {
            // As many as there were: always room.
            out.push(part).ok()?;
        }
        (out.len > 0).then_some(out)
    }
}

impl Keep for Union {
    fn is_all(self) -> bool {
        self.parts()
            .iter()
            .any(|part| part.here().is_some_and(Keep::is_all))
    }
    fn is_dropped(self) -> bool {
        self.parts()
            .iter()
            .all(|part| part.here().is_some_and(Keep::is_dropped))
    }
    /// A union builds what it reads.
    fn is_deferred(self) -> bool {
        false
    }
    fn field(self, key: &str) -> Option<Self> {
        self.map(|part| part.field(key))
    }
    fn items(self) -> Option<Self> {
        let every_part_lists = self
            .parts()
            .iter()
            .all(|part| part.here().and_then(Keep::items).is_some());
        if !every_part_lists {
            return None;
        }
        self.map(|part| part.here().and_then(Keep::items).map(Part::Here))
    }
    fn keeps_object_whole(self) -> bool {
        self.parts()
            .iter()
            .any(|part| part.here().is_some_and(Keep::keeps_object_whole))
    }
    /// A union reads a body the sketch read first (and counted), or a parsed value.
    fn counts_skipped(self) -> bool {
        false
    }
    fn fields_at_most(self) -> usize {
        // A part below names one field here; one with its own shape here, that shape's.
        self.parts()
            .iter()
            .map(|part| part.here().map_or(1, Keep::fields_at_most))
            .sum()
    }
}

/// The parts of `value` that `keep` keeps: what a [`Union`] read of its JSON would give, from
/// a value already parsed (`audit`'s manifests).
pub fn project(value: &Value, keep: Union) -> Value {
    // Reading a parsed value cannot fail: no visitor here refuses anything, and the value's
    // nesting was checked when it was parsed.
    Shaped(keep).deserialize(value).unwrap_or(Value::Null)
}

/// The value at `path` (object keys, from the document's root) of a document, with the parts
/// `keep` keeps; the rest of the document is passed over unbuilt. `None` when the document has
/// no such value, or `null` there.
pub fn read_at<'de, D: Deserializer<'de>>(
    deserializer: D,
    path: &[&str],
    keep: Union,
) -> Result<Option<Value>, D::Error> {
    Ok(At { path, keep }
        .deserialize(deserializer)?
        .filter(|v| !v.is_null()))
}

/// [`read_at`]: the rest of the path to walk, then what to keep there.
struct At<'p> {
    path: &'p [&'p str],
    keep: Union,
}

impl<'de> DeserializeSeed<'de> for At<'_> {
    type Value = Option<Value>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        match self.path {
            [] => Shaped(self.keep).deserialize(deserializer).map(Some),
            _ => deserializer.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for At<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Ok(None);
        };
        let mut found = None;
        while let Some(key) = access.next_key_seed(Key)? {
            // A key written twice: the last one, as serde_json's `Value` keeps it (`decode`
            // refuses a request or review that repeats one of its own fields).
            if key == *first {
                let below = At {
                    path: rest,
                    keep: self.keep,
                };
                found = access.next_value_seed(below)?;
            } else {
                access.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    // Anything but an object on the path: no such value.
    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        while access.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Deserializes a value keeping what its shape (or union of shapes) names.
#[derive(Clone, Copy)]
struct Shaped<K>(K);

impl<'de, K: Keep> DeserializeSeed<'de> for Shaped<K> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.0.is_all() {
            return Value::deserialize(deserializer);
        }
        deserializer.deserialize_any(self)
    }
}

/// A JSON scalar becomes the `Value` serde_json would build: what every visitor here does
/// with the parts it does not prune.
macro_rules! scalars_as_values {
    () => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
    };
}

impl<'de, K: Keep> Visitor<'de> for Shaped<K> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        if self.0.keeps_object_whole() {
            // A map where items were expected: kept whole, as the whole object has it.
            return ValueVisitor.visit_map(access);
        }
        let mut map = Map::with_capacity(self.0.fields_at_most());
        while let Some(key) = access.next_key_seed(Key)? {
            match self.0.field(&key) {
                Some(keep) if keep.is_dropped() => {
                    access.next_value::<IgnoredAny>()?;
                }
                Some(keep) => {
                    let value = access.next_value_seed(Shaped(keep))?;
                    map.insert(key.into_owned(), value);
                }
                None if self.0.counts_skipped() => access.next_value_seed(Skipped)?,
                None => {
                    access.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(map))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let Some(item) = self.0.items() else {
            // A list where fields were expected: kept whole.
            return ValueVisitor.visit_seq(access);
        };
        let mut items = Vec::new();
        while let Some(value) = access.next_element_seed(Shaped(item))? {
            items.push(value);
        }
        Ok(Value::Array(items))
    }

    scalars_as_values!();
}

/// A part of the object the sketch does not keep: read and dropped, but through serde_json's
/// nesting count (its `IgnoredAny` does not count), so an object too deep to build is refused
/// by the one read of the body whichever of its parts is deep (but `managedFields`, which no
/// path builds: [`Shape::Dropped`]).
#[derive(Clone, Copy)]
struct Skipped;

impl<'de> DeserializeSeed<'de> for Skipped {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skipped {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
        while access.next_key_seed(Skipped)?.is_some() {
            access.next_value_seed(Skipped)?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
        while access.next_element_seed(Skipped)?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A map key, borrowed from the body unless it has escapes: most keys a sketch meets are
/// skipped, and a key skipped need not be copied.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// serde_json's own visitor for a whole value, reached through `Value`'s `Deserialize`.
struct ValueVisitor;

impl ValueVisitor {
    fn visit_map<'de, A: MapAccess<'de>>(self, access: A) -> Result<Value, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(access))
    }

    fn visit_seq<'de, A: SeqAccess<'de>>(self, access: A) -> Result<Value, A::Error> {
        Value::deserialize(de::value::SeqAccessDeserializer::new(access))
    }
}

/// Where a value sits in an object being decoded: only the object's own `metadata` is pruned.
#[derive(Clone, Copy)]
enum Level {
    Object,
    Metadata,
}

/// Decodes a JSON value at `Level` into a [`Value`], leaving out what that level prunes.
#[derive(Clone, Copy)]
struct Pruned(Level);

impl<'de> DeserializeSeed<'de> for Pruned {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pruned {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = match (self.0, key.as_str()) {
                (Level::Metadata, MANAGED_FIELDS) => {
                    access.next_value::<IgnoredAny>()?;
                    continue;
                }
                (Level::Object, "metadata") => access.next_value_seed(Pruned(Level::Metadata))?,
                _ => access.next_value::<Value>()?,
            };
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }

    // An object or metadata that is not a JSON object is kept as it is: the engine skips it.
    fn visit_seq<A: SeqAccess<'de>>(self, access: A) -> Result<Value, A::Error> {
        ValueVisitor.visit_seq(access)
    }
    scalars_as_values!();
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The sketch of an object written as `text`.
    fn sketched(text: &str) -> Value {
        let read = sketch(&mut serde_json::Deserializer::from_str(text));
        read.expect("sketches").unwrap_or_default()
    }

    /// The object written as `text`, parsed.
    fn parsed(text: &str) -> Value {
        let read = parse(&mut serde_json::Deserializer::from_str(text));
        read.expect("parses").unwrap_or_default()
    }

    #[test]
    fn a_field_is_found_by_comparing_keys_as_a_map_finds_it_by_hashing() {
        for size in [0, 1, 5, COMPARED_FIELDS, COMPARED_FIELDS + 1, 40] {
            let map: Map<String, Value> = (0..size)
                .map(|i| (format!("field-{i}"), Value::from(i)))
                .collect();
            for key in ["field-0", "field-4", "field-16", "field-39", "absent", ""] {
                assert_eq!(field(&map, key), map.get(key), "{key} of {size}");
                let mut changed = map.clone();
                assert_eq!(field_mut(&mut changed, key), map.clone().get_mut(key));
            }
        }
    }

    #[test]
    fn parsing_leaves_out_managed_fields_and_keeps_everything_else() {
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "managedFields": [{"manager": "kubectl"}],
                "annotations": {"x": "1.5"}},
            "spec": {"managedFields": "a field of that name elsewhere stays", "n": [1, -2, 2.5, null, true]},
            "status": {}
        });
        let mut expected = object.clone();
        expected["metadata"]
            .as_object_mut()
            .expect("map")
            .remove("managedFields");
        assert_eq!(parsed(&object.to_string()), expected);
    }

    #[test]
    fn a_sketch_keeps_what_scope_and_may_apply_read_and_nothing_else() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"},
                "annotations": {"x": "y", "podmend.io/skip": "all"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": true}],
                "managedFields": [{"manager": "kubectl"}], "uid": "u"},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                "containers": [{"name": "app", "image": "busybox", "command": ["sh"],
                    "args": ["-c", "true"], "env": [{"name": "A", "value": "1"}]}],
                "volumes": [{"name": "sock", "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}}]},
            "status": {"phase": "Pending"}
        });
        assert_eq!(
            sketched(&pod.to_string()),
            json!({
                "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"},
                    "annotations": {"podmend.io/skip": "all"},
                    "ownerReferences": [{"kind": "ReplicaSet", "controller": true}]},
                "spec": {"nodeName": "n1",
                    "containers": [{"name": "app", "image": "busybox", "command": ["sh"],
                        "args": ["-c", "true"]}],
                    "volumes": [{"hostPath": {"path": "/var/run/docker.sock"}}]}
            })
        );
    }

    #[test]
    fn a_sketch_keeps_every_annotation_scope_and_the_rules_read() {
        for read in [
            super::super::SKIP_ANNOTATION,
            MIRROR_ANNOTATION,
            crate::rules::agent_requests::AGENT_ANNOTATION,
            crate::dind::POLICY_ANNOTATION,
        ] {
            let pod = json!({"metadata": {"annotations": {read: "v", "other": "w"}},
                "spec": {"template": {"metadata": {"annotations": {read: "v", "other": "w"}}}}});
            let kept = json!({"metadata": {"annotations": {read: "v"}},
                "spec": {"template": {"metadata": {"annotations": {read: "v"}}}}});
            assert_eq!(sketched(&pod.to_string()), kept, "{read}");
        }
    }

    #[test]
    fn a_sketch_follows_every_place_a_pod_spec_can_be() {
        let spec = json!({"nodeName": "n1", "containers": [{"name": "c", "ports": [1]}]});
        let kept = json!({"nodeName": "n1", "containers": [{"name": "c"}]});
        let template = json!({"metadata": {"labels": {"l": "v"}, "finalizers": []}, "spec": spec});
        let kept_template = json!({"metadata": {"labels": {"l": "v"}}, "spec": kept});
        for (object, expected) in [
            (
                json!({"spec": {"replicas": 1, "template": template}}),
                json!({"spec": {"template": kept_template}}),
            ),
            (
                json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
                json!({"spec": {"jobTemplate": {"spec": {"template": kept_template}}}}),
            ),
            (
                json!({"template": template}),
                json!({"template": kept_template}),
            ),
        ] {
            assert_eq!(sketched(&object.to_string()), expected);
        }
    }

    #[test]
    fn a_sketch_reads_keys_written_with_escapes_as_the_whole_object_does() {
        let text =
            r#"{"meta\u0064ata": {"n\u0061me": "p", "uid": "u"}, "sp\u0065c": {"nodeName": "n1"}}"#;
        assert_eq!(
            sketched(text),
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}})
        );
    }

    #[test]
    fn a_map_keyed_like_a_serde_json_raw_value_is_an_ordinary_map() {
        // With serde_json's `raw_value` feature (axum's default `json` feature turns it on),
        // `Value` reads such a map as the JSON in its string, with a fresh nesting count: a
        // body could then nest past the limit unrefused. The feature stays off.
        let object = json!({"metadata": {"labels": {"$serde_json::private::RawValue": "[[1]]"}}});
        assert_eq!(sketched(&object.to_string()), object);
        assert_eq!(parsed(&object.to_string()), object);
    }

    #[test]
    fn a_sketch_keeps_whole_what_has_an_unexpected_type() {
        for object in [
            json!({"spec": {"containers": {"name": "not a list"}}}),
            json!({"spec": {"volumes": ["not a map"]}}),
            json!({"metadata": "not a map"}),
            json!({"metadata": {"annotations": ["not a map"]}}),
            json!(["not", "an", "object"]),
            json!("a string"),
        ] {
            assert_eq!(sketched(&object.to_string()), object);
        }
    }
    /// A union of the sketch's shape and `reads` at a Pod's spec.
    fn pod_union(reads: &'static Shape) -> Union {
        Union::of([Part::Here(&OBJECT), Part::Below("/spec", reads)]).expect("two parts")
    }

    static RESOURCES: Shape = Shape::Fields(&[
        ("tolerations", &Shape::All),
        (
            "containers",
            &Shape::Items(&Shape::Fields(&[("resources", &Shape::All)])),
        ),
    ]);

    #[test]
    fn a_union_keeps_each_field_that_one_of_its_shapes_keeps() {
        let pod = json!({
            "metadata": {"name": "p", "uid": "u", "annotations": {"x": "y"}},
            "spec": {"nodeName": "n1", "tolerations": [{"key": "k"}], "serviceAccountName": "sa",
                "containers": [{"name": "app", "image": "busybox", "env": [{"name": "A"}],
                    "resources": {"limits": {"cpu": "1"}}}]}
        });
        let expected = json!({
            "metadata": {"name": "p", "annotations": {}},
            "spec": {"nodeName": "n1", "tolerations": [{"key": "k"}],
                "containers": [{"name": "app", "image": "busybox",
                    "resources": {"limits": {"cpu": "1"}}}]}
        });
        let union = pod_union(&RESOURCES);
        assert_eq!(project(&pod, union), expected);
        let read = read_at(
            &mut serde_json::Deserializer::from_str(
                &json!({"request": {"uid": "1", "object": pod}}).to_string(),
            ),
            &["request", "object"],
            union,
        );
        assert_eq!(read.expect("reads"), Some(expected));
    }

    #[test]
    fn a_union_part_below_follows_a_templates_path_and_nothing_else() {
        let union = Union::of([Part::Below("/spec/template/spec", &RESOURCES)]).expect("one part");
        // Keys that start a segment, or run two together, are not on the path.
        let deployment = json!({"spec/template": {"spec": {"tolerations": [3]}},
            "spe": 1, "spec": {"replicas": 2, "tolerations": [1], "templates": {"spec": {}},
            "template": {"metadata": {"labels": {}}, "spec": {"tolerations": [2], "hostNetwork": true}}}});
        assert_eq!(
            project(&deployment, union),
            json!({"spec": {"template": {"spec": {"tolerations": [2]}}}})
        );
    }

    #[test]
    fn a_union_keeps_whole_what_one_shape_keeps_whole_or_has_an_unexpected_type() {
        let whole = Union::of([Part::Here(&RESOURCES), Part::Here(&ALL)]).expect("two parts");
        let value = json!({"containers": [{"name": "a", "env": []}], "other": 1});
        assert_eq!(project(&value, whole), value);
        let union = Union::of([Part::Here(&RESOURCES), Part::Here(&POD_SPEC)]).expect("two parts");
        for value in [
            json!({"containers": {"name": "not a list"}}),
            json!({"tolerations": "not a list", "containers": ["not a map"]}),
            json!("a string"),
        ] {
            assert_eq!(project(&value, union), value);
        }
    }

    #[test]
    fn a_union_of_too_many_parts_is_refused_and_a_missing_object_reads_as_none() {
        assert!(Union::of([Part::Here(&ALL); UNION_PARTS]).is_some());
        assert!(Union::of([Part::Here(&ALL); UNION_PARTS + 1]).is_none());
        let union = pod_union(&RESOURCES);
        for body in [
            r#"{"request": {"object": null}}"#,
            // A key written twice: the last one, as a parsed `Value` keeps it.
            r#"{"request": {"object": {"metadata": {"name": "a"}}, "object": null}}"#,
            r#"{"request": 5}"#,
            r#"{"kind": "x"}"#,
        ] {
            let read = read_at(
                &mut serde_json::Deserializer::from_str(body),
                &["request", "object"],
                union,
            );
            assert_eq!(read.expect("reads"), None, "{body}");
        }
    }
}
